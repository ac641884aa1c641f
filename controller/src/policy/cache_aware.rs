//! `cache_aware`: send each request where it adds the least delay to everyone, itself
//! included, counting the prefix each rank already holds (its radix cache, as the workers' KV
//! events report it, plus what the controller sent it and its events have not confirmed yet),
//! the prompt tokens queued ahead of it there, the requests the rank is serving, and its
//! measured prefill speed; no routing key needed, and prefixes of any length count.
//!
//! ```text
//! matched(r)  = leading prompt tokens r holds or was sent (whole blocks; the RankSet's CachedPrefix)
//! uncached(r) = prompt − matched(r)
//! backlog(r)  = prompt tokens r has taken in and not computed (its status) + the uncached
//!               tokens of what was sent to it since (0 when it does not report one)
//! active(r)   = requests dispatched to r and not finished (the exact DP budget)
//! rate(r)     = its measured prefill tokens per second | the mean of the measured ranks' |
//!               1 when none is measured (every cost is then in tokens)
//! s(x)        = 1 / (max_new_tokens(x) − 1): what a second's stall of request x's decode adds to
//!               its time per output token (0 for embeddings and one-token answers)
//! s_r(x)      = 0 if max_new_tokens(x) ≤ F(r) + 1, else s(x); F(r): r's finish-first bound
//!               (Hello.finish_first_tokens, 0: off), within which no prefill stalls x there
//! S(r)        = Σ s_r(x) over the requests active on r (the controller's in-flight ledger)
//! cost(r)     = backlog(r) / rate(r) × (1 + t × (s_r(req) if matched(r) > 0 else s(req)))
//!               └ wait for the line, or its stall of this request's decode ┘
//!             + (1 + k + w × active(r) + t × S(r)) × uncached(r) / rate(r)
//!               └ its own prefill, that work again for those after it, and the stall that
//!                 prefill puts on each request already there: the later end of each, and
//!                 the time per output token it adds, the more for short answers
//!                 (k: --cache-aware-work-weight, 1; w: --cache-aware-compute-weight, 0.25;
//!                 t: --cache-aware-tpot-weight, seconds of TTFT per second of TPOT, 80) ┘
//! order       = live ranks by cost, lowest first; costs within 10 % of the lowest are ties,
//!               broken by more of the prompt held (a conversation's turn stays with its
//!               context), then fewer active requests, then HRW order on the first block's hash
//! T           = max_load_skew × max(mean active requests over live ranks, 1.0)
//! rank        = first r in order with active_requests(r) ≤ T  (branch cached | cold; spill if
//!               not the first) | order[0] if none qualifies
//! ```
//! Why time, not tokens: a rank's queue of prompts is what a new request waits behind (the
//! worker prefills before it decodes), and ranks differ in speed; the first two terms are the
//! predicted time to first token.
//!
//! Why the stall term: a worker runs a prefill step whenever one is admitted, so while it
//! computes a prompt every request it is decoding waits, and those queued ahead of it will be
//! decoding by then. A prompt's uncached tokens therefore cost their prefill time once for
//! itself and again for each request active on the rank: the cost is the delay the request adds
//! to everyone, in seconds. Without it (w = t = 0, the time to first token alone) the rank with
//! the shortest line takes every prompt, however many requests it is decoding, and the ITL of
//! all of them suffers; on the 8-rank Mooncake replay that was the one term between
//! `cache_aware` and the best goodput (docs/BENCHMARKS.md). It also makes a cached prefix worth
//! more on a busy rank, where recomputing it stalls more requests, so a burst sharing a prefix
//! joins its holder instead of recomputing it on an idle rank (unless the holder serves so many
//! more requests that stalling them all costs more than the recomputation).
//!
//! Why a quarter (w): a stall delays each decoding request's end by its length, but a serving
//! target counts it only through that request's time per output token, which the TPOT term
//! prices on its own (t × S(r)). The end still matters past capacity (a request that ends
//! later holds its batch slot longer, and every decode step of a longer batch is slower), so
//! it keeps a quarter of its weight. At w = 1 (the former default, which also scaled the TPOT
//! term) the count of running requests outweighed everything else on a busy rank: on the
//! 8-rank conversation replay at 2x it sent prompts of 40-50 k tokens, whose own prefill takes
//! most of a 2 s TTFT target, behind a line of 20-40 k tokens on the rank serving a few
//! requests fewer, and they missed. In 23 paired runs against w = 1 on four traces (8
//! simulated ranks, docs/BENCHMARKS.md) it was ahead by 1.6 points of attainment on the
//! conversation trace at 2x, where its capacity is decided (5 of 6 pairs), and on the same
//! conversations sent as sessions (3 of 4), and within a few tenths on the synthetic and
//! agentic traces and at 1.5x.
//!
//! Why the TPOT weight: a stall of S seconds delays a request's first token by S, but once it
//! is decoding the same stall adds S / (n − 1) to its time per output token, which a serving
//! target bounds about 80 times tighter (25 ms against 2 s). A 4-token answer stalled 100 ms
//! misses a 25 ms target; a 400-token one absorbs it. So a long prompt goes where the requests
//! decoding are the ones that can absorb its prefill, and a short request avoids a line it
//! would wait out between its tokens (a worker takes a request with a longer cached prefix
//! first, then prefills the line while it decodes). On the 8-rank Mooncake replay at 1.75× the
//! trace's rate (four paired runs) it took the TPOT misses of answers under 100 tokens from 8
//! to 1 per 400 requests, all TPOT misses from 21 to 11, and attainment from 88.9 to 91.5 %
//! (docs/BENCHMARKS.md). `max_new_tokens` is the client's bound, not its answer's length: a
//! request that stops early was only weighed as more robust than it was.
//!
//! Why finish-first changes the stall: a worker that finishes first (`--finish-first-tokens
//! F`, 16 by default) computes no waiting prompt while one of its requests is within F tokens
//! of its end, so a request of at most F + 1 tokens is never stalled there by a prefill (up to
//! the worker's wait bound). Such requests add nothing to S(r), and a short request with a
//! cached prefix, which the worker takes ahead of its line, counts that line once, as at most
//! a wait, not as a stall of its answer: it stays with the rank holding its prefix. Without a
//! cached prefix it waits out the line before its first token, and keeps the stall price:
//! short answers still avoid long lines. On 8 simulated ranks (conversation and synthetic
//! Mooncake traces, 1.5-2x, 17 pairs) this kept the synthetic trace's long reuses with their
//! holders (cache hit 0.98-1.04 of the pooled-LRU ceiling against 0.57-0.98) and raised
//! attainment by as much as finish-first alone did (docs/BENCHMARKS.md).
//!
//! Why the work weight: the terms above price this request's wait and the stall it puts on
//! the requests already running, but a prompt's uncached tokens are also compute that the
//! requests arriving after it wait behind, which past capacity is what decides how much the
//! cluster carries. Counting them once more (k = 1) keeps a long cached prefix with its holder
//! behind a line it would otherwise leave; in 30 paired runs on three traces it was better in
//! 23, by 1.75 points of attainment on average, most past capacity (docs/BENCHMARKS.md).
//!
//! Why predictions: the siblings of a burst arrive before the first of them is computed and
//! reported anywhere; counting the blocks sent to a rank as held there (see
//! [`crate::kv_index`]) makes them meet. A hot prefix whose holder's line grows spills to the
//! cheapest other rank, which then holds the prefix too: later requests choose among its
//! holders by cost, so its traffic spreads over as many ranks as it needs, and no further.
//!
//! Cost per decision: O(n log n) for n live ranks plus the HRW hashes; the prompt's hashing and
//! index lookups are the controller's (see `server`), O(prompt / block size).

