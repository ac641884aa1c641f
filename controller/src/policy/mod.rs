//! Load-balance methods. Each method is a type behind [`LoadBalancer`]: given a request and the
//! live ranks with their loads, it returns a [`RouteDecision`] that names the rank *and* the branch
//! taken (plus, for affinity, the key and HRW order), so every decision can be traced, counted and
//! unit-tested without a process. The explicit-rank bypass lives in [`crate::router`], not here.

mod bootstrap_room;
mod cache_aware;
mod clock;
mod dynamo_kv;
pub mod hrw;
mod least_loaded;
mod llmd_prefix;
mod page_tree;
mod pick;
mod prefix_affinity;
mod round_robin;
mod smg_cache_aware;
mod smg_power_of_two;
mod vllm_dp;

pub use bootstrap_room::FollowBootstrapRoom;
pub use cache_aware::{earliest_start_s, CacheAware, CacheAwareArgs, CacheAwareConfig};
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use dynamo_kv::{DynamoKv, DynamoKvArgs, DynamoKvConfig};
pub use hrw::{Blake2Hrw, HrwHasher};
pub use least_loaded::{TotalRequests, TotalTokens};
pub use llmd_prefix::{LlmdPrefix, LlmdPrefixArgs, LlmdPrefixConfig};
pub use prefix_affinity::{PrefixAffinity, PrefixAffinityArgs, PrefixAffinityConfig};
pub use protocol::hash::SplitMix64;
pub use round_robin::RoundRobin;
pub use smg_cache_aware::{SmgCacheAware, SmgCacheAwareArgs, SmgCacheAwareConfig};
pub use smg_power_of_two::SmgPowerOfTwo;
pub use vllm_dp::VllmDp;

/// The routing vocabulary lives in `protocol::trace_event`, beside the trace events that carry it.
pub use protocol::trace_event::{Branch, KeySource, RankCost, RankLoad, RankScore, RankTerms};

use std::fmt;

/// What the router knows about a request when it picks a rank.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    pub rid: &'a str,
    pub input_ids: &'a [u32],
    pub routing_key: Option<&'a str>,
    pub bootstrap_room: Option<u64>,
    /// The most tokens it may generate (`None`: it generates none, an embedding): how much a
    /// stall of its decode weighs on its time per output token.
    pub max_new_tokens: Option<u32>,
}

/// A generation as the balancers see it: every path that routes one (unified or disaggregated)
/// builds it here.
impl<'a> From<&'a protocol::GenerateReq> for RouteInput<'a> {
    fn from(req: &'a protocol::GenerateReq) -> Self {
        RouteInput {
            rid: &req.rid,
            input_ids: &req.input_ids,
            routing_key: req.routing_key.as_deref(),
            bootstrap_room: req.bootstrap_room,
            max_new_tokens: Some(req.sampling.max_new_tokens),
        }
    }
}

/// An embedding as the balancers see it (no bootstrap room: it never runs disaggregated).
impl<'a> From<&'a protocol::EmbedReq> for RouteInput<'a> {
    fn from(req: &'a protocol::EmbedReq) -> Self {
        RouteInput {
            rid: &req.rid,
            input_ids: &req.input_ids,
            routing_key: req.routing_key.as_deref(),
            bootstrap_room: None,
            max_new_tokens: None,
        }
    }
}

impl<'a> RouteInput<'a> {
    /// A request with only a prompt (no rid to speak of, key or room): the balancers' tests.
    #[cfg(test)]
    pub(crate) fn prompt(input_ids: &'a [u32]) -> Self {
        RouteInput {
            rid: "r",
            input_ids,
            routing_key: None,
            bootstrap_room: None,
            max_new_tokens: None,
        }
    }
}

/// [`stall_tpot`] on a rank whose worker finishes first within `finish_first` tokens of a
/// request's end (`--finish-first-tokens`): a request of at most `finish_first + 1` tokens is
/// within that bound from its first token on, so no other prompt's prefill runs while it
/// decodes there (for up to the worker's wait bound), and a stall costs it nothing.
pub fn stall_tpot_on(max_new_tokens: u64, finish_first: u64) -> f64 {
    if finish_first > 0 && max_new_tokens <= finish_first.saturating_add(1) {
        0.0
    } else {
        stall_tpot(max_new_tokens)
    }
}

