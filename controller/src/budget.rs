//! The DP budget of one rank: the load the balancers see, built from the rank's last status
//! snapshot plus the controller's own speculative accounting of what it sent since.
//!
//! ```text
//! load = applied snapshot (running + waiting, used tokens)
//!      + speculative dispatches the snapshot does not count
//! on dispatch  : add (rid, tokens, seq, sent_at) to speculative; seq numbers the dispatches
//!                to this rank (GenerateReq.dispatch_seq)
//! on finished  : remove rid from speculative (the request is gone, whatever the snapshot says)
//! on status    : skip if older than the newest held (by the worker's status counter,
//!                status_seq; by its timestamp from a worker without one); else hold it as
//!                pending, and apply it only if the last apply was ≥ 20 ms ago (refresh()
//!                applies it later otherwise)
//! on apply     : the snapshot says the last dispatch it took in (taken_seq): it counts every
//!                entry up to that number and none after, so exactly those are dropped.
//!                From a worker that does not report it (taken_seq null): drop entries sent before
//!                the snapshot's timestamp and any older than SPECULATIVE_MAX_AGE. Either way
//!                an entry older than SPECULATIVE_UNTAKEN_MAX_AGE goes: a dispatch the rank's
//!                statuses never take in (it cannot, short of a lost frame) is not load forever.
//! prefill backlog = the snapshot's (PrefillStatus.backlog_tokens) + the uncached prompt tokens
//!                   of the speculative dispatches
//! prefill rate    = Δ computed_tokens / Δ busy_seconds between applied snapshots, smoothed
//!                   over about RATE_WINDOW of prefill time (exponentially weighted)
//! ```
//! The backlog and rate feed `cache_aware`'s time cost; a worker that does not report
//! `prefill` has neither (the balancer then counts tokens, as if every rank were as fast).
//!
//! Without the speculative part, a burst arriving between two snapshots would see the same
//! loads for every request and herd onto one rank. Judging by dispatch numbers rather than
//! clocks matters during long steps: a request sent while the worker computes waits in its
//! channel, and a status taken after the step (later than the send) does not count it yet.
//!
//! Cost: O(1) per dispatch and finished rid; O(speculative entries) per applied snapshot.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use protocol::{PrefillStatus, WorkerStatus};

use crate::policy::RankQueue;

/// Snapshots are applied at most this often per rank; newer ones wait as `pending`.
pub const STATUS_REFRESH: Duration = Duration::from_millis(20);

/// A speculative entry older than this is assumed counted by any later snapshot, even if the
/// worker's clock says otherwise.
pub const SPECULATIVE_MAX_AGE: Duration = Duration::from_secs(1);

/// A numbered speculative entry still untaken this long after its dispatch is dropped by the
/// next applied snapshot. A worker takes in what arrived between two steps, so a dispatch waits
/// at most one step (a prefill step is bounded by `--prefill-step-target-ms`, 500 ms by
/// default); this is the bound in time for an entry whose frame the rank never read.
pub const SPECULATIVE_UNTAKEN_MAX_AGE: Duration = Duration::from_secs(30);

/// The prefill time over which a rank's measured speed is averaged: long enough to smooth one
/// step's noise, short enough to follow a rank that slows down (longer contexts, a busy host).
pub const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Prefill time a rate sample must cover before it is used (shorter ones are accumulated).
const RATE_MIN_SAMPLE: Duration = Duration::from_millis(20);

/// When a status was taken, as far as ordering goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatusStamp {
    /// `WorkerStatus.status_seq`: counts the statuses of one worker process.
    pub seq: Option<u64>,
    /// The worker's wall clock (unix seconds).
    pub timestamp: f64,
}

impl StatusStamp {
    pub fn of(status: &WorkerStatus) -> Self {
        StatusStamp {
            seq: status.status_seq,
            timestamp: status.timestamp,
        }
    }