use super::hrw::{self, Blake2Hrw, HrwHasher};
use super::{
    stall_tpot, stall_tpot_on, Branch, KeySource, LoadBalancer, RankCost, RankSet, RouteDecision,
    RouteInput,
};
use crate::error::{Error, Result};

/// `--cache-aware-*` settings. `Default` is the single source of the defaults; clap reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareConfig {
    /// Weight of the delay a request's prefill puts on the end of each request already active
    /// on the rank, relative to its own wait (≥ 0; 0: the stall counts only through the time
    /// per output token it adds, [`Self::tpot_weight`]).
    pub compute_weight: f64,
    /// What one second of a request's time per output token is worth in seconds of time to
    /// first token (≥ 0): a stall of S seconds in a request's decode adds S / (n − 1) to its
    /// time per output token (n: its `max_new_tokens`), so a stall weighs more on requests
    /// with short outputs. 0: a stall weighs the same on every request.
    pub tpot_weight: f64,
    /// Weight of a request's uncached tokens as work every later request of the cluster
    /// waits behind, relative to its own wait (≥ 0; 0: only the requests on the rank now).
    pub work_weight: f64,
    /// Overload threshold as a multiple of the mean active requests (≥ 1.0).
    pub max_load_skew: f64,
    /// Late binding: while every rank's predicted wait ([`earliest_start_s`]) is longer than
    /// this, the controller holds requests and dispatches each when a rank is about to free,
    /// choosing with the cache and loads of then (zero: off, every request routed at once).
    pub hold_wait: std::time::Duration,
    /// Late binding: a held request is dispatched after this long whatever the waits.
    pub max_hold: std::time::Duration,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        CacheAwareConfig {
            // A stall's delay of each running request's end, beside the TPOT term: paired runs on
            // four traces (docs/BENCHMARKS.md); 1 before 2026-12-08.
            compute_weight: 0.25,
            // The ratio of the usual targets: 2 s to the first token, 25 ms per output token.
            tpot_weight: 80.0,
            // Paired runs on three traces (docs/BENCHMARKS.md): 23 of 30 pairs better at 1
            // than at 0, +1.75 points of attainment on average; 2 no better than 1.
            work_weight: 1.0,
            // Looser than prefix_affinity's 1.5: the time cost already moves work off a rank
            // whose line grows, and at 1.5 SGLang's shared-prefix run (4 groups, 2 ranks,
            // concurrency 8) spilled groups onto both ranks (82 % cache hits; 88 % at 2).
            max_load_skew: 2.0,
            hold_wait: std::time::Duration::ZERO,
            max_hold: std::time::Duration::from_millis(1000),
        }
    }
}

