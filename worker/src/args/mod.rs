//! `dpserve worker` flags and their resolution into a [`WorkerConfig`]. Every default lives
//! once, as a constant here (or beside its idea, like [`crate::mem::DEFAULT_MEM_FRACTION`]), read
//! by clap and by the groups' `Default`; `dpserve up` and `dpserve bench --launch` flatten the
//! groups ([`ModelArgs`], [`ServeArgs`], [`DeviceArgs`]) instead of declaring the flags again.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValue;
use protocol::endpoint::default_endpoint;
use protocol::Endpoint;

use kernels::KernelPath;

use crate::error::{self, WorkerError};
use crate::model::{BuiltinSize, LoadDtype};
use crate::scheduler::{FinishFirst, SchedulePolicy};
use crate::sim::SimProfile;
use clap::builder::TypedValueParser as _;
use kernels::ComputeDtype;

mod device;
mod serve;

pub use device::{
    device_parser, kernel_path_names, kernel_path_parser, Device, DeviceArgs, Listed, SimSettings,
};
pub use serve::ServeArgs;

/// `--chunked-prefill-size` when not given (also the engine benchmark's chunk).
pub const DEFAULT_CHUNKED_PREFILL_SIZE: usize = 2048;
/// `--prefill-step-target-ms` when not given.
pub const DEFAULT_PREFILL_STEP_TARGET_MS: u64 = 500;
/// `--finish-first-tokens`' default.
pub const DEFAULT_FINISH_FIRST_TOKENS: u32 = 16;
/// `--finish-first-max-wait-ms`'s default.
pub const DEFAULT_FINISH_FIRST_MAX_WAIT_MS: u64 = 600;
/// `--max-running-requests` when not given.
pub const DEFAULT_MAX_RUNNING_REQUESTS: usize = 64;
/// `--max-prefill-tokens` when not given.
pub const DEFAULT_MAX_PREFILL_TOKENS: usize = 8192;
/// `--heartbeat-interval-ms` when not given.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 500;
/// `--drain-timeout` (seconds) when not given.
pub const DEFAULT_DRAIN_TIMEOUT_S: f64 = 30.0;
/// `--disaggregation-bootstrap-timeout` and `--disaggregation-waiting-timeout` (seconds) when
/// not given: SGLang's defaults.
pub const DEFAULT_DISAGG_TIMEOUT_S: f64 = 300.0;

/// `dpserve worker` flags. Every flag also reads `DPSERVE_<FLAG>`.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This worker's data-parallel rank (its stable id in the live set).
    #[arg(long, env = "DPSERVE_RANK")]
    pub rank: u32,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Controller's worker socket (connect, DEALER).
    #[arg(long, env = "DPSERVE_WORKER_ADDR")]
    pub worker_addr: Option<String>,
    /// Tokenizer's output socket (connect, PUSH).
    #[arg(long, env = "DPSERVE_TOKENIZER_ADDR")]
    pub tokenizer_addr: Option<String>,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Append one JSON line per message and request milestone to DIR/worker-<rank>.jsonl
    /// (`dpserve trace DIR --rid R` merges the actors' files).
    #[arg(long, env = "DPSERVE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// A message-trace file past this many MiB is renamed `<actor>.old.jsonl` (replacing the
    /// previous one) and a new one starts, so traces take at most about twice this per actor.
    #[arg(long, env = "DPSERVE_TRACE_MAX_MB", default_value_t = protocol::msg_trace::DEFAULT_TRACE_MAX_MB)]
    pub trace_max_mb: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Prefill/decode disaggregation: `null` computes prompts and decodes them here; `prefill`
    /// computes prompts and sends their KV to decode workers; `decode` receives prompts' KV
    /// and decodes.
    #[arg(long, env = "DPSERVE_DISAGGREGATION_MODE", default_value = "null",
          value_parser = disagg_mode_parser())]
    pub disaggregation_mode: protocol::DisaggMode,
    /// A prefill worker's KV socket (bind, ROUTER; decode workers connect to it). Default: an
    /// ipc socket `kv-<rank>.sock` beside the default endpoints. A `tcp://*:PORT` bind is
    /// announced as `tcp://127.0.0.1:PORT`; give the host's address for decode workers on other
    /// hosts.
    #[arg(long, env = "DPSERVE_DISAGGREGATION_KV_ADDR")]
    pub disaggregation_kv_addr: Option<String>,
    #[command(flatten)]
    pub security: protocol::SecurityArgs,
}

