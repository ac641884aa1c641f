//! What a message trace line says, as types: [`TraceLine`] is one line of
//! `DIR/<actor>[-<rank>].jsonl` (`--trace-dir`), [`TraceEvent`] a message sent or received or a
//! request [`Milestone`] with structured fields. Every actor writes these through
//! `msg_trace::MessageTracer` and `dpserve trace` reads them back with serde: nothing
//! is formatted as `k=v` text to be parsed later.
//!
//! The routing vocabulary ([`Branch`], [`KeySource`], [`RankLoad`], the methods' per-rank
//! terms) is in [`crate::routing_terms`], re-exported here because the controller's `routed`
//! milestone carries it. None of this is on the wire.
//!
//! A line as written (one JSON object; `dir` and `type` say which variant):
//! `{"t":1796022473.569,"actor":"worker","rank":1,"rid":"r1","dir":"event","type":"admitted","prefix_hit_tokens":0,"prompt_tokens":12}`.
//! Files written before the events were typed (`"detail": "k=v …"`) are still read:
//! [`TraceLine::parse`] converts their lines once, in [`legacy`], and nothing else looks at text.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::messages::{FinishReason, ReqError, TokenOut};
pub use crate::routing_terms::{Branch, KeySource, RankCost, RankLoad, RankScore, RankTerms};

/// One line of a message trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceLine {
    /// Unix seconds, the writing actor's clock.
    pub t: f64,
    /// `tokenizer`, `controller` or `worker`.
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The request the line is about (`None` for messages of no request, e.g. `Hello`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<String>,
    #[serde(flatten)]
    pub event: TraceEvent,
}

/// A message sent or received, or a milestone inside the actor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dir", rename_all = "snake_case")]
pub enum TraceEvent {
    Send(MessageSeen),
    Recv(MessageSeen),
    Event(Milestone),
}

/// A message as the tracing actor saw it on its socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageSeen {
    /// The message type (`GenerateReq`, `TokenOut`, ...).
    #[serde(rename = "type")]
    pub msg_type: String,
    /// The other end: `tokenizer`, `controller` or `worker-<rank>`.
    pub peer: String,
    /// Encoded frame size.
    pub bytes: usize,
}

/// A step of one request inside one actor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Milestone {
    /// The controller chose a rank (controller). The same decision as the routing trace's
    /// record, so a trace directory alone can show why.
    Routed {
        /// The configured load-balance method.
        method: String,
        /// The chosen rank (`rank` names the writing actor's own).
        chosen_rank: u32,
        branch: Branch,
        key_source: KeySource,
        /// 64-bit blake2b of the key, hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key_digest: Option<String>,
        /// Live ranks in HRW order, preferred first (affinity methods only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hrw_order: Vec<u32>,
        /// The overload threshold on active requests (affinity methods only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threshold: Option<f64>,
        /// Every live rank's load at decision time.
        #[serde(default)]
        loads: Vec<RankLoad>,
        /// The keyless method that chose, for branch `fallback`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fallback: Option<String>,
        /// In a disaggregated deployment, which leg this decision placed: `prefill` or
        /// `decode` (one decision each).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leg: Option<String>,
        /// `cache_aware`: each live rank's cached prefix and cost, cheapest first.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        costs: Vec<RankCost>,
        /// The peers' methods (`vllm_dp`, `smg_cache_aware`, `dynamo_kv`, `llmd_prefix`): each
        /// live rank's terms of the method's rule, in rank order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        scores: Vec<RankScore>,
    },
    /// No rank could take the request (controller): rank not live, no live rank.
    Refused { error: String },
    /// The rank holding the request went away (controller); the request ends in an error.
    Failed { error: String },
    /// A socket refused a message about the request.
    SendFailed { to: String, error: String },
    /// The worker admitted the request into its prefill line (again, after a retraction).
    Admitted {
        /// Prompt tokens found in the radix cache.
        prefix_hit_tokens: usize,
        #[serde(default)]
        prompt_tokens: usize,
    },
    /// The worker computed one chunk of the prompt (positions `start..start + tokens`) in a
    /// prefill step.
    PrefillChunk { start: usize, tokens: usize },
    /// Disaggregated decode worker: a row and the prompt's slots are held, `KvReady` went to the
    /// prefill rank.
    KvReady { room: u64, prefill_rank: u32 },
    /// Disaggregated prefill worker: the KV of positions `start..start + tokens` went out
    /// (`bytes`) to the decode rank.
    KvSent {
        room: u64,
        decode_rank: u32,
        start: usize,
        tokens: usize,
        bytes: u64,
    },
    /// Disaggregated decode worker: the whole prompt's KV arrived (`tokens`, `bytes`), `ms`
    /// after its `KvReady`.
    KvReceived {
        room: u64,
        tokens: usize,
        bytes: u64,
        ms: f64,
    },
    /// Disaggregated worker: the transfer ended without the KV (the other side or the client
    /// gave up, a peer left, a timeout).
    KvAborted { room: u64, reason: String },
    /// The first generated token left the worker, or reached the tokenizer.
    FirstToken {},
    /// The request ended (worker: sent its last output; tokenizer: as the client sees it).
    Finished {
        reason: FinishReason,
        completion_tokens: u32,
        #[serde(default)]
        cached_tokens: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ReqError>,
    },
}