/// The `--cache-aware-*` flags (`dpserve controller` and `up` flatten them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct CacheAwareArgs {
    /// cache_aware: the weight (>= 0) of the delay a request's prefill puts on the end of each
    /// request already active on a rank, relative to its own wait; 0: the stall counts only
    /// through the time per output token it adds (--cache-aware-tpot-weight).
    #[arg(long, env = "DPSERVE_CACHE_AWARE_COMPUTE_WEIGHT",
          default_value_t = CacheAwareConfig::default().compute_weight)]
    pub cache_aware_compute_weight: f64,
    /// cache_aware: seconds of time to first token that one second of time per output token
    /// is worth (>= 0; 80 is 2 s / 25 ms): a stall of a request's decode counts this much more
    /// per token of TPOT it adds, so stalls weigh on requests with short max_new_tokens; 0:
    /// a stall weighs the same on every request.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_TPOT_WEIGHT",
          default_value_t = CacheAwareConfig::default().tpot_weight)]
    pub cache_aware_tpot_weight: f64,
    /// cache_aware: the weight (>= 0) of a request's uncached prompt tokens as work that
    /// later requests wait behind, relative to its own wait: each uncached token costs this
    /// many more times its prefill time, so a prompt follows its cached prefix further; 0:
    /// only the requests on the rank now count.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_WORK_WEIGHT",
          default_value_t = CacheAwareConfig::default().work_weight)]
    pub cache_aware_work_weight: f64,
    /// cache_aware: a rank is overloaded when its active requests exceed this multiple
    /// (>= 1.0) of max(mean over live ranks, 1); the request goes to the next cheapest rank.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_MAX_LOAD_SKEW",
          default_value_t = CacheAwareConfig::default().max_load_skew)]
    pub cache_aware_max_load_skew: f64,
    /// cache_aware: late binding. While every rank's predicted wait (its queued prompt tokens
    /// over its measured prefill speed) exceeds this many milliseconds, hold requests in the
    /// controller and dispatch each, shortest prompt first, as soon as some rank's wait drops
    /// below it, choosing the rank with the cache and loads of that moment; 0: off.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_HOLD_MS",
          default_value_t = CacheAwareConfig::default().hold_wait.as_millis() as u64)]
    pub cache_aware_hold_ms: u64,
    /// cache_aware: a held request is dispatched after this many milliseconds whatever the
    /// waits (>= 1).
    #[arg(long, env = "DPSERVE_CACHE_AWARE_MAX_HOLD_MS",
          default_value_t = CacheAwareConfig::default().max_hold.as_millis() as u64)]
    pub cache_aware_max_hold_ms: u64,
}

impl Default for CacheAwareArgs {
    fn default() -> Self {
        let c = CacheAwareConfig::default();
        CacheAwareArgs {
            cache_aware_compute_weight: c.compute_weight,
            cache_aware_tpot_weight: c.tpot_weight,
            cache_aware_work_weight: c.work_weight,
            cache_aware_max_load_skew: c.max_load_skew,
            cache_aware_hold_ms: c.hold_wait.as_millis() as u64,
            cache_aware_max_hold_ms: c.max_hold.as_millis() as u64,
        }
    }
}