fn disagg_mode_parser() -> Listed<protocol::DisaggMode> {
    Listed {
        parse: |s| s.parse(),
        names: || vec!["null", "prefill", "decode"],
    }
}

/// Where the weights come from (also `up`'s and `bench --launch`'s model flags).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ModelArgs {
    /// Hugging Face model directory. Without it, the built-in model with random weights.
    #[arg(long, env = "DPSERVE_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Where the weights come from.
    #[arg(long, env = "DPSERVE_LOAD_FORMAT", value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Size of the built-in model.
    #[arg(long, env = "DPSERVE_BUILTIN_SIZE", value_parser = builtin_size_parser(),
          default_value_t = BuiltinSize::Base)]
    pub builtin_size: BuiltinSize,
    /// Seed of the built-in model's weights; every rank must use the same one.
    #[arg(long, env = "DPSERVE_WEIGHT_SEED", default_value_t = 0)]
    pub weight_seed: u64,
    /// The type the CPU keeps a checkpoint's weight matrices in (norms and biases are f32;
    /// the built-in model is f32). Computing is f32 whatever it is, unless --compute-dtype bf16;
    /// q8_0 multiplies 8-bit weights by 8-bit activations, summed as integers.
    #[arg(long, env = "DPSERVE_WEIGHT_DTYPE", value_parser = weight_dtype_parser(),
          default_value_t = LoadDtype::default())]
    pub weight_dtype: LoadDtype,
    /// What a CPU rank's linear layers compute in: `f32` (exact; results equal on every kernel
    /// path and batch) or `bf16` (opt-in: every parameter and each layer's input rounded to
    /// bf16, products summed in f32, with vdpbf16ps on CPUs with avx512_bf16 and an exact
    /// emulation elsewhere; docs/MODELS.md states the contract). A --model-path checkpoint
    /// only.
    #[arg(long, env = "DPSERVE_COMPUTE_DTYPE", default_value = "f32",
          value_parser = clap::builder::PossibleValuesParser::new(["f32", "bf16"])
              .map(|s| s.parse::<ComputeDtype>().expect("a listed value")))]
    pub compute_dtype: ComputeDtype,
    /// A directory for this host's one copy of a checkpoint's packed weight matrices: the first
    /// rank to load the checkpoint writes it there, every rank maps it read-only, so the ranks
    /// of a host share one copy (and a restart skips the packing). Unset: each rank packs its
    /// own. CPU ranks with --model-path only.
    #[arg(long, env = "DPSERVE_WEIGHT_CACHE", value_name = "DIR")]
    pub weight_cache: Option<PathBuf>,
}

impl Default for ModelArgs {
    fn default() -> Self {
        ModelArgs {
            model_path: None,
            load_format: LoadFormat::Auto,
            builtin_size: BuiltinSize::Base,
            weight_seed: 0,
            weight_dtype: LoadDtype::default(),
            compute_dtype: ComputeDtype::F32,
            weight_cache: None,
        }
    }
}

/// `--weight-dtype`'s values, with their help (the type lives with the model crate; its names
/// are its `Display`).
pub fn weight_dtype_parser() -> impl clap::builder::TypedValueParser<Value = LoadDtype> {
    let values = LoadDtype::ALL.map(|d| {
        let help = match d {
            LoadDtype::Auto => "the checkpoint's own (bf16/f16 stay 16-bit; lossless)",
            LoadDtype::F32 => "widened to f32 at load (twice a 16-bit checkpoint's memory)",
            LoadDtype::Bf16 => "bf16; other stored types rounded to nearest even",
            LoadDtype::F16 => "f16; other stored types rounded to nearest even",
            LoadDtype::Q8_0 => "llama.cpp's Q8_0 (blocks of 32 int8 weights and an f16 scale), quantized at load; lossy",
        };
        PossibleValue::new(d.name()).help(help)
    });
    clap::builder::PossibleValuesParser::new(values).map(|s| {
        let named = LoadDtype::ALL.into_iter().find(|d| d.name() == s);
        named.expect("a listed value")
    })
}

