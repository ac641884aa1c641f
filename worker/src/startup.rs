//! Worker start-up: load the model (or the simulated device), size the KV pool to the device,
//! open the sockets and the link to the controller, register, and run the actor's loop until
//! it stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{Capacity, Hello, Message};

use crate::actor::{Outbox, WorkerActor};
use crate::args::{self, ModelSource, WorkerArgs, WorkerConfig};
use crate::error::{self, WorkerError};
use crate::model::{self, LlamaModel, ModelConfig};
use crate::model_runner::ModelRunner;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sim::SimModel;
use crate::{disagg, gpu_identity, link, mem};

/// Load the model the config names. A model of a kind the code does not implement is a
/// [`WorkerError::UnsupportedModel`] (EX_CONFIG), one line naming what is unsupported.
pub fn load_model(source: &ModelSource) -> error::Result<LlamaModel> {
    match source {
        ModelSource::HfDir {
            dir,
            dtype,
            weight_cache,
        } => LlamaModel::load_hf_shared(dir, *dtype, weight_cache.as_deref()).map_err(|e| {
            if e.is_unsupported() {
                WorkerError::UnsupportedModel {
                    dir: dir.clone(),
                    reason: e.to_string(),
                }
            } else {
                WorkerError::Model {
                    dir: dir.clone(),
                    error: e,
                }
            }
        }),
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
    weight_bytes: u64,
) -> usize {
    let budget = mem::KvBudget {
        available_bytes: reading.as_ref().ok().map(|r| r.available_bytes),
        mem_fraction: config.mem_fraction,
        // As loaded (f32 or the checkpoint's 16-bit type, `--weight-dtype`).
        weight_bytes,
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

/// A simulated rank's KV pool: what the modelled GPU's memory holds beside its weights.
fn size_sim_pool(rank: u32, sim: &SimModel) -> error::Result<usize> {
    let size = sim.cost().pool_size()?;
    tracing::info!(
        rank,
        budget_bytes = size.budget_bytes,
        kv_bytes_per_token = sim.profile().kv_bytes_per_token,
        max_total_tokens = size.tokens,
        capped = size.capped,
        "simulated KV pool sized from the modelled GPU memory less the weights (--mem-fraction \
         is the host's and does not apply; set --max-total-tokens to choose it)"
    );
    Ok(size.tokens)
}

/// The start line of a simulated rank: nothing it outputs comes from a model.
fn log_simulated(
    config: &WorkerConfig,
    sim: &SimModel,
    context_len: usize,
    max_total_tokens: usize,
) {
    let p = sim.profile();
    tracing::info!(
        rank = config.rank,
        device = "sim",
        profile = %p.name,
        gpu = %p.gpu,
        model = %p.model,
        peak_tflops = p.peak_tflops,
        mem_bandwidth_gbs = p.mem_bandwidth_gbs,
        step_overhead_ms = p.step_overhead_ms,
        weight_bytes = sim.cost().weight_bytes(),
        context_len,
        max_total_tokens,
        lock_step = ?sim.lock_step().map(|l| l.path().display().to_string()),
        "SIMULATED rank: no model runs here; steps sleep for a cost model's time and emit \
         pseudo-tokens (docs/SIM.md)"
    );
}

/// The simulated rank `--device sim` asks for, in lock-step if `--sim-lock-step` is set.
fn sim_model(sim: &args::SimSettings) -> error::Result<SimModel> {
    let model = SimModel::new(sim.profile.clone(), sim.seed);
    Ok(match &sim.lock_step {
        Some(path) => model.with_lock_step(crate::sim::LockStep::open(path).map_err(|error| {
            WorkerError::File {
                flag: "sim-lock-step",
                path: path.clone(),
                error,
            }
        })?),
        None => model,
    })
}

/// `--device cuda:N` where it cannot be served: the probe's reason (no driver, no device, no
/// such ordinal, a CUDA library missing), or that this build has no CUDA backend.
fn cuda_unavailable(ordinal: u32, why: impl std::fmt::Display) -> WorkerError {
    WorkerError::DeviceUnavailable {
        device: format!("cuda:{ordinal}"),
        why: why.to_string(),
    }
}

/// `--device cuda:N`: probes GPU N, loads the model on the host and uploads it in its stored
/// type (kernels compiled by NVRTC first). The KV pool is allocated once its size is known
/// ([`alloc_gpu_pool`]). Every failure is one line and EX_CONFIG.
#[cfg(feature = "cuda")]
fn load_cuda(
    config: &WorkerConfig,
    ordinal: u32,
    pool: &rayon::ThreadPool,
) -> error::Result<model::cuda::CudaLlama> {
    let gpu = kernels::cuda::probe(ordinal).map_err(|e| cuda_unavailable(ordinal, e))?;
    let host = pool.install(|| load_model(&config.model))?;
    if let Some(why) = host.config().cuda_refusal() {
        return Err(cuda_unavailable(ordinal, why));
    }
    // cudarc panics on a symbol its library lacks: at start, that is a refusal like any other.
    let model = kernels::cuda::quietly("uploading the model", || {
        model::cuda::CudaLlama::upload(&host, gpu)
    })
    .and_then(|r| r)
    .map_err(|e| cuda_unavailable(ordinal, format!("uploading the model: {e}")))?;
    Ok(model)
}

#[cfg(not(feature = "cuda"))]
fn load_cuda(
    _config: &WorkerConfig,
    ordinal: u32,
    _pool: &rayon::ThreadPool,
) -> error::Result<LlamaModel> {
    Err(cuda_unavailable(
        ordinal,
        kernels::cuda::CudaError::NotBuilt,
    ))
}

/// The KV pool of a GPU rank: `--mem-fraction` of the GPU memory free before the model was
/// uploaded, less what the upload took and one step's activations (chunked-prefill tokens,
/// every running request), in the storage type. Too little for one full context is an error:
/// a GPU pool is allocated up front and cannot grow.
#[cfg(feature = "cuda")]
fn size_gpu_pool(
    config: &WorkerConfig,
    m: &model::cuda::CudaLlama,
    context_len: usize,
) -> error::Result<usize> {
    let ordinal = m.gpu().ordinal;
    let (free, total) = m.mem_info().map_err(|e| cuda_unavailable(ordinal, e))?;
    let uploaded = m.gpu().free_bytes.saturating_sub(free);
    let step = m.step_bytes(config.chunked_prefill_size, config.max_running_requests);
    let budget = mem::KvBudget {
        available_bytes: Some(m.gpu().free_bytes),
        mem_fraction: config.mem_fraction,
        weight_bytes: uploaded.max(m.weight_bytes()) + step,
        kv_bytes_per_token: m.kv_bytes_per_token(),
        context_len,
        req_to_token_rows: config.max_running_requests + config.pre_alloc_rows,
        // A GPU is this worker's own: the share is the pool's, not a few thousand per request.
        tokens_per_request: None,
    };
    let size = budget.derive();
    tracing::info!(
        rank = config.rank,
        gpu_free_bytes = m.gpu().free_bytes,
        gpu_total_bytes = total,
        mem_fraction = config.mem_fraction,
        uploaded_bytes = uploaded,
        step_bytes = step,
        budget_bytes = size.budget_bytes.unwrap_or(0),
        kv_bytes_per_token = budget.kv_bytes_per_token,
        max_total_tokens = size.max_total_tokens,
        limit = size.limit.as_str(),
        "GPU KV pool sized from --mem-fraction of the GPU memory free at start (set \
         --max-total-tokens to choose it)"
    );
    if size.limit == mem::PoolLimit::OneContext {
        return Err(cuda_unavailable(
            ordinal,
            format!(
                "too little GPU memory: --mem-fraction {} of the {} MiB free leaves {} MiB for \
                 the KV pool after the model ({} MiB) and one step, less than one full context \
                 of {context_len} tokens needs ({} MiB); raise --mem-fraction, lower \
                 --context-length or set --max-total-tokens",
                config.mem_fraction,
                m.gpu().free_bytes >> 20,
                size.budget_bytes.unwrap_or(0) >> 20,
                budget.weight_bytes >> 20,
                (budget.kv_bytes_per_token * context_len as u64) >> 20,
            ),
        ));
    }
    Ok(size.max_total_tokens)
}

/// Allocates the GPU KV pool of `slots` slots, then runs one step of one token (into slot 0,
/// free, so overwritten before anything reads it): every kernel and cuBLAS call a step makes
/// has then run once, and one that cannot is a start-up refusal, not a failed request.
#[cfg(feature = "cuda")]
fn alloc_gpu_pool(m: &model::cuda::CudaLlama, slots: usize) -> error::Result<()> {
    let ordinal = m.gpu().ordinal;
    let bytes = m.kv_bytes_per_token() * slots as u64;
    m.alloc_kv(slots).map_err(|e| {
        cuda_unavailable(
            ordinal,
            format!(
                "allocating the KV pool of {slots} tokens ({} MiB): {e}",
                bytes >> 20
            ),
        )
    })?;
    let first = [model::SeqInput {
        new_tokens: &[0],
        start_pos: 0,
        slots: &[0],
    }];
    let plan = model::BatchPlan::new(m.config(), slots, &first).map_err(WorkerError::Step)?;
    kernels::cuda::quietly("the first step", || m.forward(&plan))
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|e| cuda_unavailable(ordinal, format!("the first step failed: {e}")))?;
    Ok(())
}

/// Run a worker until SIGTERM/SIGINT or a `Shutdown` from the controller.
/// `mem_fraction_given`: `--mem-fraction` (or its variable) was set, so a pool sized without
/// `--max-total-tokens` takes what that share of memory allows rather than the default of a
/// few thousand slots per running request.
pub fn run(args: WorkerArgs, mem_fraction_given: bool) -> error::Result<()> {
    let config = args.resolve()?;
    crate::clock::warn_if_stepped();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|error| WorkerError::Os {
            what: "installing signal handler",
            error,
        })?;
    }
    // Fixed before any kernel runs; every step of this process then uses it.
    let kernel_path = kernels::set_kernel_path(config.kernel_path);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.num_threads)
        .thread_name(move |i| format!("compute-{i}"))
        .build()
        .map_err(WorkerError::ThreadPool)?;
    let (sched, hello) = load(&config, &pool, kernel_path, mem_fraction_given)?;
    serve(config, sched, hello, pool, kernel_path, stop)
}

