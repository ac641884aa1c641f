//! After a controller restart: the tokenizer sends `Reconcile`, the rids it still waits on, as
//! soon as it sees this controller's first status. Once the running workers have registered
//! again (each `Hello` lists the rids its worker holds), every listed rid that no rank holds is
//! answered with a 503: the old controller took it in and never passed it on (or its frame to
//! the worker died with it), or its rank died while no controller ran. Without this such a
//! request would wait for the tokenizer's request timeout.
//!
//! The order on the tokenizer's socket makes the check exact for what this controller routed:
//! a request sent before the `Reconcile` is routed (or refused) before it is read.

use std::time::{Duration, Instant};

use protocol::Reconcile;

use super::Controller;
use crate::rejoin::REJOIN_SUMMARY_AFTER;

/// A `Reconcile` is answered no sooner than this after it arrived: every running worker
/// heartbeats (every 500 ms by default), is asked to rejoin and says `Hello` within it...
pub const RECONCILE_GRACE: Duration = Duration::from_secs(2);
/// ...and once no rejoin wave is under way, or at the latest after this.
pub const RECONCILE_AT_LATEST: Duration = Duration::from_secs(2 + REJOIN_SUMMARY_AFTER.as_secs());

/// What a lost request is told.
pub const LOST_IN_RESTART: &str =
    "the request was lost when the controller restarted (no worker holds it); retry it";

/// One `Reconcile`, waiting for the workers to register again.
#[derive(Debug)]
pub struct PendingReconcile {
    received: Instant,
    rids: Vec<String>,
}

impl PendingReconcile {
    /// Whether to answer now: past the grace period with no rejoin wave under way, or late.
    fn due(&self, now: Instant, rejoining: bool) -> bool {
        let age = now.duration_since(self.received);
        (age >= RECONCILE_GRACE && !rejoining) || age >= RECONCILE_AT_LATEST
    }
}

impl Controller {
    pub(super) fn on_reconcile(&mut self, reconcile: Reconcile) {
        tracing::info!(
            open_requests = reconcile.rids.len(),
            "the tokenizer lists its open requests (this controller is new to it); those no \
             worker holds will be failed once the workers have registered again"
        );
        self.reconciles.push(PendingReconcile {
            received: Instant::now(),
            rids: reconcile.rids,
        });
    }

    /// Answers every due `Reconcile` (see the module doc).
    pub(super) fn answer_reconciles(&mut self) {
        if self.reconciles.is_empty() {
            return;
        }
        let now = Instant::now();
        let rejoining = self.rejoins.in_wave();
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reconciles)
            .into_iter()
            .partition(|r| r.due(now, rejoining));
        self.reconciles = waiting;
        for reconcile in due {
            let listed = reconcile.rids.len();
            let lost: Vec<String> = reconcile
                .rids
                .into_iter()
                .filter(|rid| !self.ranks.holds(rid) && !self.holds(rid))
                .collect();
            tracing::info!(
                listed,
                lost = lost.len(),
                live = ?self.ranks.ids(),
                "open requests reconciled with the ranks that registered again"
            );
            self.fail_requests(lost, LOST_IN_RESTART.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_after_the_grace_period_once_no_wave_runs_or_late() {
        let t0 = Instant::now();
        let r = PendingReconcile {
            received: t0,
            rids: vec![],
        };
        assert!(!r.due(t0 + Duration::from_millis(500), false));
        assert!(r.due(t0 + RECONCILE_GRACE, false));
        assert!(
            !r.due(t0 + RECONCILE_GRACE, true),
            "workers still rejoining"
        );
        assert!(r.due(t0 + RECONCILE_AT_LATEST, true));
    }
}
