//! The ZeroMQ side of the tokenizer actor: one reader thread owning the PULL socket (token
//! outputs and cluster status in) and one sender thread owning the PUSH socket (requests,
//! aborts and flushes out to the controller). A ZeroMQ socket belongs to one thread, so HTTP
//! handlers never touch a socket: they register a rid with the [`Registry`] actor to get a
//! channel of its `TokenOut`s and hand outgoing messages to the sender thread. The reader
//! hands outputs to the registry and statuses to the [`ClusterView`] actor; both actors live
//! on one arbiter thread of their own, started and stopped with the bridge.
//!
//! With `--trace-dir`, both threads record each frame they move (and the first-token and
//! finished milestones of each request) in `DIR/tokenizer.jsonl`; without it, one branch each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::{Actor, Addr, Arbiter};
use protocol::msg_trace::{MessageTracer, Milestone};
use protocol::{Endpoint, FrameStats, Message, TokenOut};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::cluster_view::CONTROLLER_UNREACHABLE;
use crate::cluster_view::{self, ClusterSnapshot, ClusterView};
use crate::error::{Result, TokenizerError};
use crate::registry::{self, Registry};

/// How often the reader wakes without traffic to notice shutdown.
const READER_POLL_MS: i32 = 100;
/// How long a request waits for the connection to a controller whose status is fresh (one that
/// just restarted) to come up, before it gets a 503.
const CONNECT_WAIT_MS: i64 = 1000;

/// Why a rid could not be registered.
#[derive(Debug, PartialEq, Eq)]
pub enum RegisterError {
    /// A request with this rid is in flight.
    RidInUse,
    /// The bridge is shut down.
    Stopped,
    /// `cap` requests are in flight already.
    Full { cap: usize },
}

/// What the socket threads share with the bridge: the actors' addresses and the flags.
struct Shared {
    registry: Addr<Registry>,
    cluster: Addr<ClusterView>,
    stats: FrameStats,
    stop: AtomicBool,
    /// Set by [`Bridge::end_all`]: the tokenizer is stopping and takes no new requests.
    stopping: AtomicBool,
    /// To the sender thread; taken (closing the channel, which ends that thread) at shutdown.
    /// Its lock also orders the requests' `submission_seq`s as they are sent.
    outbox: Mutex<Option<mpsc::Sender<Message>>>,
    /// The last `submission_seq` given (0: none yet).
    submission_seq: std::sync::atomic::AtomicU64,
    /// Counts the cluster statuses handed to the view, for those who wait for the next one.
    cluster_updates: tokio::sync::watch::Sender<u64>,
}

/// Handle to the two socket threads and the two actors; shared by every HTTP worker.
pub struct Bridge {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Where the registry and the cluster view run; stopped after the socket threads, which
    /// talk to them until they end.
    arbiter: Mutex<Option<Arbiter>>,
    security: protocol::SecurityMode,
}

/// Binds PULL at `pull_ep` and connects PUSH to `push_ep`, here so a bad address fails
/// startup; each socket then moves to its one owning thread.
fn sockets(
    transport: &protocol::Transport,
    pull_ep: &Endpoint,
    push_ep: &Endpoint,
) -> Result<(zmq::Socket, zmq::Socket)> {
    let ctx = zmq::Context::new();
    let pull = transport.bind(&ctx, zmq::PULL, pull_ep)?;
    pull.set_rcvtimeo(READER_POLL_MS)
        .map_err(|e| protocol::ProtocolError::zmq("set rcvtimeo", e))?;
    let push = transport.connect(&ctx, zmq::PUSH, push_ep, None)?;
    // Queue only to a controller that is connected: with none, a send fails at once and the
    // request gets a 503, instead of waiting in a queue for a controller that may never come
    // back.
    push.set_immediate(true)
        .map_err(|e| protocol::ProtocolError::zmq("set immediate", e))?;
    // A restarted controller is reconnected to within 200 ms, not the default backoff's 1 s.
    push.set_reconnect_ivl_max(200)
        .map_err(|e| protocol::ProtocolError::zmq("set reconnect_ivl_max", e))?;
    Ok((pull, push))
}

