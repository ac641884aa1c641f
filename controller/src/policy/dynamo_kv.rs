//! `dynamo_kv`: NVIDIA Dynamo's KV router cost, on dpserve's own KV events (the controller's
//! KV index says which prompt blocks each rank holds).
//!
//! ```text
//! B               = tokens per KV block (the workers' --kv-event-block-size)
//! overlap(r)      = leading prompt blocks rank r holds (KV index)
//! backlog(r)      = uncached prompt tokens of the last waiting(r) requests this balancer
//!                   sent r (their prefill is still to come: Dynamo's active prefill)
//! prefill(r)      = (backlog(r) + max(prompt tokens − B × overlap(r), 0)) / B
//! decode(r)       = active_tokens(r) / B + ⌈prompt tokens / B⌉      its active KV blocks,
//!                                                                  with the request's own
//! logit(r)        = overlap_score_weight × prefill(r) + decode(r)   lower is better
//! temperature 0   : rank = argmin logit; ties drawn uniformly        (branch lowest_cost)
//! temperature T>0 : p(r) ∝ exp(−(logit(r) − min) / ((max − min) × T)), uniform when all
//!                   logits are equal; rank drawn from p              (branch sampled)
//! ```
//! Source: ai-dynamo/dynamo `docs/components/router/router-concepts.md` ("Cost
//! Calculation", "Worker Selection"), `router-configuration.md`, and
//! `lib/kv-router/src/scheduling/selector/default.rs` (`worker_logit`, `minimum_cost_index`,
//! `softmax_sample_index`). Published defaults: `overlap_score_weight` 1.0 (in current Dynamo
//! the one weight became two, `--router-prefill-load-scale` on the prefill term and
//! `--router-kv-overlap-score-credit` on each cached block, both 1.0 by default, which gives
//! this same cost), `router_temperature` 0 (deterministic lowest cost). At temperature 0 Dynamo
//! breaks ties uniformly at random (reservoir sampling over equal costs); its softmax
//! normalises the costs by their range, so a constant added to every rank changes nothing.
//! Draws come from a seeded generator ([`DynamoKvConfig::seed`]), so runs repeat.
//!
//! How active blocks are counted, and what is approximated: Dynamo predicts each worker's
//! load from its own routing ("predict on route"): a routed request's prompt tokens count as
//! active prefill until its first token, its blocks as active decode blocks until it ends.
//! dpserve's controller learns load from the ranks' statuses plus the dispatches sent since
//! (the budget), so `decode(r)` is the rank's active tokens by that budget (KV held by running
//! requests, plus the prompt and output reservation of each dispatch not yet in a status) in
//! blocks. For the prefill backlog this balancer keeps its own predictions, as Dynamo does:
//! the uncached prompt tokens of each request it sent a rank, newest last. The statuses say
//! how many requests wait on the rank (plus the dispatches they do not count yet), not which,
//! so the backlog is the newest `waiting(r)` of them (a FIFO queue's waiting requests are its
//! newest); a running request still in chunked prefill, and requests sent by explicit rank,
//! are not in it. The request's own blocks are not de-duplicated
//! against blocks already active (Dynamo's `assume_kv_reuse`): a constant per request, it
//! does not change the choice. Not modelled: host and disk cache tiers (dpserve has one),
//! busy thresholds and the router queue (off by default in Dynamo), output-block tracking.
//!
//! Cost per decision: O(n) for n live ranks; the index lookups are the controller's.

use std::collections::{BTreeMap, VecDeque};

use super::pick::{pick_best, Best};
use super::{Branch, LoadBalancer, RankScore, RankSet, RouteDecision, RouteInput};
use crate::error::{peer_weight, Result};
use protocol::hash::SplitMix64;

/// Predictions kept per rank: more than any rank's waiting queue holds in practice.
const MAX_PREDICTIONS: usize = 4096;

/// `--dynamo-*` settings. `Default` is the single source of the defaults; clap reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamoKvConfig {
    /// Weight of the prefill blocks still to compute against the active decode blocks (≥ 0).
    pub overlap_score_weight: f64,
    /// Softmax temperature over the normalised logits (≥ 0; 0: the lowest logit).
    pub router_temperature: f64,
    /// Seed of the draws (ties at temperature 0, sampling above it).
    pub seed: u64,
}

impl Default for DynamoKvConfig {
    fn default() -> Self {
        DynamoKvConfig {
            overlap_score_weight: 1.0,
            router_temperature: 0.0,
            seed: 0x5eed,
        }
    }
}