    /// Whether this status was taken before `other`'s. By the status counter when both carry
    /// one: the worker's clock may step back (NTP, a VM resumed), and judged by it every
    /// fresh status would look stale and freeze the rank's load until the clock caught up.
    /// By the timestamps for workers that predate the counter.
    pub fn before(self, other: StatusStamp) -> bool {
        match (self.seq, other.seq) {
            (Some(a), Some(b)) => a < b,
            _ => self.timestamp < other.timestamp,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Snapshot {
    stamp: StatusStamp,
    requests: u64,
    tokens: u64,
    /// The split of `requests`, and the rank's KV capacity (for [`RankBudget::queue`]).
    running: u64,
    waiting: u64,
    max_total_tokens: u64,
    /// The last dispatch it counts (0: none yet); `None` from a worker that does not say.
    taken_seq: Option<u64>,
    /// Its prefill line and totals; `None` from a worker that does not report them.
    prefill: Option<PrefillStatus>,
}

#[derive(Debug, Clone, Copy)]
struct Speculative {
    tokens: u64,
    /// The prompt tokens the rank will compute for it (what it does not hold cached).
    prefill_tokens: u64,
    /// This dispatch's number (0: unnumbered).
    seq: u64,
    /// Controller wall clock (unix seconds), compared with the worker's snapshot timestamp.
    sent_unix: f64,
    sent_at: Instant,
}

/// What happened to a status snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOutcome {
    Applied,
    /// Newer than what is held, but within [`STATUS_REFRESH`] of the last apply.
    Deferred,
    /// Older than a snapshot already held; only its finished rids were used.
    Stale,
}

#[derive(Debug, Default)]
pub struct RankBudget {
    applied: Option<Snapshot>,
    applied_at: Option<Instant>,
    pending: Option<Snapshot>,
    speculative: HashMap<String, Speculative>,
    speculative_tokens: u64,
    speculative_prefill: u64,
    /// The measured prefill speed (tokens per second of prefill step), once measured.
    prefill_rate: Option<f64>,
    /// The totals the rate was last updated from (computed tokens, busy seconds).
    rate_base: Option<(u64, f64)>,
}

impl RankBudget {
    /// A request was sent to this rank: `tokens` of KV at most (prompt and output), of which
    /// `prefill_tokens` prompt tokens to compute.
    pub fn on_dispatch(
        &mut self,
        rid: &str,
        tokens: u64,
        prefill_tokens: u64,
        seq: u64,
        now: Instant,
        now_unix: f64,
    ) {
        let entry = Speculative {
            tokens,
            prefill_tokens,
            seq,
            sent_unix: now_unix,
            sent_at: now,
        };
        if let Some(old) = self.speculative.insert(rid.to_string(), entry) {
            // A duplicate rid replaces its earlier entry rather than counting twice.
            self.speculative_tokens -= old.tokens;
            self.speculative_prefill -= old.prefill_tokens;
        }
        self.speculative_tokens += tokens;
        self.speculative_prefill += prefill_tokens;
    }

    /// A request ended on this rank.
    pub fn on_finished(&mut self, rid: &str) {
        if let Some(old) = self.speculative.remove(rid) {
            self.speculative_tokens -= old.tokens;
            self.speculative_prefill -= old.prefill_tokens;
        }
    }

    /// A status snapshot arrived.
    pub fn on_status(&mut self, status: &WorkerStatus, now: Instant) -> StatusOutcome {
        for rid in &status.finished_rids {
            self.on_finished(rid);
        }
        let stamp = StatusStamp::of(status);
        let newest = self.pending.or(self.applied).map(|s| s.stamp);
        if newest.is_some_and(|held| stamp.before(held)) {
            return StatusOutcome::Stale;
        }
        self.pending = Some(Snapshot {
            stamp,
            requests: u64::from(status.num_running_reqs) + u64::from(status.num_waiting_reqs),
            tokens: status.num_used_tokens,
            running: u64::from(status.num_running_reqs),
            waiting: u64::from(status.num_waiting_reqs),
            max_total_tokens: status.max_total_tokens,
            taken_seq: status.taken_seq,
            prefill: status.prefill,
        });
        if self.refresh(now) {
            StatusOutcome::Applied
        } else {
            StatusOutcome::Deferred
        }
    }

    /// Apply a pending snapshot if the last apply is at least [`STATUS_REFRESH`] old.
    pub fn refresh(&mut self, now: Instant) -> bool {
        let due = match self.applied_at {
            Some(t) => now.saturating_duration_since(t) >= STATUS_REFRESH,
            None => true,
        };
        let Some(snap) = self.pending.filter(|_| due) else {
            return false;
        };
        self.pending = None;
        self.applied = Some(snap);
        self.applied_at = Some(now);
        if let Some(p) = snap.prefill {
            self.measure_rate(p);
        }
        self.speculative.retain(|_, s| {
            if let (Some(taken), true) = (snap.taken_seq, s.seq > 0) {
                s.seq > taken
                    && now.saturating_duration_since(s.sent_at) < SPECULATIVE_UNTAKEN_MAX_AGE
            } else {
                s.sent_unix > snap.stamp.timestamp
                    && now.saturating_duration_since(s.sent_at) < SPECULATIVE_MAX_AGE
            }
        });
        self.speculative_tokens = self.speculative.values().map(|s| s.tokens).sum();
        self.speculative_prefill = self.speculative.values().map(|s| s.prefill_tokens).sum();
        true
    }

    /// Folds the prefill totals of an applied snapshot into the measured speed.
    fn measure_rate(&mut self, p: PrefillStatus) {
        let Some((tokens, seconds)) = self.rate_base else {
            self.rate_base = Some((p.computed_tokens, p.busy_seconds));
            return;
        };
        if p.computed_tokens < tokens || p.busy_seconds < seconds {
            // Totals went back: a new worker process holds the rank. Measure afresh.
            self.rate_base = Some((p.computed_tokens, p.busy_seconds));
            return;
        }
        let dt = p.busy_seconds - seconds;
        if dt < RATE_MIN_SAMPLE.as_secs_f64() {
            return; // accumulate until the sample is long enough
        }
        let sample = (p.computed_tokens - tokens) as f64 / dt;
        let w = (dt / RATE_WINDOW.as_secs_f64()).min(1.0);
        self.prefill_rate = Some(match self.prefill_rate {
            Some(rate) => rate + w * (sample - rate),
            None => sample,
        });
        self.rate_base = Some((p.computed_tokens, p.busy_seconds));
    }

    /// (active requests, active tokens) as the balancers see them.
    pub fn load(&self) -> (u64, u64) {
        let (reqs, tokens) = self.applied.map_or((0, 0), |s| (s.requests, s.tokens));
        (
            reqs + self.speculative.len() as u64,
            tokens + self.speculative_tokens,
        )
    }

    /// The split of [`RankBudget::load`]'s requests into running and waiting, the speculative
    /// dispatches counted as waiting (the rank has not reported taking them in), and the
    /// rank's KV capacity.
    pub fn queue(&self, rank: u32) -> RankQueue {
        let (running, waiting, max_total_tokens) = self
            .applied
            .map_or((0, 0, 0), |s| (s.running, s.waiting, s.max_total_tokens));
        RankQueue {
            rank,
            running_requests: running,
            waiting_requests: waiting + self.speculative.len() as u64,
            max_total_tokens,
            prefill_backlog_tokens: self
                .applied
                .and_then(|s| s.prefill)
                .map(|p| p.backlog_tokens + self.speculative_prefill),
            prefill_rate: self.prefill_rate,
            // The ranks' in-flight ledger knows the requests' lengths, and `Hello` the bound
            // (`Ranks::rank_set`).
            stall_tpot: 0.0,
            finish_first_tokens: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(timestamp: f64, running: u32, tokens: u64, finished: &[&str]) -> WorkerStatus {
        WorkerStatus {
            rank: 0,
            timestamp,
            num_running_reqs: running,
            num_used_tokens: tokens,
            finished_rids: finished.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_burst_between_snapshots_is_counted_speculatively() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        for i in 0..5 {
            b.on_dispatch(&format!("r{i}"), 10, 0, 0, t0, 100.0);
        }
        assert_eq!(b.load(), (5, 50));
    }

    #[test]
    fn a_snapshot_replaces_what_it_already_counts_and_keeps_what_came_after() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        b.on_dispatch("early", 10, 0, 0, t0, 100.0);
        b.on_dispatch("late", 7, 0, 0, t0, 100.5);
        // Taken at 100.2: it includes "early" but cannot include "late".
        assert_eq!(
            b.on_status(&status(100.2, 1, 10, &[]), t0),
            StatusOutcome::Applied
        );
        assert_eq!(b.load(), (2, 17));
    }

    #[test]
    fn finished_rids_decrement_at_once() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        b.on_status(&status(100.0, 0, 0, &[]), t0);
        b.on_dispatch("x", 10, 0, 0, t0, 101.0);
        b.on_dispatch("y", 5, 0, 0, t0, 101.0);
        // Within the refresh window: the snapshot waits, but the finished rid counts now.
        let t1 = t0 + Duration::from_millis(5);
        assert_eq!(
            b.on_status(&status(101.5, 1, 5, &["x"]), t1),
            StatusOutcome::Deferred
        );
        assert_eq!(b.load(), (1, 5));
        b.on_finished("never-sent");
        assert_eq!(b.load(), (1, 5));
    }

    #[test]
    fn snapshots_apply_at_most_every_20_ms() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        assert_eq!(
            b.on_status(&status(1.0, 3, 0, &[]), t0),
            StatusOutcome::Applied
        );
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(
            b.on_status(&status(1.01, 4, 0, &[]), t1),
            StatusOutcome::Deferred
        );
        assert_eq!(b.load().0, 3);
        assert!(!b.refresh(t0 + Duration::from_millis(19)));
        assert!(b.refresh(t0 + Duration::from_millis(20)));
        assert_eq!(b.load().0, 4);
    }

    #[test]
    fn stale_snapshots_are_skipped() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        b.on_status(&status(5.0, 3, 30, &[]), t0);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            b.on_status(&status(4.0, 9, 90, &[]), later),
            StatusOutcome::Stale
        );
        assert_eq!(b.load(), (3, 30));
    }

