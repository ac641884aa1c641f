//! `smg_cache_aware`: the SGLang Model Gateway's `cache_aware` policy in its gRPC (token)
//! mode: an approximate prefix tree per rank built from the router's own routing history,
//! best match above a threshold, and a balance mode that drops affinity when loads diverge.
//!
//! ```text
//! load(r)     = active requests of r (SMG: the gateway's in-flight requests per worker)
//! imbalanced  = max_load − min_load > balance_abs_threshold
//!               AND max_load > balance_rel_threshold × min_load
//! least(r)    = argmin (load, requests this balancer sent r, rank id)
//! matched(r)  = leading whole 16-token pages of the prompt in r's tree
//! match_rate  = max_r matched(r) / prompt tokens
//! rank        = least                               if imbalanced          (branch balance)
//!             | the r with the best match           if match_rate > cache_threshold (matched)
//!             | least                               otherwise              (least_loaded)
//! then        : insert the prompt's pages into the chosen rank's tree (in every branch)
//! every eviction_interval (checked at decision time): each tree evicted, least recently
//!               routed leaves first, to max_tree_size tokens; 0 s: never
//! ```
//! Source: lightseekorg/smg `model_gateway/src/policies/cache_aware.rs`
//! (`select_worker`, `is_imbalanced`, `select_worker_with_tokens`, `select_worker_min_load`)
//! and `crates/kv_index/src/token_tree.rs` (`match_and_insert_with`, `evict_tenant_by_size`),
//! commit 73da68ca9472. Defaults are those of the `smg` command line
//! (`model_gateway/src/main.rs`): `cache_threshold` 0.3, `balance_abs_threshold` 64,
//! `balance_rel_threshold` 1.5, `eviction_interval` 120 s, `max_tree_size` 67 108 864 tokens.
//! (The library's `CacheAwareConfig::default()` says 0.5, 32, 1.1, 30 s and 10 000; a gateway
//! started from its command line runs with the former.)
//!
//! As SMG's code does, and where it differs from its own comments:
//! - Below the threshold the request goes to the least loaded rank (ties: fewest requests
//!   routed there by this policy, then the lowest index, SMG #1714), not to the rank with the
//!   smallest tree, which SMG's header comment still describes and older sgl-router did.
//! - The match ratio divides by the whole prompt, but only whole pages match; the test is
//!   strictly greater than the threshold.
//! - The chosen rank's tree learns the prompt in the balance branch too.
//!
//! Approximations: SMG keeps one tree whose nodes list their tenants and returns "any" tenant
//! of the deepest matched node (a hash-map order); here each rank has its own tree and a tie
//! for the best match goes to the rank that was sent that prefix most recently (then the lowest
//! rank id), which is what SMG's cached last tenant usually names. SMG also refreshes the
//! stamps of matched nodes for that arbitrary tenant; here only the chosen rank's path is
//! stamped. Eviction removes single pages rather than whole radix nodes, so it stops at the
//! size instead of below it. Its KV-usage triggers (`balance_token_usage_threshold`,
//! `overload_token_usage_threshold`) are off by default (1.0) and not modelled, nor its
//! event-driven mode (dpserve's `cache_aware` is the KV-event method). A rank that leaves the
//! live set loses its tree at the next decision (SMG's `remove_worker` is a no-op and leaves
//! stale entries to eviction; a rank that comes back here starts with an empty cache).
//!
//! Cost per decision: hashing the prompt once (O(prompt)), O(matched pages) lookups per rank,
//! O(pages) inserts; an eviction pass is O(n log n) in the tree's pages.

use std::collections::BTreeMap;
use std::time::Duration;

use super::clock::Clock;
use super::page_tree::{page_hashes, PageTree, PAGE_TOKENS};
use super::{Branch, LoadBalancer, RankScore, RankSet, RouteDecision, RouteInput};
use crate::error::{peer_flag, Result};

