//! `llmd_prefix`: llm-d's inference scheduler (the Gateway API Inference Extension's endpoint
//! picker) with the default profile of its precise prefix-cache configuration: filter →
//! weighted scorers → max-score picker, the prefix scorer fed by dpserve's own KV events.
//!
//! ```text
//! B          = tokens per KV block (the workers' --kv-event-block-size)
//! prefix(r)  = min(matched blocks(r) / ⌊prompt / B⌋, 1)     (0 for a prompt under one block)
//! queue(r)   = (max waiting − waiting(r)) / (max waiting − min waiting);  1 when all equal
//! kv(r)      = 1 − KV-cache utilisation(r)
//! score(r)   = 2 × prefix(r) + 1 × queue(r) + 1 × kv(r)        (the default weights)
//! rank       = argmax score; ties drawn uniformly              (branch max_score)
//! waiting(r) = waiting by its last status + dispatches since (not yet in a status)
//! util(r)    = active tokens / max_total_tokens (held by running requests, plus dispatches
//!              since the last status), at most 1
//! ```
//! Source: llm-d/llm-d-inference-scheduler (commit 520af47896e5):
//! `deploy/config/epp-precise-prefix-cache-config.yaml` (the default profile: decode-filter,
//! precise-prefix-cache-scorer weight 2.0, kv-cache-utilization-scorer 1.0, queue-scorer 1.0,
//! max-score-picker), `pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache/`
//! (`absoluteScoredPods`: matched blocks over the request's blocks, capped at 1),
//! `scorer/queuedepth/queue.go` (min–max normalised waiting queue, neutral 1.0),
//! `scorer/kvcacheutilization/kvcache_utilization.go` (1 − usage) and
//! `picker/maxscore/picker.go` (shuffle, then a stable sort by score: a uniform tie-break).
//!
//! Approximations: the filter stage has nothing to do here (its decode-filter keeps decode
//! and unified pods, which every rank this balancer sees is). llm-d reads queue and KV usage
//! from metrics scraped off vLLM; dpserve reads its ranks' statuses and adds the dispatches
//! sent since, as its other methods do, so a burst does not see stale queues. llm-d tokenises
//! into its own blocks (64 tokens in that profile); here the blocks are the KV index's, the
//! workers' event block size. Its optional speculative indexing (off in that profile) is not
//! modelled. Draws come from a seeded generator ([`LlmdPrefixConfig::seed`]).
//!
//! Cost per decision: O(n) for n live ranks; the index lookups are the controller's.

use super::pick::{pick_best, Best};
use super::{Branch, LoadBalancer, RankScore, RankSet, RouteDecision, RouteInput};
use crate::error::{peer_weight, Result};
use protocol::hash::SplitMix64;

/// `--llmd-*` settings. `Default` is the single source of the defaults; clap reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmdPrefixConfig {
    /// Weight of the precise prefix-cache scorer (≥ 0).
    pub prefix_cache_weight: f64,
    /// Weight of the queue scorer (≥ 0).
    pub queue_weight: f64,
    /// Weight of the KV-cache-utilisation scorer (≥ 0).
    pub kv_cache_utilization_weight: f64,
    /// Seed of the tie-break draws.
    pub seed: u64,
}

impl Default for LlmdPrefixConfig {
    fn default() -> Self {
        LlmdPrefixConfig {
            prefix_cache_weight: 2.0,
            queue_weight: 1.0,
            kv_cache_utilization_weight: 1.0,
            seed: 0x11d,
        }
    }
}

/// The `--llmd-*` flags (`dpserve controller` and `up` flatten them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct LlmdPrefixArgs {
    /// llmd_prefix: weight (>= 0) of the precise prefix-cache scorer.
    #[arg(long, env = "DPSERVE_LLMD_PREFIX_CACHE_WEIGHT",
          default_value_t = LlmdPrefixConfig::default().prefix_cache_weight)]
    pub llmd_prefix_cache_weight: f64,
    /// llmd_prefix: weight (>= 0) of the queue scorer.
    #[arg(long, env = "DPSERVE_LLMD_QUEUE_WEIGHT",
          default_value_t = LlmdPrefixConfig::default().queue_weight)]
    pub llmd_queue_weight: f64,
    /// llmd_prefix: weight (>= 0) of the KV-cache-utilisation scorer.
    #[arg(long, env = "DPSERVE_LLMD_KV_CACHE_UTILIZATION_WEIGHT",
          default_value_t = LlmdPrefixConfig::default().kv_cache_utilization_weight)]
    pub llmd_kv_cache_utilization_weight: f64,
}