/// The `--dynamo-*` flags (`dpserve controller` and `up` flatten them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct DynamoKvArgs {
    /// dynamo_kv: weight (>= 0) of the prompt blocks a rank would still compute against its
    /// active decode blocks.
    #[arg(long, env = "DPSERVE_DYNAMO_OVERLAP_SCORE_WEIGHT",
          default_value_t = DynamoKvConfig::default().overlap_score_weight)]
    pub dynamo_overlap_score_weight: f64,
    /// dynamo_kv: softmax temperature (>= 0) over the normalised costs; 0 takes the lowest.
    #[arg(long, env = "DPSERVE_DYNAMO_ROUTER_TEMPERATURE",
          default_value_t = DynamoKvConfig::default().router_temperature)]
    pub dynamo_router_temperature: f64,
}

impl Default for DynamoKvArgs {
    fn default() -> Self {
        let c = DynamoKvConfig::default();
        DynamoKvArgs {
            dynamo_overlap_score_weight: c.overlap_score_weight,
            dynamo_router_temperature: c.router_temperature,
        }
    }
}

impl DynamoKvArgs {
    /// The settings, checked.
    pub fn config(&self) -> Result<DynamoKvConfig> {
        Ok(DynamoKvConfig {
            overlap_score_weight: peer_weight(
                "--dynamo-overlap-score-weight",
                self.dynamo_overlap_score_weight,
            )?,
            router_temperature: peer_weight(
                "--dynamo-router-temperature",
                self.dynamo_router_temperature,
            )?,
            ..DynamoKvConfig::default()
        })
    }
}

#[derive(Debug)]
pub struct DynamoKv {
    config: DynamoKvConfig,
    rng: SplitMix64,
    /// Per rank, the uncached prompt tokens of the requests this balancer sent it, newest last.
    sent: BTreeMap<u32, VecDeque<u64>>,
}

impl DynamoKv {
    pub fn new(config: DynamoKvConfig) -> Self {
        let rng = SplitMix64::new(config.seed);
        DynamoKv {
            config,
            rng,
            sent: BTreeMap::new(),
        }
    }

    /// Prompt tokens still to prefill on `rank`: those of its `waiting` newest requests.
    fn backlog(&self, rank: u32, waiting: u64) -> u64 {
        self.sent
            .get(&rank)
            .map_or(0, |q| q.iter().rev().take(waiting as usize).sum())
    }

    fn predict(&mut self, rank: u32, uncached: u64) {
        let q = self.sent.entry(rank).or_default();
        if q.len() == MAX_PREDICTIONS {
            q.pop_front();
        }
        q.push_back(uncached);
    }
}

/// The probabilities Dynamo's softmax gives `logits` at temperature `t` > 0.
fn softmax(logits: &[f64], t: f64) -> Vec<f64> {
    let lo = logits.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let n = logits.len() as f64;
    // Equal logits (or a NaN range): every rank alike, as Dynamo's `min_cost == max_cost`.
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![1.0 / n; logits.len()];
    }
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| (-(l - lo) / ((hi - lo) * t)).exp())
        .collect();
    let sum: f64 = weights.iter().sum();
    weights.iter().map(|w| w / sum).collect()
}