/// `--smg-*` settings. `Default` is the single source of the defaults; clap reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct SmgCacheAwareConfig {
    /// Match ratio (0..=1) above which the best-matching rank is taken.
    pub cache_threshold: f64,
    /// Imbalance needs max − min active requests above this...
    pub balance_abs_threshold: u64,
    /// ...and max above this multiple of min.
    pub balance_rel_threshold: f64,
    /// How often the trees are evicted to `max_tree_size` (zero: never).
    pub eviction_interval: Duration,
    /// Tokens each rank's tree may keep after an eviction.
    pub max_tree_size: u64,
}

impl Default for SmgCacheAwareConfig {
    fn default() -> Self {
        SmgCacheAwareConfig {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval: Duration::from_secs(120),
            max_tree_size: 1 << 26,
        }
    }
}

/// The `--smg-*` flags (`dpserve controller` and `up` flatten them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SmgCacheAwareArgs {
    /// smg_cache_aware: the best match in the routing-history tree wins when it covers more
    /// than this share (0..=1) of the prompt; otherwise the least loaded rank.
    #[arg(long, env = "DPSERVE_SMG_CACHE_THRESHOLD",
          default_value_t = SmgCacheAwareConfig::default().cache_threshold)]
    pub smg_cache_threshold: f64,
    /// smg_cache_aware: loads are imbalanced (shortest queue, no affinity) when max − min
    /// active requests exceeds this...
    #[arg(long, env = "DPSERVE_SMG_BALANCE_ABS_THRESHOLD",
          default_value_t = SmgCacheAwareConfig::default().balance_abs_threshold)]
    pub smg_balance_abs_threshold: u64,
    /// smg_cache_aware: ...and max exceeds this multiple (>= 1.0) of min.
    #[arg(long, env = "DPSERVE_SMG_BALANCE_REL_THRESHOLD",
          default_value_t = SmgCacheAwareConfig::default().balance_rel_threshold)]
    pub smg_balance_rel_threshold: f64,
    /// smg_cache_aware: seconds between evictions of the trees to --smg-max-tree-size
    /// (0: never).
    #[arg(long, env = "DPSERVE_SMG_EVICTION_INTERVAL",
          default_value_t = SmgCacheAwareConfig::default().eviction_interval.as_secs())]
    pub smg_eviction_interval: u64,
    /// smg_cache_aware: tokens each rank's tree keeps after an eviction.
    #[arg(long, env = "DPSERVE_SMG_MAX_TREE_SIZE",
          default_value_t = SmgCacheAwareConfig::default().max_tree_size)]
    pub smg_max_tree_size: u64,
}

impl Default for SmgCacheAwareArgs {
    fn default() -> Self {
        let c = SmgCacheAwareConfig::default();
        SmgCacheAwareArgs {
            smg_cache_threshold: c.cache_threshold,
            smg_balance_abs_threshold: c.balance_abs_threshold,
            smg_balance_rel_threshold: c.balance_rel_threshold,
            smg_eviction_interval: c.eviction_interval.as_secs(),
            smg_max_tree_size: c.max_tree_size,
        }
    }
}

impl SmgCacheAwareArgs {
    /// The settings, checked.
    pub fn config(&self) -> Result<SmgCacheAwareConfig> {
        let threshold = self.smg_cache_threshold;
        let rel = self.smg_balance_rel_threshold;
        Ok(SmgCacheAwareConfig {
            cache_threshold: peer_flag(
                "--smg-cache-threshold",
                "a number in 0..=1",
                threshold,
                (0.0..=1.0).contains(&threshold),
            )?,
            balance_abs_threshold: self.smg_balance_abs_threshold,
            balance_rel_threshold: peer_flag(
                "--smg-balance-rel-threshold",
                "a finite number >= 1.0",
                rel,
                rel >= 1.0,
            )?,
            eviction_interval: Duration::from_secs(self.smg_eviction_interval),
            max_tree_size: self.smg_max_tree_size,
        })
    }
}

#[derive(Debug, Default)]
struct RankTree {
    tree: PageTree,
    /// Requests this balancer sent the rank (SMG's `processed`, the second tie-break).
    routed: u64,
}

