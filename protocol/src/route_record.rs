//! The routing trace's record: one routing decision, one JSON line of `--trace-file`. The
//! controller writes it (`controller::trace`); `dpserve trace` and `dpserve bench` read it back
//! (the `trace-tools` crate). It lives here, on the routing vocabulary
//! (`routing_terms`) it shares with the message trace, because both sides need it and neither is the other's
//! dependency. On the wire only for a client that asks (`return_routing`): the controller puts
//! its decision's record in the request (`GenerateReq.routing`), the worker hands it back in
//! the request's first `TokenOut`, and the tokenizer answers it in `meta_info.routing`.

use serde::{Deserialize, Serialize};

use crate::routing_terms::{Branch, KeySource, RankCost, RankLoad, RankScore};

/// One routing decision, as written to `--trace-file` (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteRecord {
    pub rid: String,
    /// Unix seconds.
    pub time: f64,
    /// The configured `--load-balance-method`.
    pub method: String,
    pub key_source: KeySource,
    /// 64-bit blake2b of the key, hex: the same key has the same digest across records.
    #[serde(default)]
    pub key_digest: Option<String>,
    /// Live ranks in HRW order, preferred first (affinity decisions only).
    #[serde(default)]
    pub hrw_order: Vec<u32>,
    /// Every live rank's load at decision time.
    #[serde(default)]
    pub loads: Vec<RankLoad>,
    /// Overload threshold on active requests (affinity decisions only).
    #[serde(default)]
    pub threshold: Option<f64>,
    /// The chosen rank; `None` when the request was refused.
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub branch: Option<Branch>,
    /// The keyless method that chose, for branch `fallback`.
    #[serde(default)]
    pub fallback: Option<String>,
    /// Why the request was refused (400 rank not live, 503 no live rank).
    #[serde(default)]
    pub error: Option<String>,
    /// In a disaggregated deployment, which leg this decision placed (`prefill` or `decode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leg: Option<String>,
    /// `cache_aware`: each live rank's cached prefix and cost terms, cheapest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub costs: Vec<RankCost>,
    /// The peers' methods: each live rank's terms of the method's rule, in rank order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<RankScore>,
    /// How far the chosen rank was ahead of the best other one by the method's own measure
    /// (`cache_aware`: the runner-up's cost − the chosen's, seconds; `vllm_dp`: score;
    /// `dynamo_kv`: logit; `llmd_prefix`: the chosen's score − the runner-up's): positive when
    /// the chosen rank was the method's best, negative when a guard overruled it; absent for
    /// methods without a per-rank measure, or with one live rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
    /// Late binding: how long the controller held the request before this decision, in
    /// milliseconds (absent when it was routed as it arrived).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<f64>,
}

impl RouteRecord {
    /// A record of `rid` by `method` that says nothing else yet.
    pub fn blank(rid: &str, time: f64, method: String) -> Self {
        RouteRecord {
            rid: rid.to_string(),
            time,
            method,
            key_source: KeySource::None,
            key_digest: None,
            hrw_order: Vec::new(),
            loads: Vec::new(),
            threshold: None,
            rank: None,
            branch: None,
            fallback: None,
            error: None,
            leg: None,
            costs: Vec::new(),
            scores: Vec::new(),
            margin: None,
            held_ms: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_with_only_the_required_fields_is_a_record() {
        // What an older controller wrote for a refused request, before costs, scores and legs.
        let line = r#"{"rid":"r","time":1.5,"method":"round_robin","key_source":"none","error":"no live rank"}"#;
        let rec: RouteRecord = serde_json::from_str(line).unwrap();
        let want = RouteRecord {
            error: Some("no live rank".into()),
            ..RouteRecord::blank("r", 1.5, "round_robin".into())
        };
        assert_eq!(rec, want);
        let back = serde_json::to_string(&rec).unwrap();
        assert!(
            !back.contains("costs") && !back.contains("scores") && !back.contains("leg"),
            "{back}"
        );
    }
}
