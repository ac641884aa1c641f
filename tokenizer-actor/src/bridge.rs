//! The ZeroMQ side of the tokenizer actor: one reader thread owning the PULL socket (token
//! outputs and cluster status in) and one sender thread owning the PUSH socket (requests,
//! aborts and flushes out to the controller). A ZeroMQ socket belongs to one thread, so HTTP
//! handlers never touch a socket: they register a rid to get a channel of its `TokenOut`s and
//! hand outgoing messages to the sender thread.
//!
//! With `--trace-dir`, both threads record each frame they move (and the first-token and
//! finished milestones of each request) in `DIR/tokenizer.jsonl`; without it, one branch each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protocol::msg_trace::MessageTracer;
use protocol::{ClusterStatus, Endpoint, FrameStats, Message, TokenOut};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::{Result, TokenizerError};

/// How often the reader wakes without traffic to notice shutdown.
const READER_POLL_MS: i32 = 100;

/// Why a rid could not be registered.
#[derive(Debug, PartialEq, Eq)]
pub struct RidInUse;

/// The latest cluster view and when it arrived (local clock: the controller may be another host).
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    pub status: ClusterStatus,
    pub received: Instant,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<HashMap<String, UnboundedSender<TokenOut>>>,
    cluster: RwLock<Option<ClusterSnapshot>>,
    stats: FrameStats,
    stop: AtomicBool,
}