/// Loads the model, sizes the KV pool and builds the scheduler; the `Hello` that announces
/// this rank's capacity.
fn load(
    config: &WorkerConfig,
    pool: &rayon::ThreadPool,
    kernel_path: kernels::KernelPath,
    mem_fraction_given: bool,
) -> error::Result<(Scheduler, Hello)> {
    // Free memory is read before the weights load, so they come out of this worker's share.
    let free_memory = mem::read_available_memory();
    let started = Instant::now();
    let model: ModelRunner = match (&config.sim, config.cuda) {
        (Some(sim), _) => sim_model(sim)?.into(),
        (None, Some(ordinal)) => load_cuda(config, ordinal, pool)?.into(),
        (None, None) => pool.install(|| load_model(&config.model))?.into(),
    };
    let mc = model.config().clone();
    let context_len = config
        .context_length
        .unwrap_or(mc.max_position_embeddings)
        .min(mc.max_position_embeddings);
    let max_total_tokens = match (config.max_total_tokens, &model) {
        (Some(tokens), _) => tokens,
        (None, ModelRunner::Sim(sim)) => size_sim_pool(config.rank, sim)?,
        #[cfg(feature = "cuda")]
        (None, ModelRunner::Cuda(m)) => size_gpu_pool(config, m, context_len)?,
        (None, ModelRunner::Llama(m)) => size_kv_pool(
            config,
            mem_fraction_given,
            &mc,
            context_len,
            free_memory,
            m.weight_bytes() as u64,
        ),
    };
    #[cfg(feature = "cuda")]
    if let ModelRunner::Cuda(m) = &model {
        alloc_gpu_pool(m, max_total_tokens)?;
    }
    let pool_size = PoolSize {
        context_len,
        max_total_tokens,
    };
    log_loaded(config, &model, pool_size, kernel_path, started);
    let hello = hello(config, &model, pool_size);
    let mut sched = Scheduler::new(scheduler_config(config, &mc, pool_size), model);
    sched.enable_kv_events(config.kv_event_block_size);
    Ok((sched, hello))
}