impl Default for LlmdPrefixArgs {
    fn default() -> Self {
        let c = LlmdPrefixConfig::default();
        LlmdPrefixArgs {
            llmd_prefix_cache_weight: c.prefix_cache_weight,
            llmd_queue_weight: c.queue_weight,
            llmd_kv_cache_utilization_weight: c.kv_cache_utilization_weight,
        }
    }
}

impl LlmdPrefixArgs {
    /// The settings, checked.
    pub fn config(&self) -> Result<LlmdPrefixConfig> {
        Ok(LlmdPrefixConfig {
            prefix_cache_weight: peer_weight(
                "--llmd-prefix-cache-weight",
                self.llmd_prefix_cache_weight,
            )?,
            queue_weight: peer_weight("--llmd-queue-weight", self.llmd_queue_weight)?,
            kv_cache_utilization_weight: peer_weight(
                "--llmd-kv-cache-utilization-weight",
                self.llmd_kv_cache_utilization_weight,
            )?,
            ..LlmdPrefixConfig::default()
        })
    }
}

#[derive(Debug)]
pub struct LlmdPrefix {
    config: LlmdPrefixConfig,
    rng: SplitMix64,
}

impl LlmdPrefix {
    pub fn new(config: LlmdPrefixConfig) -> Self {
        let rng = SplitMix64::new(config.seed);
        LlmdPrefix { config, rng }
    }
}