/// `--load-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    /// The model directory (--model-path), or the built-in model without one.
    Auto,
    /// The built-in model with seeded random weights.
    Dummy,
}

/// `--builtin-size`'s values, with their help (the type lives with the model crate; its names
/// are its `Display`).
pub fn builtin_size_parser() -> impl clap::builder::TypedValueParser<Value = BuiltinSize> {
    let values = [
        PossibleValue::new(BuiltinSize::Base.to_string()).help("about 29M parameters"),
        PossibleValue::new(BuiltinSize::Tiny.to_string())
            .help("a few hundred thousand parameters, for tests"),
    ];
    clap::builder::PossibleValuesParser::new(values)
        .map(|s| s.parse::<BuiltinSize>().expect("a listed value"))
}

/// `--schedule-policy` (the type lives with the scheduler; its names are its `Display`).
impl clap::ValueEnum for SchedulePolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &[SchedulePolicy::Lpm, SchedulePolicy::Fcfs]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            SchedulePolicy::Lpm => "longest cached prefix first, shared prefixes computed once",
            SchedulePolicy::Fcfs => "first come, first served",
        };
        Some(PossibleValue::new(self.to_string()).help(help))
    }
}

/// Where the model comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// A Hugging Face directory, its matrices held in the type `--weight-dtype` resolves,
    /// viewed in this host's packed weight file in `weight_cache` when it is set.
    HfDir {
        dir: PathBuf,
        dtype: LoadDtype,
        /// `--compute-dtype` (bf16: the matrices are loaded as bf16 whatever `dtype` says).
        compute: ComputeDtype,
        weight_cache: Option<PathBuf>,
    },
    Builtin {
        size: BuiltinSize,
        seed: u64,
    },
}

/// Resolved worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub rank: u32,
    pub model: ModelSource,
    /// `--device sim`: simulate a GPU instead of running `model`.
    pub sim: Option<SimSettings>,
    /// `--device cuda[:N]`: the GPU ordinal N (0 for plain `cuda`).
    pub cuda: Option<u32>,
    pub worker_addr: Endpoint,
    pub tokenizer_addr: Endpoint,
    /// CURVE or not on the TCP endpoints (`--curve-*`, `--insecure-tcp`).
    pub transport: protocol::Transport,
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
    /// KV events' block size (0: no events).
    pub kv_event_block_size: usize,
    pub num_threads: usize,
    pub kernel_path: KernelPath,
    pub prefill_step_target: Option<Duration>,
    /// `--finish-first-tokens` / `--finish-first-max-wait-ms` (`None`: off).
    pub finish_first: Option<FinishFirst>,
    pub heartbeat_interval: Duration,
    pub drain_timeout: Duration,
    pub trace_dir: Option<PathBuf>,
    pub trace_max_bytes: u64,
    pub max_queued_requests: Option<usize>,
    pub disaggregation_mode: protocol::DisaggMode,
    /// Where a prefill worker binds its KV socket.
    pub kv_addr: Endpoint,
    pub bootstrap_timeout: Duration,
    pub waiting_timeout: Duration,
}

impl ModelArgs {
    /// The model these flags name.
    pub fn source(&self) -> ModelSource {
        match (self.load_format, &self.model_path) {
            (LoadFormat::Dummy, _) | (LoadFormat::Auto, None) => ModelSource::Builtin {
                size: self.builtin_size,
                seed: self.weight_seed,
            },
            (LoadFormat::Auto, Some(path)) => ModelSource::HfDir {
                dir: path.clone(),
                dtype: self.weight_dtype,
                compute: self.compute_dtype,
                weight_cache: self.weight_cache.clone(),
            },
        }
    }
}