impl CacheAwareArgs {
    /// The settings, checked.
    pub fn config(&self) -> Result<CacheAwareConfig> {
        let skew = self.cache_aware_max_load_skew;
        if !(skew.is_finite() && skew >= 1.0) {
            return Err(Error::CacheAwareLoadSkew { got: skew });
        }
        let weight = self.cache_aware_compute_weight;
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(Error::CacheAwareComputeWeight { got: weight });
        }
        let tpot_weight = self.cache_aware_tpot_weight;
        if !(tpot_weight.is_finite() && tpot_weight >= 0.0) {
            return Err(Error::CacheAwareTpotWeight { got: tpot_weight });
        }
        let work_weight = self.cache_aware_work_weight;
        if !(work_weight.is_finite() && work_weight >= 0.0) {
            return Err(Error::CacheAwareWorkWeight { got: work_weight });
        }
        if self.cache_aware_max_hold_ms == 0 {
            return Err(Error::CacheAwareMaxHold);
        }
        Ok(CacheAwareConfig {
            compute_weight: weight,
            tpot_weight,
            work_weight,
            max_load_skew: skew,
            hold_wait: std::time::Duration::from_millis(self.cache_aware_hold_ms),
            max_hold: std::time::Duration::from_millis(self.cache_aware_max_hold_ms),
        })
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

/// Costs within this fraction of the lowest count as equal. A rank's rate is measured over
/// noisy steps to a few per cent, so without it the rank measured fastest takes every prompt
/// that no rank holds while the lines are empty, and its decode batch grows past the others'
/// (seen on the no-reuse replay, docs/BENCHMARKS.md); the running requests decide instead.
const COST_TIE: f64 = 0.1;

/// The cold key of a prompt when the controller attached none: its first block's hash at the
/// default block size.
fn first_block_of(ids: &[u32]) -> u64 {
    let n = ids.len().min(protocol::kv_events::DEFAULT_KV_BLOCK_SIZE);
    protocol::kv_events::block_hash(None, &ids[..n])
}

/// The prefill speed each rank is costed at, in [`RankSet::loads`] order: its measured one,
/// else the mean of the measured ones; all `None` while none is measured.
fn rates(ranks: &RankSet) -> Vec<Option<f64>> {
    let measured: Vec<Option<f64>> = (0..ranks.len())
        .map(|i| ranks.queue(i).prefill_rate.filter(|r| *r > 0.0))
        .collect();
    let known: Vec<f64> = measured.iter().flatten().copied().collect();
    if known.is_empty() {
        return measured;
    }
    let mean = known.iter().sum::<f64>() / known.len() as f64;
    measured.into_iter().map(|r| r.or(Some(mean))).collect()
}

/// The soonest any of `ranks` could start a new prompt, in seconds: its queued prompt tokens
/// over its prefill speed, the least over the ranks (`None` while no rank's speed is measured,
/// or with no rank).
pub fn earliest_start_s(ranks: &RankSet) -> Option<f64> {
    let rates = rates(ranks);
    (0..ranks.len())
        .filter_map(|i| {
            let rate = rates[i]?;
            Some(ranks.queue(i).prefill_backlog_tokens.unwrap_or(0) as f64 / rate)
        })
        .min_by(f64::total_cmp)
}

impl CacheAware {
    /// Every live rank's cost for `req`, cheapest first; ranks `hrw_order` lists in that order
    /// where costs are equal, and within [`COST_TIE`] of the lowest the rank running fewer
    /// requests first.
    fn costs(&self, req: &RouteInput<'_>, ranks: &RankSet, hrw_order: &[u32]) -> Vec<RankCost> {
        let loads = ranks.loads();
        let prompt = req.input_ids.len() as u64;
        let cached = ranks.cached_prefix();
        let matched_of = |i: usize| -> u64 {
            cached
                .and_then(|c| c.matched_tokens.get(i).copied())
                .unwrap_or(0)
                .min(prompt)
        };
        let rates = rates(ranks);
        let tpot = self.config.tpot_weight;
        // The line ahead of the request delays its first token, or, where the worker takes
        // the request first (a longer cached prefix), stalls its decode; unless that worker
        // finishes first, and the request is short enough that no prefill runs while it decodes.
        let own_stall = |finish_first: u64, matched: u64| {
            let n = req.max_new_tokens.map_or(0, u64::from);
            let s = if matched > 0 {
                stall_tpot_on(n, finish_first)
            } else {
                stall_tpot(n)
            };
            1.0 + tpot * s
        };
        // Candidates in HRW order, then (stable) by cost: equal costs keep the HRW order.
        let mut costs: Vec<RankCost> = hrw_order
            .iter()
            .map(|&rank| {
                let i = loads.partition_point(|l| l.rank < rank);
                let matched = matched_of(i);
                let uncached = prompt - matched;
                let queue = ranks.queue(i);
                let backlog = queue.prefill_backlog_tokens;
                let rate = rates[i];
                let per_token = rate.map_or(1.0, |r| 1.0 / r);
                let own_stall = own_stall(queue.finish_first_tokens, matched);
                let load_cost = backlog.unwrap_or(0) as f64 * per_token * own_stall;
                let stall_tpot = queue.stall_tpot;
                let stalled = self.config.compute_weight * loads[i].active_requests as f64
                    + tpot * stall_tpot;
                let per_uncached = (1.0 + self.config.work_weight + stalled) * per_token;
                RankCost {
                    rank,
                    matched_tokens: matched,
                    prefill_tokens: uncached,
                    load_cost,
                    cost: load_cost + per_uncached * uncached as f64,
                    backlog_tokens: backlog,
                    prefill_rate: rate,
                    stall_tpot: (tpot > 0.0 && stall_tpot > 0.0).then_some(stall_tpot),
                }
            })
            .collect();
        costs.sort_by(|a, b| a.cost.total_cmp(&b.cost));
        // Costs within COST_TIE of the lowest are one cost: among them the rank holding more of
        // the prompt goes first (a conversation's turns stay where their context is instead of
        // moving on a tie, which costs the next turn its cache), then the rank running fewer
        // requests, then HRW order (the sorts are stable).
        if let Some(best) = costs.first().map(|c| c.cost) {
            let near = costs
                .iter()
                .take_while(|c| c.cost <= best * (1.0 + COST_TIE))
                .count();
            costs[..near].sort_by_key(|c| {
                let active = ranks.get(c.rank).map_or(0, |l| l.active_requests);
                (std::cmp::Reverse(c.matched_tokens), active)
            });
        }
        costs
    }
}

impl LoadBalancer for CacheAware {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let loads = ranks.loads();
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

        let costs = self.costs(req, ranks, &hrw_order);
        let cold = costs.iter().all(|c| c.matched_tokens == 0);

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
            cached_tokens: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CachedPrefix, RankQueue};

    fn ranks(loads: &[(u32, u64, u64)], matched: &[u64]) -> RankSet {
        RankSet::with_loads(loads).with_cached_prefix(CachedPrefix {
            matched_tokens: matched.to_vec(),
            first_block: 42,
            block_size: 32,
        })
    }

