//! The routing vocabulary: what a decision record (the controller's `routed` milestone, a
//! client's `meta_info.routing`) says of the ranks a method weighed: each rank's load, the
//! branch the method took, where its key came from, and the method's own per-rank terms
//! (`cache_aware`'s costs, the peers' scores). Read by the trace tools and the bench.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One live rank and its load as the budget sees it (status plus speculative increments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankLoad {
    pub rank: u32,
    /// Running + waiting requests, plus those dispatched since the last status.
    pub active_requests: u64,
    /// Tokens resident or reserved on the rank, plus those of speculative dispatches.
    pub active_tokens: u64,
}

/// `cache_aware`'s view of one rank for one request: the terms of its cost, in seconds of
/// prefill (in prompt tokens while no rank's prefill speed is measured yet).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankCost {
    pub rank: u32,
    /// Leading prompt tokens the rank holds (whole blocks, from its KV events, and blocks
    /// sent to it that its events have not confirmed yet).
    pub matched_tokens: u64,
    /// Prompt tokens it would still compute: prompt − matched.
    pub prefill_tokens: u64,
    /// The wait for the prompt tokens queued ahead of it: backlog ÷ rate, × (1 + TPOT weight ÷
    /// (max_new_tokens − 1)) for a request that may wait it out between its tokens.
    pub load_cost: f64,
    /// load_cost + (1 + work weight + compute weight × the rank's active requests + TPOT weight
    /// × `stall_tpot`) × prefill_tokens ÷ rate: its predicted time to first token plus the
    /// stall its computing puts on each request already on the rank. The lowest wins, unless
    /// the overload guard skips it.
    pub cost: f64,
    /// Prompt tokens queued on the rank, not yet computed (its status plus the dispatches
    /// since); absent when the rank does not report them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_tokens: Option<u64>,
    /// The prefill speed used, prompt tokens per second (the rank's measured one, or the mean
    /// of the measured ranks'); absent while no rank's is measured (costs are then in tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_rate: Option<f64>,
    /// What a second's stall adds to the times per output token of the requests active on
    /// the rank, summed (Σ 1 ÷ (max_new_tokens − 1)); absent when the TPOT weight is 0 or no
    /// active request's length is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_tpot: Option<f64>,
}

/// A peer method's view of one rank for one request: the terms of the rule it follows, so a
/// trace shows why the rank won (`scores` of the `routed` milestone; `rule` names the method).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum RankScore {
    /// `vllm_dp`: `score = 4 × waiting + running`, the lowest wins.
    VllmDp {
        rank: u32,
        /// Waiting by its last status plus the controller's dispatches since.
        waiting: u64,
        running: u64,
        score: u64,
    },
    /// `smg_cache_aware`: what the rank's approximate tree (its routing history) holds of the
    /// prompt, and the load the balance mode compares.
    SmgCacheAware {
        rank: u32,
        /// Leading prompt tokens (whole 16-token pages) the rank's tree holds.
        matched_tokens: u64,
        /// Active requests.
        load: u64,
        /// Tokens in the rank's tree.
        tree_tokens: u64,
    },
    /// `dynamo_kv`: `logit = overlap_score_weight × prefill_blocks + decode_blocks`, the
    /// lowest wins (or is sampled from, at a temperature above 0).
    DynamoKv {
        rank: u32,
        /// Leading prompt blocks the rank's prefix cache holds (from its KV events).
        overlap_blocks: u64,
        /// Prompt blocks it would still compute: its predicted backlog (the requests it waits
        /// to prefill) and this request's uncached blocks.
        prefill_blocks: f64,
        /// Its active KV blocks plus the request's own.
        decode_blocks: f64,
        logit: f64,
        /// Its softmax probability, at a temperature above 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probability: Option<f64>,
    },
    /// `llmd_prefix`: `score = w_prefix × prefix + w_queue × queue + w_kv × kv`, the highest
    /// wins; each scorer's value is in [0, 1].
    LlmdPrefix {
        rank: u32,
        /// Matched prompt blocks / prompt blocks.
        prefix: f64,
        /// (max waiting − its waiting) / (max − min), 1 when all wait alike.
        queue: f64,
        /// 1 − its KV-cache utilisation.
        kv_cache: f64,
        score: f64,
    },
    /// Any other method's terms, as data (written without a tag of its own: the record names
    /// its `rule`). A method added after these four records its terms this way, and the trace
    /// tools render them as they are: no change here or there.
    #[serde(untagged)]
    Terms(RankTerms),
}

/// A method's view of one rank as named numbers: what a new method records (see
/// [`RankScore::Terms`]), so the routing vocabulary need not learn it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankTerms {
    /// The method (`--load-balance-method`'s name).
    pub rule: String,
    pub rank: u32,
    /// The terms it weighed for the rank, `(name, value)` in the order its rule states them.
    pub terms: Vec<(String, f64)>,
    /// What the rule ranks the rank by, lower is better (a rule where higher wins records it
    /// negated).
    pub cost: f64,
}

