//! Message traces (`--trace-dir DIR`): every actor appends one JSON line per message it sends
//! or receives, and per request milestone (admitted, first token, ...), to
//! `DIR/<actor>[-<rank>].jsonl`. `dpserve trace DIR --rid R` merges the files into one timeline.
//!
//! What a line says is typed in [`crate::trace_event`]; this module only records.
//!
//! Recording never blocks an actor: lines go through a bounded channel to a writer thread with a
//! buffered file; when the channel is full the line is dropped and counted. The writer flushes
//! whenever the channel runs empty (so `dpserve trace` run right after a response sees all of
//! it) and at least every [`FLUSH_EVERY`] under a steady stream. Disabled tracing is one branch
//! per call.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use crate::messages::{Message, TokenOut};
use crate::trace_event::MessageSeen;
pub use crate::trace_event::{Milestone, TraceEvent, TraceLine};

/// Lines buffered between an actor and its writer thread.
const QUEUE: usize = 65_536;
/// The writer flushes at least this often while lines arrive without a pause.
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// `--trace-max-mb` when not given: a trace file past this size is rotated (see
/// [`MessageTracer::open_capped`]).
pub const DEFAULT_TRACE_MAX_MB: u64 = 512;

/// Handle an actor records through; cheap to clone.
#[derive(Clone, Default)]
pub struct MessageTracer {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tx: Option<SyncSender<TraceLine>>,
    writer: Option<std::thread::JoinHandle<()>>,
    actor: String,
    rank: Option<u32>,
    dropped: AtomicU64,
}

impl MessageTracer {
    /// A tracer that records nothing.
    pub fn disabled() -> Self {
        MessageTracer { inner: None }
    }

    /// Trace into `dir/<actor>[-<rank>].jsonl` (appending), starting the writer thread, with
    /// the default size cap.
    pub fn open(dir: &Path, actor: &str, rank: Option<u32>) -> std::io::Result<Self> {
        Self::open_capped(dir, actor, rank, DEFAULT_TRACE_MAX_MB << 20)
    }

