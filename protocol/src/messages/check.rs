//! What a decoded message must hold before any actor reads it: every float a receiver turns
//! into a duration, compares or samples with is a number (no NaN, no infinity where a finite
//! value is meant), and the ids a receiver keys its tables by are not empty. `decode` refuses a
//! message that breaks a rule (`DecodeError::Invalid`), so no frame can panic an actor that
//! trusts what it decoded. The tokenizer checks the same sampling rules on HTTP bodies with
//! client-facing messages; these are the wire's floor, not a second copy of its 400s.

use super::{Message, SamplingParams};

/// The first rule `msg` breaks, as `field: what is wrong`.
pub(crate) fn check(msg: &Message) -> Result<(), String> {
    match msg {
        Message::GenerateReq(r) => {
            rid(&r.rid)?;
            finite("received_at", r.received_at)?;
            sampling(&r.sampling)
        }
        Message::EmbedReq(r) => {
            rid(&r.rid)?;
            finite("received_at", r.received_at)
        }
        // What a worker computed (log-probabilities, an embedding) is passed on as it is: a
        // model that produced NaN still ends its request with an answer.
        Message::TokenOut(t) => rid(&t.rid),
        Message::Heartbeat(h) => finite("timestamp", h.timestamp),
        Message::WorkerStatus(s) => {
            finite("timestamp", s.timestamp)?;
            at_least_zero("cache_hit_rate", s.cache_hit_rate)?;
            at_least_zero("gen_throughput", s.gen_throughput)?;
            if let Some(p) = &s.prefill {
                at_least_zero("prefill.busy_seconds", p.busy_seconds)?;
            }
            if let Some(d) = &s.disagg {
                at_least_zero("disagg.transfer_seconds", d.transfer_seconds)?;
            }
            Ok(())
        }
        Message::ClusterStatus(c) => {
            finite("timestamp", c.timestamp)?;
            for r in &c.live_ranks {
                at_least_zero("live_ranks.last_seen_s", r.last_seen_s)?;
            }
            Ok(())
        }
        Message::Shutdown(s) => match s.drain_timeout_s {
            Some(t) => at_least_zero("drain_timeout_s", t),
            None => Ok(()),
        },
        Message::KvReady(r) => rid(&r.rid),
        Message::Abort(_)
        | Message::FlushCache(_)
        | Message::Hello(_)
        | Message::HelloAck(_)
        | Message::Rejoin(_)
        | Message::KvChunk(_)
        | Message::KvDone(_)
        | Message::KvAbort(_)
        | Message::PeerGone(_)
        | Message::KvEvents(_)
        | Message::KvSnapshotReq(_)
        | Message::Reconcile(_) => Ok(()),
    }
}

/// The ranges the tokenizer admits (`tokenizer-actor/src/http/validate.rs`), as the floor every
/// worker may rely on.
fn sampling(s: &SamplingParams) -> Result<(), String> {
    let named = [
        ("temperature", s.temperature),
        ("top_p", s.top_p),
        ("min_p", s.min_p),
        ("repetition_penalty", s.repetition_penalty),
        ("frequency_penalty", s.frequency_penalty),
        ("presence_penalty", s.presence_penalty),
    ];
    for (field, v) in named {
        if !v.is_finite() {
            return Err(format!("sampling.{field}: {v} is not a finite number"));
        }
    }
    if s.temperature < 0.0 {
        return Err(format!(
            "sampling.temperature: {} is negative",
            s.temperature
        ));
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        return Err(format!("sampling.top_p: {} is not in (0, 1]", s.top_p));
    }
    if !(0.0..=1.0).contains(&s.min_p) {
        return Err(format!("sampling.min_p: {} is not in [0, 1]", s.min_p));
    }
    if s.repetition_penalty <= 0.0 {
        return Err(format!(
            "sampling.repetition_penalty: {} is not positive",
            s.repetition_penalty
        ));
    }
    match s.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
        Some((id, b)) => Err(format!(
            "sampling.logit_bias: {b} for token {id} is not finite"
        )),
        None => Ok(()),
    }
}

fn rid(rid: &str) -> Result<(), String> {
    if rid.is_empty() {
        return Err("rid: empty".into());
    }
    Ok(())
}

fn finite(field: &str, v: f64) -> Result<(), String> {
    if !v.is_finite() {
        return Err(format!("{field}: {v} is not a finite number"));
    }
    Ok(())
}

fn at_least_zero(field: &str, v: f64) -> Result<(), String> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{field}: {v} is not a finite number >= 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::codec::{decode, encode, DecodeError};
    use crate::messages::{GenerateReq, Heartbeat, Message, Shutdown};

    fn refused(msg: Message) -> String {
        match decode(&encode(&msg).unwrap()) {
            Err(DecodeError::Invalid { name, reason }) => format!("{name}: {reason}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn each_rule_refuses_with_the_field_named() {
        let shutdown = |t: f64| {
            Message::Shutdown(Shutdown {
                rank: Some(0),
                reason: String::new(),
                drain_timeout_s: Some(t),
            })
        };
        assert_eq!(
            refused(shutdown(f64::NAN)),
            "Shutdown: drain_timeout_s: NaN is not a finite number >= 0"
        );
        assert!(refused(shutdown(-0.5)).starts_with("Shutdown: drain_timeout_s: -0.5"));
        let hb = Message::Heartbeat(Heartbeat {
            rank: 1,
            timestamp: f64::INFINITY,
        });
        assert_eq!(
            refused(hb),
            "Heartbeat: timestamp: inf is not a finite number"
        );
        let mut req = GenerateReq::new("r", vec![1]);
        req.sampling.top_p = 0.0;
        assert_eq!(
            refused(Message::GenerateReq(req.clone())),
            "GenerateReq: sampling.top_p: 0 is not in (0, 1]"
        );
        req.sampling.top_p = 1.0;
        req.rid.clear();
        assert_eq!(
            refused(Message::GenerateReq(req)),
            "GenerateReq: rid: empty"
        );
    }

    #[test]
    fn what_honest_peers_send_passes() {
        let ok = |msg: Message| decode(&encode(&msg).unwrap()).unwrap();
        ok(Message::GenerateReq(GenerateReq::new("r", vec![1])));
        ok(Message::Shutdown(Shutdown {
            rank: Some(0),
            reason: "drain".into(),
            drain_timeout_s: Some(0.0),
        }));
        // A worker's output passes as computed, NaN included: its request still ends.
        let mut out = crate::messages::TokenOut::error("r", 500, "x");
        out.logprobs = Some(vec![f32::NAN, f32::NEG_INFINITY]);
        ok(Message::TokenOut(out));
    }
}
