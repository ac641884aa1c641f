//! `cache_aware`: send each request where its prompt's prefix is already cached, as the workers'
//! own radix caches report it (KV events → [`crate::kv_index`]), traded against load; no routing
//! key needed, and prefixes of any length count.
//!
//! ```text
//! matched(r)  = leading prompt tokens rank r holds (whole blocks; from the RankSet's CachedPrefix)
//! cost(r)     = (prompt − matched(r))  +  load_weight × active_tokens(r)
//!               └ prefill still to do ┘   └ work already queued or resident ┘
//! order       = live ranks by cost, lowest first (ties: HRW order on the first block's hash)
//!             | HRW order on the first block's hash, when no rank holds any of the prompt
//! T           = max_load_skew × max(mean active requests over live ranks, 1.0)
//! rank        = first r in order with active_requests(r) ≤ T  (branch cached | cold; spill if
//!               not the first) | order[0] if none qualifies
//! ```
//! Why HRW for cold prompts: a burst of prompts that share a beginning arrives before the first
//! of them is cached anywhere; a pure cost would spread them by load and compute the shared
//! prefix on every rank. The first block's hash sends them to one rank, as prefix_affinity
//! would, and the overload guard (the same as prefix_affinity's, on active requests) spills a
//! hot prefix to its next choice, which then caches it too.
//!
//! Why load in tokens, weighted down: a rank's active tokens are mostly KV that decode steps
//! read, much cheaper per token than computing a prompt token; the default weight 0.1 lets a
//! cached prefix win until the holder carries ten times more tokens than the prefill saved.
//!
//! Cost per decision: O(n log n) for n live ranks plus the HRW hashes; the prompt's hashing and
//! index lookups are the controller's (see `server`), O(prompt / block size).

use super::hrw::{self, Blake2Hrw, HrwHasher};
use super::{Branch, KeySource, LoadBalancer, RankCost, RankSet, RouteDecision, RouteInput};

/// `--cache-aware-*` settings. `Default` is the single source of the defaults; clap reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareConfig {
    /// Cost of one active token on a rank, in prompt tokens to compute (≥ 0).
    pub load_weight: f64,
    /// Overload threshold as a multiple of the mean active requests (≥ 1.0).
    pub max_load_skew: f64,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        CacheAwareConfig {
            load_weight: 0.1,
            max_load_skew: 1.5,
        }
    }
}

pub struct CacheAware {
    config: CacheAwareConfig,
    hasher: Box<dyn HrwHasher>,
    scratch: Vec<(u64, u32)>,
    ids: Vec<u32>,
}

impl std::fmt::Debug for CacheAware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheAware")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CacheAware {
    pub fn new(config: CacheAwareConfig) -> Self {
        CacheAware::with_hasher(config, Box::new(Blake2Hrw))
    }

    /// With an injected hasher (tests pin HRW scores with it).
    pub fn with_hasher(config: CacheAwareConfig, hasher: Box<dyn HrwHasher>) -> Self {
        CacheAware {
            config,
            hasher,
            scratch: Vec::new(),
            ids: Vec::new(),
        }
    }
}

/// The cold key of a prompt when the controller attached none: its first block's hash at the
/// default block size.
fn first_block_of(ids: &[u32]) -> u64 {
    let n = ids.len().min(protocol::kv_events::DEFAULT_KV_BLOCK_SIZE);
    protocol::kv_events::block_hash(None, &ids[..n])
}

impl LoadBalancer for CacheAware {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let loads = ranks.loads();
        let prompt = req.input_ids.len() as u64;
        let cached = ranks.cached_prefix();
        let first_block = cached.map_or_else(|| first_block_of(req.input_ids), |c| c.first_block);
        let key = first_block.to_le_bytes();

        self.ids.clear();
        self.ids.extend(loads.iter().map(|l| l.rank));
        let mut hrw_order = Vec::with_capacity(self.ids.len());
        hrw::order_into(
            self.hasher.as_ref(),
            &key,
            &self.ids,
            &mut self.scratch,
            &mut hrw_order,
        );

        let matched_of = |i: usize| -> u64 {
            cached
                .and_then(|c| c.matched_tokens.get(i).copied())
                .unwrap_or(0)
                .min(prompt)
        };
        let cold = (0..loads.len()).all(|i| matched_of(i) == 0);
        // Candidates in HRW order, then (stable) by cost: equal costs keep the HRW order.
        let mut costs: Vec<RankCost> = hrw_order
            .iter()
            .map(|&rank| {
                let i = loads.partition_point(|l| l.rank < rank);
                let matched = matched_of(i);
                let load_cost = self.config.load_weight * loads[i].active_tokens as f64;
                RankCost {
                    rank,
                    matched_tokens: matched,
                    prefill_tokens: prompt - matched,
                    load_cost,
                    cost: (prompt - matched) as f64 + load_cost,
                }
            })
            .collect();
        if !cold {
            costs.sort_by(|a, b| a.cost.total_cmp(&b.cost));
        }

