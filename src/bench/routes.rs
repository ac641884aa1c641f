//! What the routing trace of a `--launch` run says about its decisions: how many took each
//! branch (affinity, spill, cached, cold, …) and how many sent a request to a rank already above
//! the overload guard's threshold (possible only when every live rank was above it).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use protocol::route_record::RouteRecord;
use serde::Serialize;
use trace_tools::report;

/// The decisions of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RouteSummary {
    pub decisions: usize,
    /// Decisions per branch name (`affinity`, `spill`, `cached`, `cold`, `rotate`, …).
    pub branches: BTreeMap<String, usize>,
    /// Decisions with a threshold whose rank had more active requests than it.
    pub over_guard: usize,
}

impl RouteSummary {
    pub fn of(records: &[RouteRecord]) -> RouteSummary {
        let mut s = RouteSummary::default();
        for r in records {
            let Some(rank) = r.rank else { continue };
            s.decisions += 1;
            let branch = r.branch.map_or("none", |b| b.as_str());
            *s.branches.entry(branch.to_string()).or_default() += 1;
            let load = r.loads.iter().find(|l| l.rank == rank);
            if let (Some(t), Some(load)) = (r.threshold, load) {
                s.over_guard += usize::from(load.active_requests as f64 > t);
            }
        }
        s
    }

    /// Reads the routing trace at `path`.
    pub fn read(path: &Path) -> anyhow::Result<RouteSummary> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let (records, _) = report::parse(std::io::BufReader::new(file))
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(RouteSummary::of(&records))
    }

    /// `120 decisions: 80 cached, 30 cold, 10 spill; 0 over the guard`.
    pub fn line(&self) -> String {
        let branches: Vec<String> = self
            .branches
            .iter()
            .map(|(b, n)| format!("{n} {b}"))
            .collect();
        format!(
            "{} decisions: {}; {} over the guard",
            self.decisions,
            branches.join(", "),
            self.over_guard
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::trace_event::{Branch, RankLoad};

    fn record(rank: u32, branch: Branch, threshold: Option<f64>, loads: &[u64]) -> RouteRecord {
        let mut r = RouteRecord::blank("r", 0.0, "cache_aware".into());
        r.rank = Some(rank);
        r.branch = Some(branch);
        r.threshold = threshold;
        r.loads = loads
            .iter()
            .enumerate()
            .map(|(i, &a)| RankLoad {
                rank: i as u32,
                active_requests: a,
                active_tokens: 0,
            })
            .collect();
        r
    }

    #[test]
    fn counts_branches_and_decisions_above_the_threshold() {
        let records = vec![
            record(0, Branch::Cached, Some(3.0), &[3, 0]),
            record(1, Branch::Cold, Some(3.0), &[5, 2]),
            record(0, Branch::Cached, Some(3.0), &[4, 4]),
            record(1, Branch::Rotate, None, &[9, 9]),
            RouteRecord::blank("refused", 0.0, "cache_aware".into()),
        ];
        let s = RouteSummary::of(&records);
        assert_eq!(s.decisions, 4);
        assert_eq!(s.branches["cached"], 2);
        assert_eq!(s.branches["cold"], 1);
        assert_eq!(s.branches["rotate"], 1);
        assert_eq!(
            s.over_guard, 1,
            "rank 0 with 4 active > 3.0; no threshold is no guard"
        );
        assert_eq!(
            s.line(),
            "4 decisions: 2 cached, 1 cold, 1 rotate; 1 over the guard"
        );
    }
}