impl Bridge {
    /// Bind PULL at `tokenizer_addr`, connect PUSH to `controller_addr` (secured as `security`
    /// says), start both threads
    /// and both actors. Must be called inside an actix `System`. `tracer` records every frame
    /// in and out (a disabled one costs nothing).
    pub fn start(
        tokenizer_addr: &str,
        controller_addr: &str,
        security: &protocol::SecurityArgs,
        tracer: MessageTracer,
        max_in_flight: usize,
    ) -> Result<Bridge> {
        let pull_ep: Endpoint =
            tokenizer_addr
                .parse()
                .map_err(|error| TokenizerError::Endpoint {
                    flag: "tokenizer-addr",
                    error,
                })?;
        let push_ep: Endpoint =
            controller_addr
                .parse()
                .map_err(|error| TokenizerError::Endpoint {
                    flag: "controller-addr",
                    error,
                })?;
        let transport = security.resolve(&[&pull_ep, &push_ep], "tokenizer")?;
        let (pull, push) = sockets(&transport, &pull_ep, &push_ep)?;

        let arbiter = Arbiter::new();
        let registry =
            Registry::start_in_arbiter(&arbiter.handle(), move |_| Registry::new(max_in_flight));
        let cluster = {
            let registry = registry.clone();
            ClusterView::start_in_arbiter(&arbiter.handle(), |_| ClusterView::new(registry))
        };
        let (tx, rx) = mpsc::channel::<Message>();
        let shared = Arc::new(Shared {
            registry,
            cluster,
            stats: FrameStats::default(),
            stop: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            outbox: Mutex::new(Some(tx)),
            submission_seq: std::sync::atomic::AtomicU64::new(0),
            cluster_updates: tokio::sync::watch::Sender::new(0),
        });
        let io = |what: &str, error| TokenizerError::Io {
            what: what.to_string(),
            error,
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
        let sender = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("tok-zmq-push".into())
                .spawn(move || sender_loop(push, rx, &shared, &tracer))
        }
        .map_err(|e| io("spawn sender thread", e))?;
        tracing::info!(pull = %pull_ep, push = %push_ep, "tokenizer sockets ready");
        Ok(Bridge {
            shared,
            threads: Mutex::new(vec![reader, sender]),
            arbiter: Mutex::new(Some(arbiter)),
            security: transport.mode(),
        })
    }

    /// How the ZeroMQ endpoints are secured (`/get_server_info`'s `zmq_security`).
    pub fn security(&self) -> protocol::SecurityMode {
        self.security
    }

    /// Route `TokenOut`s of `rid` to the returned channel until [`Bridge::unregister`].
    pub async fn register(
        &self,
        rid: &str,
    ) -> std::result::Result<UnboundedReceiver<TokenOut>, RegisterError> {
        let register = registry::Register {
            rid: rid.to_string(),
        };
        match self.shared.registry.send(register).await {
            Ok(Ok(rx)) => Ok(rx),
            Ok(Err(registry::Refusal::RidInUse)) => Err(RegisterError::RidInUse),
            Ok(Err(registry::Refusal::Full { cap })) => Err(RegisterError::Full { cap }),
            Err(_) => Err(RegisterError::Stopped),
        }
    }

    pub fn unregister(&self, rid: &str) {
        self.shared.registry.do_send(registry::Unregister {
            rid: rid.to_string(),
        });
    }

    /// Queue `msg` for the controller. Returns false once the bridge is shut down, and for a
    /// new request once the tokenizer is stopping.
    pub fn send(&self, msg: Message) -> bool {
        let new_request = matches!(msg, Message::GenerateReq(_) | Message::EmbedReq(_));
        if new_request && self.shared.stopping.load(Ordering::Relaxed) {
            return false;
        }
        self.shared.send(msg)
    }

    /// The latest cluster status, fresh or not; `None` before the first (or once shut down).
    pub async fn cluster(&self) -> Option<ClusterSnapshot> {
        self.shared
            .cluster
            .send(cluster_view::Latest)
            .await
            .ok()
            .flatten()
    }

    /// Changes each time a cluster status reaches the view; a [`Bridge::cluster`] asked after
    /// the change sees that status (the view takes its messages in order).
    pub fn cluster_updates(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.cluster_updates.subscribe()
    }

    /// What the registry's ledger check found broken since start.
    pub async fn invariant_violations(&self) -> Vec<String> {
        let found = self.shared.registry.send(registry::Violations).await;
        found.unwrap_or_default()
    }

    pub async fn in_flight(&self) -> usize {
        self.shared
            .registry
            .send(registry::Count)
            .await
            .unwrap_or(0)
    }

    /// The registered rids for which `pred` holds (for `/abort_request` of a fanned-out id).
    pub async fn rids_matching(&self, pred: impl Fn(&str) -> bool) -> Vec<String> {
        let rids = self.shared.registry.send(registry::Rids).await;
        rids.unwrap_or_default()
            .into_iter()
            .filter(|k| pred(k))
            .collect()
    }

    /// The tokenizer is stopping: every request still open ends now with a 503 saying `why`
    /// (a stream gets it as its last event, then `[DONE]`), and is aborted on its worker; new
    /// requests are refused. Returns how many were open.
    pub async fn end_all(&self, why: &str) -> usize {
        self.shared.stopping.store(true, Ordering::Relaxed);
        let fail = registry::FailAllOpen {
            why: why.to_string(),
        };
        let open = self.shared.registry.send(fail).await.unwrap_or_default();
        for rid in &open {
            self.send(Message::Abort(protocol::Abort {
                rid: Some(rid.clone()),
            }));
        }
        open.len()
    }

    pub fn frames_dropped(&self) -> u64 {
        self.shared.stats.dropped()
    }

