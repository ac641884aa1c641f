//! Worker start-up: load the model (or the simulated device), size the KV pool to the device,
//! open the sockets and the link to the controller, register, and run the actor's loop until
//! it stops.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use protocol::{Capacity, Hello};

use crate::args::{self, ModelSource, WorkerArgs, WorkerConfig};
use crate::error::{self, WorkerError};
use crate::model::{self, LlamaModel, ModelConfig};
use crate::model_runner::ModelRunner;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sim::SimModel;
use crate::{disagg, gpu_identity, mem};

mod pool;
mod serve;

#[cfg(feature = "cuda")]
use pool::{alloc_gpu_pool, size_gpu_pool};
use pool::{size_kv_pool, size_sim_pool};

/// Load the model the config names. A model of a kind the code does not implement is a
/// [`WorkerError::UnsupportedModel`] (EX_CONFIG), one line naming what is unsupported.
pub fn load_model(source: &ModelSource) -> error::Result<LlamaModel> {
    match source {
        ModelSource::HfDir {
            dir,
            dtype,
            compute,
            weight_cache,
        } => load_checkpoint(dir, *dtype, *compute, weight_cache.as_deref()),
        ModelSource::Builtin { size, seed } => {
            Ok(LlamaModel::dummy(ModelConfig::builtin(*size), *seed))
        }
    }
}

/// A checkpoint's model; in the bf16 compute mode its matrices are loaded as bf16.
fn load_checkpoint(
    dir: &std::path::Path,
    dtype: model::LoadDtype,
    compute: kernels::ComputeDtype,
    weight_cache: Option<&std::path::Path>,
) -> error::Result<LlamaModel> {
    let dtype = match compute {
        kernels::ComputeDtype::Bf16 => model::LoadDtype::Bf16,
        kernels::ComputeDtype::F32 => dtype,
    };
    LlamaModel::load_hf_shared(dir, dtype, weight_cache)
        .map(|mut m| {
            m.set_compute_dtype(compute);
            m
        })
        .map_err(|e| {
            if e.is_unsupported() {
                WorkerError::UnsupportedModel {
                    dir: dir.into(),
                    reason: e.to_string(),
                }
            } else {
                WorkerError::Model {
                    dir: dir.into(),
                    error: e,
                }
            }
        })
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
        speed = p.speed,
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
    serve::serve(config, sched, hello, pool, kernel_path, stop)
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
    let simulated = matches!(model, ModelRunner::Sim(_));
    let mut sched_config = scheduler_config(config, &mc, pool_size);
    if let ModelRunner::Sim(sim) = &model {
        in_modelled_time(&mut sched_config, sim.profile().speed);
    }
    let mut sched = Scheduler::new(sched_config, model);
    sched.set_grammars(Arc::new(grammars(config, &mc, simulated)));
    sched.enable_kv_events(config.kv_event_block_size);
    Ok((sched, hello))
}

/// A simulated rank's durations are in modelled time: run `speed` times faster, it measures
/// its steps, and its prompts' waits, that much shorter, so the step-time target and
/// finish-first's wait bound shrink with them.
fn in_modelled_time(config: &mut SchedulerConfig, speed: f64) {
    config.prefill_step_target = config.prefill_step_target.map(|t| t.div_f64(speed));
    if let Some(ff) = &mut config.finish_first {
        ff.max_wait = ff.max_wait.div_f64(speed);
    }
}

/// The vocabulary requests' constraints are compiled against: the model directory's
/// `tokenizer.json` (read on the first constrained request), sized to the model's logit rows.
fn grammars(config: &WorkerConfig, mc: &ModelConfig, simulated: bool) -> grammar::LazyGrammars {
    match &config.model {
        _ if simulated => grammar::LazyGrammars::none("a simulated rank computes no logits"),
        ModelSource::HfDir { dir, .. } => grammar::LazyGrammars::tokenizer_json(
            dir.join("tokenizer.json"),
            mc.vocab_size,
            mc.eos_token_ids.clone(),
        ),
        ModelSource::Builtin { .. } => grammar::LazyGrammars::none(grammar::BUILTIN_HAS_NO_BYTES),
    }
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
            weight_dtype = %m.matrix_dtype_name(kernel_path),
            compute_dtype = %m.compute_dtype_name(kernel_path),
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
        // Every request's constraint is enforced here (scheduler::decode's sample_and_check).
        constraints: true,
        // A unified worker's finish-first bound (a role's worker prefills or decodes, not both).
        finish_first_tokens: config
            .finish_first
            .filter(|_| config.disaggregation_mode.is_null())
            .map_or(0, |ff| ff.tokens.try_into().unwrap_or(u32::MAX)),
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
        finish_first: config.finish_first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LoadDtype;

    #[test]
    fn a_checkpoint_with_a_tensor_its_config_does_not_use_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();
        crate::model::fixtures::write_checkpoint_with_unused_o_bias(dir.path());
        // The worker refuses to start with it, as a configuration error (EX_CONFIG).
        let err = load_model(&ModelSource::HfDir {
            dir: dir.path().into(),
            dtype: LoadDtype::Auto,
            compute: kernels::ComputeDtype::F32,
            weight_cache: None,
        })
        .unwrap_err();
        assert!(
            matches!(err, WorkerError::UnsupportedModel { .. }),
            "{err:?}"
        );
        assert!(err.is_config_error(), "{err}");
        assert!(err.to_string().contains("o_proj.bias"), "{err}");
    }

    #[test]
    fn a_simulated_rank_reads_its_step_target_and_finish_first_bound_in_modelled_time() {
        use crate::scheduler::FinishFirst;
        use std::time::Duration;
        let mut config = SchedulerConfig {
            prefill_step_target: Some(Duration::from_millis(500)),
            finish_first: Some(FinishFirst {
                tokens: 16,
                max_wait: Duration::from_millis(600),
            }),
            ..crate::scheduler::tests::config(1 << 16, 2048)
        };
        in_modelled_time(&mut config, 4.0);
        assert_eq!(config.prefill_step_target, Some(Duration::from_millis(125)));
        let ff = config.finish_first.expect("finish-first stays on");
        assert_eq!((ff.tokens, ff.max_wait), (16, Duration::from_millis(150)));
    }
}