/// The context and KV pool a worker was sized to.
#[derive(Debug, Clone, Copy)]
struct PoolSize {
    context_len: usize,
    max_total_tokens: usize,
}

/// The one line that says what was loaded, where, and how big its pool is.
fn log_loaded(
    config: &WorkerConfig,
    model: &ModelRunner,
    pool: PoolSize,
    kernel_path: kernels::KernelPath,
    started: Instant,
) {
    let PoolSize {
        context_len,
        max_total_tokens,
    } = pool;
    let mc = model.config();
    match model {
        ModelRunner::Sim(sim) => log_simulated(config, sim, context_len, max_total_tokens),
        #[cfg(feature = "cuda")]
        ModelRunner::Cuda(m) => {
            let gpu = m.gpu();
            tracing::info!(
                rank = config.rank,
                model = %mc.model_id,
                params = mc.num_params(),
                layers = mc.num_hidden_layers,
                hidden = mc.hidden_size,
                device = %format!("cuda:{}", gpu.ordinal),
                gpu = %gpu.name,
                gpu_memory_bytes = gpu.total_bytes,
                compute_capability = %format!("{}.{}", gpu.compute_capability.0, gpu.compute_capability.1),
                dtype = m.dtype().suffix(),
                weight_bytes = m.weight_bytes(),
                context_len,
                max_total_tokens,
                kv_bytes = m.kv_bytes_per_token() * max_total_tokens as u64,
                load_ms = started.elapsed().as_millis() as u64,
                "model loaded on the GPU"
            )
        }
        ModelRunner::Llama(m) => tracing::info!(
            rank = config.rank,
            model = %mc.model_id,
            params = mc.num_params(),
            weight_dtype = %m.matrix_dtype(),
            weight_bytes = m.weight_bytes(),
            layers = mc.num_hidden_layers,
            hidden = mc.hidden_size,
            context_len,
            max_total_tokens,
            kv_bytes = model::KvBuffers::bytes_per_slot(mc) * max_total_tokens,
            threads = config.num_threads,
            kernel_path = %kernel_path,
            load_ms = started.elapsed().as_millis() as u64,
            "model loaded"
        ),
    }
}

