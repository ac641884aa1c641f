//! Message traces (`--trace-dir DIR`): every actor appends one JSON line per message it sends
//! or receives, and per request milestone (admitted, first token, ...), to
//! `DIR/<actor>[-<rank>].jsonl`. `dpserve trace DIR --rid R` merges the files into one timeline.
//!
//! Recording never blocks an actor: lines go through a bounded channel to a writer thread with a
//! buffered file; when the channel is full the line is dropped and counted. Disabled tracing is
//! one branch per call.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Message;

/// Lines buffered between an actor and its writer thread.
const QUEUE: usize = 65_536;
/// The writer flushes at least this often while lines arrive.
const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// One line of a message trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceLine {
    /// Unix seconds.
    pub t: f64,
    pub actor: String,
    #[serde(default)]
    pub rank: Option<u32>,
    /// `send`, `recv` or `event`.
    pub dir: String,
    /// Message type, or the event name (`http_in`, `admitted`, `first_token`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub rid: Option<String>,
    #[serde(default)]
    pub peer: Option<String>,
    #[serde(default)]
    pub bytes: Option<usize>,
    /// Free-form detail of an event (e.g. `cached_tokens=512`).
    #[serde(default)]
    pub detail: Option<String>,
}

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

    /// Trace into `dir/<actor>[-<rank>].jsonl` (appending), starting the writer thread.
    pub fn open(dir: &Path, actor: &str, rank: Option<u32>) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let name = match rank {
            Some(r) => format!("{actor}-{r}.jsonl"),
            None => format!("{actor}.jsonl"),
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(name))?;
        let (tx, rx) = sync_channel::<TraceLine>(QUEUE);
        let writer = std::thread::Builder::new()
            .name("msg-trace".into())
            .spawn(move || write_lines(file, rx))?;
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
        inner.push(TraceLine {
            t: crate::unix_time(),
            actor: inner.actor.clone(),
            rank: inner.rank,
            dir: if outgoing { "send" } else { "recv" }.into(),
            kind: msg.type_name().into(),
            rid: msg.rid().map(str::to_string),
            peer: Some(peer.to_string()),
            bytes: Some(bytes),
            detail: None,
        });
    }

    /// A request milestone inside the actor.
    pub fn event(&self, name: &str, rid: &str, detail: Option<String>) {
        let Some(inner) = &self.inner else {
            return;
        };
        inner.push(TraceLine {
            t: crate::unix_time(),
            actor: inner.actor.clone(),
            rank: inner.rank,
            dir: "event".into(),
            kind: name.into(),
            rid: Some(rid.to_string()),
            peer: None,
            bytes: None,
            detail,
        });
    }

    /// Lines dropped because the writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }
}

impl Inner {
    fn push(&self, line: TraceLine) {
        let Some(tx) = &self.tx else {
            return;
        };
        match tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn write_lines(file: File, rx: std::sync::mpsc::Receiver<TraceLine>) {
    let mut out = BufWriter::new(file);
    let mut last_flush = std::time::Instant::now();
    loop {
        match rx.recv_timeout(FLUSH_EVERY) {
            Ok(line) => {
                if let Ok(json) = serde_json::to_string(&line) {
                    let _ = writeln!(out, "{json}");
                }
                // Lines arriving more often than FLUSH_EVERY (heartbeats from many ranks) must
                // not keep the buffer from reaching the file.
                if last_flush.elapsed() >= FLUSH_EVERY {
                    let _ = out.flush();
                    last_flush = std::time::Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = out.flush();
                last_flush = std::time::Instant::now();
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        }
    }
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
    use crate::{Abort, Message};

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
            t.event("admitted", "r1", Some("cached_tokens=4".into()));
        }
        let text = std::fs::read_to_string(dir.join("worker-3.jsonl")).unwrap();
        let lines: Vec<TraceLine> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].kind, "Abort");
        assert_eq!(lines[0].rid.as_deref(), Some("r1"));
        assert_eq!(lines[1].dir, "event");
        std::fs::remove_dir_all(&dir).ok();
    }
}