    /// Stop both threads and wait for them, then the actors; queued messages are still sent
    /// (socket linger).
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        lock(&self.shared.outbox).take();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        if let Some(arbiter) = lock(&self.arbiter).take() {
            arbiter.stop();
            let _ = arbiter.join();
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    /// Queue `msg` for the controller; false once shut down. A new request gets the next
    /// `submission_seq` here, in the order it is queued, and the registry learns it first.
    fn send(&self, mut msg: Message) -> bool {
        let outbox = lock(&self.outbox);
        let Some(tx) = outbox.as_ref() else {
            return false;
        };
        if let Some(slot) = msg.submission_seq_mut() {
            let seq = self.submission_seq.fetch_add(1, Ordering::Relaxed) + 1;
            *slot = Some(seq);
            let rid = msg.rid().unwrap_or_default().to_string();
            self.registry.do_send(registry::Submitted { rid, seq });
        }
        tx.send(msg).is_ok()
    }

    /// A controller this tokenizer has not seen before (a restart) may have taken requests in
    /// that it never passed on, and workers may have died while none ran: list every open
    /// request to it, so it fails those no worker holds (see `Reconcile`).
    fn reconcile(&self) {
        let open = futures::executor::block_on(self.registry.send(registry::Rids));
        let open = open.unwrap_or_default();
        tracing::info!(
            open_requests = open.len(),
            "a new controller is up; listing the open requests to it"
        );
        for rids in open.chunks(protocol::MAX_RECONCILE_RIDS) {
            self.send(Message::Reconcile(protocol::Reconcile {
                rids: rids.to_vec(),
            }));
        }
    }
}

/// A poisoned lock only means another thread panicked mid-update of a value we can still use.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn reader_loop(sock: zmq::Socket, shared: &Shared, peer: &str, tracer: &MessageTracer) {
    // The controller whose statuses arrive (`ClusterStatus.controller_id`).
    let mut controller_id = None;
    // Its statuses count more requests than this tokenizer sent (said once, not twice a second).
    let mut count_ignored = false;
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
            Some(Message::TokenOut(out)) => shared.registry.do_send(registry::Deliver(out)),
            Some(Message::ClusterStatus(mut status)) => {
                let beyond = status.taken_submission_seq
                    > Some(shared.submission_seq.load(Ordering::Relaxed));
                if beyond {
                    // Not a count of this tokenizer's requests (it restarted, or a stray frame
                    // reached the controller): no ledger check on it, but still the
                    // controller's word that it is alive and which ranks are, or every request
                    // would be refused until the controller takes one it never gets.
                    if !count_ignored {
                        tracing::warn!(
                            taken = status.taken_submission_seq,
                            "cluster statuses claim requests this tokenizer never sent; their \
                             count is ignored (no ledger check) until it matches"
                        );
                    }
                    status.taken_submission_seq = None;
                }
                count_ignored = beyond;
                let restarted = controller_id.is_some() && status.controller_id != controller_id;
                controller_id = status.controller_id;
                // After every output read before it: the registry's ledger check.
                shared
                    .registry
                    .do_send(registry::ControllerStatus::of(&status));
                shared.cluster.do_send(cluster_view::Update(status));
                shared
                    .cluster_updates
                    .send_modify(|n| *n = n.wrapping_add(1));
                if restarted {
                    shared.reconcile();
                }
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

/// Whether a cluster status arrived recently: the controller is alive. Asked from the sender
/// thread, which may block: the cluster view runs on its own arbiter, which outlives it.
fn controller_fresh(shared: &Shared) -> bool {
    let latest = futures::executor::block_on(shared.cluster.send(cluster_view::Latest));
    latest.ok().flatten().is_some_and(|snap| snap.is_fresh())
}

fn sender_loop(
    sock: zmq::Socket,
    rx: mpsc::Receiver<Message>,
    shared: &Shared,
    tracer: &MessageTracer,
) {
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
        // Never blocks for long: with no controller connected (or its queue full) the send
        // fails, after a short wait only if the controller is alive and the connection to it
        // is still coming up.
        let sent = match sock.send(&frame[..], zmq::DONTWAIT) {
            Err(zmq::Error::EAGAIN) if controller_fresh(shared) => {
                let mut items = [sock.as_poll_item(zmq::POLLOUT)];
                let _ = zmq::poll(&mut items, CONNECT_WAIT_MS);
                sock.send(&frame[..], zmq::DONTWAIT)
            }
            other => other,
        };
        if let Err(err) = sent {
            let rid = msg.rid().unwrap_or("");
            match &msg {
                Message::GenerateReq(_) | Message::EmbedReq(_) => {
                    tracing::warn!(%err, rid, "controller not connected; request refused (503)");
                    shared.registry.do_send(registry::FailOne {
                        rid: rid.to_string(),
                        why: CONTROLLER_UNREACHABLE,
                    });
                }
                _ => tracing::debug!(%err, rid, msg = msg.type_name(), "send to controller failed"),
            }
            if let Some(rid) = msg.rid() {
                tracer.milestone(
                    rid,
                    Milestone::SendFailed {
                        to: "controller".into(),
                        error: err.to_string(),
                    },
                );
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
    tracer.token_out_milestones(out);
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
