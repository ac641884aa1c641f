//! Routing-decision counters per (method, branch), reported cumulatively in `ClusterStatus` so
//! the tokenizer can expose them as `dpserve:routing_decisions_total`, and the regret counters:
//! requests sent away from the rank holding the longest prefix of their prompt, per (method,
//! the branch that decided), as `dpserve:routing_regret_total`. Counting is a map update on the
//! controller thread; the controller is the only writer, so there is no lock.

use std::collections::BTreeMap;

use protocol::RouteCount;

use crate::policy::{Method, RankSet, RouteDecision};
use crate::router::RouteError;

/// The branch label of a request that could not be routed (rank not live, no live rank).
pub const REFUSED: &str = "refused";

/// Decisions since the controller started.
#[derive(Debug, Default, Clone)]
pub struct RouteCounts {
    counts: BTreeMap<(&'static str, &'static str), u64>,
    regret: BTreeMap<(&'static str, &'static str), u64>,
}

impl RouteCounts {
    /// Count one decision of `method` (the configured method: a fallback decision counts under
    /// it, with branch `fallback`).
    pub fn record(&mut self, method: Method, decision: &Result<RouteDecision, RouteError>) {
        let branch = match decision {
            Ok(d) => d.branch.as_str(),
            Err(_) => REFUSED,
        };
        *self.counts.entry((method.as_str(), branch)).or_default() += 1;
    }

    /// Count `decision` as a regret if its rank holds less of the prompt than another of
    /// `ranks` does, by the KV index view the decision saw (no view: nothing to regret).
    pub fn record_regret(&mut self, method: Method, decision: &RouteDecision, ranks: &RankSet) {
        let Some(cached) = ranks.cached_prefix() else {
            return;
        };
        let best = cached.matched_tokens.iter().copied().max().unwrap_or(0);
        let i = ranks.loads().partition_point(|l| l.rank < decision.rank);
        let chosen = cached.matched_tokens.get(i).copied().unwrap_or(0);
        if chosen < best {
            *self
                .regret
                .entry((method.as_str(), decision.branch.as_str()))
                .or_default() += 1;
        }
    }

    /// The regret counters in wire form (`branch`: the reason), sorted by method then reason.
    pub fn regret(&self) -> Vec<RouteCount> {
        wire(&self.regret)
    }

    /// The counters in wire form, sorted by method then branch.
    pub fn snapshot(&self) -> Vec<RouteCount> {
        wire(&self.counts)
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

fn wire(counts: &BTreeMap<(&'static str, &'static str), u64>) -> Vec<RouteCount> {
    counts
        .iter()
        .map(|(&(method, branch), &count)| RouteCount {
            method: method.to_string(),
            branch: branch.to_string(),
            count,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Branch, RouteDecision};

    fn count(c: &RouteCounts, method: &str, branch: &str) -> Option<u64> {
        c.snapshot()
            .into_iter()
            .find(|r| r.method == method && r.branch == branch)
            .map(|r| r.count)
    }

    #[test]
    fn counts_each_branch_and_refusals_cumulatively() {
        let mut c = RouteCounts::default();
        let pa = Method::PrefixAffinity;
        for branch in [
            Branch::Affinity,
            Branch::Affinity,
            Branch::Spill,
            Branch::Fallback,
        ] {
            c.record(pa, &Ok(RouteDecision::plain(0, branch)));
        }
        c.record(pa, &Err(RouteError::NoLiveRank));
        c.record(
            Method::RoundRobin,
            &Ok(RouteDecision::plain(1, Branch::Rotate)),
        );
        assert_eq!(count(&c, "prefix_affinity", "affinity"), Some(2));
        assert_eq!(count(&c, "prefix_affinity", "spill"), Some(1));
        assert_eq!(count(&c, "prefix_affinity", "fallback"), Some(1));
        assert_eq!(count(&c, "prefix_affinity", "refused"), Some(1));
        assert_eq!(count(&c, "round_robin", "rotate"), Some(1));
        assert_eq!(count(&c, "prefix_affinity", "explicit"), None);
        assert_eq!(c.total(), 6);
        // Sorted, so two snapshots of the same counts encode identically.
        let snap = c.snapshot();
        let mut sorted = snap.clone();
        sorted.sort_by(|a, b| (&a.method, &a.branch).cmp(&(&b.method, &b.branch)));
        assert_eq!(snap, sorted);
    }

    #[test]
    fn regret_counts_requests_sent_away_from_the_longest_holder_by_branch() {
        use crate::policy::CachedPrefix;
        let mut c = RouteCounts::default();
        let ranks = RankSet::idle(&[0, 1, 2]).with_cached_prefix(CachedPrefix {
            matched_tokens: vec![0, 64, 64],
            first_block: 0,
            block_size: 32,
        });
        let ca = Method::CacheAware;
        // To a holder of the longest prefix (either of two): no regret.
        c.record_regret(ca, &RouteDecision::plain(1, Branch::Cached), &ranks);
        c.record_regret(ca, &RouteDecision::plain(2, Branch::Cached), &ranks);
        assert!(c.regret().is_empty());
        c.record_regret(ca, &RouteDecision::plain(0, Branch::Spill), &ranks);
        c.record_regret(ca, &RouteDecision::plain(0, Branch::Cached), &ranks);
        c.record_regret(ca, &RouteDecision::plain(0, Branch::Spill), &ranks);
        let regret = c.regret();
        let of = |b: &str| regret.iter().find(|r| r.branch == b).map(|r| r.count);
        assert_eq!((of("spill"), of("cached")), (Some(2), Some(1)));
        // Without an index view (methods that do not read it) there is nothing to regret.
        c.record_regret(
            Method::RoundRobin,
            &RouteDecision::plain(0, Branch::Rotate),
            &RankSet::idle(&[0, 1]),
        );
        assert_eq!(c.regret().len(), 2);
    }
}