/// What one second's stall of a request's decode adds to its time per output token: the
/// stall is spread over the gaps between its tokens, `max_new_tokens − 1` of them at most
/// (0 for a request that generates fewer than two tokens, or whose length is not known).
pub fn stall_tpot(max_new_tokens: u64) -> f64 {
    if max_new_tokens >= 2 {
        1.0 / (max_new_tokens - 1) as f64
    } else {
        0.0
    }
}

/// The live ranks, sorted by rank id. Never empty when handed to a balancer.
#[derive(Debug, Clone, Default)]
pub struct RankSet {
    ranks: Vec<RankLoad>,
    /// Each rank's queue split and KV capacity, in `ranks` order (empty: not known).
    queues: Vec<RankQueue>,
    /// What the KV index says of the request's prompt on these ranks (methods that read it).
    cached: Option<CachedPrefix>,
}

/// What a rank's last status said beyond its [`RankLoad`]: the split of its active requests
/// into running and waiting, and its KV capacity, for the rules that weigh them apart
/// (`vllm_dp`, `llmd_prefix`). Kept beside the load rather than in it, so the traced
/// [`RankLoad`] keeps its shape; the methods trace what they used in their [`RankScore`]s.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RankQueue {
    pub rank: u32,
    /// Running by the last applied status.
    pub running_requests: u64,
    /// Waiting by the last applied status, plus the dispatches it does not count yet
    /// (speculative): `running_requests + waiting_requests` is the load's `active_requests`.
    pub waiting_requests: u64,
    /// The rank's KV capacity in tokens (`max_total_tokens` of its status; 0 before one).
    pub max_total_tokens: u64,
    /// Prompt tokens the rank has yet to compute: its last status's backlog plus the uncached
    /// part of the dispatches it does not count yet. `None`: the rank does not report one.
    pub prefill_backlog_tokens: Option<u64>,
    /// Its measured prefill speed in prompt tokens per second; `None` until measured.
    pub prefill_rate: Option<f64>,
    /// What a second's stall of its decode adds to its requests' times per output token,
    /// summed over them: Σ 1 / (max_new_tokens − 1) (0: none known), without the requests
    /// its finish-first bound keeps from being stalled ([`stall_tpot_on`]).
    pub stall_tpot: f64,
    /// Its worker's `--finish-first-tokens` (`Hello.finish_first_tokens`; 0: off).
    pub finish_first_tokens: u64,
}

impl RankQueue {
    /// KV-cache utilisation in [0, 1]: active tokens (held, reserved, or sent since the last
    /// status) over capacity; 0 while the capacity is unknown.
    pub fn kv_utilization(&self, load: &RankLoad) -> f64 {
        if self.max_total_tokens == 0 {
            return 0.0;
        }
        (load.active_tokens as f64 / self.max_total_tokens as f64).min(1.0)
    }
}

/// A prompt as the KV index sees it on the live ranks (`cache_aware`), computed by the
/// controller before it asks the balancer, so the balancer stays a pure function of its inputs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CachedPrefix {
    /// Leading prompt tokens each rank holds, in [`RankSet::loads`] order.
    pub matched_tokens: Vec<u64>,
    /// Hash of the prompt's first block (its first tokens, when shorter): the key that keeps
    /// cold prompts with the same beginning together.
    pub first_block: u64,
    /// Tokens per block of the index (the workers' `--kv-event-block-size`).
    pub block_size: usize,
}

impl RankSet {
    pub fn new(mut ranks: Vec<RankLoad>) -> Self {
        ranks.sort_by_key(|r| r.rank);
        RankSet {
            ranks,
            queues: Vec::new(),
            cached: None,
        }
    }

    /// The same ranks, with each one's queue split and capacity (one per rank, any order).
    pub fn with_queues(mut self, mut queues: Vec<RankQueue>) -> Self {
        queues.sort_by_key(|q| q.rank);
        debug_assert!(queues
            .iter()
            .map(|q| q.rank)
            .eq(self.ranks.iter().map(|r| r.rank)));
        self.queues = queues;
        self
    }

    /// The queue split of the rank at `i` (in [`RankSet::loads`] order). Unknown: every
    /// active request counts as running, capacity 0.
    pub fn queue(&self, i: usize) -> RankQueue {
        self.queues.get(i).copied().unwrap_or_else(|| {
            let l = &self.ranks[i];
            RankQueue {
                rank: l.rank,
                running_requests: l.active_requests,
                waiting_requests: 0,
                max_total_tokens: 0,
                prefill_backlog_tokens: None,
                prefill_rate: None,
                stall_tpot: 0.0,
                finish_first_tokens: 0,
            }
        })
    }