impl LoadBalancer for DynamoKv {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let loads = ranks.loads();
        let cached = ranks.cached_prefix();
        let block = cached
            .map_or(protocol::kv_events::DEFAULT_KV_BLOCK_SIZE, |c| c.block_size)
            .max(1) as f64;
        let prompt = req.input_ids.len() as u64;
        let own_blocks = (prompt as f64 / block).ceil();
        let w = self.config.overlap_score_weight;
        self.sent.retain(|rank, _| ranks.contains(*rank));
        let mut scores: Vec<RankScore> = loads
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let matched = cached
                    .and_then(|c| c.matched_tokens.get(i).copied())
                    .unwrap_or(0)
                    .min(prompt);
                let backlog = self.backlog(l.rank, ranks.queue(i).waiting_requests);
                let prefill = (backlog + prompt - matched) as f64 / block;
                let decode = l.active_tokens as f64 / block + own_blocks;
                RankScore::DynamoKv {
                    rank: l.rank,
                    overlap_blocks: (matched as f64 / block) as u64,
                    prefill_blocks: prefill,
                    decode_blocks: decode,
                    logit: w * prefill + decode,
                    probability: None,
                }
            })
            .collect();
        let logits: Vec<f64> = scores
            .iter()
            .map(|s| match *s {
                RankScore::DynamoKv { logit, .. } => logit,
                _ => f64::INFINITY,
            })
            .collect();

        let t = self.config.router_temperature;
        let (row, branch) = if t > 0.0 {
            let p = softmax(&logits, t);
            let u = self.rng.next_f64();
            let mut cumulative = 0.0;
            let row = p
                .iter()
                .position(|&pi| {
                    cumulative += pi;
                    u <= cumulative
                })
                .unwrap_or(p.len() - 1);
            for (s, &pi) in scores.iter_mut().zip(&p) {
                if let RankScore::DynamoKv { probability, .. } = s {
                    *probability = Some(pi);
                }
            }
            (row, Branch::Sampled)
        } else {
            let row = pick_best(&logits, Best::Lowest, &mut self.rng);
            (row, Branch::LowestCost)
        };
        let matched = cached
            .and_then(|c| c.matched_tokens.get(row).copied())
            .unwrap_or(0)
            .min(prompt);
        self.predict(loads[row].rank, prompt - matched);
        RouteDecision::scored(loads[row].rank, branch, scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::CachedPrefix;

    const B: usize = 32;

    /// Ranks `(rank, active tokens)` holding `matched` leading prompt tokens each.
    fn ranks(loads: &[(u32, u64)], matched: &[u64]) -> RankSet {
        let loads: Vec<(u32, u64, u64)> = loads.iter().map(|&(r, t)| (r, 0, t)).collect();
        RankSet::with_loads(&loads).with_cached_prefix(CachedPrefix {
            matched_tokens: matched.to_vec(),
            first_block: 0,
            block_size: B,
        })
    }

    fn req(ids: &[u32]) -> RouteInput<'_> {
        RouteInput::prompt(ids)
    }

    fn logits(d: &RouteDecision) -> Vec<f64> {
        d.scores
            .iter()
            .map(|s| match s {
                RankScore::DynamoKv { logit, .. } => *logit,
                _ => unreachable!(),
            })
            .collect()
    }

    const PROMPT: [u32; 320] = [3; 320]; // 10 blocks

    #[test]
    fn the_defaults_are_dynamos() {
        let c = DynamoKvConfig::default();
        assert_eq!((c.overlap_score_weight, c.router_temperature), (1.0, 0.0));
    }

    #[test]
    fn cached_blocks_lower_the_prefill_term_and_active_blocks_raise_the_decode_term() {
        let mut m = DynamoKv::new(DynamoKvConfig::default());
        // Rank 0: 8 of 10 blocks cached, 192 active tokens (6 blocks): 2 + 6 + 10 = 18.
        // Rank 1: nothing cached, idle: 10 + 0 + 10 = 20.
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 192), (1, 0)], &[256, 0]));
        assert_eq!(logits(&d), [18.0, 20.0]);
        assert_eq!((d.rank, d.branch), (0, Branch::LowestCost));
        // Twice the load on rank 0 (12 blocks) outweighs the 8 blocks it saves.
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 384), (1, 0)], &[256, 0]));
        assert_eq!(d.rank, 1);
    }

    #[test]
    fn the_weight_scales_the_prefill_term() {
        let mut m = DynamoKv::new(DynamoKvConfig {
            overlap_score_weight: 2.0,
            ..Default::default()
        });
        // 2 × 2 + 12 + 10 = 26 against 2 × 10 + 0 + 10 = 30: the cache now wins.
        let d = m.select(&req(&PROMPT), &ranks(&[(0, 384), (1, 0)], &[256, 0]));
        assert_eq!(logits(&d), [26.0, 30.0]);
        assert_eq!(d.rank, 0);
    }

    #[test]
    fn ties_at_temperature_zero_are_drawn_uniformly() {
        let mut m = DynamoKv::new(DynamoKvConfig::default());
        let set = ranks(&[(0, 0), (1, 0), (2, 0), (3, 64)], &[0, 0, 0, 0]);
        let mut seen = [0usize; 4];
        for _ in 0..300 {
            let d = m.select(&req(&PROMPT), &set);
            assert_eq!(d.branch, Branch::LowestCost);
            seen[d.rank as usize] += 1;
        }
        assert_eq!(seen[3], 0, "never the costlier rank at temperature 0");
        assert!(seen[..3].iter().all(|&n| n > 60), "{seen:?}");
        // The same seed makes the same draws.
        let mut a = DynamoKv::new(DynamoKvConfig::default());
        let mut b = DynamoKv::new(DynamoKvConfig::default());
        for _ in 0..20 {
            assert_eq!(
                a.select(&req(&PROMPT), &set).rank,
                b.select(&req(&PROMPT), &set).rank
            );
        }
    }

    #[test]
    fn a_positive_temperature_samples_by_the_normalised_softmax() {
        let mut m = DynamoKv::new(DynamoKvConfig {
            router_temperature: 1.0,
            ..Default::default()
        });
        // Logits 18 and 20: normalised by the range, p = e^0 : e^-1.
        let set = ranks(&[(0, 192), (1, 0)], &[256, 0]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(d.branch, Branch::Sampled);
        let p: Vec<f64> = d
            .scores
            .iter()
            .map(|s| match s {
                RankScore::DynamoKv { probability, .. } => probability.unwrap(),
                _ => unreachable!(),
            })
            .collect();
        let e = (-1f64).exp();
        assert!((p[0] - 1.0 / (1.0 + e)).abs() < 1e-12 && (p[1] - e / (1.0 + e)).abs() < 1e-12);
        let to_1 = (0..2000)
            .filter(|_| m.select(&req(&PROMPT), &set).rank == 1)
            .count();
        // e / (1 + e) ≈ 0.269 of 2000 ≈ 538.
        assert!((440..640).contains(&to_1), "{to_1}");
        // A constant added to every logit (here 5 active blocks everywhere) changes nothing.
        let shifted = ranks(&[(0, 352), (1, 160)], &[256, 0]);
        assert_eq!(softmax(&logits(&m.select(&req(&PROMPT), &shifted)), 1.0), p);
    }

    #[test]
    fn the_prefill_backlog_is_the_newest_waiting_requests_it_sent() {
        use crate::policy::{RankLoad, RankQueue};
        let mut m = DynamoKv::new(DynamoKvConfig::default());
        let set = |waiting: [u64; 2]| {
            let loads = (0..2)
                .map(|rank| RankLoad {
                    rank,
                    active_requests: waiting[rank as usize],
                    active_tokens: 0,
                })
                .collect();
            let queues = (0..2)
                .map(|rank| RankQueue {
                    rank,
                    running_requests: 0,
                    waiting_requests: waiting[rank as usize],
                    max_total_tokens: 0,
                    ..Default::default()
                })
                .collect();
            RankSet::new(loads)
                .with_queues(queues)
                .with_cached_prefix(CachedPrefix {
                    matched_tokens: vec![0, 0],
                    first_block: 0,
                    block_size: B,
                })
        };
        // Two requests to rank 0 (ties drawn; force by making rank 1 look busy first).
        let busy1 = ranks(&[(0, 0), (1, 3200)], &[0, 0]);
        assert_eq!(m.select(&req(&PROMPT), &busy1).rank, 0);
        assert_eq!(m.select(&req(&PROMPT[..64]), &busy1).rank, 0);
        // Rank 0 still has one waiting: the newest (64 tokens, 2 blocks) is its backlog.
        let d = m.select(&req(&PROMPT), &set([1, 0]));
        let prefill: Vec<f64> = d
            .scores
            .iter()
            .map(|s| match s {
                RankScore::DynamoKv { prefill_blocks, .. } => *prefill_blocks,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(prefill, [12.0, 10.0]);
        assert_eq!(d.rank, 1);
        // Both waiting on rank 0: 320 + 64 tokens of backlog; none once they run.
        assert_eq!(m.backlog(0, 2), 384);
        assert_eq!(m.backlog(0, 0), 0);
        // A rank that leaves takes its predictions with it.
        m.select(&req(&PROMPT), &RankSet::with_loads(&[(1, 0, 0)]));
        assert_eq!(m.backlog(0, 2), 0);
    }

    #[test]
    fn equal_logits_sample_uniformly_and_no_index_view_means_no_overlap() {
        assert_eq!(softmax(&[4.0, 4.0], 0.5), [0.5, 0.5]);
        let mut m = DynamoKv::new(DynamoKvConfig::default());
        let d = m.select(
            &req(&PROMPT),
            &RankSet::with_loads(&[(0, 0, 0), (1, 0, 320)]),
        );
        assert_eq!(d.rank, 0);
        assert_eq!(logits(&d), [20.0, 30.0]);
    }
}
