//! A loaded worker at work: its sockets, the controller link and KV link threads, and the
//! actor's loop until it leaves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use protocol::{Hello, Message};

use crate::actor::{Outbox, WorkerActor};
use crate::args::WorkerConfig;
use crate::error::{self, WorkerError};
use crate::scheduler::Scheduler;
use crate::{disagg, link};

/// The KV link of a disaggregated worker: its socket thread, and the outbox the actor sends
/// through. A prefill worker binds its KV socket here and announces it in `hello`.
fn start_kv_link(
    ctx: &zmq::Context,
    config: &WorkerConfig,
    hello: &mut Hello,
    inbound: mpsc::Sender<link::Inbound>,
    stop: Arc<AtomicBool>,
) -> error::Result<(zmq::Socket, std::thread::JoinHandle<error::Result<()>>)> {
    let (outbox_rx, outbox) = inproc_pipe(ctx, disagg::link::KV_OUTBOX)?;
    let router = match config.disaggregation_mode {
        protocol::DisaggMode::Prefill => {
            let (router, endpoint) = disagg::link::bind(ctx, &config.transport, &config.kv_addr)
                .map_err(|error| WorkerError::Bind {
                    flag: "disaggregation-kv-addr",
                    addr: config.kv_addr.to_string(),
                    error,
                })?;
            tracing::info!(rank = config.rank, kv_endpoint = %endpoint, "KV socket bound");
            hello.kv_endpoint = Some(endpoint);
            hello.kv_public_key = config.transport.public_key().map(|k| k.z85());
            Some(router)
        }
        _ => None,
    };
    let kv = disagg::link::KvLink {
        ctx: ctx.clone(),
        outbox: outbox_rx,
        router,
        identity: format!("decode-{}-{}", config.rank, std::process::id()).into_bytes(),
        transport: config.transport.clone(),
        // The actor is gone only when the worker stops.
        deliver: Box::new(move |kv| {
            inbound.send(link::Inbound::Kv(kv)).ok();
        }),
        stop,
        max_frame: hello
            .kv_layout
            .as_ref()
            .map_or(protocol::socket::MAX_FRAME_BYTES, |l| {
                disagg::link::max_kv_frame(l.bytes_per_token(), hello.capacity.context_len as usize)
            }),
    };
    let thread = std::thread::Builder::new()
        .name("kv-link".into())
        .spawn(move || disagg::link::run(kv))
        .map_err(|error| WorkerError::Os {
            what: "starting the KV link thread",
            error,
        })?;
    Ok((outbox, thread))
}

/// Connects (tokenizer socket, controller link thread, the KV link of a disaggregated role)
/// and runs the actor until it leaves.
pub(super) fn serve(
    config: WorkerConfig,
    mut sched: Scheduler,
    mut hello: Hello,
    pool: rayon::ThreadPool,
    kernel_path: kernels::KernelPath,
    stop: Arc<AtomicBool>,
) -> error::Result<()> {
    let ctx = zmq::Context::new();
    let tracer = open_tracer(&config)?;
    sched.tracer = tracer.clone();
    let held_rids = link::HeldRids::default();
    let (inbound_tx, inbound) = mpsc::channel();
    let link_stop = Arc::new(AtomicBool::new(false));
    let (kv_outbox, kv_thread) = if config.disaggregation_mode.is_null() {
        (None, None)
    } else {
        let to_actor = inbound_tx.clone();
        let (outbox, thread) =
            start_kv_link(&ctx, &config, &mut hello, to_actor, Arc::clone(&link_stop))?;
        (Some(outbox), Some(thread))
    };
    let (outbox_rx, outbox) = inproc_pipe(&ctx, link::OUTBOX)?;
    let to_tokenizer = config
        .transport
        .connect(&ctx, zmq::PUSH, &config.tokenizer_addr, None)?;
    let tokenizer_handshakes =
        protocol::transport::watch_handshakes(&ctx, &to_tokenizer, "tokenizer-push")?;
    let link = link::Link {
        ctx: ctx.clone(),
        outbox: outbox_rx,
        worker_addr: config.worker_addr.clone(),
        transport: config.transport.clone(),
        tokenizer_handshakes,
        hello,
        heartbeat_interval: config.heartbeat_interval,
        inbound: inbound_tx,
        stop: Arc::clone(&link_stop),
        draining: Arc::clone(&stop),
        tracer: tracer.clone(),
        held_rids: held_rids.clone(),
    };
    let link = std::thread::Builder::new()
        .name("controller-link".into())
        .spawn(move || link::run(link))
        .map_err(|error| WorkerError::Os {
            what: "starting the controller link thread",
            error,
        })?;
    let out = Sockets {
        to_tokenizer,
        outbox,
        kv_outbox,
        tracer,
    };
    tracing::info!(rank = config.rank, worker_addr = %config.worker_addr, tokenizer_addr = %config.tokenizer_addr, "worker started");
    let mut actor = WorkerActor::new(
        config.rank,
        config.drain_timeout,
        sched,
        pool,
        kernel_path,
        out,
        held_rids,
        stop,
    );
    run_actor(&mut actor, &inbound);
    actor.leave();
    wind_down(&actor, config.rank, &link_stop, link, kv_thread)
}

