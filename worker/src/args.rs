//! `dpserve worker` flags and their resolution into a [`WorkerConfig`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use protocol::endpoint::default_endpoint;
use protocol::Endpoint;

use kernels::KernelPath;

use crate::model::BuiltinSize;
use crate::req_to_token::DecodePrealloc;
use crate::scheduler::SchedulePolicy;

/// `--chunked-prefill-size` when not given (also the engine benchmark's chunk).
pub const DEFAULT_CHUNKED_PREFILL_SIZE: usize = 2048;
/// `--prefill-step-target-ms` when not given.
pub const DEFAULT_PREFILL_STEP_TARGET_MS: u64 = 500;

/// `dpserve worker` flags. Every flag also reads `DPSERVE_<FLAG>`.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This worker's data-parallel rank (its stable id in the live set).
    #[arg(long, env = "DPSERVE_RANK")]
    pub rank: u32,
    /// Hugging Face model directory. Without it, the built-in model with random weights.
    #[arg(long, env = "DPSERVE_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// `auto` (the model directory, or the built-in model without one) or `dummy` (the
    /// built-in model, seeded random weights).
    #[arg(long, env = "DPSERVE_LOAD_FORMAT", default_value = "auto")]
    pub load_format: String,
    /// Size of the built-in model: `base` (tens of millions of parameters) or `tiny` (tests).
    #[arg(long, env = "DPSERVE_BUILTIN_SIZE", default_value = "base")]
    pub builtin_size: String,
    /// Seed of the built-in model's weights; every rank must use the same one.
    #[arg(long, env = "DPSERVE_WEIGHT_SEED", default_value_t = 0)]
    pub weight_seed: u64,
    /// Controller's worker socket (connect, DEALER).
    #[arg(long, env = "DPSERVE_WORKER_ADDR")]
    pub worker_addr: Option<String>,
    /// Tokenizer's output socket (connect, PUSH).
    #[arg(long, env = "DPSERVE_TOKENIZER_ADDR")]
    pub tokenizer_addr: Option<String>,
    /// KV pool size in tokens (slots). Unset: derived from --mem-fraction of the memory free at
    /// start, less the model's weights, between one full context and max-running-requests (plus
    /// pre-allocated rows) × 2048 (× context length when --mem-fraction is set). Set, it wins.
    #[arg(long, env = "DPSERVE_MAX_TOTAL_TOKENS")]
    pub max_total_tokens: Option<usize>,
    /// Share of the memory free at start (MemAvailable, or the cgroup's headroom when tighter)
    /// that this worker's model weights and KV pool may take, in (0, 1]; used when
    /// --max-total-tokens is unset. Low by default because host memory is shared, unlike a
    /// GPU's: the OS, the page cache that reads the weights, the other actors and the forward
    /// pass's activations live in the other half, and KV pages are only touched as slots fill,
    /// so an over-large pool fails late (an OOM kill while serving), not at start. Workers
    /// sharing a host must split it: `up --dp-size N` gives each 1/N of its --mem-fraction.
    #[arg(long, env = "DPSERVE_MEM_FRACTION", default_value_t = crate::mem::DEFAULT_MEM_FRACTION,
          value_parser = crate::mem::parse_mem_fraction)]
    pub mem_fraction: f64,
    /// Most requests decoding at once.
    #[arg(long, env = "DPSERVE_MAX_RUNNING_REQUESTS", default_value_t = 64)]
    pub max_running_requests: usize,
    /// Most prompt tokens of one request computed in one step (longer prompts are chunked).
    #[arg(long, env = "DPSERVE_CHUNKED_PREFILL_SIZE", default_value_t = DEFAULT_CHUNKED_PREFILL_SIZE)]
    pub chunked_prefill_size: usize,
    /// Most prompt tokens computed in one prefill step over all requests.
    #[arg(long, env = "DPSERVE_MAX_PREFILL_TOKENS", default_value_t = 8192)]
    pub max_prefill_tokens: usize,
    /// Extra request-to-token rows beyond --max-running-requests for requests that hold KV
    /// without running (disaggregated decode): `auto` = 2 × max-running-requests when that is
    /// at most 32, else 0; or a row count.
    #[arg(long, env = "DPSERVE_DECODE_PREALLOC_SIZE", default_value_t = DecodePrealloc::Auto)]
    pub decode_prealloc_size: DecodePrealloc,
    /// Scheduling policy: `lpm` (longest cached prefix first, shared prefixes computed once)
    /// or `fcfs`.
    #[arg(long, env = "DPSERVE_SCHEDULE_POLICY", default_value_t = SchedulePolicy::Lpm)]
    pub schedule_policy: SchedulePolicy,
    /// Do not keep or reuse prompt prefixes.
    #[arg(long, env = "DPSERVE_DISABLE_RADIX_CACHE")]
    pub disable_radix_cache: bool,
    /// Context length (default: the model's `max_position_embeddings`).
    #[arg(long, env = "DPSERVE_CONTEXT_LENGTH")]
    pub context_length: Option<usize>,
    /// Compute threads of this worker (default: the CPUs this process may use).
    #[arg(long, env = "DPSERVE_NUM_THREADS")]
    pub num_threads: Option<usize>,
    /// Heartbeat period in milliseconds (independent of model steps).
    #[arg(long, env = "DPSERVE_HEARTBEAT_INTERVAL_MS", default_value_t = 500)]
    pub heartbeat_interval_ms: u64,
    /// Seconds a worker told to stop (SIGTERM) keeps running what it holds before it exits;
    /// 0 stops at once. New requests go elsewhere from the first moment.
    #[arg(long, env = "DPSERVE_DRAIN_TIMEOUT", default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Append one JSON line per message and request milestone to DIR/worker-<rank>.jsonl
    /// (`dpserve trace DIR --rid R` merges the actors' files).
    #[arg(long, env = "DPSERVE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// A prefill step computes only as many prompt tokens as fit in about this many
    /// milliseconds (learnt from earlier steps), so status, aborts and SIGTERM are served
    /// promptly on any CPU; 0 = no time bound (only the token limits).
    #[arg(long, env = "DPSERVE_PREFILL_STEP_TARGET_MS", default_value_t = DEFAULT_PREFILL_STEP_TARGET_MS)]
    pub prefill_step_target_ms: u64,
    /// CPU kernel path: `auto` (the widest this CPU supports) or one of `avx512`, `avx2`
    /// (AVX2 + FMA), `neon`, `portable`. All give bit-identical results; forcing one is for
    /// tests and benchmarks. A path this CPU cannot run is refused at start.
    #[arg(long, env = kernels::KERNEL_PATH_ENV, default_value = "auto",
          value_parser = |s: &str| s.parse::<KernelPath>().map_err(|e| e.to_string()))]
    pub kernel_path: KernelPath,
    /// Compute device. Only `cpu` in this build.
    #[arg(long, env = "DPSERVE_DEVICE", default_value = "cpu")]
    pub device: String,
}

