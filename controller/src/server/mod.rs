//! The controller actor: one thread owns its three sockets and all routing state, and reacts to
//! frames from the tokenizer (PULL) and the workers (ROUTER) plus a timer for liveness.
//!
//! Nothing here blocks on a peer: sends to workers fail fast (ROUTER_MANDATORY), and every
//! request that cannot be routed or whose rank dies gets exactly one error `TokenOut`.
//!
//! Observability: each decision is counted per (method, branch) and reported in every
//! `ClusterStatus`; with `--trace-file` it is also a routing-trace line, and with `--trace-dir`
//! every frame in or out (and each decision) is a message-trace line.

mod disagg;
mod hold;
mod kv_events;
mod membership;
mod reconcile;
mod route;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::msg_trace::{MessageTracer, Milestone};
use protocol::socket::{identity_rank, rank_identity};
use protocol::{encode, ClusterStatus, Endpoint, FrameStats, Message, TokenOut};

use crate::kv_index::KvIndex;
use crate::policy::{CacheAwareConfig, LoadBalancer, Method, PeerConfigs, PrefixAffinityConfig};
use crate::ranks::Ranks;
use crate::rejoin::Rejoins;
use crate::route_counts::RouteCounts;
use crate::trace::TraceWriter;

/// Resolved controller settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub controller_addr: Endpoint,
    pub worker_addr: Endpoint,
    pub tokenizer_addr: Endpoint,
    /// CURVE or not on the TCP endpoints (`--curve-*`, `--insecure-tcp`).
    pub transport: protocol::Transport,
    pub method: Method,
    /// Disaggregated deployments: the decode leg's method (`method` picks the prefill rank).
    pub decode_method: Method,
    pub prefix_affinity: PrefixAffinityConfig,
    pub cache_aware: CacheAwareConfig,
    /// The peers' methods (`vllm_dp`, `smg_cache_aware`, `dynamo_kv`, `llmd_prefix`).
    pub peers: PeerConfigs,
    /// Append one JSON line per routing decision here.
    pub trace_file: Option<PathBuf>,
    /// Message traces: `DIR/controller.jsonl`, one line per frame in or out.
    pub trace_dir: Option<PathBuf>,
    /// Size at which a message-trace file rotates.
    pub trace_max_bytes: u64,
    pub worker_timeout: Duration,
    pub model_id: Option<String>,
    pub cluster_status_interval: Duration,
}

/// How often liveness is checked; also the poll timeout.
const TICK: Duration = Duration::from_millis(50);
/// How often the live ranks' connections are probed: a rank whose process exited is gone
/// within about this long, not at its heartbeat timeout.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);
pub struct Controller {
    config: ControllerConfig,
    ranks: Ranks,
    balancer: Box<dyn LoadBalancer>,
    decode_balancer: Box<dyn LoadBalancer>,
    trace: Option<TraceWriter>,
    tracer: MessageTracer,
    route_counts: RouteCounts,
    stats: FrameStats,
    from_tokenizer: zmq::Socket,
    workers: zmq::Socket,
    to_tokenizer: zmq::Socket,
    last_cluster_status: Instant,
    cluster_changed: bool,
    rejoins: Rejoins,
    /// Which ranks hold which KV blocks (from their `KvEvents`), for `cache_aware`.
    kv_index: KvIndex,
    /// Random, drawn at start: `ClusterStatus.controller_id`.
    id: u64,
    /// The tokenizer's `Reconcile`s not yet answered (see `reconcile`).
    reconciles: Vec<reconcile::PendingReconcile>,
    /// When the live ranks' connections were last probed (`probe_ranks`).
    last_probe: Instant,
    /// The last `submission_seq` taken in from the tokenizer (`ClusterStatus.taken_submission_seq`).
    taken_submission_seq: Option<u64>,
    /// Requests held for late binding (see `hold`).
    held: Vec<hold::Held>,
    /// While a held request is routed: how long it was held (its record says so).
    releasing: Option<Duration>,
}