    /// Ranks `(rank, backlog tokens, measured prefill rate)` holding `matched` tokens each,
    /// one active request apiece.
    fn timed(spec: &[(u32, u64, Option<f64>)], matched: &[u64]) -> RankSet {
        RankSet::with_prefill_lines(spec).with_cached_prefix(CachedPrefix {
            matched_tokens: matched.to_vec(),
            first_block: 42,
            block_size: 32,
        })
    }

    fn req(ids: &[u32]) -> RouteInput<'_> {
        RouteInput::prompt(ids)
    }

    const PROMPT: [u32; 100] = [7; 100];

    /// The defaults with a whole stall weight and without the work weight: the tests of the
    /// other terms keep their arithmetic (the weights' own tests set them).
    fn without_work() -> CacheAwareConfig {
        CacheAwareConfig {
            work_weight: 0.0,
            compute_weight: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn the_rank_holding_the_prefix_wins_and_the_trace_has_every_cost() {
        let mut m = CacheAware::new(without_work());
        let set = ranks(&[(0, 1, 0), (1, 1, 0), (2, 1, 0)], &[0, 64, 32]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!((d.rank, d.branch), (1, Branch::Cached));
        let order: Vec<(u32, u64, f64)> = d
            .costs
            .iter()
            .map(|c| (c.rank, c.prefill_tokens, c.cost))
            .collect();
        // No backlog or speed reported: the cost is twice the tokens to compute.
        assert_eq!(order, [(1, 36, 72.0), (2, 68, 136.0), (0, 100, 200.0)]);
        assert_eq!(d.key_digest, Some(42));
    }

    #[test]
    fn the_cost_is_time_on_ranks_of_different_speed() {
        let mut m = CacheAware::new(without_work());
        // Equal lines, nothing cached: rank 1 computes twice as fast.
        let set = timed(&[(0, 1000, Some(1000.0)), (1, 1000, Some(2000.0))], &[0, 0]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(d.rank, 1);
        let c1 = d.costs.iter().find(|c| c.rank == 1).unwrap();
        assert_eq!(c1.load_cost, 0.5);
        assert!((c1.cost - 0.6).abs() < 1e-12, "{}", c1.cost);
        assert_eq!(c1.prefill_rate, Some(2000.0));
        // The fast rank's line is three times longer: the slow one is sooner.
        let set = timed(&[(0, 1000, Some(1000.0)), (1, 3000, Some(2000.0))], &[0, 0]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 0);
        // A rank not measured yet is costed at the mean of the measured ones.
        let set = timed(
            &[(0, 0, None), (1, 0, Some(2000.0)), (2, 0, Some(1000.0))],
            &[0, 0, 0],
        );
        let d = m.select(&req(&PROMPT), &set);
        let c0 = d.costs.iter().find(|c| c.rank == 0).unwrap();
        assert_eq!(c0.prefill_rate, Some(1500.0));
        assert_eq!(d.rank, 1);
    }

    /// The work weight counts uncached tokens again, for the requests after this one: the
    /// line that sent the prompt away from its cached prefix at 0 keeps it with its holder.
    #[test]
    fn the_work_weight_keeps_a_prompt_with_its_prefix_behind_a_longer_line() {
        let set = timed(&[(0, 0, Some(100.0)), (1, 160, Some(100.0))], &[0, 64]);
        // k = 0: 1.6 + 2 × 0.36 = 2.32 s on the holder against 2 × 1 = 2 s on the idle rank.
        let mut plain = CacheAware::new(without_work());
        assert_eq!(plain.select(&req(&PROMPT), &set).rank, 0);
        // k = 1 (the default): 1.6 + 3 × 0.36 = 2.68 s against 3 × 1 = 3 s.
        let mut work = CacheAware::new(CacheAwareConfig {
            work_weight: 1.0,
            ..without_work()
        });
        let d = work.select(&req(&PROMPT), &set);
        assert_eq!(d.rank, 1);
        let idle = d.costs.iter().find(|c| c.rank == 0).unwrap();
        assert!((idle.cost - 3.0).abs() < 1e-12, "{}", idle.cost);
    }

    #[test]
    fn a_long_line_outweighs_a_cached_prefix_but_not_a_short_one() {
        let mut m = CacheAware::new(without_work());
        // Rank 1 holds 64 of 100 tokens: it saves 2 × 64 = 128 tokens of cost.
        let set = timed(&[(0, 0, Some(100.0)), (1, 120, Some(100.0))], &[0, 64]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 1);
        // 1.6 + 0.72 = 2.32 s against 2 s: beyond the 10 % tie (within it, at a line of 140,
        // the holder keeps the request).
        let set = timed(&[(0, 0, Some(100.0)), (1, 160, Some(100.0))], &[0, 64]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 0);
        // Weight 0 (and no answer here to stall): the time to first token alone; the idle rank
        // wins at once.
        let mut ttft = CacheAware::new(CacheAwareConfig {
            compute_weight: 0.0,
            ..without_work()
        });
        let set = timed(&[(0, 0, Some(100.0)), (1, 80, Some(100.0))], &[0, 64]);
        assert_eq!(ttft.select(&req(&PROMPT), &set).rank, 0);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 1);
    }

    /// Ranks `(rank, active requests, backlog tokens)` at 100 tokens/s holding `matched`.
    fn busy(spec: &[(u32, u64, u64)], matched: &[u64]) -> RankSet {
        let loads: Vec<(u32, u64, u64)> = spec.iter().map(|&(r, a, _)| (r, a, 0)).collect();
        RankSet::with_loads(&loads)
            .with_queues(
                spec.iter()
                    .map(|&(rank, active, backlog)| RankQueue {
                        rank,
                        running_requests: active,
                        waiting_requests: 0,
                        max_total_tokens: 1 << 20,
                        prefill_backlog_tokens: Some(backlog),
                        prefill_rate: Some(100.0),
                        stall_tpot: 0.0,
                        finish_first_tokens: 0,
                    })
                    .collect(),
            )
            .with_cached_prefix(CachedPrefix {
                matched_tokens: matched.to_vec(),
                first_block: 42,
                block_size: 32,
            })
    }

    #[test]
    fn a_prompt_is_charged_the_stall_it_puts_on_each_request_already_there() {
        let mut m = CacheAware::new(without_work());
        // Empty lines, nothing cached: 100 tokens cost 1 s for the request itself and 1 s
        // more for each request the rank is serving.
        let d = m.select(&req(&PROMPT), &busy(&[(0, 8, 0), (1, 3, 0)], &[0, 0]));
        let costs: Vec<(u32, f64)> = d.costs.iter().map(|c| (c.rank, c.cost)).collect();
        assert_eq!(costs.len(), 2);
        for ((rank, cost), want) in costs.iter().zip([(1, 4.0), (0, 9.0)]) {
            assert_eq!(*rank, want.0);
            assert!((cost - want.1).abs() < 1e-9, "{costs:?}");
        }
        assert_eq!((d.rank, d.branch), (1, Branch::Cold));
        // The time to first token alone (weight 0, and no answer here whose TPOT a stall
        // adds to) ignores what the rank is serving: the shorter line wins however busy its rank.
        let mut ttft = CacheAware::new(CacheAwareConfig {
            compute_weight: 0.0,
            ..without_work()
        });
        let set = busy(&[(0, 8, 0), (1, 3, 50)], &[0, 0]);
        assert_eq!(ttft.select(&req(&PROMPT), &set).rank, 0);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 1);
    }

    /// The default weighs a stall's delay of each running request's end at a quarter of the
    /// request's own wait: a prompt whose own prefill is most of a TTFT target goes to the
    /// empty line, not behind a line on the rank serving a few requests fewer.
    #[test]
    fn by_default_a_running_request_weighs_a_quarter_of_the_prompts_own_wait() {
        // 1 s of prefill; rank 0 serves 8 requests with no line, rank 1 serves 4 behind 1.5 s.
        let set = busy(&[(0, 8, 0), (1, 4, 150)], &[0, 0]);
        let mut m = CacheAware::new(CacheAwareConfig::default());
        let d = m.select(&req(&PROMPT), &set);
        let cost = |r: u32| d.costs.iter().find(|c| c.rank == r).unwrap().cost;
        // (1 + 1 + 0.25 × 8) × 1 s = 4 s against 1.5 s + (1 + 1 + 0.25 × 4) × 1 s = 4.5 s.
        assert_eq!(d.rank, 0, "{:?}", d.costs);
        assert!((cost(0) - 4.0).abs() < 1e-9, "{:?}", d.costs);
        assert!((cost(1) - 4.5).abs() < 1e-9, "{:?}", d.costs);
        // Each running request weighed as much as the prompt's own wait (the former default):
        // 10 s against 7.5 s, and the prompt waits out the line.
        let mut whole = CacheAware::new(CacheAwareConfig {
            compute_weight: 1.0,
            ..Default::default()
        });
        assert_eq!(whole.select(&req(&PROMPT), &set).rank, 1);
    }

    #[test]
    fn a_cached_prefix_is_worth_more_on_a_busier_rank() {
        let mut m = CacheAware::new(without_work());
        // Rank 0 holds 64 of 100 tokens, rank 1 nothing, both serving 2 requests: the holder
        // costs 3 × 0.36 s against 3 × 1 s, even behind a 1.5 s line.
        let set = busy(&[(0, 2, 150), (1, 2, 0)], &[64, 0]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 0);
        // Serving 6 each, the prefix saves 7 × 0.64 s: a 3.5 s line is still worth joining,
        // where serving 2 each a 4 s line is not.
        let set = busy(&[(0, 6, 350), (1, 6, 0)], &[64, 0]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 0);
        let set = busy(&[(0, 2, 400), (1, 2, 0)], &[64, 0]);
        assert_eq!(m.select(&req(&PROMPT), &set).rank, 1);
    }

    #[test]
    fn the_overload_guard_spills_to_the_next_cheapest() {
        let mut m = CacheAware::new(without_work());
        // Mean 3 requests, threshold 6: rank 1 (9 requests) is overloaded.
        let set = ranks(&[(0, 0, 0), (1, 9, 0), (2, 0, 0)], &[0, 96, 32]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(
            (d.rank, d.branch, d.threshold),
            (2, Branch::Spill, Some(6.0))
        );
    }

    #[test]
    fn cold_prompts_on_equal_ranks_go_to_one_rank_by_hrw() {
        let mut m = CacheAware::new(without_work());
        let set = ranks(
            &[(0, 0, 0), (1, 0, 500), (2, 0, 0), (3, 0, 0)],
            &[0, 0, 0, 0],
        );
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(d.branch, Branch::Cold);
        assert_eq!(d.rank, d.hrw_order[0], "equal costs keep the HRW order");
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

    /// Empty lines and no prefix anywhere, rank 0 serving 3 requests and rank 1 serving 2:
    /// costs 5 % apart (rank 0 that much faster than its extra request costs) are one cost,
    /// so the rank running fewer requests wins; 35 % apart, the cheaper rank wins.
    #[test]
    fn near_equal_costs_go_to_the_rank_running_fewer_requests() {
        let mut m = CacheAware::new(without_work());
        let lines = |fast_rate: f64| {
            RankSet::with_loads(&[(0, 3, 0), (1, 2, 0)]).with_queues(
                [(0, fast_rate), (1, 1000.0)]
                    .iter()
                    .map(|&(rank, rate)| RankQueue {
                        rank,
                        running_requests: if rank == 0 { 3 } else { 2 },
                        waiting_requests: 0,
                        max_total_tokens: 1 << 20,
                        prefill_backlog_tokens: Some(0),
                        prefill_rate: Some(rate),
                        stall_tpot: 0.0,
                        finish_first_tokens: 0,
                    })
                    .collect(),
            )
        };
        // 4 × 100 / 1400 = 0.286 s against 3 × 100 / 1000 = 0.3 s.
        let d = m.select(&req(&PROMPT), &lines(1400.0));
        assert_eq!((d.rank, d.branch), (1, Branch::Cold), "{:?}", d.costs);
        assert_eq!(d.costs[0].rank, 1, "the trace lists the choice first");
        // 0.222 s against 0.3 s.
        assert_eq!(m.select(&req(&PROMPT), &lines(1800.0)).rank, 0);
    }

    /// A conversation's next turn whose cost on the rank holding its context is within the
    /// tie of a less busy rank's stays with its context (turns moving on ties cost the next
    /// turn its cache: vllm#52463, sglang#37543); without a tie the cheaper rank wins.
    #[test]
    fn near_ties_stick_to_the_rank_holding_the_previous_turn() {
        let mut m = CacheAware::new(without_work());
        // Rank 0 holds 60 of the 100 tokens and runs 2 requests; rank 1 holds nothing and runs
        // none. Costs, rates r0 and 1000: rank 0 (1 + 2) × 40 / r0, rank 1 100 / 1000 = 0.1 s.
        let lines = |rate0: f64| {
            RankSet::with_loads(&[(0, 2, 0), (1, 0, 0)])
                .with_queues(
                    [(0, rate0, 2), (1, 1000.0, 0)]
                        .iter()
                        .map(|&(rank, rate, running)| RankQueue {
                            rank,
                            running_requests: running,
                            waiting_requests: 0,
                            max_total_tokens: 1 << 20,
                            prefill_backlog_tokens: Some(0),
                            prefill_rate: Some(rate),
                            stall_tpot: 0.0,
                            finish_first_tokens: 0,
                        })
                        .collect(),
                )
                .with_cached_prefix(CachedPrefix {
                    matched_tokens: vec![60, 0],
                    first_block: 42,
                    block_size: 20,
                })
        };
        // 120 / 1150 = 0.104 s: within 10 % of 0.1 s, so the holder keeps the turn.
        let d = m.select(&req(&PROMPT), &lines(1150.0));
        assert_eq!((d.rank, d.branch), (0, Branch::Cached), "{:?}", d.costs);
        // 120 / 1000 = 0.12 s: 20 % dearer, so the idle rank takes it.
        assert_eq!(m.select(&req(&PROMPT), &lines(1000.0)).rank, 1);
    }

    #[test]
    fn a_cold_prompt_goes_to_the_shortest_line() {
        let mut m = CacheAware::new(without_work());
        let set = timed(
            &[
                (0, 500, Some(100.0)),
                (1, 0, Some(100.0)),
                (2, 900, Some(100.0)),
            ],
            &[0, 0, 0],
        );
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!((d.rank, d.branch), (1, Branch::Cold));
    }

    #[test]
    fn a_single_rank_is_never_overloaded() {
        let mut m = CacheAware::new(without_work());
        let d = m.select(&req(&PROMPT), &ranks(&[(5, 100, 100)], &[0]));
        assert_eq!((d.rank, d.branch), (5, Branch::Cold));
    }

    /// `busy` ranks whose requests may each generate `outputs[i]` tokens.
    fn with_outputs(spec: &[(u32, u64, u64)], matched: &[u64], outputs: &[u64]) -> RankSet {
        let set = busy(spec, matched);
        let queues = (0..spec.len())
            .map(|i| RankQueue {
                stall_tpot: spec[i].1 as f64 * stall_tpot(outputs[i]),
                finish_first_tokens: 0,
                ..set.queue(i)
            })
            .collect();
        set.with_queues(queues)
    }

    #[test]
    fn a_long_prompt_stalls_the_rank_whose_requests_feel_it_least() {
        let mut m = CacheAware::new(without_work());
        // Rank 0 serves 4 requests of 4 tokens, rank 1 five of 400: one second's stall adds
        // 4 × 1/3 s to rank 0's times per output token and 5 × 1/399 s to rank 1's.
        let set = with_outputs(&[(0, 4, 0), (1, 5, 0)], &[0, 0], &[4, 400]);
        let d = m.select(&req(&PROMPT), &set);
        assert_eq!(d.rank, 1);
        let cost = |r: u32| d.costs.iter().find(|c| c.rank == r).unwrap().cost;
        // 1 s of prefill × (1 + 4 + 80 × 4/3) against 1 s × (1 + 5 + 80 × 5/399).
        assert!(
            (cost(0) - (5.0 + 320.0 / 3.0)).abs() < 1e-9,
            "{:?}",
            d.costs
        );
        assert!(
            (cost(1) - (6.0 + 400.0 / 399.0)).abs() < 1e-9,
            "{:?}",
            d.costs
        );
        // Weight 0: every request feels a stall alike; the rank serving fewer takes it.
        let mut alike = CacheAware::new(CacheAwareConfig {
            tpot_weight: 0.0,
            ..without_work()
        });
        assert_eq!(alike.select(&req(&PROMPT), &set).rank, 0);
    }

    #[test]
    fn a_short_request_avoids_the_line_a_long_one_waits_in_for_its_prefix() {
        let mut m = CacheAware::new(without_work());
        // Rank 0 holds 64 of the 100 tokens behind a 1 s line; rank 1 holds nothing, no line.
        let set = with_outputs(&[(0, 2, 100), (1, 2, 0)], &[64, 0], &[400, 400]);
        let long = RouteInput {
            max_new_tokens: Some(400),
            ..req(&PROMPT)
        };
        // 1 s × (1 + 80/399) + 0.36 s × 3 ≈ 2.3 s against 1 s × 3.
        assert_eq!(m.select(&long, &set).rank, 0);
        // Taken first for its cached prefix, a 4-token answer would wait out the line between
        // its tokens: 1 s × (1 + 80/3) + 1.08 s against 3 s.
        let short = RouteInput {
            max_new_tokens: Some(4),
            ..req(&PROMPT)
        };
        assert_eq!(m.select(&short, &set).rank, 1);
    }

    #[test]
    fn a_short_request_stays_with_its_prefix_where_the_rank_finishes_first() {
        let mut m = CacheAware::new(without_work());
        // As above, but rank 0's worker finishes first within 16 tokens: taken ahead of the
        // line for its prefix, a 4-token answer ends before the line's prefill starts, so the
        // line costs it only what it is, 1 s, and it stays with its 64 cached tokens.
        let set = with_outputs(&[(0, 2, 100), (1, 2, 0)], &[64, 0], &[400, 400]);
        let queues = (0..2)
            .map(|i| RankQueue {
                finish_first_tokens: if i == 0 { 16 } else { 0 },
                ..set.queue(i)
            })
            .collect();
        let set = set.with_queues(queues);
        let short = RouteInput {
            max_new_tokens: Some(4),
            ..req(&PROMPT)
        };
        let d = m.select(&short, &set);
        assert_eq!(d.rank, 0, "{:?}", d.costs);
        let cost = |r: u32| d.costs.iter().find(|c| c.rank == r).unwrap().cost;
        // Each rank's prefill weighs 1 + 2 active + 80 × 2/399 of stall: 1 s of line + 0.36 s
        // of prefill against 1 s of prefill.
        let per_prefill_s = 3.0 + 160.0 / 399.0;
        assert!(
            (cost(0) - (1.0 + 0.36 * per_prefill_s)).abs() < 1e-9,
            "{:?}",
            d.costs
        );
        assert!((cost(1) - per_prefill_s).abs() < 1e-9, "{:?}", d.costs);
        // An answer longer than the bound + 1 is still stalled by the line: it leaves.
        let longer = RouteInput {
            max_new_tokens: Some(18),
            ..req(&PROMPT)
        };
        assert_eq!(m.select(&longer, &set).rank, 1);
        // Without a cached prefix there it waits out the line before its first token, and
        // keeps the stall's price: the same line weighs 1 + 80/3 on a cold rank.
        let cold = with_outputs(&[(0, 2, 100), (1, 2, 0)], &[0, 0], &[400, 400]);
        let queues = (0..2)
            .map(|i| RankQueue {
                finish_first_tokens: 16,
                ..cold.queue(i)
            })
            .collect();
        let cold = cold.with_queues(queues);
        let d = m.select(&short, &cold);
        let cost = |r: u32| d.costs.iter().find(|c| c.rank == r).unwrap().cost;
        let stalled_line = 1.0 + 80.0 / 3.0;
        assert!(
            (cost(0) - (stalled_line + per_prefill_s)).abs() < 1e-9,
            "{:?}",
            d.costs
        );
    }
}