/// Where the model comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    HfDir(PathBuf),
    Builtin { size: BuiltinSize, seed: u64 },
}

/// Resolved worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub rank: u32,
    pub model: ModelSource,
    pub worker_addr: Endpoint,
    pub tokenizer_addr: Endpoint,
    /// `None`: derive it from `mem_fraction` once the model is known.
    pub max_total_tokens: Option<usize>,
    pub mem_fraction: f64,
    pub max_running_requests: usize,
    pub pre_alloc_rows: usize,
    pub chunked_prefill_size: usize,
    pub max_prefill_tokens: usize,
    pub context_length: Option<usize>,
    pub schedule_policy: SchedulePolicy,
    pub disable_radix_cache: bool,
    pub num_threads: usize,
    pub kernel_path: KernelPath,
    pub prefill_step_target: Option<Duration>,
    pub heartbeat_interval: Duration,
    pub drain_timeout: Duration,
    pub trace_dir: Option<PathBuf>,
}

impl WorkerArgs {
    pub fn resolve(&self) -> anyhow::Result<WorkerConfig> {
        let addr = |flag: &str, value: &Option<String>, name: &str| -> anyhow::Result<Endpoint> {
            match value {
                Some(s) => s.parse().with_context(|| format!("--{flag}")),
                None => Ok(default_endpoint(name)),
            }
        };
        let size: BuiltinSize = self
            .builtin_size
            .parse()
            .map_err(|e| anyhow::anyhow!("--builtin-size: {e}"))?;
        let model = match (self.load_format.as_str(), &self.model_path) {
            ("dummy", _) | ("auto", None) => ModelSource::Builtin {
                size,
                seed: self.weight_seed,
            },
            ("auto", Some(path)) => ModelSource::HfDir(path.clone()),
            (other, _) => anyhow::bail!("--load-format must be auto or dummy, got {other:?}"),
        };
        if self.device != "cpu" {
            anyhow::bail!(
                "--device {:?} is not available in this build (only cpu)",
                self.device
            );
        }
        let positive = |flag: &str, v: usize| -> anyhow::Result<()> {
            if v == 0 {
                anyhow::bail!("--{flag} must be at least 1");
            }
            Ok(())
        };
        if let Some(tokens) = self.max_total_tokens {
            positive("max-total-tokens", tokens)?;
            if tokens > u32::MAX as usize {
                anyhow::bail!("--max-total-tokens must fit in 32 bits");
            }
        }
        positive("max-running-requests", self.max_running_requests)?;
        positive("chunked-prefill-size", self.chunked_prefill_size)?;
        positive("max-prefill-tokens", self.max_prefill_tokens)?;
        // The parser checks the flag; this guards a WorkerArgs built in code.
        crate::mem::check_mem_fraction(self.mem_fraction)
            .map_err(|e| anyhow::anyhow!("--mem-fraction: {e}"))?;
        if !(self.drain_timeout.is_finite() && self.drain_timeout >= 0.0) {
            anyhow::bail!(
                "--drain-timeout must be a number of seconds >= 0, got {}",
                self.drain_timeout
            );
        }
        let num_threads = match self.num_threads {
            Some(0) => anyhow::bail!("--num-threads must be at least 1"),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        Ok(WorkerConfig {
            rank: self.rank,
            model,
            worker_addr: addr("worker-addr", &self.worker_addr, "worker")?,
            tokenizer_addr: addr("tokenizer-addr", &self.tokenizer_addr, "tokenizer")?,
            max_total_tokens: self.max_total_tokens,
            mem_fraction: self.mem_fraction,
            max_running_requests: self.max_running_requests,
            pre_alloc_rows: self.decode_prealloc_size.rows(self.max_running_requests),
            schedule_policy: self.schedule_policy,
            disable_radix_cache: self.disable_radix_cache,
            chunked_prefill_size: self.chunked_prefill_size,
            max_prefill_tokens: self.max_prefill_tokens,
            context_length: self.context_length,
            num_threads,
            kernel_path: self.kernel_path,
            prefill_step_target: (self.prefill_step_target_ms > 0)
                .then(|| Duration::from_millis(self.prefill_step_target_ms)),
            heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms.max(10)),
            drain_timeout: Duration::from_secs_f64(self.drain_timeout),
            trace_dir: self.trace_dir.clone(),
        })
    }
}