/// Handle to the two socket threads; shared by every HTTP worker.
pub struct Bridge {
    shared: Arc<Shared>,
    outbox: Mutex<Option<mpsc::Sender<Message>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Bridge {
    /// Bind PULL at `tokenizer_addr`, connect PUSH to `controller_addr`, start both threads.
    /// `tracer` records every frame in and out (a disabled one costs nothing).
    pub fn start(
        tokenizer_addr: &str,
        controller_addr: &str,
        tracer: MessageTracer,
    ) -> Result<Bridge> {
        let pull_ep: Endpoint =
            tokenizer_addr
                .parse()
                .map_err(|source| TokenizerError::Endpoint {
                    flag: "tokenizer-addr",
                    source,
                })?;
        let push_ep: Endpoint =
            controller_addr
                .parse()
                .map_err(|source| TokenizerError::Endpoint {
                    flag: "controller-addr",
                    source,
                })?;
        let ctx = zmq::Context::new();
        // Bind and connect here so a bad address fails startup, then move each socket to its
        // one owning thread.
        let pull = protocol::socket::bind(&ctx, zmq::PULL, &pull_ep)?;
        pull.set_rcvtimeo(READER_POLL_MS)
            .map_err(|e| protocol::ProtocolError::zmq("set rcvtimeo", e))?;
        let push = protocol::socket::connect(&ctx, zmq::PUSH, &push_ep, None)?;

        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel::<Message>();
        let io = |what: &str, source| TokenizerError::Io {
            what: what.to_string(),
            source,
        };
        let reader = {
            let shared = shared.clone();
            let peer = pull_ep.to_string();
            let tracer = tracer.clone();
            std::thread::Builder::new()
                .name("tok-zmq-pull".into())
                .spawn(move || reader_loop(pull, &shared, &peer, &tracer))
                .map_err(|e| io("spawn reader thread", e))?
        };
        let sender = std::thread::Builder::new()
            .name("tok-zmq-push".into())
            .spawn(move || sender_loop(push, rx, &tracer))
            .map_err(|e| io("spawn sender thread", e))?;
        tracing::info!(pull = %pull_ep, push = %push_ep, "tokenizer sockets ready");
        Ok(Bridge {
            shared,
            outbox: Mutex::new(Some(tx)),
            threads: Mutex::new(vec![reader, sender]),
        })
    }

    /// Route `TokenOut`s of `rid` to the returned channel until [`Bridge::unregister`].
    pub fn register(
        &self,
        rid: &str,
    ) -> std::result::Result<UnboundedReceiver<TokenOut>, RidInUse> {
        let (tx, rx) = unbounded_channel();
        let mut pending = lock(&self.shared.pending);
        if pending.contains_key(rid) {
            return Err(RidInUse);
        }
        pending.insert(rid.to_string(), tx);
        Ok(rx)
    }

    pub fn unregister(&self, rid: &str) {
        lock(&self.shared.pending).remove(rid);
    }

    /// Queue `msg` for the controller. Returns false once the bridge is shut down.
    pub fn send(&self, msg: Message) -> bool {
        match lock(&self.outbox).as_ref() {
            Some(tx) => tx.send(msg).is_ok(),
            None => false,
        }
    }

    pub fn cluster(&self) -> Option<ClusterSnapshot> {
        self.shared
            .cluster
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn in_flight(&self) -> usize {
        lock(&self.shared.pending).len()
    }

    /// The registered rids for which `pred` holds (for `/abort_request` of a fanned-out id).
    pub fn rids_matching(&self, pred: impl Fn(&str) -> bool) -> Vec<String> {
        lock(&self.shared.pending)
            .keys()
            .filter(|k| pred(k))
            .cloned()
            .collect()
    }

    pub fn frames_dropped(&self) -> u64 {
        self.shared.stats.dropped()
    }

    /// Stop both threads and wait for them; queued messages are still sent (socket linger).
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        lock(&self.outbox).take();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A poisoned lock only means another thread panicked mid-update of a map we can still use.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn reader_loop(sock: zmq::Socket, shared: &Shared, peer: &str, tracer: &MessageTracer) {
    while !shared.stop.load(Ordering::Relaxed) {
        let frame = match sock.recv_bytes(0) {
            Ok(frame) => frame,
            Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => continue,
            Err(zmq::Error::ETERM) => break,
            Err(err) => {
                tracing::warn!(%err, "tokenizer PULL receive failed");
                std::thread::sleep(Duration::from_millis(READER_POLL_MS as u64));
                continue;
            }
        };
        let msg = shared.stats.decode_or_drop(&frame, peer);
        if let (Some(msg), true) = (&msg, tracer.enabled()) {
            trace_incoming(tracer, msg, frame.len());
        }
        match msg {
            Some(Message::TokenOut(out)) => {
                let tx = lock(&shared.pending).get(&out.rid).cloned();
                match tx {
                    Some(tx) => {
                        // The receiver is gone only if the request just ended; nothing to do.
                        let _ = tx.send(out);
                    }
                    None => {
                        tracing::debug!(rid = %out.rid, "output for unknown or finished request")
                    }
                }
            }
            Some(Message::ClusterStatus(status)) => {
                *shared.cluster.write().unwrap_or_else(|p| p.into_inner()) =
                    Some(ClusterSnapshot {
                        status,
                        received: Instant::now(),
                    });
            }
            Some(other) => {
                tracing::warn!(
                    msg = other.type_name(),
                    "unexpected message on tokenizer PULL"
                )
            }
            None => {}
        }
    }
}

fn sender_loop(sock: zmq::Socket, rx: mpsc::Receiver<Message>, tracer: &MessageTracer) {
    // Ends when the bridge drops its sender (shutdown).
    while let Ok(msg) = rx.recv() {
        let frame = match protocol::encode(&msg) {
            Ok(f) => f,
            Err(err) => {
                tracing::error!(%err, rid = msg.rid().unwrap_or(""), "encode failed");
                continue;
            }
        };
        // Traced before the send, so the line cannot be later than the controller's `recv`.
        tracer.message(true, &msg, "controller", frame.len());
        if let Err(err) = sock.send(&frame[..], 0) {
            tracing::warn!(%err, rid = msg.rid().unwrap_or(""), "send to controller failed");
            if let Some(rid) = msg.rid() {
                tracer.event("send_failed", rid, Some(format!("to controller: {err}")));
            }
        }
    }
}

/// Trace an incoming frame. The PULL socket does not say who sent it: a `TokenOut` naming its
/// rank came from that worker, anything else (cluster status, routing errors) from the
/// controller. A request's first tokens and its end are milestones here too: they are what the
/// client sees.
fn trace_incoming(tracer: &MessageTracer, msg: &Message, bytes: usize) {
    let Message::TokenOut(out) = msg else {
        tracer.message(false, msg, "controller", bytes);
        return;
    };
    let peer = out
        .dp_rank
        .map_or_else(|| "controller".to_string(), |r| format!("worker-{r}"));
    tracer.message(false, msg, &peer, bytes);
    if !out.output_ids.is_empty() && out.completion_tokens as usize == out.output_ids.len() {
        tracer.event("first_token", &out.rid, None);
    }
    if let Some(reason) = out.finish_reason {
        let mut detail = format!(
            "reason={} completion_tokens={} cached_tokens={}",
            reason.as_str(),
            out.completion_tokens,
            out.cached_tokens
        );
        if let Some(err) = &out.error {
            // `message` last: it runs to the end of the line (`dpserve trace` reads it so).
            detail.push_str(&format!(" status={} message={}", err.status, err.message));
        }
        tracer.event("finished", &out.rid, Some(detail));
    }
}

/// Sends `Abort` for its rid when dropped before the request finished: a client that goes
/// away (handler future or SSE stream dropped) or a timeout frees the worker's slot.
pub struct RequestGuard {
    rid: String,
    bridge: Arc<Bridge>,
    finished: bool,
}

impl RequestGuard {
    pub fn new(rid: String, bridge: Arc<Bridge>) -> Self {
        RequestGuard {
            rid,
            bridge,
            finished: false,
        }
    }

    pub fn rid(&self) -> &str {
        &self.rid
    }

    /// The final message arrived; no abort needed.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// This side ended the request early (a stop string matched): abort it on the worker now,
    /// so its KV slots return, and not again on drop.
    pub fn abort(&mut self) {
        if !self.finished {
            tracing::debug!(rid = %self.rid, "ended here (stop string): aborting on the worker");
            self.bridge.send(Message::Abort(protocol::Abort {
                rid: Some(self.rid.clone()),
            }));
            self.finished = true;
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.bridge.unregister(&self.rid);
        if !self.finished {
            tracing::info!(rid = %self.rid, "request ended before its final output: aborting");
            self.bridge.send(Message::Abort(protocol::Abort {
                rid: Some(self.rid.clone()),
            }));
        }
    }
}
