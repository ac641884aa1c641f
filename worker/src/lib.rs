//! The worker actor: one data-parallel rank. It owns a device, its KV pool, the scheduler and
//! the model, and talks to the controller (DEALER, through [`link`]) and the tokenizer (PUSH).
//!
//! Threads: the main thread runs the scheduler and owns the PUSH socket to the tokenizer and the
//! inproc end of the outbox; the link thread owns the DEALER. Model compute runs on a rayon pool
//! of `--num-threads` threads.

pub mod args;
pub mod kv_alloc;
pub mod kv_memory;
pub mod link;
pub mod mem;
pub mod model;
pub mod radix_cache;
pub mod req_to_token;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod step_budget;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use protocol::{Capacity, Hello, Message, Shutdown, WorkerStatus};

pub use args::{DeviceArgs, ModelArgs, ModelSource, ServeArgs, WorkerArgs, WorkerConfig};
use link::Inbound;
use model::{LlamaModel, ModelConfig};
use scheduler::{Scheduler, SchedulerConfig};

/// Status snapshots go out at most this often while the worker is busy.
const STATUS_MIN_INTERVAL: Duration = Duration::from_millis(20);
/// ...and at least this often while it is idle.
const STATUS_IDLE_INTERVAL: Duration = Duration::from_millis(1000);

/// The controller refused this worker (wrong model or protocol version): a configuration error
/// that restarting will not fix.
#[derive(Debug)]
pub struct Refused(pub String);

impl Refused {
    /// `EX_CONFIG` from sysexits.h.
    pub const EXIT_CODE: u8 = 78;
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused by the controller: {}", self.0)
    }
}

impl std::error::Error for Refused {}

/// Load the model the config names.
pub fn load_model(source: &ModelSource) -> anyhow::Result<LlamaModel> {
    match source {
        ModelSource::HfDir(dir) => LlamaModel::load_hf(dir)
            .with_context(|| format!("loading model from {}", dir.display())),
        ModelSource::Builtin { size, seed } => {
            Ok(LlamaModel::dummy(ModelConfig::builtin(*size), *seed))
        }
    }
}

/// The KV pool size from `--mem-fraction` of the memory read before the model loaded, logged
/// with everything it came from.
fn size_kv_pool(
    config: &WorkerConfig,
    mem_fraction_given: bool,
    mc: &ModelConfig,
    context_len: usize,
    reading: Result<mem::MemReading, String>,
) -> usize {
    let budget = mem::KvBudget {
        available_bytes: reading.as_ref().ok().map(|r| r.available_bytes),
        mem_fraction: config.mem_fraction,
        // Weights are held as f32 whatever the checkpoint's dtype.
        weight_bytes: (mc.num_params() * std::mem::size_of::<f32>()) as u64,
        kv_bytes_per_token: model::KvBuffers::bytes_per_slot(mc) as u64,
        context_len,
        req_to_token_rows: config.max_running_requests + config.pre_alloc_rows,
        tokens_per_request: (!mem_fraction_given).then_some(mem::KV_TOKENS_PER_RUNNING_REQUEST),
    };
    let size = budget.derive();
    let (min_tokens, max_tokens) = budget.bounds();
    match &reading {
        Ok(r) => tracing::info!(
            rank = config.rank,
            available_bytes = r.available_bytes,
            source = %r.source,
            mem_fraction = budget.mem_fraction,
            weight_bytes = budget.weight_bytes,
            budget_bytes = size.budget_bytes.unwrap_or(0),
            kv_bytes_per_token = budget.kv_bytes_per_token,
            min_tokens,
            max_tokens,
            tokens_per_request = ?budget.tokens_per_request,
            max_total_tokens = size.max_total_tokens,
            pool_bytes = budget.kv_bytes_per_token * size.max_total_tokens as u64,
            limit = size.limit.as_str(),
            "KV pool sized from --mem-fraction and max-running-requests (set --max-total-tokens to choose it)"
        ),
        Err(why) => tracing::warn!(
            rank = config.rank,
            %why,
            max_total_tokens = size.max_total_tokens,
            "free memory unknown; KV pool uses the fixed default (set --max-total-tokens to choose it)"
        ),
    }
    if size.limit == mem::PoolLimit::OneContext {
        tracing::warn!(
            rank = config.rank,
            max_total_tokens = size.max_total_tokens,
            "the memory budget is below one full context; the pool may not fit in memory"
        );
    }
    size.max_total_tokens
}

