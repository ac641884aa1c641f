//! Lock-step simulated ranks (`--sim-lock-step`): every rank's step waits for the slowest step
//! of the round it joins, as data-parallel attention makes GPUs do. Under DP attention the
//! attention layers run per rank but the MoE/MLP layers are one collective over all ranks, so a
//! forward pass ends on every rank together: one rank's 100 ms prefill holds the others'
//! 10 ms decode steps for 100 ms (SGLang PR #31170 measured its routing on such ranks).
//!
//! The ranks of one cluster share a small state file (the same path on every rank, derived
//! from the controller's worker address) holding the latest **round**: its id, start and end
//! in nanoseconds of the host's wall clock. Updates happen under an exclusive `flock` on the
//! file; the file is tiny and on the host's temporary directory, so a step costs a few
//! system calls. A rank that is ready to step with modelled duration `d`:
//!
//! - joins the latest round if it started at most [`JOIN_WINDOW`] ago (the gap between a
//!   collective's end and the next step's launch on every rank: a rank whose scheduler is
//!   ready inside it makes the same forward pass), extending its end to `now + d` if later;
//! - otherwise opens the next round, starting when the latest one ends (a collective in
//!   flight cannot be joined) or now if it already has, and ending `d` after its start;
//!
//! then sleeps until its round's end, re-reading it (a later joiner may extend the round; once
//! a newer round exists, this one is final). Idle ranks take no part, which is what SGLang's
//! idle batches amount to: they add no time to a round.
//!
//! One host only (the clock and the file are the host's); a stale file from an earlier
//! cluster holds a round that ended long ago, which no rank joins.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How late after a round's start a rank may still join it.
pub const JOIN_WINDOW: Duration = Duration::from_millis(2);

/// The shared round: id, start, end (ns since the Unix epoch), little-endian.
const STATE_BYTES: usize = 24;

/// One round of lock-step steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Round {
    id: u64,
    start: u64,
    end: u64,
}

impl Round {
    fn decode(b: &[u8; STATE_BYTES]) -> Round {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Round {
            id: word(0),
            start: word(1),
            end: word(2),
        }
    }

    fn encode(self) -> [u8; STATE_BYTES] {
        let mut b = [0u8; STATE_BYTES];
        b[..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.start.to_le_bytes());
        b[16..].copy_from_slice(&self.end.to_le_bytes());
        b
    }

    /// The round a step of `d_ns` ready at `now` takes part in, given the latest one.
    fn join(self, now: u64, d_ns: u64, window_ns: u64) -> Round {
        if self.id > 0 && now <= self.start.saturating_add(window_ns) {
            Round {
                end: self.end.max(now.saturating_add(d_ns)),
                ..self
            }
        } else {
            let start = now.max(self.end);
            Round {
                id: self.id + 1,
                start,
                end: start.saturating_add(d_ns),
            }
        }
    }
}

/// A rank's handle on its cluster's lock-step state.
#[derive(Debug)]
pub struct LockStep {
    file: File,
    path: PathBuf,
    window: Duration,
}

impl LockStep {
    /// The state file the ranks connecting to `worker_addr` share.
    pub fn path_for(worker_addr: &str) -> PathBuf {
        // FNV-1a: stable across processes and builds (std's hasher is not).
        let hash = protocol::hash::fnv1a64(worker_addr.as_bytes());
        std::env::temp_dir().join(format!("dpserve-sim-lockstep-{hash:016x}"))
    }

    /// Opens (creating if absent) the state file at `path`.
    pub fn open(path: &Path) -> io::Result<LockStep> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(LockStep {
            file,
            path: path.to_path_buf(),
            window: JOIN_WINDOW,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes part in a round with a step of `d` starting now; returns when the round ends.
    pub fn step(&self, d: Duration) -> io::Result<()> {
        let d_ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let window_ns = u64::try_from(self.window.as_nanos()).unwrap_or(u64::MAX);
        self.file.lock()?;
        let joined = self
            .read()
            .map(|latest| latest.join(now_ns(), d_ns, window_ns));
        let written = joined.and_then(|round| self.write(round).map(|()| round));
        self.file.unlock()?;
        let mut round = written?;
        loop {
            let now = now_ns();
            if now < round.end {
                std::thread::sleep(Duration::from_nanos(round.end - now));
            }
            self.file.lock_shared()?;
            let latest = self.read();
            self.file.unlock()?;
            let latest = latest?;
            // A newer round means this one is final; the same round may have grown.
            if latest.id != round.id || latest.end <= round.end {
                return Ok(());
            }
            round = latest;
        }
    }

    fn read(&self) -> io::Result<Round> {
        let mut b = [0u8; STATE_BYTES];
        match self.file.read_exact_at(&mut b, 0) {
            Ok(()) => Ok(Round::decode(&b)),
            // A new (or truncated) file: no round yet.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Round::default()),
            Err(e) => Err(e),
        }
    }

    fn write(&self, round: Round) -> io::Result<()> {
        self.file.write_all_at(&round.encode(), 0)
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_round_is_joined_inside_the_window_and_queued_behind_otherwise() {
        let first = Round::default().join(100 * MS, 10 * MS, 2 * MS);
        assert_eq!((first.id, first.start, first.end), (1, 100 * MS, 110 * MS));
        // Ready 1 ms after the start with a longer step: the same round, which now ends later.
        let joined = first.join(101 * MS, 30 * MS, 2 * MS);
        assert_eq!(
            (joined.id, joined.start, joined.end),
            (1, 100 * MS, 131 * MS)
        );
        // A shorter step joining does not shorten it.
        assert_eq!(joined.join(102 * MS, MS, 2 * MS).end, 131 * MS);
        // Ready mid-round: the next round starts when this one ends.
        let next = joined.join(120 * MS, 5 * MS, 2 * MS);
        assert_eq!((next.id, next.start, next.end), (2, 131 * MS, 136 * MS));
        // Ready after everything ended: a round of its own, starting now.
        let later = next.join(500 * MS, 5 * MS, 2 * MS);
        assert_eq!((later.id, later.start, later.end), (3, 500 * MS, 505 * MS));
    }

    #[test]
    fn the_state_round_trips_through_its_bytes() {
        let r = Round {
            id: 7,
            start: u64::MAX - 3,
            end: 42,
        };
        assert_eq!(Round::decode(&r.encode()), r);
    }

    #[test]
    fn one_addr_one_file_and_distinct_clusters_apart() {
        let a = LockStep::path_for("tcp://127.0.0.1:5000");
        assert_eq!(a, LockStep::path_for("tcp://127.0.0.1:5000"));
        assert_ne!(a, LockStep::path_for("tcp://127.0.0.1:5001"));
    }

    /// Two ranks, a long step and then a short one while it runs: the short one ends with (or
    /// after) the long one, whether it joined the long step's round or queued behind it.
    #[test]
    fn the_short_step_waits_for_the_long_one() {
        let dir =
            std::env::temp_dir().join(format!("dpserve-lockstep-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state");
        std::fs::remove_file(&path).ok();
        let long = LockStep::open(&path).unwrap();
        let short = LockStep::open(&path).unwrap();
        let started = Instant::now();
        let t = std::thread::spawn(move || long.step(Duration::from_millis(200)));
        while short.read().unwrap().id == 0 {
            std::thread::yield_now();
        }
        short.step(Duration::from_millis(1)).unwrap();
        let short_done = started.elapsed();
        t.join().unwrap().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert!(short_done >= Duration::from_millis(199), "{short_done:?}");
    }
}