impl Milestone {
    /// The name in the file (`type`) and in `dpserve trace`'s text.
    pub fn name(&self) -> &'static str {
        match self {
            Milestone::Routed { .. } => "routed",
            Milestone::Refused { .. } => "refused",
            Milestone::Failed { .. } => "failed",
            Milestone::SendFailed { .. } => "send_failed",
            Milestone::Admitted { .. } => "admitted",
            Milestone::PrefillChunk { .. } => "prefill_chunk",
            Milestone::KvReady { .. } => "kv_ready",
            Milestone::KvSent { .. } => "kv_sent",
            Milestone::KvReceived { .. } => "kv_received",
            Milestone::KvAborted { .. } => "kv_aborted",
            Milestone::FirstToken {} => "first_token",
            Milestone::Finished { .. } => "finished",
        }
    }

    /// The milestones an output marks: its first token, its end.
    pub fn of_token_out(out: &TokenOut) -> impl Iterator<Item = Milestone> {
        let first =
            !out.output_ids.is_empty() && out.completion_tokens as usize == out.output_ids.len();
        let finished = out.finish_reason.map(|reason| Milestone::Finished {
            reason,
            completion_tokens: out.completion_tokens,
            cached_tokens: out.cached_tokens,
            error: out.error.clone(),
        });
        first
            .then_some(Milestone::FirstToken {})
            .into_iter()
            .chain(finished)
    }
}

/// What `dpserve trace DIR --rid R` prints after the milestone's name: for people, never
/// parsed (the fields are in the file).
impl fmt::Display for Milestone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Milestone::Routed {
                chosen_rank,
                branch,
                key_source,
                leg,
                ..
            } => {
                if let Some(leg) = leg {
                    write!(f, "leg={leg} ")?;
                }
                write!(
                    f,
                    "rank={chosen_rank} branch={branch} key_source={key_source}"
                )
            }
            Milestone::Refused { error } | Milestone::Failed { error } => f.write_str(error),
            Milestone::SendFailed { to, error } => write!(f, "to {to}: {error}"),
            Milestone::Admitted {
                prefix_hit_tokens,
                prompt_tokens,
            } => write!(
                f,
                "prefix_hit_tokens={prefix_hit_tokens} prompt_tokens={prompt_tokens}"
            ),
            Milestone::PrefillChunk { start, tokens } => write!(f, "start={start} tokens={tokens}"),
            Milestone::KvReady { room, prefill_rank } => {
                write!(f, "room={room} prefill_rank={prefill_rank}")
            }
            Milestone::KvSent {
                room,
                decode_rank,
                start,
                tokens,
                bytes,
            } => write!(
                f,
                "room={room} decode_rank={decode_rank} start={start} tokens={tokens} bytes={bytes}"
            ),
            Milestone::KvReceived {
                room,
                tokens,
                bytes,
                ms,
            } => write!(f, "room={room} tokens={tokens} bytes={bytes} ms={ms:.1}"),
            Milestone::KvAborted { room, reason } => write!(f, "room={room} {reason}"),
            Milestone::FirstToken {} => Ok(()),
            Milestone::Finished {
                reason,
                completion_tokens,
                cached_tokens,
                error,
            } => {
                write!(
                    f,
                    "reason={} completion_tokens={completion_tokens} cached_tokens={cached_tokens}",
                    reason.as_str()
                )?;
                if let Some(e) = error {
                    write!(f, " status={} message={}", e.status, e.message)?;
                }
                Ok(())
            }
        }
    }
}

