//! Routing-decision counters per (method, branch), reported cumulatively in `ClusterStatus` so
//! the tokenizer can expose them as `dpserve:routing_decisions_total`. Counting is a map update
//! on the controller thread; the controller is the only writer, so there is no lock.

use std::collections::BTreeMap;

use protocol::RouteCount;

use crate::policy::{Method, RouteDecision};
use crate::router::RouteError;

/// The branch label of a request that could not be routed (rank not live, no live rank).
pub const REFUSED: &str = "refused";

/// Decisions since the controller started.
#[derive(Debug, Default, Clone)]
pub struct RouteCounts {
    counts: BTreeMap<(&'static str, &'static str), u64>,
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

    /// The counters in wire form, sorted by method then branch.
    pub fn snapshot(&self) -> Vec<RouteCount> {
        self.counts
            .iter()
            .map(|(&(method, branch), &count)| RouteCount {
                method: method.to_string(),
                branch: branch.to_string(),
                count,
            })
            .collect()
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
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
}