    /// The same ranks, with what the KV index says of the request's prompt on each.
    pub fn with_cached_prefix(mut self, cached: CachedPrefix) -> Self {
        debug_assert_eq!(cached.matched_tokens.len(), self.ranks.len());
        self.cached = Some(cached);
        self
    }

    pub fn cached_prefix(&self) -> Option<&CachedPrefix> {
        self.cached.as_ref()
    }

    /// Idle ranks with these ids (tests and benchmarks).
    pub fn idle(ids: &[u32]) -> Self {
        RankSet::new(
            ids.iter()
                .map(|&rank| RankLoad {
                    rank,
                    active_requests: 0,
                    active_tokens: 0,
                })
                .collect(),
        )
    }

    /// Ranks with these `(rank, active requests, active tokens)` (tests).
    #[cfg(test)]
    pub(crate) fn with_loads(loads: &[(u32, u64, u64)]) -> Self {
        RankSet::new(
            loads
                .iter()
                .map(|&(rank, active_requests, active_tokens)| RankLoad {
                    rank,
                    active_requests,
                    active_tokens,
                })
                .collect(),
        )
    }

    /// Ranks `(rank, prefill backlog tokens, measured prefill rate)`, one running request and
    /// 2^20 KV tokens each (tests of the time cost).
    #[cfg(test)]
    pub(crate) fn with_prefill_lines(spec: &[(u32, u64, Option<f64>)]) -> Self {
        RankSet::with_loads(
            &spec
                .iter()
                .map(|&(rank, _, _)| (rank, 1, 0))
                .collect::<Vec<_>>(),
        )
        .with_queues(
            spec.iter()
                .map(|&(rank, backlog, rate)| RankQueue {
                    rank,
                    running_requests: 1,
                    waiting_requests: 0,
                    max_total_tokens: 1 << 20,
                    prefill_backlog_tokens: Some(backlog),
                    prefill_rate: rate,
                    stall_tpot: 0.0,
                    finish_first_tokens: 0,
                })
                .collect(),
        )
    }

    pub fn loads(&self) -> &[RankLoad] {
        &self.ranks
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    pub fn contains(&self, rank: u32) -> bool {
        self.get(rank).is_some()
    }

    pub fn get(&self, rank: u32) -> Option<&RankLoad> {
        self.ranks
            .binary_search_by_key(&rank, |r| r.rank)
            .ok()
            .map(|i| &self.ranks[i])
    }

    pub fn ids(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.rank).collect()
    }
}

/// A routing decision: the rank and why. The affinity fields stay empty for methods without a
/// key, which costs nothing (`Vec::new` does not allocate).
#[derive(Debug, Clone, PartialEq)]
pub struct RouteDecision {
    pub rank: u32,
    pub branch: Branch,
    pub key_source: KeySource,
    /// 64-bit blake2b of the key bytes: identifies the key in traces without revealing it.
    pub key_digest: Option<u64>,
    /// Live ranks in HRW order, preferred first (affinity methods only).
    pub hrw_order: Vec<u32>,
    /// The overload-guard threshold on active requests (affinity methods only).
    pub threshold: Option<f64>,
    /// The method that chose when the branch is `Fallback`.
    pub fallback: Option<Method>,
    /// `cache_aware`: every candidate's cached prefix and cost, cheapest first.
    pub costs: Vec<RankCost>,
    /// The peers' methods: every live rank's terms of the rule, in rank order.
    pub scores: Vec<RankScore>,
    /// The leading prompt tokens the chosen rank holds by the KV index (blocks predicted
    /// there included), for the methods that read it; `None` for the others.
    pub cached_tokens: Option<u64>,
}

impl RouteDecision {
    /// A decision with no key information.
    pub fn plain(rank: u32, branch: Branch) -> Self {
        RouteDecision {
            rank,
            branch,
            key_source: KeySource::None,
            key_digest: None,
            hrw_order: Vec::new(),
            threshold: None,
            fallback: None,
            costs: Vec::new(),
            scores: Vec::new(),
            cached_tokens: None,
        }
    }

