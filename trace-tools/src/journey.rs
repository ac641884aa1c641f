//! One request's journey as drawable parts, read off its [`Timeline`]: a lane per actor, each
//! traced message as one arrow (its send paired with its receive), milestones as marks, the
//! phases between them (queued, prefill, decode, ...), and the routing decision in words. The
//! SVG picture ([`crate::picture`]) and the Chrome trace ([`crate::chrome`]) both draw this, so
//! they show the same thing.
//!
//! Pairing: the i-th `send` of a type from actor A to B is the i-th `recv` of that type at B
//! from A. Counting, not timestamps, pairs them, so clock skew between hosts cannot cross two
//! messages. A send nobody traced receiving (or the reverse) is still one arrow, drawn open.

use std::collections::BTreeMap;

use protocol::msg_trace::Milestone;
use protocol::route_record::RouteRecord;
use protocol::trace_event::RankLoad;

use crate::timeline::{RowKind, Timeline};

/// A request's journey; times are Unix seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Journey {
    pub rid: String,
    /// The first traced time: what the pictures count from.
    pub t0: f64,
    pub t_end: f64,
    /// Actor labels (`tokenizer`, `controller`, `worker[1]`), top to bottom.
    pub lanes: Vec<String>,
    pub messages: Vec<Arrow>,
    pub marks: Vec<Mark>,
    pub phases: Vec<Phase>,
    /// The routing decision, one line per fact.
    pub route: Vec<String>,
    /// `Timeline`'s one sentence.
    pub summary: String,
}

/// One message; at least one of `sent` and `received` is set.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrow {
    pub from: usize,
    pub to: usize,
    pub msg_type: String,
    pub bytes: usize,
    pub sent: Option<f64>,
    pub received: Option<f64>,
}

impl Arrow {
    /// `GenerateReq 339 B`.
    pub fn label(&self) -> String {
        format!("{} {} B", self.msg_type, self.bytes)
    }
}

/// A milestone on an actor's lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub lane: usize,
    pub t: f64,
    pub milestone: Milestone,
}

impl Mark {
    /// What the picture writes beside the mark.
    pub fn label(&self) -> String {
        match &self.milestone {
            Milestone::Routed {
                chosen_rank,
                branch,
                ..
            } => format!("routed → rank {chosen_rank} ({branch})"),
            Milestone::Refused { error } => format!("refused: {error}"),
            Milestone::Failed { error } => format!("failed: {error}"),
            Milestone::SendFailed { to, error } => format!("send to {to} failed: {error}"),
            Milestone::Admitted {
                prefix_hit_tokens,
                prompt_tokens,
            } => format!("admitted ({prefix_hit_tokens} of {prompt_tokens} prompt tokens cached)"),
            Milestone::PrefillChunk { start, tokens } => {
                format!("prefill chunk {start}..{}", start + tokens)
            }
            Milestone::KvReady { prefill_rank, .. } => {
                format!("KV ready: slots held, waiting for prefill rank {prefill_rank}")
            }
            Milestone::KvSent {
                decode_rank,
                start,
                tokens,
                bytes,
                ..
            } => format!(
                "KV {start}..{} sent to rank {decode_rank} ({})",
                start + tokens,
                human_bytes(*bytes)
            ),
            Milestone::KvReceived {
                tokens, bytes, ms, ..
            } => format!(
                "KV received: {tokens} tokens, {} in {ms:.1} ms",
                human_bytes(*bytes)
            ),
            Milestone::KvAborted { reason, .. } => format!("KV transfer aborted: {reason}"),
            Milestone::FirstToken {} => "first token".into(),
            Milestone::Finished {
                reason,
                completion_tokens,
                error,
                ..
            } => match error {
                Some(e) => format!("finished: {} ({})", reason.as_str(), e.message),
                None => format!("finished: {}, {completion_tokens} tokens", reason.as_str()),
            },
        }
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / (1 << 10) as f64),
        b => format!("{b} B"),
    }
}

/// A stretch of time on one lane between two traced moments.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub lane: usize,
    pub start: f64,
    pub end: f64,
    /// `queued`, `prefill`, `decode`, `routing`, `waiting for first token`, `streaming`.
    pub name: &'static str,
}