        let total: u64 = loads.iter().map(|l| l.active_requests).sum();
        let mean = total as f64 / loads.len() as f64;
        let threshold = self.config.max_load_skew * mean.max(1.0);
        let load_of = |rank: u32| ranks.get(rank).map_or(0, |l| l.active_requests);
        let first = if cold { Branch::Cold } else { Branch::Cached };
        let (rank, branch) = if costs.len() == 1 {
            (costs[0].rank, first)
        } else {
            match costs
                .iter()
                .position(|c| load_of(c.rank) as f64 <= threshold)
            {
                Some(0) | None => (costs[0].rank, first),
                Some(i) => (costs[i].rank, Branch::Spill),
            }
        };
        RouteDecision {
            rank,
            branch,
            key_source: KeySource::TokenPrefix,
            key_digest: Some(first_block),
            hrw_order,
            threshold: Some(threshold),
            fallback: None,
            costs,
            scores: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::CachedPrefix;

    fn ranks(loads: &[(u32, u64, u64)], matched: &[u64]) -> RankSet {
        RankSet::with_loads(loads).with_cached_prefix(CachedPrefix {
            matched_tokens: matched.to_vec(),
            first_block: 42,
            block_size: 32,
        })
    }

    fn req(ids: &[u32]) -> RouteInput<'_> {
        RouteInput::prompt(ids)
    }

    const PROMPT: [u32; 100] = [7; 100];

    #[test]
    fn the_rank_holding_the_prefix_wins_and_the_trace_has_every_cost() {
        let mut m = CacheAware::new(CacheAwareConfig::default());
        let set = ranks(&[(0, 1, 0), (1, 1, 0), (2, 1, 0)], &[0, 64, 32]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!((d.rank, d.branch), (1, Branch::Cached));
        let order: Vec<(u32, u64)> = d.costs.iter().map(|c| (c.rank, c.prefill_tokens)).collect();
        assert_eq!(order, [(1, 36), (2, 68), (0, 100)]);
        assert_eq!(d.key_digest, Some(42));
    }

    #[test]
    fn load_outweighs_a_small_saving_but_not_a_large_one() {
        let mut m = CacheAware::new(CacheAwareConfig::default());
        // Rank 1 saves 64 prefill tokens but carries 1000 more active tokens (cost +100).
        let set = ranks(&[(0, 1, 0), (1, 1, 1000)], &[0, 64]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 0);
        let set = ranks(&[(0, 1, 0), (1, 1, 500)], &[0, 64]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 1);
    }

    #[test]
    fn the_overload_guard_spills_to_the_next_cheapest() {
        let mut m = CacheAware::new(CacheAwareConfig::default());
        // Mean 2 requests, threshold 3: rank 1 (6 requests) is overloaded.
        let set = ranks(&[(0, 0, 0), (1, 6, 0), (2, 0, 0)], &[0, 96, 32]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(
            (d.rank, d.branch, d.threshold),
            (2, Branch::Spill, Some(3.0))
        );
    }

    #[test]
    fn cold_prompts_with_one_first_block_go_to_one_rank_by_hrw() {
        let mut m = CacheAware::new(CacheAwareConfig::default());
        let set = ranks(
            &[(0, 0, 0), (1, 0, 500), (2, 0, 0), (3, 0, 0)],
            &[0, 0, 0, 0],
        );
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(d.branch, Branch::Cold);
        assert_eq!(d.rank, d.hrw_order[0], "load does not spread a cold burst");
        let order = hrw::order(&Blake2Hrw, &42u64.to_le_bytes(), &[0, 1, 2, 3]);
        assert_eq!(d.hrw_order, order);
        // Without an index view the key is the prompt's own first block.
        let plain = RankSet::idle(&[0, 1, 2, 3]);
        let a = m.select(&req(&PROMPT), &plain);
        let mut other = PROMPT;
        other[99] = 8; // a different tail, same first block
        assert_eq!(m.select(&req(&other), &plain).rank, a.rank);
        assert_eq!(a.key_digest, Some(first_block_of(&PROMPT)));
    }

    #[test]
    fn a_single_rank_is_never_overloaded() {
        let mut m = CacheAware::new(CacheAwareConfig::default());
        let d = m.select(&req(&PROMPT), &ranks(&[(5, 100, 100)], &[0]));
        assert_eq!((d.rank, d.branch), (5, Branch::Cold));
    }
}