impl Controller {
    pub fn bind(ctx: &zmq::Context, config: ControllerConfig) -> crate::error::Result<Self> {
        let net = &config.transport;
        let from_tokenizer = net.bind(ctx, zmq::PULL, &config.controller_addr)?;
        let workers = net.bind(ctx, zmq::ROUTER, &config.worker_addr)?;
        let to_tokenizer = net.connect(ctx, zmq::PUSH, &config.tokenizer_addr, None)?;
        // The message tracer first: it creates its directory, which may hold the routing trace.
        let tracer = match &config.trace_dir {
            Some(dir) => {
                MessageTracer::open_capped(dir, "controller", None, config.trace_max_bytes)
                    .map_err(|error| crate::error::Error::TraceDir {
                        path: dir.clone(),
                        error,
                    })?
            }
            None => MessageTracer::disabled(),
        };
        let trace = config
            .trace_file
            .as_deref()
            .map(TraceWriter::create)
            .transpose()?;
        tracing::info!(
            controller_addr = %config.controller_addr,
            worker_addr = %config.worker_addr,
            tokenizer_addr = %config.tokenizer_addr,
            method = %config.method,
            prefix_affinity = ?config.prefix_affinity,
            trace_file = ?config.trace_file,
            trace_dir = ?config.trace_dir,
            "controller listening"
        );
        Ok(Controller {
            ranks: Ranks::new(config.model_id.clone(), config.worker_timeout),
            balancer: config.method.balancer(
                &config.prefix_affinity,
                &config.cache_aware,
                &config.peers,
            ),
            decode_balancer: config.decode_method.balancer(
                &config.prefix_affinity,
                &config.cache_aware,
                &config.peers,
            ),
            trace,
            tracer,
            route_counts: RouteCounts::default(),
            stats: FrameStats::default(),
            from_tokenizer,
            workers,
            to_tokenizer,
            last_cluster_status: Instant::now(),
            cluster_changed: true,
            rejoins: Rejoins::default(),
            kv_index: KvIndex::new(),
            id: protocol::random_room(),
            reconciles: Vec::new(),
            last_probe: Instant::now(),
            taken_submission_seq: None,
            held: Vec::new(),
            releasing: None,
            config,
        })
    }