impl WorkerArgs {
    pub fn resolve(&self) -> error::Result<WorkerConfig> {
        let addr =
            |flag: &'static str, value: &Option<String>, name: &str| -> error::Result<Endpoint> {
                match value {
                    Some(s) => s
                        .parse()
                        .map_err(|error| WorkerError::Endpoint { flag, error }),
                    None => Ok(default_endpoint(name)),
                }
            };
        let model = self.model.source();
        let refusal = self.weight_dtype_refusal();
        let refusal = refusal.or_else(|| self.compute_dtype_refusal());
        let refusal = refusal.or_else(|| self.weight_cache_refusal());
        if let Some(refusal) = refusal.or_else(|| self.disaggregation_refusal()) {
            return Err(WorkerError::Flag(refusal));
        }
        let worker_addr = addr("worker-addr", &self.worker_addr, "worker")?;
        let sim = self.sim_settings(&worker_addr)?;
        let serve = &self.serve;
        serve.check()?;
        let seconds = |v: f64| Duration::from_secs_f64(v);
        let num_threads = match serve.num_threads {
            Some(0) => return Err(flag("--num-threads must be at least 1")),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let tokenizer_addr = addr("tokenizer-addr", &self.tokenizer_addr, "tokenizer")?;
        let kv_addr = addr(
            "disaggregation-kv-addr",
            &self.disaggregation_kv_addr,
            &format!("kv-{}", self.rank),
        )?;
        let mut endpoints = vec![&worker_addr, &tokenizer_addr];
        if self.disaggregation_mode == protocol::DisaggMode::Prefill {
            endpoints.push(&kv_addr);
        }
        let transport = self.security.resolve(&endpoints, "worker")?;
        Ok(WorkerConfig {
            rank: self.rank,
            model,
            sim,
            cuda: self.device.device.cuda_ordinal(),
            worker_addr,
            tokenizer_addr,
            transport,
            max_total_tokens: serve.max_total_tokens,
            mem_fraction: serve.mem_fraction,
            max_running_requests: serve.max_running_requests,
            pre_alloc_rows: serve
                .decode_prealloc_size
                .rows(self.disaggregation_mode, serve.max_running_requests),
            schedule_policy: serve.schedule_policy,
            disable_radix_cache: serve.disable_radix_cache,
            kv_event_block_size: serve.kv_event_block_size,
            chunked_prefill_size: serve.chunked_prefill_size,
            max_prefill_tokens: serve.max_prefill_tokens,
            context_length: serve.context_length,
            num_threads,
            kernel_path: self.device.kernel_path,
            prefill_step_target: (serve.prefill_step_target_ms > 0)
                .then(|| Duration::from_millis(serve.prefill_step_target_ms)),
            // A zero wait holds nothing: off, and `Hello` says so.
            finish_first: (serve.finish_first_tokens > 0 && serve.finish_first_max_wait_ms > 0)
                .then(|| FinishFirst {
                    tokens: serve.finish_first_tokens as usize,
                    max_wait: Duration::from_millis(serve.finish_first_max_wait_ms),
                }),
            heartbeat_interval: Duration::from_millis(serve.heartbeat_interval_ms.max(10)),
            drain_timeout: Duration::from_secs_f64(serve.drain_timeout),
            trace_dir: self.trace_dir.clone(),
            trace_max_bytes: self.trace_max_mb << 20,
            max_queued_requests: serve.max_queued_requests,
            disaggregation_mode: self.disaggregation_mode,
            kv_addr,
            bootstrap_timeout: seconds(serve.disaggregation_bootstrap_timeout),
            waiting_timeout: seconds(serve.disaggregation_waiting_timeout),
        })
    }

    /// Why `--weight-dtype` cannot apply here, if it cannot: it picks the type of the CPU's
    /// copy of a checkpoint (the built-in model is f32; the CUDA worker keeps the checkpoint's
    /// type on the GPU).
    fn weight_dtype_refusal(&self) -> Option<String> {
        let d = self.model.weight_dtype;
        if d == LoadDtype::Auto {
            return None;
        }
        if !matches!(self.model.source(), ModelSource::HfDir { .. }) {
            return Some(format!(
                "--weight-dtype {d} applies to a --model-path checkpoint; the built-in model is f32"
            ));
        }
        match self.device.device {
            Device::Cpu => None,
            other => Some(format!(
                "--weight-dtype {d} is for --device cpu; --device {other} keeps the checkpoint's \
                 own type"
            )),
        }
    }