/// Stops the link threads once the actor has left, and says why it stopped.
fn wind_down<O: Outbox>(
    actor: &WorkerActor<O>,
    rank: u32,
    link_stop: &AtomicBool,
    link: std::thread::JoinHandle<error::Result<()>>,
    kv_thread: Option<std::thread::JoinHandle<error::Result<()>>>,
) -> error::Result<()> {
    // The Shutdown is queued before the stop flag is set, and the links drain their outboxes
    // once more after they see the flag, so the controller (and KV peers) hear it.
    link_stop.store(true, Ordering::Relaxed);
    join("controller link", link)?;
    if let Some(kv) = kv_thread {
        join("KV link", kv)?;
    }
    match actor.refused() {
        Some(reason) => Err(WorkerError::Refused(reason.to_string())),
        None => {
            tracing::info!(rank, "worker stopped");
            Ok(())
        }
    }
}

/// The message tracer `--trace-dir` asks for (a disabled one without it).
fn open_tracer(config: &WorkerConfig) -> error::Result<protocol::msg_trace::MessageTracer> {
    Ok(match &config.trace_dir {
        Some(dir) => protocol::msg_trace::MessageTracer::open_capped(
            dir,
            "worker",
            Some(config.rank),
            config.trace_max_bytes,
        )
        .map_err(|error| WorkerError::File {
            flag: "trace-dir",
            path: dir.clone(),
            error,
        })?,
        None => protocol::msg_trace::MessageTracer::disabled(),
    })
}

/// An inproc pipe from the actor to a link thread: the thread's PULL end (bound first, as
/// inproc needs) and the actor's PUSH end.
fn inproc_pipe(ctx: &zmq::Context, endpoint: &str) -> error::Result<(zmq::Socket, zmq::Socket)> {
    let pipe = || -> std::result::Result<_, zmq::Error> {
        let rx = ctx.socket(zmq::PULL)?;
        rx.bind(endpoint)?;
        let tx = ctx.socket(zmq::PUSH)?;
        tx.connect(endpoint)?;
        Ok((rx, tx))
    };
    pipe().map_err(|error| WorkerError::Socket {
        what: "opening an inproc pipe",
        error,
    })
}

/// The actor's loop: take everything that arrived, then one round; block briefly for the
/// inbox only when there is nothing to compute.
fn run_actor<O: Outbox>(actor: &mut WorkerActor<O>, inbound: &mpsc::Receiver<link::Inbound>) {
    while actor.keep_running() {
        let mut first = if actor.busy() {
            inbound.try_recv().ok()
        } else {
            match inbound.recv_timeout(Duration::from_millis(50)) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        };
        while let Some(item) = first.take().or_else(|| inbound.try_recv().ok()) {
            actor.on_inbound(item);
        }
        actor.tick();
    }
}

fn join(
    what: &'static str,
    thread: std::thread::JoinHandle<error::Result<()>>,
) -> error::Result<()> {
    thread.join().unwrap_or(Err(WorkerError::Panicked(what)))
}

/// The actor's [`Outbox`] in a running worker: outputs go to the tokenizer's PULL socket
/// (traced before they go out, so a merged timeline never shows the tokenizer's `recv` ahead
/// of this `send`), the rest to the link thread's outbox, which forwards it to the controller.
struct Sockets {
    to_tokenizer: zmq::Socket,
    outbox: zmq::Socket,
    /// The KV link's inproc outbox (disaggregated roles only).
    kv_outbox: Option<zmq::Socket>,
    tracer: protocol::msg_trace::MessageTracer,
}

impl Outbox for Sockets {
    fn to_tokenizer(&mut self, msg: &Message) {
        let frame = match protocol::encode(msg) {
            Ok(frame) => frame,
            Err(e) => return tracing::warn!(%e, msg = msg.type_name(), "encode failed"),
        };
        if let Message::TokenOut(out) = msg {
            if self.tracer.enabled() {
                self.tracer.message(true, msg, "tokenizer", frame.len());
                self.tracer.token_out_milestones(out);
            }
        }
        if let Err(e) = self.to_tokenizer.send(&frame[..], 0) {
            tracing::warn!(%e, "send to tokenizer failed");
        }
    }

    fn to_controller(&mut self, msg: &Message) {
        protocol::socket::send(&self.outbox, msg).ok();
    }

    fn to_peer(&mut self, send: disagg::KvSend) {
        match &self.kv_outbox {
            Some(outbox) => disagg::link::send(outbox, send),
            None => tracing::warn!(msg = send.msg.type_name(), "no KV link; dropped"),
        }
    }
}