    /// As [`Self::open`]; once the file holds `max_bytes`, it becomes
    /// `<actor>[-<rank>].old.jsonl` (replacing the previous one) and a new file starts, so an
    /// actor's traces never take more than about twice `max_bytes` of disk. `dpserve trace DIR`
    /// reads both.
    pub fn open_capped(
        dir: &Path,
        actor: &str,
        rank: Option<u32>,
        max_bytes: u64,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let stem = match rank {
            Some(r) => format!("{actor}-{r}"),
            None => actor.to_string(),
        };
        let file = TraceFile {
            path: dir.join(format!("{stem}.jsonl")),
            old: dir.join(format!("{stem}.old.jsonl")),
            max_bytes: max_bytes.max(1),
        };
        let out = file.open()?;
        let (tx, rx) = sync_channel::<TraceLine>(QUEUE);
        let writer = std::thread::Builder::new()
            .name("msg-trace".into())
            .spawn(move || write_lines(file, out, rx))?;
        Ok(MessageTracer {
            inner: Some(Arc::new(Inner {
                tx: Some(tx),
                writer: Some(writer),
                actor: actor.to_string(),
                rank,
                dropped: AtomicU64::new(0),
            })),
        })
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// A message sent (`outgoing`) or received, to or from `peer`.
    /// Liveness and load reports (`Heartbeat`, `WorkerStatus`, `ClusterStatus`) are not
    /// traced: they say nothing about one request, and several a second per rank would make a
    /// trace directory grow without bound on an idle deployment.
    pub fn message(&self, outgoing: bool, msg: &Message, peer: &str, bytes: usize) {
        let Some(inner) = &self.inner else {
            return;
        };
        if matches!(
            msg,
            Message::Heartbeat(_) | Message::WorkerStatus(_) | Message::ClusterStatus(_)
        ) {
            return;
        }
        let seen = MessageSeen {
            msg_type: msg.type_name().into(),
            peer: peer.to_string(),
            bytes,
        };
        inner.push(
            msg.rid(),
            if outgoing {
                TraceEvent::Send(seen)
            } else {
                TraceEvent::Recv(seen)
            },
        );
    }

    /// A request milestone inside the actor.
    pub fn milestone(&self, rid: &str, milestone: Milestone) {
        if let Some(inner) = &self.inner {
            inner.push(Some(rid), TraceEvent::Event(milestone));
        }
    }

    /// The milestones an output marks (first token, finished), where this actor sees it.
    pub fn token_out_milestones(&self, out: &TokenOut) {
        if self.inner.is_some() {
            for m in Milestone::of_token_out(out) {
                self.milestone(&out.rid, m);
            }
        }
    }

    /// Lines dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }
}

impl Inner {
    fn push(&self, rid: Option<&str>, event: TraceEvent) {
        let Some(tx) = &self.tx else {
            return;
        };
        let line = TraceLine {
            t: crate::messages::unix_time(),
            actor: self.actor.clone(),
            rank: self.rank,
            rid: rid.map(str::to_string),
            event,
        };
        match tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Where a tracer writes, and when it rotates.
struct TraceFile {
    path: std::path::PathBuf,
    old: std::path::PathBuf,
    max_bytes: u64,
}

impl TraceFile {
    /// The file for appending, with the bytes it already holds.
    fn open(&self) -> std::io::Result<(BufWriter<File>, u64)> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        Ok((BufWriter::new(file), len))
    }

    /// The current file becomes the old one; a new one starts. On failure the writer keeps
    /// appending to what it has (a trace must never stop an actor).
    fn rotate(&self, out: &mut BufWriter<File>, len: &mut u64) {
        let _ = out.flush();
        if std::fs::rename(&self.path, &self.old).is_ok() {
            if let Ok((fresh, fresh_len)) = self.open() {
                *out = fresh;
                *len = fresh_len;
            }
        }
    }
}

fn write_lines(
    file: TraceFile,
    (mut out, mut len): (BufWriter<File>, u64),
    rx: std::sync::mpsc::Receiver<TraceLine>,
) {
    let mut write = |out: &mut BufWriter<File>, line: &TraceLine| {
        if let Ok(json) = serde_json::to_string(line) {
            if len + json.len() as u64 + 1 > file.max_bytes && len > 0 {
                file.rotate(out, &mut len);
            }
            if writeln!(out, "{json}").is_ok() {
                len += json.len() as u64 + 1;
            }
        }
    };
    // Ends when the tracer is dropped (the channel closes).
    while let Ok(line) = rx.recv() {
        write(&mut out, &line);
        // Take what else is queued, then flush once the queue is empty: a reader right after a
        // response sees every line, and a burst still costs one write. A queue that never
        // empties is flushed every FLUSH_EVERY.
        let batch = std::time::Instant::now();
        while batch.elapsed() < FLUSH_EVERY {
            match rx.try_recv() {
                Ok(line) => write(&mut out, &line),
                Err(_) => break,
            }
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the writer after it flushes; wait for it so a process that
        // exits right after still leaves complete lines.
        self.tx = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{Abort, Message};

    #[test]
    fn disabled_tracer_records_nothing() {
        let t = MessageTracer::disabled();
        t.message(true, &Message::Abort(Abort { rid: None }), "x", 3);
        assert!(!t.enabled());
    }

    #[test]
    fn lines_reach_the_file() {
        let dir = std::env::temp_dir().join(format!("dps-trace-{}", std::process::id()));
        {
            let t = MessageTracer::open(&dir, "worker", Some(3)).unwrap();
            t.message(
                false,
                &Message::Abort(Abort {
                    rid: Some("r1".into()),
                }),
                "controller",
                20,
            );
            t.milestone(
                "r1",
                Milestone::Admitted {
                    prefix_hit_tokens: 4,
                    prompt_tokens: 9,
                },
            );
            // The writer flushes when its queue runs empty: the lines are in the file while
            // the tracer is still open.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let path = dir.join("worker-3.jsonl");
            while std::fs::read_to_string(&path).map_or(0, |s| s.lines().count()) < 2 {
                assert!(std::time::Instant::now() < deadline, "lines not flushed");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let text = std::fs::read_to_string(dir.join("worker-3.jsonl")).unwrap();
        let lines: Vec<TraceLine> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].message().unwrap().1.msg_type, "Abort");
        assert_eq!(lines[0].rid.as_deref(), Some("r1"));
        assert_eq!(lines[1].milestone().unwrap().name(), "admitted");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_full_file_rotates_and_the_newest_lines_are_kept() {
        let dir = std::env::temp_dir().join(format!("dps-trace-cap-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let cap = 2000;
        {
            let t = MessageTracer::open_capped(&dir, "controller", None, cap).unwrap();
            for i in 0..100 {
                t.milestone(
                    &format!("r{i}"),
                    Milestone::PrefillChunk {
                        start: i,
                        tokens: 1,
                    },
                );
            }
        } // dropped: the writer flushed and ended
        let lines = |name: &str| -> Vec<TraceLine> {
            std::fs::read_to_string(dir.join(name))
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let (new, old) = (lines("controller.jsonl"), lines("controller.old.jsonl"));
        for name in ["controller.jsonl", "controller.old.jsonl"] {
            let len = std::fs::metadata(dir.join(name)).unwrap().len();
            assert!(len <= cap, "{name} is {len} bytes, over the cap of {cap}");
        }
        assert!(!old.is_empty() && !new.is_empty());
        // The old file ends where the new one starts, and the newest line is the last written.
        let rid = |l: &TraceLine| l.rid.clone().unwrap();
        let last_old: usize = rid(old.last().unwrap())[1..].parse().unwrap();
        let first_new: usize = rid(&new[0])[1..].parse().unwrap();
        assert_eq!(first_new, last_old + 1);
        assert_eq!(rid(new.last().unwrap()), "r99");
        std::fs::remove_dir_all(&dir).ok();
    }
}