pub struct SmgCacheAware {
    config: SmgCacheAwareConfig,
    clock: Box<dyn Clock>,
    trees: BTreeMap<u32, RankTree>,
    /// Stamps tree inserts, so eviction knows the least recently routed pages.
    tick: u64,
    next_eviction: Duration,
}

impl std::fmt::Debug for SmgCacheAware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmgCacheAware")
            .field("config", &self.config)
            .field("ranks", &self.trees.len())
            .finish_non_exhaustive()
    }
}

impl SmgCacheAware {
    pub fn new(config: SmgCacheAwareConfig, clock: Box<dyn Clock>) -> Self {
        let next_eviction = clock.now() + config.eviction_interval;
        SmgCacheAware {
            config,
            clock,
            trees: BTreeMap::new(),
            tick: 0,
            next_eviction,
        }
    }

    /// Tokens in `rank`'s tree (tests, traces).
    pub fn tree_tokens(&self, rank: u32) -> u64 {
        self.trees.get(&rank).map_or(0, |t| t.tree.tokens())
    }

    /// SMG's periodic eviction, run by the decision that finds it due.
    fn evict_if_due(&mut self) {
        if self.config.eviction_interval.is_zero() {
            return;
        }
        let now = self.clock.now();
        if now < self.next_eviction {
            return;
        }
        for t in self.trees.values_mut() {
            t.tree.evict_to(self.config.max_tree_size);
        }
        self.next_eviction = now + self.config.eviction_interval;
    }

    /// Trees for exactly the live ranks: a new rank starts empty, a departed one's is dropped.
    fn track(&mut self, ranks: &RankSet) {
        self.trees.retain(|rank, _| ranks.contains(*rank));
        for l in ranks.loads() {
            self.trees.entry(l.rank).or_default();
        }
    }

    fn imbalanced(&self, min_load: u64, max_load: u64) -> bool {
        max_load - min_load > self.config.balance_abs_threshold
            && max_load as f64 > self.config.balance_rel_threshold * min_load as f64
    }
}

impl LoadBalancer for SmgCacheAware {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        self.evict_if_due();
        self.track(ranks);
        let loads = ranks.loads();
        let hashes = page_hashes(req.input_ids);

        let min_load = loads.iter().map(|l| l.active_requests).min().unwrap_or(0);
        let max_load = loads.iter().map(|l| l.active_requests).max().unwrap_or(0);
        let least = loads
            .iter()
            .min_by_key(|l| (l.active_requests, self.trees[&l.rank].routed, l.rank))
            .map_or(0, |l| l.rank);

        // (rank, matched pages, stamp of its deepest matched page), in rank order.
        let matches: Vec<(u32, usize, u64)> = loads
            .iter()
            .map(|l| {
                let (pages, stamp) = self.trees[&l.rank].tree.matched(&hashes);
                (l.rank, pages, stamp)
            })
            .collect();
        let best = matches
            .iter()
            .max_by_key(|&&(rank, pages, stamp)| (pages, stamp, std::cmp::Reverse(rank)));
        let prompt = req.input_ids.len();
        let match_rate = match best {
            Some(&(_, pages, _)) if prompt > 0 => (pages * PAGE_TOKENS) as f64 / prompt as f64,
            _ => 0.0,
        };

        let (rank, branch) = if self.imbalanced(min_load, max_load) {
            (least, Branch::Balance)
        } else if match_rate > self.config.cache_threshold {
            (best.map_or(least, |b| b.0), Branch::Matched)
        } else {
            (least, Branch::LeastLoaded)
        };

        self.tick += 1;
        if let Some(t) = self.trees.get_mut(&rank) {
            t.tree.insert(&hashes, self.tick);
            t.routed += 1;
        }
        let scores = loads
            .iter()
            .zip(&matches)
            .map(|(l, &(_, pages, _))| RankScore::SmgCacheAware {
                rank: l.rank,
                matched_tokens: (pages * PAGE_TOKENS) as u64,
                load: l.active_requests,
                tree_tokens: self.tree_tokens(l.rank),
            })
            .collect();
        RouteDecision::scored(rank, branch, scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ManualClock;

    fn policy(config: SmgCacheAwareConfig) -> (SmgCacheAware, ManualClock) {
        let clock = ManualClock::default();
        (SmgCacheAware::new(config, Box::new(clock.clone())), clock)
    }

    /// A prompt of whole pages with these page values.
    fn prompt(pages: &[u32]) -> Vec<u32> {
        pages
            .iter()
            .flat_map(|&p| std::iter::repeat_n(p, PAGE_TOKENS))
            .collect()
    }

    fn req(ids: &[u32]) -> RouteInput<'_> {
        RouteInput::prompt(ids)
    }