impl TraceLine {
    /// One line of a trace file: the typed form, or a line of a file written before the events
    /// were typed. `None` for anything else (a line cut short by a crash).
    pub fn parse(text: &str) -> Option<TraceLine> {
        serde_json::from_str(text)
            .ok()
            .or_else(|| legacy::parse(text))
    }

    pub fn milestone(&self) -> Option<&Milestone> {
        match &self.event {
            TraceEvent::Event(m) => Some(m),
            _ => None,
        }
    }

    /// The message and whether this actor sent it.
    pub fn message(&self) -> Option<(bool, &MessageSeen)> {
        match &self.event {
            TraceEvent::Send(m) => Some((true, m)),
            TraceEvent::Recv(m) => Some((false, m)),
            TraceEvent::Event(_) => None,
        }
    }

    /// `worker[1]`, `controller`: the actor and its rank.
    pub fn actor_label(&self) -> String {
        match self.rank {
            Some(r) => format!("{}[{r}]", self.actor),
            None => self.actor.clone(),
        }
    }
}

/// Lines of files written before the events were typed: `{"dir", "type", "detail": "k=v …"}`.
/// Read once into the typed form; the writer never produces them.
mod legacy {
    use serde::Deserialize;

    use super::{Branch, KeySource, MessageSeen, Milestone, TraceEvent, TraceLine};
    use crate::messages::{FinishReason, ReqError};

    #[derive(Deserialize)]
    struct Line {
        t: f64,
        actor: String,
        #[serde(default)]
        rank: Option<u32>,
        dir: String,
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        rid: Option<String>,
        #[serde(default)]
        peer: Option<String>,
        #[serde(default)]
        bytes: Option<usize>,
        #[serde(default)]
        detail: Option<String>,
    }

    pub(super) fn parse(text: &str) -> Option<TraceLine> {
        let l: Line = serde_json::from_str(text).ok()?;
        let seen = || MessageSeen {
            msg_type: l.kind.clone(),
            peer: l.peer.clone().unwrap_or_default(),
            bytes: l.bytes.unwrap_or(0),
        };
        let event = match l.dir.as_str() {
            "send" => TraceEvent::Send(seen()),
            "recv" => TraceEvent::Recv(seen()),
            "event" => TraceEvent::Event(milestone(&l.kind, l.detail.as_deref().unwrap_or(""))?),
            _ => return None,
        };
        Some(TraceLine {
            t: l.t,
            actor: l.actor,
            rank: l.rank,
            rid: l.rid,
            event,
        })
    }

