//! Trace files for tests: one request across three actors, written as the actors write them.

use controller::policy::{Branch, KeySource, Method, RankSet, RouteDecision};
use controller::trace::route_record;
use protocol::msg_trace::{Milestone, TraceEvent, TraceLine};
use protocol::trace_event::MessageSeen;
use protocol::FinishReason;

use crate::timeline::TraceSet;

/// One JSON line of `actor[rank]`'s file about request `r1`.
pub fn line(t: f64, actor: &str, rank: Option<u32>, event: TraceEvent) -> String {
    serde_json::to_string(&TraceLine {
        t,
        actor: actor.into(),
        rank,
        rid: Some("r1".into()),
        event,
    })
    .unwrap()
}

pub fn send(ty: &str, peer: &str) -> TraceEvent {
    TraceEvent::Send(MessageSeen {
        msg_type: ty.into(),
        peer: peer.into(),
        bytes: 100,
    })
}

pub fn recv(ty: &str, peer: &str) -> TraceEvent {
    TraceEvent::Recv(MessageSeen {
        msg_type: ty.into(),
        peer: peer.into(),
        bytes: 100,
    })
}

pub fn event(m: Milestone) -> TraceEvent {
    TraceEvent::Event(m)
}

pub fn finished(reason: FinishReason, completion_tokens: u32) -> Milestone {
    Milestone::Finished {
        reason,
        completion_tokens,
        cached_tokens: 0,
        error: None,
    }
}

pub fn decision() -> RouteDecision {
    RouteDecision {
        rank: 1,
        branch: Branch::Affinity,
        key_source: KeySource::RoutingKey,
        key_digest: Some(0xab),
        hrw_order: vec![1, 0],
        threshold: Some(1.5),
        fallback: None,
        costs: Vec::new(),
        scores: Vec::new(),
        cached_tokens: None,
    }
}

/// Three actors' files and a routing trace, as `dpserve trace DIR` would read them: request
/// `r1` routed to rank 1, two tokens, 8 traced messages (4 sent and received, 0 lost).
pub fn traces() -> TraceSet {
    let tok = |t, e| line(t, "tokenizer", None, e);
    let ctl = |t, e| line(t, "controller", None, e);
    let wrk = |t, e| line(t, "worker", Some(1), e);
    let tokenizer = [
        tok(10.000, send("GenerateReq", "controller")),
        tok(10.020, recv("TokenOut", "worker-1")),
        tok(10.020, event(Milestone::FirstToken {})),
        tok(10.050, recv("TokenOut", "worker-1")),
        tok(10.050, event(finished(FinishReason::Length, 2))),
    ]
    .join("\n");
    let ranks = RankSet::idle(&[0, 1]);
    let controller = [
        ctl(10.001, recv("GenerateReq", "tokenizer")),
        ctl(
            10.001,
            event(decision().milestone(Method::PrefixAffinity, &ranks)),
        ),
        ctl(10.002, send("GenerateReq", "worker-1")),
    ]
    .join("\n");
    // The worker's file ends in half a line (killed mid-write).
    let worker = [
        wrk(10.003, recv("GenerateReq", "controller")),
        wrk(
            10.004,
            event(Milestone::Admitted {
                prefix_hit_tokens: 0,
                prompt_tokens: 12,
            }),
        ),
        wrk(
            10.012,
            event(Milestone::PrefillChunk {
                start: 0,
                tokens: 8,
            }),
        ),
        wrk(
            10.018,
            event(Milestone::PrefillChunk {
                start: 8,
                tokens: 4,
            }),
        ),
        wrk(10.019, send("TokenOut", "tokenizer")),
        wrk(10.019, event(Milestone::FirstToken {})),
        wrk(10.049, send("TokenOut", "tokenizer")),
        wrk(10.049, event(finished(FinishReason::Length, 2))),
        "{\"t\": 10.0".to_string(),
    ]
    .join("\n");
    let route = route_record(
        "r1",
        10.0015,
        Method::PrefixAffinity,
        &ranks,
        &Ok(decision()),
    );
    let mut set = TraceSet::default();
    for text in [
        tokenizer,
        controller,
        worker,
        serde_json::to_string(&route).unwrap(),
    ] {
        set.add(text.as_bytes()).unwrap();
    }
    set
}