    fn numbered(timestamp: f64, running: u32, taken_seq: u64, finished: &[&str]) -> WorkerStatus {
        WorkerStatus {
            taken_seq: Some(taken_seq),
            ..status(timestamp, running, 0, finished)
        }
    }

    #[test]
    fn a_status_counts_exactly_the_dispatches_it_took_in() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        for (i, rid) in ["a", "b", "c"].into_iter().enumerate() {
            b.on_dispatch(rid, 10, 0, i as u64 + 1, t0, 100.0);
        }
        // Taken after all three were sent (a long step), but the worker had only taken in "a":
        // by timestamps all three would be dropped and the rank would look idle but for one.
        b.on_status(&numbered(105.0, 1, 1, &[]), t0);
        assert_eq!(b.load().0, 3);
        b.on_status(&numbered(106.0, 3, 3, &[]), t0 + STATUS_REFRESH);
        assert_eq!(b.load().0, 3, "now the snapshot counts them all");
    }

    #[test]
    fn a_dispatch_the_rank_never_takes_in_stops_counting_after_its_bound() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        b.on_dispatch("lost", 10, 0, 1, t0, 100.0);
        // Statuses keep coming, none takes dispatch 1 in (its frame was never read).
        let mut now = t0;
        for i in 1..=3 {
            now += SPECULATIVE_UNTAKEN_MAX_AGE / 4;
            b.on_status(&numbered(100.0 + f64::from(i), 0, 0, &[]), now);
            assert_eq!(b.load(), (1, 10), "still within its bound");
        }
        now = t0 + SPECULATIVE_UNTAKEN_MAX_AGE;
        b.on_status(&numbered(110.0, 0, 0, &[]), now);
        assert_eq!(b.load(), (0, 0));
    }

    proptest::proptest! {
        /// A rank's worker as a queue (dispatched, not yet taken in) and a held set; any
        /// interleaving of dispatches, take-ins, finishes and statuses (some arriving within
        /// the refresh interval, so deferred). The controller's view never falls below what the
        /// rank holds, queued or taken in.
        #[test]
        fn the_view_never_falls_below_what_the_rank_holds(
            ops in proptest::collection::vec((0u8..4, 0u64..30), 1..200)
        ) {
            let mut b = RankBudget::default();
            let t0 = Instant::now();
            let mut now = t0;
            let (mut seq, mut taken) = (0u64, 0u64);
            let mut channel = std::collections::VecDeque::new();
            let mut held: Vec<String> = Vec::new();
            let mut finished: Vec<String> = Vec::new();
            for (op, arg) in ops {
                now += Duration::from_millis(arg);
                match op {
                    0 => {
                        seq += 1;
                        let rid = format!("r{seq}");
                        b.on_dispatch(&rid, 1, 0, seq, now, 0.0);
                        channel.push_back((rid, seq));
                    }
                    1 => {
                        if let Some((rid, s)) = channel.pop_front() {
                            held.push(rid);
                            taken = s;
                        }
                    }
                    2 => {
                        if !held.is_empty() {
                            finished.push(held.remove(arg as usize % held.len()));
                        }
                    }
                    _ => {
                        let done: Vec<&str> = finished.iter().map(String::as_str).collect();
                        let st = numbered(
                            now.duration_since(t0).as_secs_f64(),
                            held.len() as u32,
                            taken,
                            &done,
                        );
                        b.on_status(&st, now);
                        finished.clear();
                    }
                }
                b.refresh(now);
                let holds = (held.len() + channel.len()) as u64;
                proptest::prop_assert!(b.load().0 >= holds, "view {:?} < holds {holds}", b.load());
            }
        }
    }

    fn sequenced(status_seq: u64, timestamp: f64, running: u32) -> WorkerStatus {
        WorkerStatus {
            status_seq: Some(status_seq),
            ..status(timestamp, running, 0, &[])
        }
    }

    #[test]
    fn statuses_are_ordered_by_their_counter_not_the_worker_clock() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        b.on_status(&sequenced(1, 1000.0, 5), t0);
        // The worker's clock steps back an hour: its next status is still the newest.
        let t1 = t0 + STATUS_REFRESH;
        assert_eq!(
            b.on_status(&sequenced(2, 1000.0 - 3600.0, 0), t1),
            StatusOutcome::Applied
        );
        assert_eq!(b.load().0, 0, "an idle rank is seen idle");
        // One that really is older (a lower number) is skipped, whatever its clock says.
        assert_eq!(
            b.on_status(&sequenced(1, 5000.0, 9), t1 + STATUS_REFRESH),
            StatusOutcome::Stale
        );
        assert_eq!(b.load().0, 0);
    }

    #[test]
    fn old_speculative_entries_expire_even_if_the_worker_clock_lags() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        // The controller's clock is an hour ahead of the worker's.
        b.on_dispatch("x", 10, 0, 0, t0, 3600.0 + 10.0);
        b.on_status(&status(11.0, 1, 10, &[]), t0 + Duration::from_millis(100));
        assert_eq!(
            b.load(),
            (2, 20),
            "young entry kept: the snapshot looks older"
        );
        b.on_status(&status(12.0, 1, 10, &[]), t0 + SPECULATIVE_MAX_AGE);
        assert_eq!(b.load(), (1, 10));
    }

    /// A numbered status reporting this prefill line and these totals.
    fn with_prefill(seq: u64, taken: u64, backlog: u64, tokens: u64, seconds: f64) -> WorkerStatus {
        WorkerStatus {
            status_seq: Some(seq),
            timestamp: seq as f64,
            taken_seq: Some(taken),
            prefill: Some(PrefillStatus {
                backlog_tokens: backlog,
                computed_tokens: tokens,
                busy_seconds: seconds,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_prefill_rate_is_measured_from_the_totals_and_follows_a_change() {
        let mut b = RankBudget::default();
        let mut now = Instant::now();
        assert_eq!(b.queue(0).prefill_rate, None);
        let mut status = |b: &mut RankBudget, seq: u64, tokens: u64, seconds: f64| {
            now += STATUS_REFRESH;
            b.on_status(&with_prefill(seq, 0, 0, tokens, seconds), now);
        };
        status(&mut b, 1, 0, 0.0);
        assert_eq!(b.queue(0).prefill_rate, None, "one total is no rate yet");
        status(&mut b, 2, 1000, 0.5);
        assert_eq!(b.queue(0).prefill_rate, Some(2000.0));
        // Samples under RATE_MIN_SAMPLE of prefill time accumulate.
        status(&mut b, 3, 1001, 0.501);
        assert_eq!(b.queue(0).prefill_rate, Some(2000.0));
        // The rank slows to 1000 tokens/s: a whole window of it moves the rate there.
        status(&mut b, 4, 1001 + 2000, 2.501);
        let rate = b.queue(0).prefill_rate.unwrap();
        assert!((rate - 1000.0).abs() < 1.0, "{rate}");
        // A quarter of a window at 3000 tokens/s moves it a quarter of the way there.
        status(&mut b, 5, 3001 + 1500, 3.001);
        let half = b.queue(0).prefill_rate.unwrap();
        assert!((half - 1500.0).abs() < 1.0, "{half}");
        // Totals that go back (a new process) start a fresh measurement, keeping the rate.
        status(&mut b, 6, 10, 0.01);
        assert_eq!(b.queue(0).prefill_rate, Some(half));
        status(&mut b, 7, 10 + 4000, 1.01);
        let fresh = b.queue(0).prefill_rate.unwrap();
        assert!(fresh > half && fresh < 4000.0, "{fresh}");
    }

    #[test]
    fn the_backlog_is_the_status_line_plus_what_was_sent_since() {
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        assert_eq!(b.queue(0).prefill_backlog_tokens, None, "no status yet");
        b.on_dispatch("a", 110, 100, 1, t0, 0.0);
        b.on_dispatch("b", 60, 50, 2, t0, 0.0);
        // The status took in "a" (its 100 are in the backlog it reports), not "b".
        b.on_status(&with_prefill(1, 1, 300, 0, 0.0), t0);
        assert_eq!(b.queue(0).prefill_backlog_tokens, Some(350));
        b.on_finished("b");
        assert_eq!(b.queue(0).prefill_backlog_tokens, Some(300));
        // A worker that does not report its line has none.
        let mut old = RankBudget::default();
        old.on_status(&numbered(1.0, 0, 0, &[]), t0);
        assert_eq!(old.queue(0).prefill_backlog_tokens, None);
    }
}
