//! Writing the routing trace: one JSON line per routing decision, off the controller thread.
//!
//! The controller only builds a [`RouteRecord`] ([`route_record`]) and hands it to a bounded
//! channel with `try_send`; a writer thread serialises, buffers and flushes it (whenever the
//! channel runs empty, at least every [`FLUSH_INTERVAL`] under a steady stream, and on exit). A
//! full channel drops the record and counts it, so a slow disk can never stall routing.
//!
//! Not here: the record type itself (`protocol::route_record`, shared with the readers), message
//! traces (`--trace-dir`, written by `protocol::msg_trace`), and reading any trace back: reports,
//! timelines and pictures are the `trace-tools` crate's, used by `dpserve trace`.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use protocol::route_record::RouteRecord;

use crate::error::{Error, Result};
use crate::policy::{KeySource, Method, RankSet, RouteDecision};
use crate::router::RouteError;

/// Records waiting for the writer before new ones are dropped.
pub const CHANNEL_CAPACITY: usize = 65_536;
/// The writer flushes at least this often while records arrive without a pause.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(200);

/// How far the chosen rank was ahead of the best other one by the method's per-rank measure
/// (lower is better; negative: a guard overruled the measure); `None` without one or without
/// another rank.
fn margin(d: &RouteDecision) -> Option<f64> {
    let measures: Vec<(u32, f64)> = if !d.costs.is_empty() {
        d.costs.iter().map(|c| (c.rank, c.cost)).collect()
    } else {
        d.scores
            .iter()
            .map(|s| Some((s.rank(), s.lower_is_better()?)))
            .collect::<Option<_>>()?
    };
    let chosen = measures.iter().find(|(r, _)| *r == d.rank)?.1;
    let best_other = measures
        .iter()
        .filter(|(r, _)| *r != d.rank)
        .map(|(_, m)| *m)
        .min_by(f64::total_cmp)?;
    Some(best_other - chosen)
}

/// The record of `rid`'s routing decision by `method` over `ranks` (or of its refusal).
pub fn route_record(
    rid: &str,
    time: f64,
    method: Method,
    ranks: &RankSet,
    result: &std::result::Result<RouteDecision, RouteError>,
) -> RouteRecord {
    let mut rec = RouteRecord {
        loads: ranks.loads().to_vec(),
        ..RouteRecord::blank(rid, time, method.to_string())
    };
    match result {
        Ok(d) => {
            rec.key_source = d.key_source;
            rec.key_digest = d.key_digest.map(|k| format!("{k:016x}"));
            rec.hrw_order = d.hrw_order.clone();
            rec.threshold = d.threshold;
            rec.rank = Some(d.rank);
            rec.branch = Some(d.branch);
            rec.fallback = d.fallback.map(|m| m.to_string());
            rec.costs.clone_from(&d.costs);
            rec.scores.clone_from(&d.scores);
            rec.margin = margin(d);
        }
        Err(e) => {
            if matches!(e, RouteError::UnknownRank { .. }) {
                rec.key_source = KeySource::Explicit;
            }
            rec.error = Some(e.to_string());
        }
    }
    rec
}

/// Appends records to a file from a background thread. Dropping it flushes and joins.
#[derive(Debug)]
pub struct TraceWriter {
    tx: Option<SyncSender<RouteRecord>>,
    thread: Option<JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
    path: PathBuf,
}

impl TraceWriter {
    /// Open `path` for appending (a restarted controller adds to the same history).
    pub fn create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|error| Error::TraceFile {
                path: path.to_path_buf(),
                error,
            })?;
        let (tx, rx) = mpsc::sync_channel(CHANNEL_CAPACITY);
        let out = BufWriter::with_capacity(1 << 16, file);
        let shown = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("route-trace".into())
            .spawn(move || write_loop(rx, out, &shown))
            .map_err(|error| Error::TraceFile {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(TraceWriter {
            tx: Some(tx),
            thread: Some(thread),
            dropped: Arc::new(AtomicU64::new(0)),
            path: path.to_path_buf(),
        })
    }

    /// Queue a record; never blocks. Returns false when it was dropped.
    pub fn record(&self, rec: RouteRecord) -> bool {
        let Some(tx) = &self.tx else { return false };
        match tx.try_send(rec) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Records dropped because the writer fell behind (or died).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        // Closing the channel makes the writer drain what is queued, flush and exit.
        self.tx = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!(path = %self.path.display(), "route trace writer panicked");
            }
        }
        let dropped = self.dropped();
        if dropped > 0 {
            tracing::warn!(path = %self.path.display(), dropped, "route trace records dropped (writer fell behind)");
        }
    }
}