/// Run a worker until SIGTERM/SIGINT or a `Shutdown` from the controller.
/// `mem_fraction_given`: `--mem-fraction` (or its variable) was set, so a pool sized without
/// `--max-total-tokens` takes what that share of memory allows rather than the default of a
/// few thousand slots per running request.
pub fn run(args: WorkerArgs, mem_fraction_given: bool) -> anyhow::Result<()> {
    let config = args.resolve()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handler")?;
    }
    // Fixed before any kernel runs; every step of this process then uses it.
    let kernel_path = kernels::set_kernel_path(config.kernel_path);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.num_threads)
        .thread_name(move |i| format!("compute-{i}"))
        .build()
        .context("building the compute thread pool")?;
    // Free memory is read before the weights load, so they come out of this worker's share.
    let free_memory = mem::read_available_memory();
    let started = Instant::now();
    let model = pool.install(|| load_model(&config.model))?;
    let mc = model.config().clone();
    let context_len = config
        .context_length
        .unwrap_or(mc.max_position_embeddings)
        .min(mc.max_position_embeddings);
    let max_total_tokens = match config.max_total_tokens {
        Some(tokens) => tokens,
        None => size_kv_pool(&config, mem_fraction_given, &mc, context_len, free_memory),
    };
    tracing::info!(
        rank = config.rank,
        model = %mc.model_id,
        params = mc.num_params(),
        layers = mc.num_hidden_layers,
        hidden = mc.hidden_size,
        context_len,
        max_total_tokens,
        kv_bytes = model::KvBuffers::bytes_per_slot(&mc) * max_total_tokens,
        threads = config.num_threads,
        kernel_path = %kernel_path,
        load_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
    let hello = Hello {
        rank: config.rank,
        capacity: Capacity {
            max_total_tokens: max_total_tokens as u64,
            max_running_requests: config.max_running_requests as u32,
            context_len: context_len as u64,
            vocab_size: mc.vocab_size as u64,
        },
        model_id: mc.model_id.clone(),
        protocol_version: protocol::PROTOCOL_VERSION,
        pid: std::process::id(),
        held_rids: Vec::new(),
    };
    let mut sched = Scheduler::new(
        SchedulerConfig {
            rank: config.rank,
            max_total_tokens,
            max_running_requests: config.max_running_requests,
            pre_alloc_rows: config.pre_alloc_rows,
            chunked_prefill_size: config.chunked_prefill_size,
            max_prefill_tokens: config.max_prefill_tokens,
            context_len,
            policy: config.schedule_policy,
            disable_radix_cache: config.disable_radix_cache,
            prefill_step_target: config.prefill_step_target,
        },
        model,
    );

    let ctx = zmq::Context::new();
    let outbox_rx = ctx.socket(zmq::PULL)?;
    outbox_rx.bind(link::OUTBOX)?;
    let outbox = ctx.socket(zmq::PUSH)?;
    outbox.connect(link::OUTBOX)?;
    let to_tokenizer = protocol::socket::connect(&ctx, zmq::PUSH, &config.tokenizer_addr, None)?;
    let tracer = match &config.trace_dir {
        Some(dir) => protocol::msg_trace::MessageTracer::open(dir, "worker", Some(config.rank))
            .with_context(|| format!("--trace-dir {}", dir.display()))?,
        None => protocol::msg_trace::MessageTracer::disabled(),
    };
    sched.tracer = tracer.clone();
    let held_rids = link::HeldRids::default();
    let (inbound_tx, inbound) = mpsc::channel();
    let link_stop = Arc::new(AtomicBool::new(false));
    let link = {
        let link = link::Link {
            ctx: ctx.clone(),
            outbox: outbox_rx,
            worker_addr: config.worker_addr.clone(),
            hello,
            heartbeat_interval: config.heartbeat_interval,
            inbound: inbound_tx,
            stop: Arc::clone(&link_stop),
            draining: Arc::clone(&stop),
            tracer: tracer.clone(),
            held_rids: held_rids.clone(),
        };
        std::thread::Builder::new()
            .name("controller-link".into())
            .spawn(move || link::run(link))?
    };
    tracing::info!(rank = config.rank, worker_addr = %config.worker_addr, tokenizer_addr = %config.tokenizer_addr, "worker started");

    // Traced before it goes out, so a merged timeline never shows the tokenizer's `recv`
    // ahead of this `send`.
    let send = |msg: &Message| {
        let frame = match protocol::encode(msg) {
            Ok(frame) => frame,
            Err(e) => return tracing::warn!(%e, msg = msg.type_name(), "encode failed"),
        };
        if let Message::TokenOut(out) = msg {
            trace_token_out(&tracer, out, frame.len());
            if out.finish_reason.is_some() {
                held_rids.remove(&out.rid);
            }
        }
        if let Err(e) = to_tokenizer.send(&frame[..], 0) {
            tracing::warn!(%e, "send to tokenizer failed");
        }
    };
    let mut last_status = Instant::now();
    // The first snapshot goes out at once, so the controller (and /metrics) see this rank's
    // load from the moment it joins rather than a second later.
    let mut status_now = true;
    let mut last_generated = 0u64;
    let mut refused: Option<String> = None;
    // SIGTERM starts a drain: the controller stops routing here at once, what is held finishes
    // within --drain-timeout, then the worker leaves.
    let mut drain_deadline: Option<Instant> = None;
    loop {
        if refused.is_some() {
            break;
        }
        if stop.load(Ordering::Relaxed) && drain_deadline.is_none() {
            if !sched.has_work() || config.drain_timeout.is_zero() {
                break;
            }
            tracing::info!(
                rank = config.rank,
                running = sched.num_running(),
                waiting = sched.num_waiting(),
                drain_timeout_s = config.drain_timeout.as_secs_f64(),
                "draining before exit"
            );
            protocol::socket::send(
                &outbox,
                &Message::Shutdown(Shutdown {
                    rank: Some(config.rank),
                    reason: "draining".into(),
                    drain_timeout_s: Some(config.drain_timeout.as_secs_f64()),
                }),
            )
            .ok();
            drain_deadline = Some(Instant::now() + config.drain_timeout);
        }
        if let Some(deadline) = drain_deadline {
            if !sched.has_work() || Instant::now() >= deadline {
                break;
            }
        }
        // Take everything that arrived; block briefly only when there is nothing to compute.
        let mut first = if sched.has_work() {
            inbound.try_recv().ok()
        } else {
            match inbound.recv_timeout(Duration::from_millis(50)) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        };
        while let Some(item) = first.take().or_else(|| inbound.try_recv().ok()) {
            match item {
                Inbound::Refused(reason) => {
                    refused = Some(reason);
                    stop.store(true, Ordering::Relaxed);
                }
                Inbound::Msg(Message::GenerateReq(protocol::GenerateReq { rid, .. }))
                | Inbound::Msg(Message::EmbedReq(protocol::EmbedReq { rid, .. }))
                    if protocol::rid_problem(&rid).is_some() =>
                {
                    send(&Message::TokenOut(bad_rid_error(&rid)));
                }
                Inbound::Msg(Message::GenerateReq(req)) if drain_deadline.is_some() => {
                    send(&Message::TokenOut(draining_error(&req.rid, config.rank)));
                }
                Inbound::Msg(Message::EmbedReq(req)) if drain_deadline.is_some() => {
                    send(&Message::TokenOut(draining_error(&req.rid, config.rank)));
                }
                Inbound::Msg(Message::GenerateReq(req)) => {
                    // Held until its final output goes out (a refusal is one too).
                    held_rids.insert(&req.rid);
                    if let Some(out) = sched.submit(req) {
                        send(&Message::TokenOut(out));
                    }
                }
                Inbound::Msg(Message::EmbedReq(req)) => {
                    held_rids.insert(&req.rid);
                    if let Some(out) = sched.submit_embed(req.rid, req.input_ids) {
                        send(&Message::TokenOut(out));
                    }
                }
                Inbound::Msg(Message::Abort(abort)) => {
                    for out in sched.abort(abort.rid.as_deref()) {
                        send(&Message::TokenOut(out));
                    }
                }
                Inbound::Msg(Message::FlushCache(_)) => match sched.flush_cache() {
                    Ok(freed) => tracing::info!(freed_slots = freed, "prefix cache flushed"),
                    Err(refused) => tracing::warn!(%refused, "flush_cache refused"),
                },
                Inbound::Msg(Message::Shutdown(s)) => {
                    tracing::info!(reason = %s.reason, "controller asked this worker to stop");
                    stop.store(true, Ordering::Relaxed);
                }
                Inbound::Msg(other) => {
                    tracing::warn!(msg = other.type_name(), "unexpected message; dropped")
                }
            }
        }
        let stepped = sched.has_work();
        if stepped {
            for out in pool.install(|| sched.step()) {
                send(&Message::TokenOut(out));
            }
        }
        // Going idle is reported at once, not a throttle or idle interval later: `/flush_cache`
        // and the router read "nothing running" from this status.
        let went_idle = stepped && !sched.has_work();
        let due = last_status.elapsed();
        if status_now
            || went_idle
            || (stepped && due >= STATUS_MIN_INTERVAL)
            || due >= STATUS_IDLE_INTERVAL
        {
            status_now = false;
            let generated = sched.stats.generated_tokens;
            let status = WorkerStatus {
                rank: config.rank,
                timestamp: protocol::unix_time(),
                num_running_reqs: sched.num_running() as u32,
                num_waiting_reqs: sched.num_waiting() as u32,
                num_used_tokens: sched.used_tokens() as u64,
                max_total_tokens: max_total_tokens as u64,
                cache_hit_rate: sched.cache_hit_rate(),
                gen_throughput: (generated - last_generated) as f64 / due.as_secs_f64().max(1e-3),
                finished_rids: sched.take_finished_rids(),
                num_free_tokens: sched.free_slots() as u64,
                num_evictable_tokens: sched.evictable_slots() as u64,
                kernel_path: kernel_path.name().to_string(),
            };
            last_generated = generated;
            last_status = Instant::now();
            protocol::socket::send(&outbox, &Message::WorkerStatus(status)).ok();
        }
    }

    // Leaving: no request may hang, so everything still held fails with a clear error.
    let why = match &refused {
        Some(reason) => format!(
            "worker {} was refused by the controller: {reason}",
            config.rank
        ),
        // Only what is still held when the drain ends ran out of time.
        None if drain_deadline.is_some() && sched.has_work() => format!(
            "data parallel rank {} stopped: its drain timeout ({:.1}s) ran out",
            config.rank,
            config.drain_timeout.as_secs_f64()
        ),
        None if drain_deadline.is_some() => format!(
            "data parallel rank {} drained: its requests finished in {:.1}s",
            config.rank,
            drain_deadline
                .map(|d| (Instant::now() + config.drain_timeout).saturating_duration_since(d))
                .unwrap_or_default()
                .as_secs_f64()
        ),
        None => format!("data parallel rank {} is shutting down", config.rank),
    };
    for out in sched.fail_all(503, &why) {
        send(&Message::TokenOut(out));
    }
    protocol::socket::send(
        &outbox,
        &Message::Shutdown(Shutdown {
            rank: Some(config.rank),
            reason: why.clone(),
            drain_timeout_s: None,
        }),
    )
    .ok();
    // The Shutdown is queued before the stop flag is set, and the link drains its outbox once
    // more after it sees the flag, so the controller hears it.
    link_stop.store(true, Ordering::Relaxed);
    match link.join() {
        Ok(result) => result?,
        Err(_) => anyhow::bail!("controller link thread panicked"),
    }
    match refused {
        Some(reason) => Err(Refused(reason).into()),
        None => {
            tracing::info!(rank = config.rank, "worker stopped");
            Ok(())
        }
    }
}

