//! Workers asked to say `Hello` again (`Rejoin`): at most one ask per worker process a second,
//! and one log line per wave of asks (a restarted controller asks every running worker at
//! once), instead of one line per heartbeat or status that arrived before the `Hello`.
//!
//! Not the registration itself: that is `ranks::Ranks::hello`.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// At most one `Rejoin` per worker process this often: its heartbeats and statuses (one per
/// step while busy) keep coming until its `Hello` arrives.
pub const REJOIN_EVERY: Duration = Duration::from_secs(1);
/// A wave is reported once every rank asked has registered again and no other was asked for
/// this long (every running worker heartbeats within it, so one restart is one line)...
pub const REJOIN_QUIET: Duration = Duration::from_millis(1500);
/// ...or at the latest this long after its first ask.
pub const REJOIN_SUMMARY_AFTER: Duration = Duration::from_secs(5);

/// One wave of asks, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejoinSummary {
    pub rejoined: BTreeSet<u32>,
    pub not_back: BTreeSet<u32>,
}

#[derive(Debug, Default)]
pub struct Rejoins {
    /// When each worker process (by identity) was last asked.
    asked_at: HashMap<Vec<u8>, Instant>,
    /// Ranks asked in this wave, and those of them that registered again.
    asked: BTreeSet<u32>,
    rejoined: BTreeSet<u32>,
    first_ask: Option<Instant>,
    last_ask: Option<Instant>,
}

impl Rejoins {
    /// Whether to ask worker process `identity` (claiming `rank`) now; records the ask.
    pub fn ask(&mut self, identity: &[u8], rank: u32, now: Instant) -> bool {
        if self
            .asked_at
            .get(identity)
            .is_some_and(|at| now.duration_since(*at) < REJOIN_EVERY)
        {
            return false;
        }
        self.asked_at.insert(identity.to_vec(), now);
        self.asked.insert(rank);
        self.first_ask.get_or_insert(now);
        self.last_ask = Some(now);
        true
    }

    /// Whether `rank` was asked in this wave (its `Hello` is then a rejoin, not a join).
    pub fn was_asked(&self, rank: u32) -> bool {
        self.asked.contains(&rank)
    }

    pub fn rejoined(&mut self, rank: u32) {
        self.rejoined.insert(rank);
    }

    /// Whether a wave is under way (some worker was asked and its wave is not summarised yet).
    pub fn in_wave(&self) -> bool {
        self.first_ask.is_some()
    }

    /// The wave, once it is over; then a new one starts.
    pub fn summary(&mut self, now: Instant) -> Option<RejoinSummary> {
        let first = self.first_ask?;
        let all_back = self.asked.is_subset(&self.rejoined)
            && self
                .last_ask
                .is_some_and(|at| now.duration_since(at) >= REJOIN_QUIET);
        if !all_back && now.duration_since(first) < REJOIN_SUMMARY_AFTER {
            return None;
        }
        let summary = RejoinSummary {
            not_back: self.asked.difference(&self.rejoined).copied().collect(),
            rejoined: std::mem::take(&mut self.rejoined),
        };
        self.asked.clear();
        self.first_ask = None;
        self.last_ask = None;
        self.asked_at
            .retain(|_, at| now.duration_since(*at) < REJOIN_SUMMARY_AFTER);
        Some(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ask_per_process_a_second_and_one_summary_per_wave() {
        let t0 = Instant::now();
        let mut r = Rejoins::default();
        assert!(r.ask(b"rank-0.a", 0, t0));
        // A busy worker's statuses before its Hello arrives: not asked again.
        assert!(!r.ask(b"rank-0.a", 0, t0 + Duration::from_millis(20)));
        assert!(r.ask(b"rank-1.b", 1, t0 + Duration::from_millis(200)));
        assert!(r.was_asked(0) && r.was_asked(1) && !r.was_asked(2));
        r.rejoined(0);
        assert_eq!(r.summary(t0 + Duration::from_millis(300)), None);
        r.rejoined(1);
        // Everyone is back, but another worker may still heartbeat: wait for quiet.
        assert_eq!(r.summary(t0 + Duration::from_millis(400)), None);
        let s = r
            .summary(t0 + Duration::from_millis(1800))
            .expect("summary");
        assert_eq!(s.rejoined, BTreeSet::from([0, 1]));
        assert!(s.not_back.is_empty());
        assert_eq!(
            r.summary(t0 + Duration::from_secs(60)),
            None,
            "one line per wave"
        );
    }

    #[test]
    fn a_worker_that_never_comes_back_is_named_after_the_deadline() {
        let t0 = Instant::now();
        let mut r = Rejoins::default();
        assert!(r.ask(b"rank-3.a", 3, t0));
        assert_eq!(r.summary(t0 + Duration::from_secs(2)), None);
        let s = r.summary(t0 + REJOIN_SUMMARY_AFTER).expect("summary");
        assert_eq!(s.not_back, BTreeSet::from([3]));
        // It may be asked again later, in a new wave.
        assert!(r.ask(b"rank-3.a", 3, t0 + REJOIN_SUMMARY_AFTER));
    }
}