fn write_loop(rx: Receiver<RouteRecord>, mut out: impl Write, path: &str) {
    let mut failed = false;
    let mut report = |what: &str, e: std::io::Error| {
        // Log once: a full disk would otherwise flood the log with one line per request.
        if !failed {
            tracing::error!(path, %e, "{what} route trace failed");
            failed = true;
        }
    };
    let write = |out: &mut dyn Write, rec: &RouteRecord| {
        serde_json::to_writer(&mut *out, rec)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
    };
    // Ends when the writer is dropped (the channel closes).
    while let Ok(rec) = rx.recv() {
        let batch = Instant::now();
        let mut res = write(&mut out, &rec);
        // Take what else is queued, then flush once the queue is empty, so `dpserve trace`
        // run right after a response sees its decision; a queue that never empties is
        // flushed every FLUSH_INTERVAL.
        while res.is_ok() && batch.elapsed() < FLUSH_INTERVAL {
            match rx.try_recv() {
                Ok(rec) => res = write(&mut out, &rec),
                Err(_) => break,
            }
        }
        if let Err(e) = res {
            report("writing", e);
        }
        if let Err(e) = out.flush() {
            report("flushing", e);
        }
    }
    if let Err(e) = out.flush() {
        tracing::error!(path, %e, "flushing route trace failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Branch;

    fn decision() -> RouteDecision {
        RouteDecision {
            rank: 2,
            branch: Branch::Spill,
            key_source: KeySource::RoutingKey,
            key_digest: Some(0xabc),
            hrw_order: vec![1, 2, 0],
            threshold: Some(1.5),
            fallback: None,
            costs: Vec::new(),
            scores: Vec::new(),
            cached_tokens: None,
        }
    }

    #[test]
    fn records_round_trip_through_json() {
        let ranks = RankSet::idle(&[0, 1, 2]);
        let rec = route_record("r1", 10.0, Method::PrefixAffinity, &ranks, &Ok(decision()));
        assert_eq!(rec.key_digest.as_deref(), Some("0000000000000abc"));
        let line = serde_json::to_string(&rec).unwrap();
        assert!(
            line.contains(r#""branch":"spill""#) && line.contains(r#""key_source":"routing_key""#)
        );
        assert_eq!(serde_json::from_str::<RouteRecord>(&line).unwrap(), rec);
    }

    #[test]
    fn the_margin_is_the_runner_up_s_measure_less_the_chosen_s() {
        use protocol::trace_event::{RankCost, RankScore};
        let ranks = RankSet::idle(&[0, 1, 2]);
        let cost = |rank, cost| RankCost {
            rank,
            matched_tokens: 0,
            prefill_tokens: 0,
            load_cost: 0.0,
            cost,
            backlog_tokens: None,
            prefill_rate: None,
            stall_tpot: None,
        };
        // cache_aware: costs, the chosen (2) cheapest by 0.25 s.
        let d = RouteDecision {
            costs: vec![cost(2, 0.5), cost(0, 0.75), cost(1, 2.0)],
            ..decision()
        };
        let rec = route_record("r", 0.0, Method::CacheAware, &ranks, &Ok(d));
        assert_eq!(rec.margin, Some(0.25));
        // llm-d: the highest score wins; rank 2 was overruled by a better rank 0: negative.
        let score = |rank, score| RankScore::LlmdPrefix {
            rank,
            prefix: 0.0,
            queue: 0.0,
            kv_cache: 0.0,
            score,
        };
        let d = RouteDecision {
            scores: vec![score(0, 0.9), score(1, 0.1), score(2, 0.5)],
            ..decision()
        };
        let rec = route_record("r", 0.0, Method::LlmdPrefix, &ranks, &Ok(d));
        assert!(
            (rec.margin.unwrap() + 0.4).abs() < 1e-12,
            "{:?}",
            rec.margin
        );
        // No measure (prefix_affinity), or one rank: none.
        let rec = route_record("r", 0.0, Method::PrefixAffinity, &ranks, &Ok(decision()));
        assert_eq!(rec.margin, None);
        let d = RouteDecision {
            costs: vec![cost(2, 0.5)],
            ..decision()
        };
        assert_eq!(
            route_record("r", 0.0, Method::CacheAware, &ranks, &Ok(d)).margin,
            None
        );
    }

    #[test]
    fn refused_requests_are_recorded_with_their_error() {
        let ranks = RankSet::idle(&[0]);
        let err = RouteError::UnknownRank {
            rank: 4,
            live: vec![0],
        };
        let rec = route_record("r", 0.0, Method::RoundRobin, &ranks, &Err(err));
        assert_eq!((rec.rank, rec.key_source), (None, KeySource::Explicit));
        assert!(rec.error.unwrap().contains("not live"));
    }

    #[test]
    fn the_writer_appends_one_line_per_record_and_flushes_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("route.jsonl");
        let ranks = RankSet::idle(&[0, 1, 2]);
        {
            let w = TraceWriter::create(&path).unwrap();
            for i in 0..100 {
                let rec = route_record(
                    &format!("r{i}"),
                    1.0,
                    Method::PrefixAffinity,
                    &ranks,
                    &Ok(decision()),
                );
                assert!(w.record(rec));
            }
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 100);
        // Reopening appends.
        {
            let w = TraceWriter::create(&path).unwrap();
            w.record(route_record(
                "again",
                2.0,
                Method::PrefixAffinity,
                &ranks,
                &Ok(decision()),
            ));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 101);
        assert!(text.lines().last().unwrap().contains("again"));
    }

    #[test]
    fn a_record_reaches_the_file_while_the_writer_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("route.jsonl");
        let w = TraceWriter::create(&path).unwrap();
        let ranks = RankSet::idle(&[0, 1, 2]);
        w.record(route_record(
            "r1",
            1.0,
            Method::PrefixAffinity,
            &ranks,
            &Ok(decision()),
        ));
        // Flushed because the queue ran empty, not because the writer closed.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&path).map_or(0, |s| s.lines().count()) < 1 {
            assert!(Instant::now() < deadline, "record not flushed");
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(w);
    }

    #[test]
    fn an_unwritable_path_is_a_clear_error() {
        let err = TraceWriter::create(Path::new("/nonexistent-dir/x/route.jsonl")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent-dir/x/route.jsonl"),
            "{err}"
        );
    }
}