impl Phase {
    pub fn label(&self) -> String {
        format!("{} {}", self.name, ms_text((self.end - self.start) * 1e3))
    }
}

/// `0.31 ms`, `28.4 ms`, `1.52 s`.
pub fn ms_text(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// `worker-1` (a peer name) → `worker[1]` (a lane).
fn lane_of_peer(peer: &str) -> String {
    match peer.strip_prefix("worker-") {
        Some(r) => format!("worker[{r}]"),
        None => peer.to_string(),
    }
}

/// Tokenizer first, then the controller, then workers by rank, then anything else.
fn lane_order(label: &str) -> (u8, u64, String) {
    if label == "tokenizer" {
        return (0, 0, String::new());
    }
    if label == "controller" {
        return (1, 0, String::new());
    }
    if let Some(r) = label
        .strip_prefix("worker[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.parse().ok())
    {
        return (2, r, String::new());
    }
    (3, 0, label.to_string())
}

impl Journey {
    pub fn of(tl: &Timeline) -> Journey {
        let mut lanes: Vec<String> = Vec::new();
        for r in &tl.rows {
            lanes.push(r.actor.clone());
            if let RowKind::Message { seen, .. } = &r.what {
                lanes.push(lane_of_peer(&seen.peer));
            }
        }
        lanes.sort_by_key(|l| lane_order(l));
        lanes.dedup();
        let lane = |label: &str| lanes.iter().position(|l| l == label).unwrap_or(0);

        // (from, to, type) → the sends and the receives, each in time order.
        type Ends = (Vec<(f64, usize)>, Vec<(f64, usize)>);
        let mut by_key: BTreeMap<(usize, usize, String), Ends> = BTreeMap::new();
        let mut marks = Vec::new();
        let mut record: Option<&RouteRecord> = None;
        for r in &tl.rows {
            match &r.what {
                RowKind::Message { outgoing, seen } => {
                    let me = lane(&r.actor);
                    let other = lane(&lane_of_peer(&seen.peer));
                    let (from, to) = if *outgoing { (me, other) } else { (other, me) };
                    let ends = by_key.entry((from, to, seen.msg_type.clone())).or_default();
                    let side = if *outgoing { &mut ends.0 } else { &mut ends.1 };
                    side.push((r.t, seen.bytes));
                }
                RowKind::Milestone(m) => marks.push(Mark {
                    lane: lane(&r.actor),
                    t: r.t,
                    milestone: m.clone(),
                }),
                RowKind::Route(rec) => record = Some(rec),
            }
        }
        let mut messages = Vec::new();
        for ((from, to, msg_type), (sends, recvs)) in by_key {
            for i in 0..sends.len().max(recvs.len()) {
                let (s, r) = (sends.get(i), recvs.get(i));
                messages.push(Arrow {
                    from,
                    to,
                    msg_type: msg_type.clone(),
                    bytes: s.or(r).map_or(0, |e| e.1),
                    sent: s.map(|e| e.0),
                    received: r.map(|e| e.0),
                });
            }
        }
        let at = |a: &Arrow| a.sent.or(a.received).unwrap_or(0.0);
        messages.sort_by(|a, b| at(a).total_cmp(&at(b)));

        let route = match record {
            Some(rec) => route_lines_of_record(rec),
            None => marks
                .iter()
                .rev()
                .find_map(|m| route_lines_of_milestone(&m.milestone))
                .unwrap_or_default(),
        };
        let t0 = tl.rows.first().map_or(0.0, |r| r.t);
        let t_end = tl.rows.last().map_or(t0, |r| r.t);
        let phases = phases(&lanes, &tl.rows, &marks);
        Journey {
            rid: tl.rid.clone(),
            t0,
            t_end,
            lanes,
            messages,
            marks,
            phases,
            route,
            summary: tl.outcome.sentence(&tl.rid),
        }
    }
}

/// The phases each actor's traced moments bound.
fn phases(lanes: &[String], rows: &[crate::timeline::Row], marks: &[Mark]) -> Vec<Phase> {
    let mut out = Vec::new();
    for (lane, label) in lanes.iter().enumerate() {
        let first = |name: &str| {
            marks
                .iter()
                .find(|m| m.lane == lane && m.milestone.name() == name)
                .map(|m| m.t)
        };
        let request_msg = |outgoing: bool| {
            rows.iter()
                .find(|r| {
                    &r.actor == label
                        && matches!(&r.what, RowKind::Message { outgoing: o, seen }
                            if *o == outgoing
                                && matches!(seen.msg_type.as_str(), "GenerateReq" | "EmbedReq"))
                })
                .map(|r| r.t)
        };
        let mut add = |start: Option<f64>, end: Option<f64>, name| {
            if let (Some(start), Some(end)) = (start, end) {
                if end >= start {
                    out.push(Phase {
                        lane,
                        start,
                        end,
                        name,
                    });
                }
            }
        };
        let (first_token, finished) = (first("first_token"), first("finished"));
        match lane_order(label).0 {
            0 => {
                let sent = request_msg(true);
                match first_token {
                    Some(ft) => {
                        add(sent, Some(ft), "waiting for first token");
                        add(Some(ft), finished, "streaming");
                    }
                    None => add(sent, finished, "waiting"),
                }
            }
            1 => add(request_msg(false), request_msg(true), "routing"),
            2 => {
                let admitted = first("admitted");
                add(request_msg(false), admitted, "queued");
                match first_token {
                    Some(ft) => {
                        add(admitted, Some(ft), "prefill");
                        add(Some(ft), finished, "decode");
                    }
                    None => add(admitted, finished, "prefill"),
                }
            }
            _ => {}
        }
    }
    out
}

fn loads_line(loads: &[RankLoad], threshold: Option<f64>) -> String {
    let each: Vec<String> = loads
        .iter()
        .map(|l| {
            let over = threshold.is_some_and(|t| l.active_requests as f64 > t);
            format!(
                "r{} {}{}",
                l.rank,
                l.active_requests,
                if over { " (over)" } else { "" }
            )
        })
        .collect();
    let mut s = format!("active requests: {}", each.join(", "));
    if let Some(t) = threshold {
        s.push_str(&format!("; threshold {t:.2}"));
    }
    s
}

fn route_lines_of_record(r: &RouteRecord) -> Vec<String> {
    match (r.rank, r.branch, &r.error) {
        (Some(rank), Some(branch), None) => {
            let by = r
                .fallback
                .as_ref()
                .map_or(String::new(), |f| format!(" (by {f})"));
            let mut lines = vec![format!("{} → rank {rank}, branch {branch}{by}", r.method)];
            let mut second = format!("key {}", key_text(r.key_source, r.key_digest.as_deref()));
            if !r.hrw_order.is_empty() {
                let order: Vec<String> = r.hrw_order.iter().map(u32::to_string).collect();
                second.push_str(&format!("; HRW order {}", order.join(" > ")));
            }
            lines.push(second);
            if !r.loads.is_empty() {
                lines.push(loads_line(&r.loads, r.threshold));
            }
            if !r.costs.is_empty() {
                let each: Vec<String> = r
                    .costs
                    .iter()
                    .map(|c| {
                        format!(
                            "r{} {} cached, cost {:.1}",
                            c.rank, c.matched_tokens, c.cost
                        )
                    })
                    .collect();
                lines.push(format!("cached prefix: {}", each.join("; ")));
            }
            if !r.scores.is_empty() {
                let each: Vec<String> = r.scores.iter().map(crate::scores::brief).collect();
                lines.push(format!("scores: {}", each.join("; ")));
            }
            lines
        }
        (_, _, Some(err)) if r.loads.is_empty() => vec![format!("{}: refused: {err}", r.method)],
        (_, _, Some(err)) => vec![
            format!("{}: refused: {err}", r.method),
            loads_line(&r.loads, r.threshold),
        ],
        _ => vec![format!("{}: incomplete record", r.method)],
    }
}

/// The controller's `routed` (or `refused`) milestone as the record it mirrors.
fn route_lines_of_milestone(m: &Milestone) -> Option<Vec<String>> {
    let mut rec = RouteRecord::blank("", 0.0, "routed".into());
    match m {
        Milestone::Routed {
            method,
            chosen_rank,
            branch,
            key_source,
            key_digest,
            hrw_order,
            threshold,
            loads,
            fallback,
            leg,
            costs,
            scores,
        } => {
            rec.leg = leg.clone();
            rec.costs.clone_from(costs);
            rec.scores.clone_from(scores);
            if !method.is_empty() {
                rec.method = method.clone();
            }
            rec.rank = Some(*chosen_rank);
            rec.branch = Some(*branch);
            rec.key_source = *key_source;
            rec.key_digest = key_digest.clone();
            rec.hrw_order = hrw_order.clone();
            rec.threshold = *threshold;
            rec.loads = loads.clone();
            rec.fallback = fallback.clone();
        }
        Milestone::Refused { error } => {
            rec.method = "routing".into();
            rec.error = Some(error.clone());
        }
        _ => return None,
    }
    Some(route_lines_of_record(&rec))
}

fn key_text(source: protocol::trace_event::KeySource, digest: Option<&str>) -> String {
    match digest {
        Some(d) => format!("from {source} ({d})"),
        None => format!("source {source}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::traces;
    use crate::timeline::timeline;

    #[test]
    fn every_message_is_one_arrow_and_every_milestone_a_mark() {
        let tl = timeline(&traces(), "r1").unwrap();
        let j = Journey::of(&tl);
        assert_eq!(j.lanes, ["tokenizer", "controller", "worker[1]"]);
        // tokenizer→controller, controller→worker, two TokenOuts worker→tokenizer.
        assert_eq!(j.messages.len(), 4);
        assert!(j
            .messages
            .iter()
            .all(|a| a.sent.is_some() && a.received.is_some()));
        assert_eq!((j.messages[0].from, j.messages[0].to), (0, 1));
        assert_eq!((j.messages[1].from, j.messages[1].to), (1, 2));
        let names: Vec<&str> = j.marks.iter().map(|m| m.milestone.name()).collect();
        assert_eq!(
            names,
            [
                "routed",
                "admitted",
                "prefill_chunk",
                "prefill_chunk",
                "first_token",
                "first_token",
                "finished",
                "finished"
            ]
        );
        let phases: Vec<&str> = j.phases.iter().map(|p| p.name).collect();
        assert_eq!(
            phases,
            [
                "waiting for first token",
                "streaming",
                "routing",
                "queued",
                "prefill",
                "decode"
            ]
        );
        assert!(
            j.route[0].contains("prefix_affinity → rank 1, branch affinity"),
            "{:?}",
            j.route
        );
        assert!(j.route[1].contains("HRW order 1 > 0"), "{:?}", j.route);
        assert!(j.route[2].contains("threshold 1.50"), "{:?}", j.route);
    }

    #[test]
    fn a_message_received_but_not_traced_as_sent_is_still_one_arrow() {
        let mut tl = timeline(&traces(), "r1").unwrap();
        tl.rows
            .retain(|r| !(r.actor == "worker[1]" && r.dir() == "send"));
        let j = Journey::of(&tl);
        assert_eq!(j.messages.len(), 4);
        let open: Vec<&Arrow> = j.messages.iter().filter(|a| a.sent.is_none()).collect();
        assert_eq!(open.len(), 2);
        assert_eq!((open[0].from, open[0].to), (2, 0));
    }

    #[test]
    fn a_peer_methods_decision_lists_each_ranks_terms() {
        use protocol::trace_event::RankScore;
        let mut rec = RouteRecord::blank("r", 0.0, "vllm_dp".into());
        rec.rank = Some(1);
        rec.branch = Some(protocol::trace_event::Branch::LeastLoaded);
        rec.scores = vec![
            RankScore::VllmDp {
                rank: 0,
                waiting: 1,
                running: 2,
                score: 6,
            },
            RankScore::VllmDp {
                rank: 1,
                waiting: 0,
                running: 3,
                score: 3,
            },
        ];
        let lines = route_lines_of_record(&rec);
        assert_eq!(lines.last().unwrap(), "scores: r0 4×1+2=6; r1 4×0+3=3");
    }
}