/// The answer to a request whose rid breaks the one rid limit ([`protocol::MAX_RID_LEN`]):
/// the controller refuses those already, so only a peer that skips it meets this.
fn bad_rid_error(rid: &str) -> protocol::TokenOut {
    let why = protocol::rid_problem(rid).unwrap_or_default();
    tracing::warn!(rid_len = rid.len(), "request refused: {why}");
    protocol::TokenOut::error(rid, 400, why)
}

fn draining_error(rid: &str, rank: u32) -> protocol::TokenOut {
    let mut out = protocol::TokenOut::error(
        rid,
        503,
        format!("data parallel rank {rank} is draining and takes no new requests"),
    );
    out.dp_rank = Some(rank);
    out
}

/// Message trace of an output: the message, plus the first-token and finished milestones.
fn trace_token_out(
    tracer: &protocol::msg_trace::MessageTracer,
    out: &protocol::TokenOut,
    bytes: usize,
) {
    if !tracer.enabled() {
        return;
    }
    tracer.message(true, &Message::TokenOut(out.clone()), "tokenizer", bytes);
    tracer.token_out_milestones(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rid_over_the_limit_is_answered_with_a_400() {
        let long = "x".repeat(protocol::MAX_RID_LEN + 1);
        let out = bad_rid_error(&long);
        assert_eq!(out.rid, long);
        assert_eq!(out.finish_reason, Some(protocol::FinishReason::Error));
        assert_eq!(out.error.map(|e| e.status), Some(400));
    }
}