    fn idle(n: u32) -> RankSet {
        RankSet::idle(&(0..n).collect::<Vec<_>>())
    }

    #[test]
    fn the_defaults_are_the_smg_command_lines() {
        let c = SmgCacheAwareConfig::default();
        assert_eq!(
            (
                c.cache_threshold,
                c.balance_abs_threshold,
                c.balance_rel_threshold
            ),
            (0.3, 64, 1.5)
        );
        assert_eq!(c.eviction_interval, Duration::from_secs(120));
        assert_eq!(c.max_tree_size, 67_108_864);
    }

    #[test]
    fn a_repeated_prefix_follows_the_rank_that_was_sent_it() {
        let (mut m, _) = policy(SmgCacheAwareConfig::default());
        let set = idle(3);
        let first = m.select(&req(&prompt(&[1, 2, 3, 4])), &set);
        assert_eq!((first.rank, first.branch), (0, Branch::LeastLoaded));
        // Rank 0 is now the busiest by routed count, but holds 3 of the 4 pages: 0.75 > 0.3.
        let again = m.select(&req(&prompt(&[1, 2, 3, 9])), &set);
        assert_eq!((again.rank, again.branch), (0, Branch::Matched));
        match again.scores[0].clone() {
            RankScore::SmgCacheAware {
                matched_tokens,
                tree_tokens,
                ..
            } => assert_eq!((matched_tokens, tree_tokens), (48, 80)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn at_or_below_the_threshold_the_least_loaded_rank_takes_it() {
        let (mut m, _) = policy(SmgCacheAwareConfig {
            cache_threshold: 0.5,
            ..Default::default()
        });
        let set = idle(2);
        m.select(&req(&prompt(&[1, 2, 3, 4])), &set); // to rank 0
                                                      // 2 of 4 pages: exactly 0.5, not above it. Rank 1 has routed nothing: the tie-break.
        let d = m.select(&req(&prompt(&[1, 2, 7, 8])), &set);
        assert_eq!((d.rank, d.branch), (1, Branch::LeastLoaded));
        // 3 of 4 is above.
        let d = m.select(&req(&prompt(&[1, 2, 3, 8])), &set);
        assert_eq!((d.rank, d.branch), (0, Branch::Matched));
    }

    #[test]
    fn a_partial_page_never_matches_but_counts_in_the_ratio() {
        let (mut m, _) = policy(SmgCacheAwareConfig::default());
        let set = idle(2);
        let short = [5u32; PAGE_TOKENS - 1];
        assert_eq!(m.select(&req(&short), &set).rank, 0);
        assert_eq!(m.tree_tokens(0), 0, "nothing cacheable below one page");
        let d = m.select(&req(&short), &set);
        assert_eq!((d.rank, d.branch), (1, Branch::LeastLoaded));
    }

    #[test]
    fn the_balance_mode_needs_both_thresholds() {
        let (mut m, _) = policy(SmgCacheAwareConfig::default());
        let ids = prompt(&[1, 2, 3, 4]);
        m.select(&req(&ids), &idle(2)); // rank 0 learns the prefix
                                        // Gap 65 > 64, but 200 ≤ 1.5 × 135: balanced, affinity holds.
        let d = m.select(
            &req(&ids),
            &RankSet::with_loads(&[(0, 200, 0), (1, 135, 0)]),
        );
        assert_eq!((d.rank, d.branch), (0, Branch::Matched));
        // 3 > 1.5 × 1, but the gap 2 ≤ 64: balanced.
        let d = m.select(&req(&ids), &RankSet::with_loads(&[(0, 3, 0), (1, 1, 0)]));
        assert_eq!((d.rank, d.branch), (0, Branch::Matched));
        // Gap 70 > 64 and 100 > 1.5 × 30: imbalanced, shortest queue despite the match.
        assert_eq!(m.tree_tokens(1), 0);
        let d = m.select(&req(&ids), &RankSet::with_loads(&[(0, 100, 0), (1, 30, 0)]));
        assert_eq!((d.rank, d.branch), (1, Branch::Balance));
        // In balance mode the chosen rank learns the prompt too.
        assert_eq!(m.tree_tokens(1), 64);
    }

    #[test]
    fn least_loaded_ties_go_to_the_rank_routed_least_then_the_lowest_id() {
        let (mut m, _) = policy(SmgCacheAwareConfig::default());
        let set = idle(3);
        let got: Vec<u32> = (0..6u32)
            .map(|i| m.select(&req(&prompt(&[100 + i])), &set).rank)
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn trees_are_evicted_to_the_max_size_when_the_interval_is_due() {
        let (mut m, clock) = policy(SmgCacheAwareConfig {
            eviction_interval: Duration::from_secs(120),
            max_tree_size: 2 * PAGE_TOKENS as u64,
            ..Default::default()
        });
        let set = idle(1);
        m.select(&req(&prompt(&[1, 2, 3, 4])), &set);
        m.select(&req(&prompt(&[7, 8])), &set);
        assert_eq!(m.tree_tokens(0), 96);
        clock.advance(Duration::from_secs(119));
        m.select(&req(&prompt(&[7, 8])), &set);
        assert_eq!(m.tree_tokens(0), 96, "not due yet");
        clock.advance(Duration::from_secs(1));
        let d = m.select(&req(&prompt(&[7, 8])), &set);
        // The older path [1 2 3 4] went leaf first; the recent [7 8] stayed.
        assert_eq!(m.tree_tokens(0), 32);
        assert_eq!(d.branch, Branch::Matched);
        let d = m.select(&req(&prompt(&[1, 2, 3, 4])), &set);
        assert_eq!(d.branch, Branch::LeastLoaded, "its pages were evicted");
    }

    #[test]
    fn a_zero_interval_never_evicts() {
        let (mut m, clock) = policy(SmgCacheAwareConfig {
            eviction_interval: Duration::ZERO,
            max_tree_size: 0,
            ..Default::default()
        });
        m.select(&req(&prompt(&[1, 2])), &idle(1));
        clock.advance(Duration::from_secs(3600));
        m.select(&req(&prompt(&[3])), &idle(1));
        assert_eq!(m.tree_tokens(0), 48);
    }

    #[test]
    fn a_rank_that_leaves_loses_its_tree() {
        let (mut m, _) = policy(SmgCacheAwareConfig::default());
        let ids = prompt(&[1, 2, 3]);
        assert_eq!(m.select(&req(&ids), &idle(2)).rank, 0);
        assert!(m.tree_tokens(0) > 0);
        m.select(&req(&prompt(&[9])), &RankSet::idle(&[1]));
        assert_eq!(m.tree_tokens(0), 0);
        // Back again: a cold cache, so no affinity.
        let d = m.select(&req(&ids), &RankSet::with_loads(&[(0, 0, 0), (1, 0, 0)]));
        assert_eq!(d.branch, Branch::LeastLoaded);
    }

    #[test]
    fn a_tie_for_the_best_match_goes_to_the_rank_sent_it_last() {
        let (mut m, _) = policy(SmgCacheAwareConfig::default());
        let ids = prompt(&[1, 2, 3]);
        // Balance mode sends the prefix to rank 1 then rank 0 (least loaded each time).
        m.select(&req(&ids), &RankSet::with_loads(&[(0, 100, 0), (1, 0, 0)]));
        m.select(&req(&ids), &RankSet::with_loads(&[(0, 0, 0), (1, 100, 0)]));
        let d = m.select(&req(&ids), &idle(2));
        assert_eq!((d.rank, d.branch), (0, Branch::Matched));
    }
}