impl LoadBalancer for LlmdPrefix {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let loads = ranks.loads();
        let cached = ranks.cached_prefix();
        let block = cached
            .map_or(protocol::kv_events::DEFAULT_KV_BLOCK_SIZE, |c| c.block_size)
            .max(1);
        let prompt_blocks = req.input_ids.len() / block;
        let waiting: Vec<u64> = (0..loads.len())
            .map(|i| ranks.queue(i).waiting_requests)
            .collect();
        let (lo, hi) = (
            waiting.iter().copied().min().unwrap_or(0),
            waiting.iter().copied().max().unwrap_or(0),
        );
        let c = &self.config;
        let scores: Vec<RankScore> = loads
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let matched_blocks = cached
                    .and_then(|c| c.matched_tokens.get(i).copied())
                    .unwrap_or(0) as usize
                    / block;
                let prefix = if prompt_blocks == 0 {
                    0.0
                } else {
                    (matched_blocks as f64 / prompt_blocks as f64).min(1.0)
                };
                let queue = if hi == lo {
                    1.0
                } else {
                    (hi - waiting[i]) as f64 / (hi - lo) as f64
                };
                let kv_cache = 1.0 - ranks.queue(i).kv_utilization(l);
                RankScore::LlmdPrefix {
                    rank: l.rank,
                    prefix,
                    queue,
                    kv_cache,
                    score: c.prefix_cache_weight * prefix
                        + c.queue_weight * queue
                        + c.kv_cache_utilization_weight * kv_cache,
                }
            })
            .collect();
        let score_of = |s: &RankScore| match *s {
            RankScore::LlmdPrefix { score, .. } => score,
            _ => f64::NEG_INFINITY,
        };
        let values: Vec<f64> = scores.iter().map(score_of).collect();
        let row = pick_best(&values, Best::Highest, &mut self.rng);
        RouteDecision::scored(loads[row].rank, Branch::MaxScore, scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CachedPrefix, RankLoad, RankQueue};

    const B: usize = 32;

    /// Ranks `(rank, waiting, active tokens of 1000)` holding `matched` prompt tokens each.
    fn ranks(spec: &[(u32, u64, u64)], matched: &[u64]) -> RankSet {
        let loads = spec
            .iter()
            .map(|&(rank, waiting, tokens)| RankLoad {
                rank,
                active_requests: waiting,
                active_tokens: tokens,
            })
            .collect();
        let queues = spec
            .iter()
            .map(|&(rank, waiting, _)| RankQueue {
                rank,
                running_requests: 0,
                waiting_requests: waiting,
                max_total_tokens: 1000,
                ..Default::default()
            })
            .collect();
        RankSet::new(loads)
            .with_queues(queues)
            .with_cached_prefix(CachedPrefix {
                matched_tokens: matched.to_vec(),
                first_block: 0,
                block_size: B,
            })
    }

    fn req(ids: &[u32]) -> RouteInput<'_> {
        RouteInput::prompt(ids)
    }

    fn terms(d: &RouteDecision) -> Vec<(f64, f64, f64, f64)> {
        d.scores
            .iter()
            .map(|s| match *s {
                RankScore::LlmdPrefix {
                    prefix,
                    queue,
                    kv_cache,
                    score,
                    ..
                } => (prefix, queue, kv_cache, score),
                _ => unreachable!(),
            })
            .collect()
    }

    const PROMPT: [u32; 330] = [1; 330]; // 10 whole blocks and a partial one

    #[test]
    fn the_defaults_are_the_precise_profiles_weights() {
        let c = LlmdPrefixConfig::default();
        assert_eq!(
            (
                c.prefix_cache_weight,
                c.queue_weight,
                c.kv_cache_utilization_weight
            ),
            (2.0, 1.0, 1.0)
        );
    }

    #[test]
    fn each_scorer_is_normalised_and_weighted() {
        let mut m = LlmdPrefix::new(LlmdPrefixConfig::default());
        // Rank 0: 5 of 10 blocks, 2 waiting (the most), 500/1000 used.
        // Rank 1: nothing cached, 0 waiting, idle.
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 2, 500), (1, 0, 0)], &[160, 0]));
        assert_eq!(terms(&d), [(0.5, 0.0, 0.5, 1.5), (0.0, 1.0, 1.0, 2.0)]);
        assert_eq!((d.rank, d.branch), (1, Branch::MaxScore));
        // The whole prompt cached: 2 × 1 + 0 + 0.5 = 2.5 wins.
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 2, 500), (1, 0, 0)], &[320, 0]));
        assert_eq!(d.rank, 0);
    }

    #[test]
    fn equal_queues_score_one_and_utilisation_is_capped() {
        let mut m = LlmdPrefix::new(LlmdPrefixConfig::default());
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 3, 5000), (1, 3, 0)], &[0, 0]));
        assert_eq!(terms(&d), [(0.0, 1.0, 0.0, 1.0), (0.0, 1.0, 1.0, 2.0)]);
        assert_eq!(d.rank, 1);
    }

    #[test]
    fn a_prompt_under_one_block_scores_no_prefix() {
        let mut m = LlmdPrefix::new(LlmdPrefixConfig::default());
        let d = m.select(&req(&[1; 20]), &ranks(&[(0, 0, 0), (1, 0, 0)], &[0, 0]));
        assert!(terms(&d).iter().all(|t| t.0 == 0.0));
    }

    #[test]
    fn ties_are_drawn_uniformly() {
        let mut m = LlmdPrefix::new(LlmdPrefixConfig::default());
        let set = ranks(&[(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 0)], &[0, 0, 0, 0]);
        let mut seen = [0usize; 4];
        for _ in 0..300 {
            seen[m.select(&req(&PROMPT), &set).rank as usize] += 1;
        }
        assert_eq!(seen[3], 0);
        assert!(seen[..3].iter().all(|&n| n > 60), "{seen:?}");
    }

    #[test]
    fn the_weights_change_the_winner() {
        let mut m = LlmdPrefix::new(LlmdPrefixConfig {
            prefix_cache_weight: 0.0,
            ..Default::default()
        });
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 2, 500), (1, 0, 0)], &[320, 0]));
        assert_eq!(d.rank, 1, "without the prefix scorer only load counts");
    }
}