    /// A decision with no key information and these per-rank scores.
    pub fn scored(rank: u32, branch: Branch, scores: Vec<RankScore>) -> Self {
        RouteDecision {
            scores,
            ..RouteDecision::plain(rank, branch)
        }
    }

    /// The `routed` milestone of a message trace: this decision and the loads it saw.
    pub fn milestone(&self, method: Method, ranks: &RankSet) -> protocol::trace_event::Milestone {
        protocol::trace_event::Milestone::Routed {
            method: method.to_string(),
            chosen_rank: self.rank,
            branch: self.branch,
            key_source: self.key_source,
            key_digest: self.key_digest.map(|k| format!("{k:016x}")),
            hrw_order: self.hrw_order.clone(),
            threshold: self.threshold,
            loads: ranks.loads().to_vec(),
            fallback: self.fallback.map(|m| m.to_string()),
            leg: None,
            costs: self.costs.clone(),
            scores: self.scores.clone(),
        }
    }
}

/// One load-balance method.
pub trait LoadBalancer: Send {
    /// Pick a rank from `ranks` (never empty) for `req`.
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision;
}

/// The `--load-balance-method` values (clap lists them, with these comments, in `--help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Method {
    /// Each live rank in turn.
    RoundRobin,
    /// The rank with the fewest active requests.
    TotalRequests,
    /// The rank with the fewest active tokens (ties: fewest requests).
    TotalTokens,
    /// bootstrap_room % live ranks (stable rank ids).
    FollowBootstrapRoom,
    /// Rendezvous hashing on the routing key or the prompt's first tokens, with an overload
    /// guard: requests sharing a prefix (or a routing key) meet the cache that holds it.
    PrefixAffinity,
    /// The rank where the request adds the least delay, counting the prefix each rank's cache
    /// holds (the workers' KV events), its queued prompts, its measured prefill speed and the
    /// requests it serves, with an overload guard; no key needed (the default: the highest
    /// capacity at SLO of dpserve's methods and the peers' on the production traces measured).
    #[default]
    CacheAware,
    /// vLLM's data-parallel balancer: the lowest 4 × waiting + running (first rank on ties).
    VllmDp,
    /// SMG's cache_aware: a prefix tree per rank from the routing history; the best match
    /// above --smg-cache-threshold, else the least loaded, shortest queue when imbalanced.
    SmgCacheAware,
    /// Dynamo's KV router: the lowest overlap_score_weight × prefill blocks to compute +
    /// active decode blocks (KV events), softmax-sampled at --dynamo-router-temperature > 0.
    DynamoKv,
    /// llm-d's scheduler: the highest weighted sum of its precise prefix-cache (KV events),
    /// queue and KV-utilisation scorers.
    LlmdPrefix,
    /// SMG's power_of_two: of two live ranks drawn at random, the one with fewer active
    /// requests (the first drawn on a tie).
    SmgPowerOfTwo,
}

impl Method {
    /// The name in flags, traces and metrics (clap's name too; a test keeps them equal).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::RoundRobin => "round_robin",
            Method::TotalRequests => "total_requests",
            Method::TotalTokens => "total_tokens",
            Method::FollowBootstrapRoom => "follow_bootstrap_room",
            Method::PrefixAffinity => "prefix_affinity",
            Method::CacheAware => "cache_aware",
            Method::VllmDp => "vllm_dp",
            Method::SmgCacheAware => "smg_cache_aware",
            Method::DynamoKv => "dynamo_kv",
            Method::LlmdPrefix => "llmd_prefix",
            Method::SmgPowerOfTwo => "smg_power_of_two",
        }
    }

    /// Whether the method is a peer's rule (SGLang's own four, vLLM's, SMG's, Dynamo's,
    /// llm-d's) rather than dpserve's own: what `dpserve bench --sweep` rates dpserve's against.
    pub fn is_peer(self) -> bool {
        !matches!(self, Method::PrefixAffinity | Method::CacheAware)
    }

    /// Whether the method reads the KV index (the controller then matches each prompt).
    pub fn uses_kv_index(self) -> bool {
        matches!(
            self,
            Method::CacheAware | Method::DynamoKv | Method::LlmdPrefix
        )
    }

    /// Build the balancer; `affinity` configures `prefix_affinity`, `cache` `cache_aware`,
    /// `peers` the peers' methods.
    pub fn balancer(
        self,
        affinity: &PrefixAffinityConfig,
        cache: &CacheAwareConfig,
        peers: &PeerConfigs,
    ) -> Box<dyn LoadBalancer> {
        match self {
            Method::RoundRobin => Box::new(RoundRobin::default()),
            Method::TotalRequests => Box::new(TotalRequests::default()),
            Method::TotalTokens => Box::new(TotalTokens::default()),
            Method::FollowBootstrapRoom => Box::new(FollowBootstrapRoom::default()),
            Method::PrefixAffinity => Box::new(PrefixAffinity::new(affinity.clone())),
            Method::CacheAware => Box::new(CacheAware::new(cache.clone())),
            Method::VllmDp => Box::new(VllmDp),
            Method::SmgCacheAware => Box::new(SmgCacheAware::new(
                peers.smg.clone(),
                Box::new(MonotonicClock::new()),
            )),
            Method::DynamoKv => Box::new(DynamoKv::new(peers.dynamo.clone())),
            Method::LlmdPrefix => Box::new(LlmdPrefix::new(peers.llmd.clone())),
            Method::SmgPowerOfTwo => Box::new(SmgPowerOfTwo::default()),
        }
    }
}