    /// Why `--compute-dtype` cannot apply here, if it cannot: bf16 is a CPU rank's mode for a
    /// checkpoint, whose matrices it holds in bf16.
    fn compute_dtype_refusal(&self) -> Option<String> {
        if self.model.compute_dtype == ComputeDtype::F32 {
            return None;
        }
        let c = self.model.compute_dtype;
        if !matches!(self.model.source(), ModelSource::HfDir { .. }) {
            return Some(format!(
                "--compute-dtype {c} applies to a --model-path checkpoint; the built-in model \
                 computes in f32"
            ));
        }
        if self.device.device != Device::Cpu {
            return Some(format!(
                "--compute-dtype {c} is for --device cpu, not --device {}",
                self.device.device
            ));
        }
        match self.model.weight_dtype {
            LoadDtype::Auto | LoadDtype::Bf16 => None,
            d => Some(format!(
                "--compute-dtype {c} computes with bf16 weights; --weight-dtype {d} contradicts \
                 it (leave it auto, or bf16)"
            )),
        }
    }

    /// Why `--weight-cache` cannot apply here, if it cannot: it holds a CPU rank's packed copy
    /// of a checkpoint's matrices.
    fn weight_cache_refusal(&self) -> Option<String> {
        self.model.weight_cache.as_ref()?;
        if !matches!(self.model.source(), ModelSource::HfDir { .. }) {
            return Some(
                "--weight-cache applies to a --model-path checkpoint; the built-in model's \
                 weights are generated in each rank"
                    .into(),
            );
        }
        match self.device.device {
            Device::Cpu => None,
            other => Some(format!(
                "--weight-cache is for --device cpu; --device {other} keeps the weights in its \
                 own memory"
            )),
        }
    }

    /// Why this worker's device cannot take its disaggregated role, if it cannot.
    fn disaggregation_refusal(&self) -> Option<String> {
        match self.disaggregation_mode.is_null() {
            true => None,
            false => self.device.device.disagg_refusal(),
        }
    }

    /// The simulated GPU `--device sim` asks for (its profile file read and checked), or
    /// `None` for a real device.
    fn sim_settings(&self, worker_addr: &Endpoint) -> error::Result<Option<SimSettings>> {
        let d = &self.device;
        if d.device != Device::Sim {
            if d.sim_config.is_some() {
                return Err(flag("--sim-config applies only with --device sim"));
            }
            if d.sim_lock_step {
                return Err(flag("--sim-lock-step applies only with --device sim"));
            }
            return Ok(None);
        }
        if matches!(self.model.source(), ModelSource::HfDir { .. }) {
            return Err(flag(
                "--device sim speaks the built-in tokenizer's vocabulary and loads no weights; \
                 drop --model-path",
            ));
        }
        let profile = SimProfile::load(&d.sim_profile, d.sim_config.as_deref())?;
        Ok(Some(SimSettings {
            profile,
            seed: self.model.weight_seed,
            lock_step: d
                .sim_lock_step
                .then(|| crate::sim::LockStep::path_for(&worker_addr.to_string())),
        }))
    }
}