impl RankTerms {
    /// The terms of `rule` for `rank`, ranked by `cost`.
    pub fn new(rule: &str, rank: u32, terms: &[(&str, f64)], cost: f64) -> Self {
        RankTerms {
            rule: rule.to_string(),
            rank,
            terms: terms.iter().map(|&(n, v)| (n.to_string(), v)).collect(),
            cost,
        }
    }
}

impl RankScore {
    /// The rule's measure of the rank, oriented so that lower is better (llm-d's score, where
    /// higher wins, negated); `None` for SMG's, which has no single measure.
    pub fn lower_is_better(&self) -> Option<f64> {
        match *self {
            RankScore::VllmDp { score, .. } => Some(score as f64),
            RankScore::DynamoKv { logit, .. } => Some(logit),
            RankScore::LlmdPrefix { score, .. } => Some(-score),
            RankScore::SmgCacheAware { .. } => None,
            RankScore::Terms(ref t) => Some(t.cost),
        }
    }

    pub fn rank(&self) -> u32 {
        match *self {
            RankScore::VllmDp { rank, .. }
            | RankScore::SmgCacheAware { rank, .. }
            | RankScore::DynamoKv { rank, .. }
            | RankScore::LlmdPrefix { rank, .. } => rank,
            RankScore::Terms(ref t) => t.rank,
        }
    }
}

/// Which branch of a method produced the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Branch {
    /// The client named the rank.
    Explicit,
    /// Round-robin rotation.
    Rotate,
    /// Least-loaded choice (`total_requests`, `total_tokens`).
    LeastLoaded,
    /// `bootstrap_room % live ranks`.
    Room,
    /// The preferred (first HRW) rank was taken.
    Affinity,
    /// The preferred rank was over the load threshold; a later HRW candidate was taken.
    Spill,
    /// No key (or no bootstrap room); the fallback method chose.
    Fallback,
    /// `cache_aware`: the cheapest rank (prefill still to compute plus weighted load), where
    /// some rank holds part of the prompt.
    Cached,
    /// `cache_aware`: no rank holds any of the prompt; the first HRW choice on its first block.
    Cold,
    /// `smg_cache_aware`: loads were balanced and the best match in the routing-history tree
    /// was above `cache_threshold` of the prompt; the rank holding it.
    Matched,
    /// `smg_cache_aware`: loads were imbalanced (both thresholds exceeded); shortest queue.
    Balance,
    /// `dynamo_kv`: the lowest logit (temperature 0).
    LowestCost,
    /// `dynamo_kv`: sampled by softmax over the normalised logits (temperature above 0).
    Sampled,
    /// `llmd_prefix`: the highest weighted score.
    MaxScore,
}

impl Branch {
    /// The name in traces and metrics (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Branch::Explicit => "explicit",
            Branch::Rotate => "rotate",
            Branch::LeastLoaded => "least_loaded",
            Branch::Room => "room",
            Branch::Affinity => "affinity",
            Branch::Spill => "spill",
            Branch::Fallback => "fallback",
            Branch::Cached => "cached",
            Branch::Cold => "cold",
            Branch::Matched => "matched",
            Branch::Balance => "balance",
            Branch::LowestCost => "lowest_cost",
            Branch::Sampled => "sampled",
            Branch::MaxScore => "max_score",
        }
    }
}

impl fmt::Display for Branch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an affinity key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// `x-smg-routing-key` header or body `routing_key`.
    RoutingKey,
    /// Hash of the first `--prefix-affinity-hash-tokens` input ids.
    TokenPrefix,
    /// No key: the method does not use one, or the request had none.
    None,
    /// The client named the rank; no key was looked at.
    Explicit,
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeySource::RoutingKey => "routing_key",
            KeySource::TokenPrefix => "token_prefix",
            KeySource::None => "none",
            KeySource::Explicit => "explicit",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_as_data_round_trip_beside_the_peers_typed_terms() {
        let terms = RankScore::Terms(RankTerms::new(
            "smg_power_of_two",
            3,
            &[("drawn", 1.0), ("active_requests", 4.0)],
            4.0,
        ));
        let typed = RankScore::VllmDp {
            rank: 1,
            waiting: 2,
            running: 3,
            score: 11,
        };
        let json = serde_json::to_value(&terms).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"rule": "smg_power_of_two", "rank": 3,
                "terms": [["drawn", 1.0], ["active_requests", 4.0]], "cost": 4.0})
        );
        for s in [terms, typed] {
            let back: RankScore =
                serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
            assert_eq!(back, s);
            let packed: RankScore =
                rmp_serde::from_slice(&rmp_serde::to_vec_named(&s).unwrap()).unwrap();
            assert_eq!(packed, s);
        }
        assert_eq!(
            RankScore::Terms(RankTerms::new("x", 5, &[], -2.0)).rank(),
            5
        );
        assert_eq!(
            RankScore::Terms(RankTerms::new("x", 5, &[], -2.0)).lower_is_better(),
            Some(-2.0)
        );
        // A peer's record with a field missing is not taken for terms: it is refused.
        let broken = serde_json::json!({"rule": "vllm_dp", "rank": 1, "waiting": 2});
        assert!(serde_json::from_value::<RankScore>(broken).is_err());
    }
}