/// The settings of the peers' methods (`--smg-*`, `--dynamo-*`, `--llmd-*`; `vllm_dp` has
/// none). `Default` holds each project's published defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PeerConfigs {
    pub smg: SmgCacheAwareConfig,
    pub dynamo: DynamoKvConfig,
    pub llmd: LlmdPrefixConfig,
}

/// The peers' methods' flags, each method's declared and checked in its own file.
#[derive(clap::Args, Debug, Clone, PartialEq, Default)]
pub struct PeerArgs {
    #[command(flatten)]
    pub smg: SmgCacheAwareArgs,
    #[command(flatten)]
    pub dynamo: DynamoKvArgs,
    #[command(flatten)]
    pub llmd: LlmdPrefixArgs,
}

impl PeerArgs {
    /// Every peer method's settings, checked.
    pub fn configs(&self) -> crate::error::Result<PeerConfigs> {
        Ok(PeerConfigs {
            smg: self.smg.config()?,
            dynamo: self.dynamo.config()?,
            llmd: self.llmd.config()?,
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `--prefix-affinity-fallback` values: the keyless methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum FallbackMethod {
    /// Each live rank in turn.
    RoundRobin,
    /// The rank with the fewest active requests.
    TotalRequests,
    /// The rank with the fewest active tokens (the default: without a key, put the request
    /// where the fewest tokens are).
    #[default]
    TotalTokens,
}

impl FallbackMethod {
    pub fn method(self) -> Method {
        match self {
            FallbackMethod::RoundRobin => Method::RoundRobin,
            FallbackMethod::TotalRequests => Method::TotalRequests,
            FallbackMethod::TotalTokens => Method::TotalTokens,
        }
    }

    pub fn balancer(self) -> Box<dyn LoadBalancer> {
        match self {
            FallbackMethod::RoundRobin => Box::new(RoundRobin::default()),
            FallbackMethod::TotalRequests => Box::new(TotalRequests::default()),
            FallbackMethod::TotalTokens => Box::new(TotalTokens::default()),
        }
    }
}

impl fmt::Display for FallbackMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.method().as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_names_are_the_trace_and_metric_names() {
        use clap::ValueEnum;
        for m in Method::value_variants() {
            let name = m.to_possible_value().unwrap();
            assert_eq!(name.get_name(), m.as_str());
            assert_eq!(Method::from_str(m.as_str(), false).unwrap(), *m);
        }
        for m in FallbackMethod::value_variants() {
            let name = m.to_possible_value().unwrap();
            assert_eq!(name.get_name(), m.to_string());
        }
        let names: Vec<&str> = Method::value_variants()
            .iter()
            .map(|m| m.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "round_robin",
                "total_requests",
                "total_tokens",
                "follow_bootstrap_room",
                "prefix_affinity",
                "cache_aware",
                "vllm_dp",
                "smg_cache_aware",
                "dynamo_kv",
                "llmd_prefix",
                "smg_power_of_two"
            ]
        );
    }

    #[test]
    fn defaults_are_cache_aware_and_total_tokens() {
        assert_eq!(Method::default(), Method::CacheAware);
        assert_eq!(FallbackMethod::default(), FallbackMethod::TotalTokens);
    }
}