/// A flag's value refused at start.
fn flag(why: impl Into<String>) -> WorkerError {
    WorkerError::Flag(why.into())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::*;
    use crate::sim::DEFAULT_SIM_PROFILE;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    fn parse(flags: &[&str]) -> Result<WorkerArgs, clap::Error> {
        Cli::try_parse_from(["worker", "--rank", "0"].iter().chain(flags)).map(|c| c.args)
    }

    #[test]
    fn clap_defaults_are_the_groups_defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.model, ModelArgs::default());
        assert_eq!(args.serve, ServeArgs::default());
        assert_eq!(args.device, DeviceArgs::default());
    }

    #[test]
    fn closed_sets_parse_to_their_enums() {
        let args = parse(&[
            "--load-format",
            "dummy",
            "--builtin-size",
            "tiny",
            "--schedule-policy",
            "fcfs",
            "--device",
            "cpu",
            "--kernel-path",
            "portable",
        ])
        .unwrap();
        assert_eq!(args.model.load_format, LoadFormat::Dummy);
        assert_eq!(args.model.builtin_size, BuiltinSize::Tiny);
        assert_eq!(args.serve.schedule_policy, SchedulePolicy::Fcfs);
        assert_eq!(args.device.kernel_path, KernelPath::Portable);
        for (flag, bad) in [
            ("--load-format", "pt"),
            ("--builtin-size", "huge"),
            ("--schedule-policy", "lifo"),
            ("--device", "tpu"),
        ] {
            let err = parse(&[flag, bad]).unwrap_err().to_string();
            assert!(err.contains(flag), "{flag} {bad}: {err}");
        }
        // The kernel path says why, not only "not one of these".
        let err = parse(&["--kernel-path", "sse9"]).unwrap_err().to_string();
        assert!(err.contains("is not a kernel path"), "{err}");
        let args = parse(&["--disaggregation-mode", "decode"]).unwrap();
        assert_eq!(args.disaggregation_mode, protocol::DisaggMode::Decode);
        let err = parse(&["--disaggregation-mode", "both"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--disaggregation-mode"), "{err}");
    }

    #[test]
    fn finish_first_is_on_by_default_and_off_with_either_bound_zero() {
        let on = parse(&[]).unwrap().resolve().unwrap().finish_first;
        assert_eq!(
            on.map(|ff| (ff.tokens, ff.max_wait)),
            Some((16, Duration::from_millis(600)))
        );
        for off in [
            &["--finish-first-tokens", "0"][..],
            &["--finish-first-max-wait-ms", "0"][..],
        ] {
            let config = parse(off).unwrap().resolve().unwrap();
            assert!(config.finish_first.is_none(), "{off:?}");
        }
    }

    #[test]
    fn compute_dtype_bf16_is_a_cpu_mode_for_a_checkpoint_with_bf16_weights() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().to_str().unwrap();
        for extra in [&[][..], &["--weight-dtype", "bf16"][..]] {
            let mut flags = vec!["--model-path", m, "--compute-dtype", "bf16"];
            flags.extend(extra);
            let config = parse(&flags).unwrap().resolve().unwrap();
            assert!(
                matches!(
                    config.model,
                    ModelSource::HfDir {
                        compute: ComputeDtype::Bf16,
                        ..
                    }
                ),
                "{flags:?}"
            );
        }
        for (flags, says) in [
            (
                &["--compute-dtype", "bf16"][..],
                "the built-in model computes in f32",
            ),
            (
                &[
                    "--model-path",
                    m,
                    "--compute-dtype",
                    "bf16",
                    "--weight-dtype",
                    "f32",
                ],
                "--weight-dtype f32 contradicts it",
            ),
            (
                &[
                    "--model-path",
                    m,
                    "--compute-dtype",
                    "bf16",
                    "--device",
                    "sim",
                ],
                "is for --device cpu, not --device sim",
            ),
        ] {
            let err = parse(flags).unwrap().resolve().unwrap_err().to_string();
            assert!(err.contains(says), "{flags:?}: {err}");
        }
        let err = parse(&["--compute-dtype", "f16"]).unwrap_err().to_string();
        assert!(err.contains("f32") && err.contains("bf16"), "{err}");
    }

    #[test]
    fn q8_0_weights_take_a_weight_cache_and_refuse_the_bf16_compute_mode() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().to_str().unwrap();
        let config = parse(&["--model-path", m, "--weight-dtype", "q8_0"])
            .unwrap()
            .resolve()
            .unwrap();
        assert!(matches!(
            config.model,
            ModelSource::HfDir {
                dtype: LoadDtype::Q8_0,
                ..
            }
        ));
        let flags = [
            "--model-path",
            m,
            "--weight-dtype",
            "q8_0",
            "--weight-cache",
            m,
        ];
        let config = parse(&flags).unwrap().resolve().unwrap();
        assert!(matches!(
            config.model,
            ModelSource::HfDir {
                dtype: LoadDtype::Q8_0,
                weight_cache: Some(_),
                ..
            }
        ));
        let flags = [
            "--model-path",
            m,
            "--weight-dtype",
            "q8_0",
            "--compute-dtype",
            "bf16",
        ];
        let err = parse(&flags).unwrap().resolve().unwrap_err().to_string();
        assert!(err.contains("--weight-dtype q8_0 contradicts it"), "{err}");
    }

    #[test]
    fn weight_dtype_applies_to_a_checkpoint_on_the_cpu_only() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().to_str().unwrap();
        let config = parse(&["--model-path", m, "--weight-dtype", "bf16"])
            .unwrap()
            .resolve()
            .unwrap();
        assert!(matches!(
            config.model,
            ModelSource::HfDir {
                dtype: LoadDtype::Bf16,
                ..
            }
        ));
        let config = parse(&["--model-path", m]).unwrap().resolve().unwrap();
        assert!(matches!(
            config.model,
            ModelSource::HfDir {
                dtype: LoadDtype::Auto,
                weight_cache: None,
                ..
            }
        ));
        for (flags, says) in [
            (&["--weight-dtype", "f16"][..], "the built-in model is f32"),
            (
                &[
                    "--model-path",
                    m,
                    "--weight-dtype",
                    "f32",
                    "--device",
                    "cuda",
                ],
                "--device cuda keeps the checkpoint's own type",
            ),
        ] {
            let err = parse(flags).unwrap().resolve().unwrap_err().to_string();
            assert!(err.contains(says), "{flags:?}: {err}");
        }
        let err = parse(&["--weight-dtype", "fp8"]).unwrap_err().to_string();
        assert!(err.contains("--weight-dtype"), "{err}");
    }

    #[test]
    fn pre_allocation_rows_exist_only_on_decode_workers() {
        // As SGLang's decode request pool (PR #6980): a unified or prefill worker's admission
        // never holds a request without running it, so extra rows would only widen the KV
        // pool's bound.
        for (mode, auto_rows, given_rows) in
            [("null", 0, 0), ("prefill", 0, 0), ("decode", 2 * 8, 5)]
        {
            let mode_flags = ["--disaggregation-mode", mode, "--max-running-requests", "8"];
            let config = parse(&mode_flags).unwrap().resolve().unwrap();
            assert_eq!(config.pre_alloc_rows, auto_rows, "{mode}, auto");
            let given = [&mode_flags[..], &["--decode-prealloc-size", "5"]].concat();
            let config = parse(&given).unwrap().resolve().unwrap();
            assert_eq!(config.pre_alloc_rows, given_rows, "{mode}, 5 given");
        }
    }

    #[test]
    fn disaggregation_settings_resolve_and_bad_timeouts_name_their_flag() {
        let config = parse(&["--disaggregation-mode", "prefill"])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(config.disaggregation_mode, protocol::DisaggMode::Prefill);
        assert!(
            config.kv_addr.to_string().ends_with("kv-0.sock"),
            "{}",
            config.kv_addr
        );
        assert_eq!(config.bootstrap_timeout, Duration::from_secs(300));
        for flag in [
            "--disaggregation-bootstrap-timeout",
            "--disaggregation-waiting-timeout",
        ] {
            let err = parse(&[flag, "0"])
                .unwrap()
                .resolve()
                .unwrap_err()
                .to_string();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn device_sim_resolves_its_profile_and_refuses_what_it_cannot_simulate() {
        assert!(parse(&[]).unwrap().resolve().unwrap().sim.is_none());
        let config = parse(&["--device", "sim", "--weight-seed", "4"])
            .unwrap()
            .resolve()
            .unwrap();
        let sim = config.sim.expect("--device sim");
        assert_eq!(
            (sim.profile.name.as_str(), sim.seed),
            (DEFAULT_SIM_PROFILE, 4)
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h200.toml");
        std::fs::write(&file, "name = \"h200\"\ngpu_mem_gb = 141\n").unwrap();
        let file = file.to_str().unwrap();
        let sim = parse(&[
            "--device",
            "sim",
            "--sim-profile",
            "cpu-calibrated",
            "--sim-config",
            file,
        ])
        .unwrap()
        .resolve()
        .unwrap()
        .sim
        .unwrap();
        assert_eq!(sim.profile.name, "h200");
        assert_eq!(sim.profile.gpu_mem_gb, 141.0);
        assert_eq!(
            sim.profile.peak_tflops,
            SimProfile::cpu_calibrated().peak_tflops
        );
        // Lock-step: one state file per controller address, so a cluster's ranks share it.
        let lock = |flags: &[&str]| {
            parse(flags)
                .unwrap()
                .resolve()
                .unwrap()
                .sim
                .unwrap()
                .lock_step
        };
        assert_eq!(lock(&["--device", "sim"]), None);
        let mine = lock(&[
            "--device",
            "sim",
            "--sim-lock-step",
            "--worker-addr",
            "tcp://127.0.0.1:7001",
        ]);
        assert!(mine.is_some());
        assert_eq!(
            mine,
            lock(&[
                "--device",
                "sim",
                "--worker-addr",
                "tcp://127.0.0.1:7001",
                "--sim-lock-step",
                "true"
            ])
        );
        assert_ne!(
            mine,
            lock(&[
                "--device",
                "sim",
                "--sim-lock-step",
                "--worker-addr",
                "tcp://127.0.0.1:7002"
            ])
        );
        for (flags, want) in [
            (&["--sim-lock-step"][..], "--sim-lock-step"),
            (&["--sim-config", file][..], "--sim-config"),
            (&["--device", "sim", "--model-path", "/m"], "--model-path"),
            (
                &["--device", "sim", "--disaggregation-mode", "prefill"],
                "disaggregated",
            ),
            (
                &["--device", "sim", "--sim-config", "/nonexistent.toml"],
                "/nonexistent.toml",
            ),
        ] {
            let err = format!("{:#}", parse(flags).unwrap().resolve().unwrap_err());
            assert!(err.contains(want), "{flags:?}: {err}");
        }
        let err = parse(&["--sim-profile", "a100"]).unwrap_err().to_string();
        assert!(err.contains("--sim-profile"), "{err}");
    }

    #[test]
    fn device_cuda_takes_an_optional_ordinal_and_says_what_is_wrong_with_a_bad_one() {
        for (value, want, ordinal) in [
            ("cpu", Device::Cpu, None),
            ("sim", Device::Sim, None),
            ("cuda", Device::Cuda(None), Some(0)),
            ("cuda:0", Device::Cuda(Some(0)), Some(0)),
            ("cuda:3", Device::Cuda(Some(3)), Some(3)),
        ] {
            let args = parse(&["--device", value]).unwrap();
            assert_eq!(args.device.device, want, "{value}");
            assert_eq!(args.device.device.to_string(), value);
            assert_eq!(args.resolve().unwrap().cuda, ordinal, "{value}");
        }
        for mode in ["prefill", "decode"] {
            let args = parse(&["--device", "cuda:1", "--disaggregation-mode", mode]).unwrap();
            let err = format!("{:#}", args.resolve().unwrap_err());
            assert!(
                err.starts_with("--device cuda:1 does not serve disaggregated roles yet"),
                "{mode}: {err}"
            );
        }
        for bad in [
            "cuda:abc", "cuda:", "cuda:-1", "cuda:+1", "cuda:1.5", "cuda0", "gpu",
        ] {
            let err = parse(&["--device", bad]).unwrap_err().to_string();
            assert!(
                err.contains("--device") && err.contains(bad),
                "{bad}: {err}"
            );
            let why = if bad.starts_with("cuda:") {
                "must be a number"
            } else {
                "one of cpu, sim, cuda, cuda:N"
            };
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn weight_cache_applies_to_a_checkpoint_on_the_cpu_only() {
        let config = parse(&["--model-path", "/m", "--weight-cache", "/c"])
            .unwrap()
            .resolve()
            .unwrap();
        assert!(matches!(
            config.model,
            ModelSource::HfDir { weight_cache: Some(c), .. } if c == Path::new("/c")
        ));
        for (flags, says) in [
            (&["--weight-cache", "/c"][..], "the built-in model"),
            (
                &[
                    "--model-path",
                    "/m",
                    "--weight-cache",
                    "/c",
                    "--device",
                    "cuda",
                ],
                "--weight-cache is for --device cpu",
            ),
        ] {
            let err = parse(flags).unwrap().resolve().unwrap_err().to_string();
            assert!(err.contains(says), "{flags:?}: {err}");
        }
    }

    #[test]
    fn the_model_source_follows_load_format_and_path() {
        let dir = ["--model-path", "/m"];
        let source = |flags: &[&str]| parse(flags).unwrap().model.source();
        assert!(matches!(source(&dir), ModelSource::HfDir { .. }));
        assert!(matches!(
            source(&[&dir[..], &["--load-format", "dummy"]].concat()),
            ModelSource::Builtin { .. }
        ));
        assert!(matches!(
            source(&["--weight-seed", "9"]),
            ModelSource::Builtin {
                size: BuiltinSize::Base,
                seed: 9
            }
        ));
    }
}