    /// Serve until `stop` is set (SIGTERM/SIGINT). On the way out, tell the workers to stop.
    pub fn run(mut self, stop: Arc<AtomicBool>) -> crate::error::Result<()> {
        let mut last_tick = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let (tok_ready, workers_ready) = {
                let mut items = [
                    self.from_tokenizer.as_poll_item(zmq::POLLIN),
                    self.workers.as_poll_item(zmq::POLLIN),
                ];
                match zmq::poll(&mut items, TICK.as_millis() as i64) {
                    Ok(_) => (items[0].is_readable(), items[1].is_readable()),
                    Err(zmq::Error::EINTR) => continue,
                    Err(e) => return Err(crate::error::Error::Poll(e)),
                }
            };
            if workers_ready {
                self.drain_workers();
                self.release_held();
            }
            if tok_ready {
                self.drain_tokenizer();
            }
            if last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                self.expire_ranks();
                if self.last_probe.elapsed() >= PROBE_INTERVAL {
                    self.last_probe = Instant::now();
                    self.probe_ranks();
                }
                self.ranks.refresh();
                self.summarise_rejoins();
                self.answer_reconciles();
                self.release_held();
            }
            if self.cluster_changed
                || self.last_cluster_status.elapsed() >= self.config.cluster_status_interval
            {
                self.push_cluster_status();
            }
        }
        tracing::info!("controller stopping");
        self.fail_held();
        Ok(())
    }

    fn drain_tokenizer(&mut self) {
        loop {
            let frame = match self.from_tokenizer.recv_bytes(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => return,
                Err(e) => {
                    tracing::warn!(%e, "receive from tokenizer failed");
                    return;
                }
            };
            if let Some(msg) = self.stats.decode_or_drop(&frame, "tokenizer") {
                self.tracer.message(false, &msg, "tokenizer", frame.len());
                self.on_tokenizer_message(msg);
            }
        }
    }

    fn drain_workers(&mut self) {
        loop {
            let parts = match self.workers.recv_multipart(zmq::DONTWAIT) {
                Ok(p) => p,
                Err(zmq::Error::EAGAIN) => return,
                Err(e) => {
                    tracing::warn!(%e, "receive from workers failed");
                    return;
                }
            };
            let [identity, frame] = parts.as_slice() else {
                self.stats.decode_or_drop(&[], "worker (bad multipart)");
                continue;
            };
            let peer = String::from_utf8_lossy(identity).into_owned();
            let Some(rank) = identity_rank(identity) else {
                tracing::warn!(
                    peer,
                    "dropping frame from a peer whose identity is not rank-<R>"
                );
                continue;
            };
            if let Some(msg) = self.stats.decode_or_drop(frame, &peer) {
                if self.tracer.enabled() {
                    self.tracer
                        .message(false, &msg, &worker_peer(rank), frame.len());
                }
                self.on_worker_message(identity, rank, msg);
            }
        }
    }

    fn on_tokenizer_message(&mut self, msg: Message) {
        // Log lines about a request while it is routed carry its rid.
        let _span = msg
            .rid()
            .map(|rid| tracing::info_span!("request", rid).entered());
        // Taken in: from here it ends with an error sent now or a dispatch counted in flight.
        // The last number, not the highest: the tokenizer's requests arrive in its order, and
        // a restarted tokenizer counts from 1 again (or a stray frame carried any number),
        // which the highest would claim forever, and the tokenizer reads a claim beyond what
        // it sent as no ledger at all.
        if let Some(seq) = msg.submission_seq() {
            self.taken_submission_seq = Some(seq);
        }
        match msg {
            Message::GenerateReq(req) if self.refused_rid(&req.rid) => {}
            Message::EmbedReq(req) if self.refused_rid(&req.rid) => {}
            Message::GenerateReq(req) if self.ranks.disaggregated() => self.route_pd(req),
            Message::GenerateReq(req) => {
                if let Some(req) = self.hold_or_pass(req) {
                    self.route_unified(req);
                }
            }
            Message::EmbedReq(req) => {
                let tokens = req.input_ids.len() as u64;
                let (decision, prefill, _) =
                    self.decide_one(&(&req).into(), req.routed_dp_rank, false);
                let rid = req.rid.clone();
                self.dispatch(&rid, decision, tokens, prefill, Message::EmbedReq(req));
            }
            Message::Abort(abort) => {
                self.abort_held(abort.rid.as_deref());
                // The request may be on any rank (or still in flight to one): tell them all,
                // the draining ones too (a client gone need not wait for the drain deadline).
                // A rank that does not hold the rid lists it finished, so the in-flight map
                // of a rid whose dispatch went astray ends here too (see `ledger`).
                for (rank, identity) in self.ranks.held() {
                    self.send_to_peer(&identity, rank, &Message::Abort(abort.clone()));
                }
            }
            Message::FlushCache(flush) => {
                for rank in self.ranks.ids() {
                    self.send_to_worker(rank, &Message::FlushCache(flush.clone()));
                }
            }
            Message::Reconcile(reconcile) => self.on_reconcile(reconcile),
            other => tracing::warn!(
                msg = other.type_name(),
                "unexpected message from the tokenizer; dropped"
            ),
        }
    }

    /// Whether `rid` breaks the one rid limit ([`protocol::MAX_RID_LEN`]); if so the request is
    /// answered with a 400 and goes nowhere (the tokenizer never sends one; another peer might).
    fn refused_rid(&mut self, rid: &str) -> bool {
        let Some(why) = protocol::rid_problem(rid) else {
            return false;
        };
        tracing::warn!(rid_len = rid.len(), "request refused: {why}");
        self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(rid, 400, why)));
        true
    }

    /// A frame from the worker process `identity`, which claims `rank`.
    fn on_worker_message(&mut self, identity: &[u8], rank: u32, msg: Message) {
        match msg {
            Message::Hello(hello) if hello.rank != rank => {
                tracing::warn!(
                    identity_rank = rank,
                    hello_rank = hello.rank,
                    "Hello rank differs from the socket identity; refused"
                );
                self.send_ack(
                    identity,
                    rank,
                    false,
                    Some("Hello rank differs from the socket identity".into()),
                );
            }
            Message::Hello(hello) => self.on_hello(identity, &hello),
            Message::KvEvents(events) if events.rank == rank => {
                if self.ranks.is_holder(rank, identity) {
                    self.on_kv_events(identity, &events);
                }
            }
            Message::Heartbeat(_) => {
                if !self.ranks.seen(rank, identity) {
                    self.ask_to_rejoin(identity, rank);
                }
            }
            Message::WorkerStatus(status) if status.rank == rank => {
                let idle = status.num_running_reqs + status.num_waiting_reqs == 0;
                let went_idle = idle && self.ranks.is_busy(rank);
                if !self.ranks.status(status, identity) {
                    self.ask_to_rejoin(identity, rank);
                } else if went_idle {
                    // Passed on at once, as the worker sends it: the tokenizer's view says
                    // "nothing running" (`/flush_cache`) as soon as the last answer is out,
                    // not a status interval later.
                    self.cluster_changed = true;
                }
            }
            Message::Shutdown(shutdown) if !self.ranks.is_holder(rank, identity) => {
                // A refused duplicate leaving, or a process that lost its rank to a restart:
                // the rank's holder is not going anywhere.
                tracing::debug!(rank, reason = %shutdown.reason, "Shutdown from a worker that does not hold its rank; ignored");
            }
            Message::Shutdown(shutdown) if shutdown.drain_timeout_s.is_some() => {
                let timeout = shutdown.drain_timeout().unwrap_or_default();
                let reason = &shutdown.reason;
                if self.ranks.start_drain(rank, timeout) {
                    tracing::info!(rank, %reason, drain_timeout_s = timeout.as_secs_f64(), live = ?self.ranks.ids(), "rank draining; no new requests go to it");
                    self.cluster_changed = true;
                }
            }
            Message::Shutdown(shutdown) => {
                let mode = self.ranks.holder(rank).map(|h| h.mode);
                if let Some(lost) = self.ranks.remove(rank) {
                    self.kv_index.remove(rank);
                    self.announce_gone(rank, mode, &shutdown.reason);
                    tracing::info!(rank, reason = %shutdown.reason, live = ?self.ranks.ids(), "rank left");
                    self.fail_requests(lost, format!("data parallel rank {rank} shut down"));
                    self.cluster_changed = true;
                }
            }
            other => tracing::warn!(
                rank,
                msg = other.type_name(),
                "unexpected message from a worker; dropped"
            ),
        }
    }

    fn push_cluster_status(&mut self) {
        let status = ClusterStatus {
            timestamp: protocol::unix_time(),
            load_balance_method: self.config.method.to_string(),
            live_ranks: self.ranks.infos(),
            routing: self.route_counts.snapshot(),
            controller_id: Some(self.id),
            regret: self.route_counts.regret(),
            taken_submission_seq: self.taken_submission_seq,
            num_inflight: Some(self.ranks.num_inflight() + self.held.len() as u64),
        };
        self.send_to_tokenizer(&Message::ClusterStatus(status));
        self.last_cluster_status = Instant::now();
        self.cluster_changed = false;
    }

    /// Send to the process holding `rank` (or, for a rank no process holds, to the bare
    /// `rank-<R>` identity); false when it cannot be reached.
    fn send_to_worker(&mut self, rank: u32, msg: &Message) -> bool {
        let identity = match self.ranks.holder(rank) {
            Some(h) => h.identity.clone(),
            None => rank_identity(rank),
        };
        self.send_to_peer(&identity, rank, msg)
    }

    /// Send to the worker process `identity`, which claims `rank`; false when it cannot be
    /// reached.
    fn send_to_peer(&mut self, identity: &[u8], rank: u32, msg: &Message) -> bool {
        let frame = match encode(msg) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(%e, "encode failed");
                return false;
            }
        };
        // Traced before the send, so the line cannot be later than the peer's `recv` of it.
        if self.tracer.enabled() {
            self.tracer
                .message(true, msg, &worker_peer(rank), frame.len());
        }
        match self
            .workers
            .send_multipart([identity, frame.as_slice()], zmq::DONTWAIT)
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(rank, %e, msg = msg.type_name(), "send to worker failed");
                if let Some(rid) = msg.rid() {
                    self.tracer.milestone(
                        rid,
                        Milestone::SendFailed {
                            to: format!("worker-{rank}"),
                            error: e.to_string(),
                        },
                    );
                }
                false
            }
        }
    }

    fn send_to_tokenizer(&mut self, msg: &Message) {
        let frame = match encode(msg) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(%e, "encode failed");
                return;
            }
        };
        self.tracer.message(true, msg, "tokenizer", frame.len());
        if let Err(e) = self.to_tokenizer.send(&frame[..], 0) {
            tracing::warn!(%e, "send to tokenizer failed");
            if let Some(rid) = msg.rid() {
                self.tracer.milestone(
                    rid,
                    Milestone::SendFailed {
                        to: "tokenizer".into(),
                        error: e.to_string(),
                    },
                );
            }
        }
    }

    /// Frames dropped as undecodable or of unknown type.
    pub fn dropped_frames(&self) -> u64 {
        self.stats.dropped()
    }
}

/// A worker as a message-trace peer: the name of its own trace file (`worker-<rank>`).
fn worker_peer(rank: u32) -> String {
    format!("worker-{rank}")
}