/// The worker's registration: its capacity, model and role.
fn hello(config: &WorkerConfig, model: &ModelRunner, pool: PoolSize) -> Hello {
    let mc = model.config();
    Hello {
        rank: config.rank,
        capacity: Capacity {
            max_total_tokens: pool.max_total_tokens as u64,
            max_running_requests: config.max_running_requests as u32,
            context_len: pool.context_len as u64,
            vocab_size: mc.vocab_size as u64,
        },
        model_id: mc.model_id.clone(),
        protocol_version: protocol::PROTOCOL_VERSION,
        pid: std::process::id(),
        held_rids: Vec::new(),
        disaggregation_mode: config.disaggregation_mode,
        kv_endpoint: None, // set once the KV socket is bound
        kv_public_key: None,
        kv_layout: (!config.disaggregation_mode.is_null()).then(|| mc.kv_layout()),
        // The GPU a CUDA rank runs on, as its probe found it; none on the CPU or a simulated rank.
        gpu: model.gpu().map(gpu_identity::gpu_identity),
        taken_seq: None, // nothing sent to this process yet; a rejoin's Hello says
    }
}

/// The scheduler's limits from the flags and the pool the worker was sized to.
fn scheduler_config(config: &WorkerConfig, mc: &ModelConfig, pool: PoolSize) -> SchedulerConfig {
    let disagg = (!config.disaggregation_mode.is_null()).then(|| disagg::DisaggConfig {
        mode: config.disaggregation_mode,
        layout: mc.kv_layout(),
        bootstrap_timeout: config.bootstrap_timeout,
        waiting_timeout: config.waiting_timeout,
    });
    SchedulerConfig {
        rank: config.rank,
        max_total_tokens: pool.max_total_tokens,
        max_running_requests: config.max_running_requests,
        pre_alloc_rows: config.pre_alloc_rows,
        chunked_prefill_size: config.chunked_prefill_size,
        max_prefill_tokens: config.max_prefill_tokens,
        context_len: pool.context_len,
        policy: config.schedule_policy,
        disable_radix_cache: config.disable_radix_cache,
        prefill_step_target: config.prefill_step_target,
        disagg,
        max_queued_requests: config.max_queued_requests,
    }
}

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
        inbound,
        stop,
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
fn serve(
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
            tracing::info!(rank = config.rank, "worker stopped");
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