    /// `key=` up to the next space; `message=` was written last and runs to the end.
    fn field<'a>(detail: &'a str, key: &str) -> Option<&'a str> {
        let at = if detail.starts_with(&format!("{key}=")) {
            0
        } else {
            detail.find(&format!(" {key}="))? + 1
        };
        let value = &detail[at + key.len() + 1..];
        if key == "message" {
            Some(value)
        } else {
            value.split(' ').next()
        }
    }

    fn named<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
        serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
    }

    fn num<T: std::str::FromStr>(detail: &str, key: &str) -> Option<T> {
        field(detail, key).and_then(|v| v.parse().ok())
    }

    fn milestone(name: &str, d: &str) -> Option<Milestone> {
        Some(match name {
            "routed" => Milestone::Routed {
                method: String::new(),
                chosen_rank: num(d, "rank")?,
                branch: named::<Branch>(field(d, "branch")?)?,
                key_source: field(d, "key_source")
                    .and_then(named::<KeySource>)
                    .unwrap_or(KeySource::None),
                key_digest: None,
                hrw_order: Vec::new(),
                threshold: None,
                loads: Vec::new(),
                fallback: None,
                leg: None,
                costs: Vec::new(),
                scores: Vec::new(),
            },
            "refused" => Milestone::Refused { error: d.into() },
            "failed" => Milestone::Failed { error: d.into() },
            "send_failed" => {
                let (to, error) = d.strip_prefix("to ")?.split_once(": ")?;
                Milestone::SendFailed {
                    to: to.into(),
                    error: error.into(),
                }
            }
            "admitted" => Milestone::Admitted {
                prefix_hit_tokens: num(d, "prefix_hit_tokens").unwrap_or(0),
                prompt_tokens: 0,
            },
            "first_token" => Milestone::FirstToken {},
            "finished" => Milestone::Finished {
                reason: named::<FinishReason>(field(d, "reason")?)?,
                completion_tokens: num(d, "completion_tokens").unwrap_or(0),
                cached_tokens: num(d, "cached_tokens").unwrap_or(0),
                error: num(d, "status").map(|status| ReqError {
                    status,
                    message: field(d, "message").unwrap_or("").into(),
                }),
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(event: TraceEvent) -> TraceLine {
        TraceLine {
            t: 10.5,
            actor: "worker".into(),
            rank: Some(1),
            rid: Some("r1".into()),
            event,
        }
    }

    fn every_kind() -> Vec<TraceLine> {
        let seen = MessageSeen {
            msg_type: "GenerateReq".into(),
            peer: "controller".into(),
            bytes: 339,
        };
        [
            TraceEvent::Send(seen.clone()),
            TraceEvent::Recv(seen),
            TraceEvent::Event(Milestone::Routed {
                method: "prefix_affinity".into(),
                chosen_rank: 1,
                branch: Branch::Spill,
                key_source: KeySource::RoutingKey,
                key_digest: Some("00ab".into()),
                hrw_order: vec![0, 1],
                threshold: Some(1.5),
                loads: vec![RankLoad {
                    rank: 0,
                    active_requests: 3,
                    active_tokens: 40,
                }],
                fallback: None,
                leg: Some("prefill".into()),
                costs: vec![RankCost {
                    rank: 1,
                    matched_tokens: 64,
                    prefill_tokens: 36,
                    load_cost: 4.0,
                    cost: 40.0,
                    backlog_tokens: Some(400),
                    prefill_rate: Some(100.0),
                    stall_tpot: Some(0.5),
                }],
                scores: vec![
                    RankScore::VllmDp {
                        rank: 0,
                        waiting: 2,
                        running: 1,
                        score: 9,
                    },
                    RankScore::SmgCacheAware {
                        rank: 1,
                        matched_tokens: 32,
                        load: 3,
                        tree_tokens: 64,
                    },
                    RankScore::DynamoKv {
                        rank: 2,
                        overlap_blocks: 2,
                        prefill_blocks: 1.5,
                        decode_blocks: 7.0,
                        logit: 8.5,
                        probability: Some(0.25),
                    },
                    RankScore::LlmdPrefix {
                        rank: 3,
                        prefix: 0.5,
                        queue: 1.0,
                        kv_cache: 0.75,
                        score: 2.75,
                    },
                ],
            }),
            TraceEvent::Event(Milestone::Refused {
                error: "no live rank".into(),
            }),
            TraceEvent::Event(Milestone::Failed { error: "x".into() }),
            TraceEvent::Event(Milestone::SendFailed {
                to: "tokenizer".into(),
                error: "full".into(),
            }),
            TraceEvent::Event(Milestone::Admitted {
                prefix_hit_tokens: 4,
                prompt_tokens: 12,
            }),
            TraceEvent::Event(Milestone::PrefillChunk {
                start: 0,
                tokens: 12,
            }),
            TraceEvent::Event(Milestone::FirstToken {}),
            TraceEvent::Event(Milestone::Finished {
                reason: FinishReason::Error,
                completion_tokens: 2,
                cached_tokens: 4,
                error: Some(ReqError {
                    status: 503,
                    message: "rank 1 is gone".into(),
                }),
            }),
        ]
        .into_iter()
        .map(line)
        .collect()
    }

    #[test]
    fn every_event_round_trips_through_one_json_line() {
        for l in every_kind() {
            let text = serde_json::to_string(&l).unwrap();
            assert!(!text.contains('\n'));
            assert_eq!(TraceLine::parse(&text).as_ref(), Some(&l), "{text}");
        }
    }

    #[test]
    fn lines_keep_the_flat_shape_tools_read() {
        let l = &every_kind()[6];
        let v: serde_json::Value = serde_json::to_value(l).unwrap();
        assert_eq!(v["dir"], "event");
        assert_eq!(v["type"], "admitted");
        assert_eq!(v["rid"], "r1");
        assert_eq!(v["prefix_hit_tokens"], 4);
        let v: serde_json::Value = serde_json::to_value(&every_kind()[0]).unwrap();
        assert_eq!(
            (&v["dir"], &v["type"], &v["bytes"]),
            (&"send".into(), &"GenerateReq".into(), &339.into())
        );
    }

    #[test]
    fn scores_are_flat_objects_named_by_their_rule_and_old_lines_lack_them() {
        let v = serde_json::to_value(RankScore::VllmDp {
            rank: 1,
            waiting: 2,
            running: 3,
            score: 11,
        })
        .unwrap();
        assert_eq!(v["rule"], "vllm_dp");
        assert_eq!((&v["rank"], &v["score"]), (&1.into(), &11.into()));
        let no_p = serde_json::to_value(RankScore::DynamoKv {
            rank: 0,
            overlap_blocks: 0,
            prefill_blocks: 1.0,
            decode_blocks: 1.0,
            logit: 2.0,
            probability: None,
        })
        .unwrap();
        assert!(no_p.get("probability").is_none());
        // A routed line written before the peers' methods existed.
        let old = r#"{"t":1.0,"actor":"controller","rid":"r","dir":"event","type":"routed","method":"total_tokens","chosen_rank":0,"branch":"least_loaded","key_source":"none","loads":[{"rank":0,"active_requests":1,"active_tokens":2}]}"#;
        match TraceLine::parse(old).and_then(|l| l.milestone().cloned()) {
            Some(Milestone::Routed { scores, loads, .. }) => {
                assert!(scores.is_empty());
                assert_eq!(loads[0].active_tokens, 2);
            }
            other => panic!("{other:?}"),
        }
        for b in [
            Branch::Matched,
            Branch::Balance,
            Branch::LowestCost,
            Branch::Sampled,
            Branch::MaxScore,
        ] {
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
        }
    }

    #[test]
    fn lines_of_untyped_files_are_still_read() {
        let old = [
            r#"{"t":1.0,"actor":"tokenizer","rank":null,"dir":"send","type":"GenerateReq","rid":"r1","peer":"controller","bytes":40,"detail":null}"#,
            r#"{"t":1.1,"actor":"controller","dir":"event","type":"routed","rid":"r1","detail":"rank=2 branch=spill key_source=routing_key"}"#,
            r#"{"t":1.2,"actor":"worker","rank":2,"dir":"event","type":"admitted","rid":"r1","detail":"prefix_hit_tokens=7"}"#,
            r#"{"t":1.3,"actor":"tokenizer","dir":"event","type":"first_token","rid":"r1","detail":null}"#,
            r#"{"t":1.4,"actor":"tokenizer","dir":"event","type":"finished","rid":"r1","detail":"reason=error completion_tokens=1 cached_tokens=0 status=503 message=rank 2 is gone"}"#,
        ];
        let lines: Vec<TraceLine> = old.iter().map(|t| TraceLine::parse(t).unwrap()).collect();
        assert_eq!(lines[0].message().unwrap().1.bytes, 40);
        assert!(matches!(
            lines[1].milestone(),
            Some(Milestone::Routed {
                chosen_rank: 2,
                branch: Branch::Spill,
                ..
            })
        ));
        assert!(matches!(
            lines[2].milestone(),
            Some(Milestone::Admitted {
                prefix_hit_tokens: 7,
                ..
            })
        ));
        assert_eq!(lines[3].milestone(), Some(&Milestone::FirstToken {}));
        match lines[4].milestone() {
            Some(Milestone::Finished {
                reason,
                error: Some(e),
                ..
            }) => {
                assert_eq!((*reason, e.status), (FinishReason::Error, 503));
                assert_eq!(e.message, "rank 2 is gone");
            }
            other => panic!("{other:?}"),
        }
        assert!(TraceLine::parse(r#"{"t": 6"#).is_none());
        assert!(TraceLine::parse(r#"{"t":1,"actor":"x","dir":"event","type":"nope"}"#).is_none());
    }

    #[test]
    fn an_output_marks_its_first_token_and_its_end() {
        let mut out = TokenOut::error("r", 503, "gone");
        assert_eq!(
            Milestone::of_token_out(&out)
                .map(|m| m.name())
                .collect::<Vec<_>>(),
            ["finished"]
        );
        out = TokenOut::error("r", 503, "gone");
        out.finish_reason = None;
        out.error = None;
        out.output_ids = vec![5];
        out.completion_tokens = 1;
        assert_eq!(
            Milestone::of_token_out(&out)
                .map(|m| m.name())
                .collect::<Vec<_>>(),
            ["first_token"]
        );
    }
}
