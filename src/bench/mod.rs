//! `dpserve bench`: the serving benchmark. Against a running server (`--base-url`) it sends a
//! workload (SGLang bench_serving's generated shared prefixes, multi-turn conversations, a
//! replayed Mooncake production trace, or one of the routers' known failure cases) and reports
//! bench_serving's metrics plus goodput under an SLO and the workload's cache-hit ceilings;
//! with `--launch --compare m1,m2,…` it starts a fresh cluster per load-balance method
//! (or deployment, `m@1p1d`), runs the identical workload on each and compares them (table,
//! JSON, Markdown, SVG).
//!
//! Module map: `workload` builds requests (`mooncake` from a trace), `client` sends and times
//! one, `metrics` aggregates, `ceiling` bounds the hit rate, `report` formats, `launch` starts
//! and stops clusters, `chart` draws the comparison.

pub mod ceiling;
pub mod chart;
pub mod client;
pub mod engine;
pub mod launch;
pub mod metrics;
pub mod mooncake;
pub mod probe;
pub mod report;
pub mod routes;
pub mod workload;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Map, Value};

use client::{Backend, BenchClient};
use launch::ServerFlags;
use metrics::{BenchMetrics, RequestOutcome, Slo};
use mooncake::TraceConfig;
use report::{MethodResult, RunInfo};
use worker::model::BuiltinSize;
use workload::{BenchRequest, Dataset, GspConfig};

/// bench_serving's defaults for the generated-shared-prefix dataset.
pub const DEFAULT_GSP: GspConfig = GspConfig {
    dataset: Dataset::GeneratedSharedPrefix,
    num_groups: 64,
    prompts_per_group: 16,
    system_prompt_len: 2048,
    question_len: 128,
    output_len: 256,
    range_ratio: 1.0,
    send_routing_key: false,
    zipf: None,
};

/// The load-balance methods `--launch` compares when `--compare` is not given.
pub const DEFAULT_COMPARE: &str = "round_robin,total_requests,total_tokens,prefix_affinity";

/// dpserve's methods and the peers' (SGLang's own three, vLLM's, SMG's, Dynamo's, llm-d's): what
/// the trace presets compare.
pub const EVERY_METHOD: &str = "round_robin,total_requests,total_tokens,prefix_affinity,\
                                cache_aware,vllm_dp,smg_cache_aware,dynamo_kv,llmd_prefix";

/// The default simulated profile with the context its model serves (Qwen3.5: 262k; the trace's
/// longest prompt is 126k tokens), for the trace presets: written beside the results and given
/// to every rank as `--sim-config`.
const SIM_LONG_CONTEXT: &str = "# written by dpserve bench --preset mooncake-*\n\
                                base = \"h100-qwen3.5-122b-a10b-fp8\"\n\
                                context_len = 131072\n";

/// Output tokens of a warm-up request at most: warm-up only needs the path exercised.
const WARMUP_MAX_OUTPUT: usize = 16;

/// Named workload + cluster sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// Finishes in a few minutes on 2 CPU cores with the built-in `base` model, 2 ranks. Each
    /// rank's KV pool holds the prefixes of its own half of the groups plus the running
    /// requests, but not every group's: the regime where cache-affinity routing matters.
    CpuSmall,
    /// SGLang's published prefix-affinity workload (16 groups × 32 prompts, 4096-token system
    /// prompts, question 128, output 256, concurrency 64, no routing key) on 8 **simulated**
    /// H100 ranks serving Qwen3.5-122B-A10B-FP8 (`--device sim`, docs/SIM.md), compared over
    /// the methods SGLang compared plus cache_aware. Every timing it reports is simulated.
    #[value(name = "sglang-8gpu")]
    Sglang8Gpu,
    /// The Mooncake conversation trace (`--dataset-path`) on 8 **simulated** H100 ranks of
    /// Qwen3.5-122B-A10B-FP8 with a 128k context: its first 1000 requests, 512-token blocks,
    /// time compressed 4x, open loop; every method, dpserve's and the peers'. With another
    /// `--dataset-name`, that workload (64 × 8 requests, system 4096 + question 128, output
    /// 256, concurrency 64) on the same ranks.
    #[value(name = "mooncake-8gpu")]
    Mooncake8Gpu,
    /// As `mooncake-8gpu` on 16 simulated ranks, time compressed 8x (twice the ranks, twice
    /// the rate: the same load per rank).
    #[value(name = "mooncake-16gpu")]
    Mooncake16Gpu,
    /// The Mooncake conversation trace on 2 CPU ranks of the built-in `base` model: 400
    /// requests from the trace's start (reuse grows with the window: conversations span
    /// minutes), 2 tokens per block (prompts ≈ 47 tokens on average), outputs x0.02, time
    /// compressed 4x (≈ 12 requests/s, a load two CPU ranks serve: at 8x, ≈ 24/s, they sat
    /// at their limit and no two runs ordered the methods alike); finishes in under ten
    /// minutes for every method.
    MooncakeCpu,
}

/// What a preset sets (flags given explicitly win).
pub struct PresetValues {
    /// The dataset unless `--dataset-name` names another.
    pub dataset: Dataset,
    pub gsp: GspConfig,
    /// The trace's scaling (the trace presets).
    pub trace: TraceConfig,
    pub num_prompts: Option<usize>,
    /// For generated workloads; a trace is replayed open loop.
    pub max_concurrency: usize,
    pub dp_size: u32,
    /// The built-in model size (`None`: a simulated rank, which loads no model).
    pub builtin_size: Option<BuiltinSize>,
    /// Each rank's KV pool (`None`: what the device holds).
    pub max_total_tokens: Option<usize>,
    /// `up` arguments the preset adds unless the user's `--up-arg`s name the same flag.
    pub up_args: &'static [(&'static str, &'static str)],
    /// The methods `--launch` compares unless `--compare` is given.
    pub compare: &'static str,
    /// A `--sim-config` TOML the preset gives every rank (written into `--output-dir`).
    pub sim_config: Option<&'static str>,
}

/// The generated workload of the trace presets beside the trace: SGLang's 8-GPU shape with 64
/// groups of 8 (so hot-prefix, sibling-burst and no-reuse each send 512 requests).
const TRACE_PRESET_GSP: GspConfig = GspConfig {
    dataset: Dataset::GeneratedSharedPrefix,
    num_groups: 64,
    prompts_per_group: 8,
    system_prompt_len: 4096,
    question_len: 128,
    output_len: 256,
    range_ratio: 1.0,
    send_routing_key: false,
    zipf: None,
};

/// A trace preset on `dp_size` simulated ranks, time compressed `compression` times.
fn sim_trace_preset(dp_size: u32, compression: f64) -> PresetValues {
    PresetValues {
        dataset: Dataset::Mooncake,
        gsp: TRACE_PRESET_GSP,
        trace: TraceConfig {
            time_compression: compression,
            ..TraceConfig::default()
        },
        num_prompts: Some(1000),
        max_concurrency: 64,
        dp_size,
        builtin_size: None,
        max_total_tokens: None,
        up_args: &[("--device", "sim")],
        compare: EVERY_METHOD,
        sim_config: Some(SIM_LONG_CONTEXT),
    }
}

impl Preset {
    pub fn values(self) -> PresetValues {
        match self {
            Preset::CpuSmall => {
                let gsp = GspConfig {
                    dataset: Dataset::GeneratedSharedPrefix,
                    num_groups: 8,
                    prompts_per_group: 16,
                    system_prompt_len: 1024,
                    question_len: 64,
                    output_len: 32,
                    range_ratio: 1.0,
                    // Token-prefix hashing covers the first 4096 ids, i.e. the question too at
                    // these lengths; a key per group is what a client would send here.
                    send_routing_key: true,
                    zipf: None,
                };
                let dp_size = 2;
                let max_concurrency = 16;
                PresetValues {
                    dataset: Dataset::GeneratedSharedPrefix,
                    max_total_tokens: Some(cpu_small_kv_tokens(&gsp, dp_size, max_concurrency)),
                    gsp,
                    trace: TraceConfig::default(),
                    num_prompts: None,
                    max_concurrency,
                    dp_size,
                    builtin_size: Some(BuiltinSize::Base),
                    up_args: &[],
                    compare: DEFAULT_COMPARE,
                    sim_config: None,
                }
            }
            // The workload of SGLang's data_parallel_controller benchmark
            // (bench_serving --dataset-name generated-shared-prefix, 8 × H100 80GB with DP
            // attention): 512 prompts, no routing key, so prefix_affinity hashes the first
            // 4096 tokens, which are exactly the system prompt.
            Preset::Sglang8Gpu => PresetValues {
                dataset: Dataset::GeneratedSharedPrefix,
                trace: TraceConfig::default(),
                num_prompts: None,
                sim_config: None,
                gsp: GspConfig {
                    dataset: Dataset::GeneratedSharedPrefix,
                    num_groups: 16,
                    prompts_per_group: 32,
                    system_prompt_len: 4096,
                    question_len: 128,
                    output_len: 256,
                    range_ratio: 1.0,
                    send_routing_key: false,
                    zipf: None,
                },
                max_concurrency: 64,
                dp_size: 8,
                builtin_size: None,
                // The simulated GPU's memory sizes the pool (docs/SIM.md).
                max_total_tokens: None,
                // DP attention: every rank's step ends with the slowest (docs/SIM.md).
                up_args: &[("--device", "sim"), ("--sim-lock-step", "true")],
                compare: "round_robin,total_tokens,prefix_affinity,cache_aware",
            },
            Preset::Mooncake8Gpu => sim_trace_preset(8, 4.0),
            Preset::Mooncake16Gpu => sim_trace_preset(16, 8.0),
            // The trace's first 600 requests span 200 s; compressed 8x, ~24 requests/s arrive
            // for 25 s.
            Preset::MooncakeCpu => PresetValues {
                dataset: Dataset::Mooncake,
                gsp: TRACE_PRESET_GSP,
                trace: TraceConfig {
                    block_tokens: 2,
                    time_compression: 4.0,
                    output_scale: 0.02,
                    ..TraceConfig::default()
                },
                num_prompts: Some(400),
                max_concurrency: 16,
                dp_size: 2,
                builtin_size: Some(BuiltinSize::Base),
                max_total_tokens: Some(8192),
                up_args: &[],
                compare: EVERY_METHOD,
                sim_config: None,
            },
        }
    }
}

/// KV tokens per worker for `cpu-small`: the prefixes of 3/4 of the groups (a rank's own half,
/// with room for an uneven hash split) plus the question and output of every request the rank
/// may run at once (running requests share their group's prefix). Every group's prefix, which
/// a content-blind method needs on every rank, does not fit.
pub fn cpu_small_kv_tokens(gsp: &GspConfig, dp_size: u32, max_concurrency: usize) -> usize {
    let prefixes = (gsp.num_groups * 3).div_ceil(4) * gsp.system_prompt_len;
    let running =
        max_concurrency.div_ceil(dp_size.max(1) as usize) * (gsp.question_len + gsp.output_len);
    prefixes + running
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Server to benchmark (ignored with --launch).
    #[arg(
        long,
        env = "DPSERVE_BENCH_BASE_URL",
        default_value = "http://127.0.0.1:30000"
    )]
    pub base_url: String,
    /// API to drive: native `/generate` or OpenAI `/v1/completions`.
    #[arg(long, env = "DPSERVE_BENCH_BACKEND", value_enum, default_value_t = Backend::Generate)]
    pub backend: Backend,
    /// Model name for the OpenAI API (default: the server's `served_model_name`, else the first
    /// model `GET /v1/models` lists).
    #[arg(long, env = "DPSERVE_BENCH_MODEL")]
    pub model: Option<String>,
    /// Vocabulary size the prompts' token ids are drawn from (default: the server's, from
    /// `GET /get_server_info` or llama.cpp's `/v1/models`; required for servers that say neither).
    #[arg(long, env = "DPSERVE_BENCH_VOCAB_SIZE")]
    pub vocab_size: Option<u32>,
    /// Workload: bench_serving's shared system prompts; conversations whose prompt grows each
    /// turn (`--gsp-num-groups` conversations of `--gsp-prompts-per-group` turns, each turn
    /// sent when the previous one finished); a Mooncake trace (`--dataset-path`, `--trace-*`);
    /// or a router's failure case: one hot system prompt, bursts of identical prompts, no reuse
    /// (shaped by the `--gsp-*` flags). [default: generated-shared-prefix, or the preset's]
    #[arg(long, value_enum)]
    pub dataset_name: Option<Dataset>,
    /// The trace file of `--dataset-name mooncake` (one JSON object a line: timestamp ms,
    /// input_length, output_length, hash_ids of 512-token blocks).
    #[arg(long, env = "DPSERVE_BENCH_DATASET_PATH")]
    pub dataset_path: Option<PathBuf>,
    /// [mooncake] Tokens each of the trace's 512-token blocks becomes (prompt lengths scale
    /// with it) [default: 512, or the preset's].
    #[arg(long)]
    pub trace_block_tokens: Option<usize>,
    /// [mooncake] Divide the trace's timestamps by this [default: 1, or the preset's].
    #[arg(long)]
    pub trace_time_compression: Option<f64>,
    /// [mooncake] Start the window at this timestamp (ms); earlier requests are skipped.
    #[arg(long)]
    pub trace_start_ms: Option<u64>,
    /// [mooncake] Multiply output lengths by this (at least 1 token) [default: 1, or the
    /// preset's].
    #[arg(long)]
    pub trace_output_scale: Option<f64>,
    /// Goodput SLO: time to first token at most this (ms).
    #[arg(long, default_value_t = Slo::default().ttft_ms)]
    pub slo_ttft_ms: f64,
    /// Goodput SLO: a request's mean inter-token latency (its TPOT) at most this (ms).
    #[arg(long, default_value_t = Slo::default().itl_ms)]
    pub slo_itl_ms: f64,
    /// Workload and cluster sizes for a machine class (explicit flags win).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Number of shared system prompts [default: 64].
    #[arg(long)]
    pub gsp_num_groups: Option<usize>,
    /// Questions per system prompt [default: 16].
    #[arg(long)]
    pub gsp_prompts_per_group: Option<usize>,
    /// System prompt tokens [default: 2048].
    #[arg(long)]
    pub gsp_system_prompt_len: Option<usize>,
    /// Question tokens [default: 128].
    #[arg(long)]
    pub gsp_question_len: Option<usize>,
    /// Output tokens [default: 256].
    #[arg(long)]
    pub gsp_output_len: Option<usize>,
    /// Lengths are drawn from [len · ratio, len] [default: 1.0].
    #[arg(long)]
    pub gsp_range_ratio: Option<f64>,
    /// Send one routing key per group or conversation (`x-smg-routing-key`); `false` turns off
    /// a preset's keys.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub gsp_send_routing_key: Option<bool>,
    /// Draw each request's group from a Zipf law with this exponent (group g with weight
    /// 1/(g+1)^s; groups × prompts per group requests in all), so a few prefixes are hot.
    #[arg(long, value_name = "S")]
    pub gsp_zipf: Option<f64>,
    /// Send at most this many of the workload's requests [default: all groups × prompts; a
    /// trace: all from the start offset, or the preset's].
    #[arg(long)]
    pub num_prompts: Option<usize>,
    /// Most requests in flight at once [default: unlimited].
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Requests per second, Poisson arrivals; `inf` sends all at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Seed of the workload (and of the arrival times).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Warm-up requests before the measured run (a prompt unrelated to the workload).
    #[arg(long, default_value_t = 1)]
    pub warmup_requests: usize,
    /// Flush the server's prefix cache after warm-up.
    #[arg(long)]
    pub flush_cache: bool,
    /// Append each result as one JSON line to this file.
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub disable_progress_bar: bool,
    /// Start a fresh cluster per method (`dpserve up`) instead of using --base-url.
    #[arg(long)]
    pub launch: bool,
    /// [--launch] Comma-separated load-balance methods to compare. `METHOD@<P>p<D>d` (e.g.
    /// `round_robin@1p1d`) runs a disaggregated deployment of P prefill and D decode workers
    /// instead of the unified `--dp-size` ranks (the deployment axis).
    /// [default: round_robin,total_requests,total_tokens,prefix_affinity, or the preset's]
    #[arg(long)]
    pub compare: Option<String>,
    /// [--launch] Directory for compare.json, compare.md, compare.svg and the cluster logs.
    #[arg(long, default_value = "bench-results")]
    pub output_dir: PathBuf,
    /// Benchmark the CPU engine alone (no server): prefill and decode tok/s of the model given
    /// by --model-path / --builtin-size, beside this machine's fma-peak and memory-copy ceilings.
    #[arg(long)]
    pub engine: bool,
    /// [--engine] Kernel path: `auto` (the best this CPU supports), a named one, or `all` (each
    /// supported path in turn, compared).
    #[arg(long, env = kernels::KERNEL_PATH_ENV, default_value = "auto",
          value_parser = engine_kernel_path_parser())]
    pub kernel_path: String,
    /// [--engine] Prompt lengths to prefill (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub engine_prompt_lens: Vec<usize>,
    /// [--engine] Decode batch sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub engine_batches: Vec<usize>,
    /// [--engine] Decode steps per batch, from an empty context.
    #[arg(long, default_value_t = 128)]
    pub engine_decode_steps: usize,
    /// [--engine] Timed repetitions of each prefill (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub engine_reps: usize,
    #[command(flatten)]
    pub server: ServerFlags,
}

/// `--kernel-path` of `--engine`: the worker's choices plus `all`; the engine checks the name
/// (so a path this CPU lacks is refused with the paths it has).
fn engine_kernel_path_parser() -> worker::args::Listed<String> {
    worker::args::Listed {
        parse: |s| Ok(s.trim().to_string()),
        names: || worker::args::kernel_path_names().chain(["all"]).collect(),
    }
}

/// Everything a run needs, after the preset and the defaults are applied.
#[derive(Debug, Clone)]
pub struct Plan {
    pub backend: Backend,
    pub model: Option<String>,
    pub vocab_size: Option<u32>,
    pub gsp: GspConfig,
    pub trace: TraceConfig,
    pub slo: Slo,
    pub num_prompts: Option<usize>,
    pub max_concurrency: Option<usize>,
    pub request_rate: f64,
    pub seed: u64,
    pub warmup_requests: usize,
    pub flush_cache: bool,
    pub progress: bool,
}

impl BenchArgs {
    /// The `--engine` settings.
    pub fn engine_args(&self) -> anyhow::Result<engine::EngineArgs> {
        let cluster = self.server.cluster();
        let chunk = cluster.serve.chunked_prefill_size;
        anyhow::ensure!(chunk > 0, "--chunked-prefill-size must be positive");
        Ok(engine::EngineArgs {
            model_path: cluster.model.model_path.clone(),
            builtin_size: cluster.model.builtin_size,
            weight_dtype: cluster.model.weight_dtype,
            threads: cluster.serve.num_threads,
            kernel_path: self.kernel_path.trim().to_string(),
            prompt_lens: self.engine_prompt_lens.clone(),
            batches: self.engine_batches.clone(),
            decode_steps: self.engine_decode_steps,
            chunk,
            reps: self.engine_reps,
            output_file: self.output_file.clone(),
        })
    }

    /// The plan and the server flags, with explicit flags over the preset over the defaults.
    pub fn resolve(&self) -> anyhow::Result<(Plan, ServerFlags)> {
        anyhow::ensure!(
            self.request_rate > 0.0,
            "--request-rate must be positive (or inf), got {}",
            self.request_rate
        );
        for (flag, ms) in [
            ("--slo-ttft-ms", self.slo_ttft_ms),
            ("--slo-itl-ms", self.slo_itl_ms),
        ] {
            anyhow::ensure!(
                ms.is_finite() && ms > 0.0,
                "{flag} must be a positive number of milliseconds, got {ms}"
            );
        }
        let preset = self.preset.map(Preset::values);
        let base = preset.as_ref().map_or(DEFAULT_GSP, |p| p.gsp.clone());
        let dataset = self
            .dataset_name
            .or(preset.as_ref().map(|p| p.dataset))
            .unwrap_or(Dataset::GeneratedSharedPrefix);
        let base_trace = preset
            .as_ref()
            .map_or_else(TraceConfig::default, |p| p.trace.clone());
        let trace = TraceConfig {
            path: self.dataset_path.clone(),
            block_tokens: self.trace_block_tokens.unwrap_or(base_trace.block_tokens),
            time_compression: self
                .trace_time_compression
                .unwrap_or(base_trace.time_compression),
            start_ms: self.trace_start_ms.unwrap_or(base_trace.start_ms),
            output_scale: self.trace_output_scale.unwrap_or(base_trace.output_scale),
        };
        anyhow::ensure!(
            dataset == Dataset::Mooncake || self.dataset_path.is_none(),
            "--dataset-path is for --dataset-name mooncake (this run's dataset is {})",
            dataset.name()
        );
        let gsp = GspConfig {
            dataset,
            num_groups: self.gsp_num_groups.unwrap_or(base.num_groups),
            prompts_per_group: self.gsp_prompts_per_group.unwrap_or(base.prompts_per_group),
            system_prompt_len: self.gsp_system_prompt_len.unwrap_or(base.system_prompt_len),
            question_len: self.gsp_question_len.unwrap_or(base.question_len),
            output_len: self.gsp_output_len.unwrap_or(base.output_len),
            range_ratio: self.gsp_range_ratio.unwrap_or(base.range_ratio),
            send_routing_key: self.gsp_send_routing_key.unwrap_or(base.send_routing_key),
            zipf: self.gsp_zipf.or(base.zipf),
        };
        let mut server = self.server.clone();
        // The user's own --device wins, and then none of the preset's simulation setup applies;
        // the user's own --sim-* flags replace the preset's profile file.
        let own_device = server
            .up_args
            .iter()
            .any(|a| a == "--device" || a.starts_with("--device="));
        let own_sim = server.up_args.iter().any(|a| a.starts_with("--sim-"));
        if let Some(p) = &preset {
            let cluster = &mut server.cluster.0;
            cluster.default_to("dp_size", &p.dp_size.to_string(), |c| c.dp_size = p.dp_size);
            if let (None, Some(size)) = (&cluster.model.model_path, p.builtin_size) {
                cluster.default_to("builtin_size", &size.to_string(), |c| {
                    c.model.value.builtin_size = size
                });
            }
            if let Some(tokens) = p.max_total_tokens {
                cluster.default_to("max_total_tokens", &tokens.to_string(), |c| {
                    c.serve.value.max_total_tokens = Some(tokens)
                });
            }
            for (flag, value) in p.up_args {
                let given = |a: &String| a == flag || a.starts_with(&format!("{flag}="));
                if own_device && flag.starts_with("--sim-") {
                    continue;
                }
                if !server.up_args.iter().any(given) {
                    server.up_args.extend([flag.to_string(), value.to_string()]);
                }
            }
        }
        // A trace is replayed open loop: the preset's concurrency is for generated workloads.
        let max_concurrency = self.max_concurrency.or(preset
            .as_ref()
            .filter(|_| dataset != Dataset::Mooncake)
            .map(|p| p.max_concurrency));
        // A preset's window is the trace's; generated workloads keep their own size.
        let num_prompts = self.num_prompts.or(preset
            .as_ref()
            .filter(|_| dataset == Dataset::Mooncake)
            .and_then(|p| p.num_prompts));
        if let Some(toml) = preset.as_ref().and_then(|p| p.sim_config) {
            if !own_device && !own_sim {
                server.sim_config = Some(toml.to_string());
            }
        }
        anyhow::ensure!(
            max_concurrency != Some(0),
            "--max-concurrency must be at least 1"
        );
        let plan = Plan {
            backend: self.backend,
            model: self.model.clone(),
            vocab_size: self.vocab_size,
            gsp,
            trace,
            slo: Slo {
                ttft_ms: self.slo_ttft_ms,
                itl_ms: self.slo_itl_ms,
            },
            num_prompts,
            max_concurrency,
            request_rate: self.request_rate,
            seed: self.seed,
            warmup_requests: self.warmup_requests,
            flush_cache: self.flush_cache,
            progress: !self.disable_progress_bar,
        };
        Ok((plan, server))
    }
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.engine {
        return engine::run(&args.engine_args()?);
    }
    let (plan, server) = args.resolve()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if args.launch {
        return run_compare(&args, &plan, &server, &rt);
    }
    let (info, m) = rt.block_on(run_once(&args.base_url, &plan))?;
    print!("{}", report::result_table(&info, &m));
    if let Some(path) = &args.output_file {
        append_jsonl(path, &report::result_json(&info, &m))?;
    }
    if m.completed == 0 {
        anyhow::bail!("no request completed");
    }
    Ok(())
}

fn append_jsonl(path: &Path, line: &Value) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))
}

/// One benchmark run against a server.
pub async fn run_once(base_url: &str, plan: &Plan) -> anyhow::Result<(RunInfo, BenchMetrics)> {
    let mut client = BenchClient::new(base_url, plan.backend, plan.model.clone())?;
    let facts = probe::probe(&client, plan.vocab_size, plan.model.as_deref()).await?;
    let mut notes = facts.notes(plan.backend == Backend::Openai);
    for note in &notes {
        eprintln!("note: {note}");
    }
    if let Some(model) = &facts.model {
        client.set_model(model.clone());
    }
    let requests = workload_of(plan, facts.vocab_size)?;
    warm_up(&client, plan, &requests, facts.vocab_size).await?;
    if plan.flush_cache {
        client.flush_cache().await?;
        // The flush is fire-and-forget to the ranks; give it a moment to land.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let arrivals = workload::send_times(&plan.gsp, &requests, plan.request_rate, plan.seed);
    // The prompts in send order, for the ceilings (computed once the capacity is known).
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| arrivals[a].total_cmp(&arrivals[b]));
    let prompts: Vec<Vec<u32>> = order
        .iter()
        .map(|&i| requests[i].input_ids.clone())
        .collect();
    let pb = progress_bar(plan.progress, requests.len());
    let num_prompts = requests.len();
    let (outcomes, duration) = send_all(
        &client,
        requests,
        arrivals,
        plan.max_concurrency,
        pb.clone(),
    )
    .await;
    pb.finish_and_clear();
    let mut m = BenchMetrics::compute(&outcomes, duration, plan.slo);

    // The method and per-rank hit rates as the server saw them, after the run (unknown when
    // the server has no /get_server_info).
    let after = match &facts.server_info {
        Ok(before) => Some(
            client
                .server_info()
                .await
                .unwrap_or_else(|_| before.clone()),
        ),
        Err(_) => None,
    };
    let rank_hits = after.as_ref().map(rank_cache_hits);
    let after = after.unwrap_or(Value::Null);
    if let Some(dp) = after["dp_size"].as_u64() {
        m = m.with_ranks(dp as u32);
    }
    let granularity = match plan.gsp.dataset {
        Dataset::Mooncake => plan.trace.block_tokens,
        _ => 1,
    };
    m.ceilings = Some(ceiling::compute(
        prompts.iter().map(Vec::as_slice),
        granularity,
        total_kv_capacity(&after),
    ));
    let sim_profiles: Vec<String> = after["sim_profiles"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    if !sim_profiles.is_empty() {
        notes.push(format!(
            "SIMULATED: the ranks are simulated ({}); every timing here comes from a cost \
             model, not a model run (docs/SIM.md)",
            sim_profiles.join(", ")
        ));
    }
    let info = RunInfo {
        backend: plan.backend.name().to_string(),
        gsp: plan.gsp.clone(),
        trace: (plan.gsp.dataset == Dataset::Mooncake).then(|| plan.trace.clone()),
        num_prompts,
        request_rate: plan.request_rate,
        max_concurrency: plan.max_concurrency,
        seed: plan.seed,
        load_balance_method: after["load_balance_method"].as_str().map(str::to_string),
        dp_size: after["dp_size"].as_u64(),
        server_rank_cache_hit_rate: rank_hits,
        vocab_size: facts.vocab_size,
        vocab_size_from: facts.vocab_from.to_string(),
        model: facts.model.clone(),
        model_from: facts.model_from.to_string(),
        notes,
        sim_profiles,
    };
    Ok((info, m))
}

/// The requests of the plan's dataset (a trace window, or a generated workload).
fn workload_of(plan: &Plan, vocab_size: u32) -> anyhow::Result<Vec<BenchRequest>> {
    let requests = match plan.gsp.dataset {
        Dataset::Mooncake => {
            mooncake::generate(&plan.trace, vocab_size, plan.num_prompts, plan.seed)?
        }
        _ => workload::generate(&plan.gsp, vocab_size, plan.num_prompts, plan.seed)?,
    };
    anyhow::ensure!(
        !requests.is_empty(),
        "the workload is empty (--num-prompts 0, or a trace window with no request?)"
    );
    Ok(requests)
}

/// `--warmup-requests` requests of the workload's shape, all sent at once; any failure stops
/// the run.
async fn warm_up(
    client: &BenchClient,
    plan: &Plan,
    requests: &[BenchRequest],
    vocab_size: u32,
) -> anyhow::Result<()> {
    if plan.warmup_requests == 0 {
        return Ok(());
    }
    let (len, output) = match plan.gsp.dataset {
        Dataset::Mooncake => (requests[0].prompt_len(), requests[0].output_len),
        _ => (
            plan.gsp.system_prompt_len + plan.gsp.question_len,
            plan.gsp.output_len,
        ),
    };
    let w = workload::warmup_request(vocab_size, len, output.min(WARMUP_MAX_OUTPUT), plan.seed);
    let warm: Vec<BenchRequest> = (0..plan.warmup_requests).map(|_| w.clone()).collect();
    let n = warm.len();
    let (outcomes, _) = send_all(client, warm, vec![0.0; n], None, ProgressBar::hidden()).await;
    if let Some(failed) = outcomes.iter().find(|o| !o.success) {
        anyhow::bail!(
            "warm-up failed: {}",
            failed.error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}

fn progress_bar(shown: bool, len: usize) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Each rank's cache hit rate, by rank, from `/get_server_info`.
fn rank_cache_hits(info: &Value) -> Map<String, Value> {
    let mut rank_hits = Map::new();
    for r in info["ranks"].as_array().into_iter().flatten() {
        if let (Some(rank), Some(rate)) =
            (r["rank"].as_u64(), r["status"]["cache_hit_rate"].as_f64())
        {
            rank_hits.insert(rank.to_string(), json!(rate));
        }
    }
    rank_hits
}

/// Every rank's KV pool added up, from `/get_server_info` (unknown without it).
fn total_kv_capacity(info: &Value) -> Option<u64> {
    info["ranks"].as_array().and_then(|ranks| {
        ranks
            .iter()
            .map(|r| {
                r["capacity"]["max_total_tokens"]
                    .as_u64()
                    .or(r["status"]["max_total_tokens"].as_u64())
            })
            .sum()
    })
}

/// Sends every request at its arrival time (seconds after start) and, when it names one, once
/// the request it comes `after` has finished (success or not), at most `max_concurrency` at
/// once; returns the outcomes in request order and the wall time of the whole run.
async fn send_all(
    client: &BenchClient,
    requests: Vec<BenchRequest>,
    arrivals: Vec<f64>,
    max_concurrency: Option<usize>,
    pb: ProgressBar,
) -> (Vec<RequestOutcome>, f64) {
    let semaphore = max_concurrency.map(|c| Arc::new(tokio::sync::Semaphore::new(c)));
    // finished[i] turns true when request i has its outcome; a request waits for its `after`'s
    // before it takes a concurrency slot (a slot held while waiting could starve the request
    // waited for).
    let (finished_tx, finished_rx): (Vec<_>, Vec<_>) = (0..requests.len())
        .map(|_| tokio::sync::watch::channel(false))
        .unzip();
    let start = tokio::time::Instant::now();
    let wall = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let n = requests.len();
    for ((pos, (req, at)), done) in requests
        .into_iter()
        .zip(arrivals)
        .enumerate()
        .zip(finished_tx)
    {
        let client = client.clone();
        let semaphore = semaphore.clone();
        let pb = pb.clone();
        let mut before = req.after.and_then(|j| finished_rx.get(j)).cloned();
        tasks.spawn(async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
            if let Some(before) = &mut before {
                // An error means the earlier request's task is gone: go on regardless.
                before.wait_for(|finished| *finished).await.ok();
            }
            let _permit = match &semaphore {
                Some(s) => Some(s.clone().acquire_owned().await),
                None => None,
            };
            let outcome = client.send(&req).await;
            done.send_replace(true);
            pb.inc(1);
            (pos, outcome)
        });
    }
    let mut outcomes: Vec<RequestOutcome> = vec![RequestOutcome::default(); n];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((pos, outcome)) => outcomes[pos] = outcome,
            Err(e) => tracing::error!("a request task failed: {e}"),
        }
    }
    (outcomes, wall.elapsed().as_secs_f64())
}

/// `--launch`: a fresh cluster per method, the same workload on each, one comparison.
fn run_compare(
    args: &BenchArgs,
    plan: &Plan,
    server: &ServerFlags,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let methods = compare_methods(args)?;
    let out_dir = &args.output_dir;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let runtime_root = std::env::temp_dir().join(format!("dpserve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&runtime_root)
        .with_context(|| format!("creating {}", runtime_root.display()))?;
    let server = &with_sim_config(server, out_dir)?;

    let mut runs = Vec::new();
    for method in &methods {
        runs.push(run_method(method, args, plan, server, &runtime_root, rt)?);
    }
    std::fs::remove_dir_all(&runtime_root).ok();
    let mut results: Vec<MethodResult> = Vec::new();
    let mut lines: Vec<Value> = Vec::new();
    let mut pictures: Vec<String> = Vec::new();
    let mut routing: Vec<(String, routes::RouteSummary)> = Vec::new();
    for run in runs {
        lines.extend(run.line);
        pictures.extend(run.picture);
        routing.extend(run.routing.map(|r| (run.result.method.clone(), r)));
        results.push(run.result);
    }

    // Simulated ranks are named on every summary of their numbers.
    let simulated: Vec<&str> = lines
        .iter()
        .flat_map(|l| l["sim_profiles"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let described = describe(plan, server, &simulated);
    println!();
    println!("{described}");
    print!("{}", report::compare_table(&results));
    let routing_lines: String = routing
        .iter()
        .map(|(method, r)| format!("routing, {method}: {}\n", r.line()))
        .collect();
    print!("{routing_lines}");

    let summary = compare_summary(args, plan, server, &simulated, &results, &lines, &routing);
    let json_path = out_dir.join("compare.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = out_dir.join("compare.md");
    let md = format!(
        "{}\n\n{}\n{}",
        described,
        report::compare_markdown(&results),
        routing_lines
    );
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    let svg_path = out_dir.join("compare.svg");
    let mut written = vec![
        json_path.display().to_string(),
        md_path.display().to_string(),
    ];
    match chart::write_svg(&results, &chart_title(plan, server, &simulated), &svg_path) {
        Ok(()) => written.push(svg_path.display().to_string()),
        Err(e) => eprintln!("no chart: {e:#}"),
    }
    written.extend(pictures);
    println!("wrote {}", written.join(", "));
    if results.iter().all(|r| r.result.is_err()) {
        anyhow::bail!("no method ran");
    }
    Ok(())
}

/// The methods `--compare` names (or the preset's, or the default), each deployment checked.
fn compare_methods(args: &BenchArgs) -> anyhow::Result<Vec<String>> {
    let compare = args.compare.as_deref().unwrap_or(match args.preset {
        Some(p) => p.values().compare,
        None => DEFAULT_COMPARE,
    });
    let methods: Vec<String> = compare
        .split(',')
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .collect();
    anyhow::ensure!(!methods.is_empty(), "--compare names no method");
    for entry in &methods {
        if let Some((_, deployment)) = entry.split_once('@') {
            anyhow::ensure!(
                launch::parse_deployment(deployment).is_some_and(|(p, d)| p > 0 && d > 0),
                "--compare {entry}: a deployment is <P>p<D>d, e.g. round_robin@1p1d"
            );
        }
    }
    Ok(methods)
}

/// The server flags with the preset's `--sim-config` TOML written into `out_dir` and passed
/// by path.
fn with_sim_config(server: &ServerFlags, out_dir: &Path) -> anyhow::Result<ServerFlags> {
    let mut server = server.clone();
    if let Some(toml) = server.sim_config.take() {
        let path = out_dir.join("sim-profile.toml");
        std::fs::write(&path, toml).with_context(|| format!("writing {}", path.display()))?;
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        server.up_args.push("--sim-config".into());
        server.up_args.push(path.display().to_string());
    }
    Ok(server)
}

/// What one method's cluster gave: its outcome, its result line, its routing summary and
/// picture (when its trace was written here).
struct MethodRun {
    result: MethodResult,
    line: Option<Value>,
    routing: Option<routes::RouteSummary>,
    picture: Option<String>,
}

/// Starts a cluster for `method`, runs the workload against it, stops it, and reads its
/// routing trace. A cluster that does not start or completes nothing is a skipped method, not
/// an error; only writing `--output-file` is.
fn run_method(
    method: &str,
    args: &BenchArgs,
    plan: &Plan,
    server: &ServerFlags,
    runtime_root: &Path,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<MethodRun> {
    let out_dir = &args.output_dir;
    eprintln!("== {method}: starting a cluster");
    // Each cluster writes a routing trace, drawn beside the tables as routing-<method>.svg
    // (unless the caller routes traces elsewhere with --up-arg=--trace-file).
    let route_trace = out_dir.join(format!("route-{method}.jsonl"));
    let mut server = server.clone();
    let traced = !server.up_args.iter().any(|a| a.starts_with("--trace-file"));
    if traced {
        std::fs::remove_file(&route_trace).ok();
        server.up_args.push("--trace-file".into());
        server.up_args.push(route_trace.display().to_string());
    }
    let mut line = None;
    let outcome = match launch::start(method, &server, runtime_root, out_dir) {
        Err(reason) => Err(reason),
        Ok(mut cluster) => {
            eprintln!(
                "== {method}: ready at {}; running the workload",
                cluster.base_url
            );
            let run = rt.block_on(run_once(&cluster.base_url, plan));
            cluster.stop(Duration::from_secs(15));
            match run {
                Ok((mut info, m)) => {
                    // The entry we asked for, even if the server did not report one (and with
                    // its deployment, which the server's method does not say).
                    if method.contains('@') {
                        info.load_balance_method = Some(method.to_string());
                    }
                    info.load_balance_method
                        .get_or_insert_with(|| method.to_string());
                    print!("{}", report::result_table(&info, &m));
                    let result = report::result_json(&info, &m);
                    if let Some(path) = &args.output_file {
                        append_jsonl(path, &result)?;
                    }
                    line = Some(result);
                    if m.completed == 0 {
                        Err(format!(
                            "no request completed: {}",
                            m.errors.first().map_or("", String::as_str)
                        ))
                    } else {
                        Ok(m)
                    }
                }
                Err(e) => Err(format!("{e:#}")),
            }
        }
    };
    let (mut routing, mut picture) = (None, None);
    if let Err(reason) = &outcome {
        eprintln!("== {method}: skipped: {reason}");
    } else if traced {
        match routes::RouteSummary::read(&route_trace) {
            Ok(summary) => {
                eprintln!("== {method}: routing: {}", summary.line());
                routing = Some(summary);
            }
            Err(e) => eprintln!("== {method}: no routing summary: {e:#}"),
        }
        let svg = out_dir.join(format!("routing-{method}.svg"));
        match chart::write_routing_svg(&route_trace, method, &svg) {
            Ok(path) => picture = Some(path),
            Err(e) => eprintln!("== {method}: no routing picture: {e:#}"),
        }
    }
    Ok(MethodRun {
        result: MethodResult {
            method: method.to_string(),
            result: outcome,
        },
        line,
        routing,
        picture,
    })
}

/// `compare.json`: the workload, the server, and each method's result or why it was skipped.
fn compare_summary(
    args: &BenchArgs,
    plan: &Plan,
    server: &ServerFlags,
    simulated: &[&str],
    results: &[MethodResult],
    lines: &[Value],
    routing: &[(String, routes::RouteSummary)],
) -> Value {
    let cluster = server.cluster();
    json!({
        "workload": {
            "dataset_name": plan.gsp.dataset.name(),
            "dataset_path": (plan.gsp.dataset == Dataset::Mooncake)
                .then(|| plan.trace.path.as_ref().map(|p| p.display().to_string())),
            "trace": (plan.gsp.dataset == Dataset::Mooncake).then(|| json!({
                "block_tokens": plan.trace.block_tokens,
                "time_compression": plan.trace.time_compression,
                "start_ms": plan.trace.start_ms,
                "output_scale": plan.trace.output_scale,
            })),
            "slo_ttft_ms": plan.slo.ttft_ms,
            "slo_itl_ms": plan.slo.itl_ms,
            "gsp_zipf": plan.gsp.zipf,
            "gsp_num_groups": plan.gsp.num_groups,
            "gsp_prompts_per_group": plan.gsp.prompts_per_group,
            "gsp_system_prompt_len": plan.gsp.system_prompt_len,
            "gsp_question_len": plan.gsp.question_len,
            "gsp_output_len": plan.gsp.output_len,
            "gsp_range_ratio": plan.gsp.range_ratio,
            "gsp_send_routing_key": plan.gsp.send_routing_key,
            "num_prompts": plan.num_prompts,
            "max_concurrency": plan.max_concurrency,
            "request_rate": if plan.request_rate.is_finite() { json!(plan.request_rate) } else { json!("inf") },
            "seed": plan.seed,
            "backend": plan.backend.name(),
        },
        "server": {
            "dp_size": cluster.dp_size,
            "builtin_size": cluster.model.builtin_size.to_string(),
            "model_path": cluster.model.model_path.as_ref().map(|p| p.display().to_string()),
            "max_total_tokens": cluster.serve.max_total_tokens,
            "max_running_requests": cluster.serve.max_running_requests,
            "up_args": server.up_args,
        },
        "preset": args.preset.map(|p| format!("{p:?}")),
        "simulated": !simulated.is_empty(),
        "methods": results.iter().map(|r| match &r.result {
            Ok(_) => json!({"method": r.method, "status": "ok",
                "result": lines.iter().find(|l| l["load_balance_method"] == r.method.as_str()),
                "routing": routing.iter().find(|(m, _)| *m == r.method).map(|(_, s)| s)}),
            Err(reason) => json!({"method": r.method, "status": "skipped", "reason": reason}),
        }).collect::<Vec<_>>(),
    })
}

/// One line saying what was compared.
/// What ran where, in words; results from simulated ranks (their `sim_profiles`) open with a
/// line saying so.
fn describe(plan: &Plan, server: &ServerFlags, simulated: &[&str]) -> String {
    let g = &plan.gsp;
    let cluster = server.cluster();
    let model = match (simulated, &cluster.model.model_path) {
        ([], Some(path)) => path.display().to_string(),
        ([], None) => format!("built-in {}", cluster.model.builtin_size),
        (profiles, _) => format!("simulated ({})", profiles.join(", ")),
    };
    let banner = match simulated {
        [] => String::new(),
        profiles => format!(
            "SIMULATED ranks ({}; docs/SIM.md): every timing below is a cost model's.\n",
            profiles.join(", ")
        ),
    };
    let workload = match g.dataset {
        Dataset::Mooncake => format!(
            "trace {} ({}), {} requests at its timestamps",
            plan.trace
                .path
                .as_ref()
                .map_or("?".into(), |p| p.display().to_string()),
            plan.trace.describe(),
            plan.num_prompts.map_or("all".into(), |n| n.to_string()),
        ),
        _ => format!(
            "{}, system {} + question {} tokens, output {} (range ratio {}), routing key {}",
            shape(g),
            g.system_prompt_len,
            g.question_len,
            g.output_len,
            g.range_ratio,
            match (g.send_routing_key, g.dataset) {
                (false, _) => "none",
                (true, Dataset::MultiTurn) => "per conversation",
                (true, _) => "per group",
            },
        ),
    };
    let rate = match g.dataset {
        Dataset::Mooncake => "the trace's".to_string(),
        _ => plan.request_rate.to_string(),
    };
    format!(
        "{banner}workload: {workload}, concurrency {}, rate {rate}, seed {}; SLO TTFT {} ms, \
         ITL {} ms; cluster: dp {}, model {}, max_total_tokens {}",
        plan.max_concurrency
            .map_or("unlimited".into(), |c| c.to_string()),
        plan.seed,
        plan.slo.ttft_ms,
        plan.slo.itl_ms,
        cluster.dp_size,
        model,
        cluster
            .serve
            .max_total_tokens
            .map_or("default".into(), |t| t.to_string()),
    )
}

/// The workload's shape in words: `8 groups x 16 prompts`, `… (Zipf s = 1.1)`,
/// `8 conversations x 6 turns`.
fn shape(g: &GspConfig) -> String {
    match g.dataset {
        Dataset::MultiTurn => format!(
            "multi-turn, {} conversations x {} turns",
            g.num_groups, g.prompts_per_group
        ),
        Dataset::GeneratedSharedPrefix => {
            let zipf = g.zipf.map_or(String::new(), |s| format!(" (Zipf s = {s})"));
            format!(
                "shared prefix, {} groups x {} prompts{zipf}",
                g.num_groups, g.prompts_per_group
            )
        }
        Dataset::HotPrefix => format!(
            "hot prefix, one system prompt x {} prompts",
            g.num_groups * g.prompts_per_group
        ),
        Dataset::SiblingBurst => format!(
            "sibling bursts, {} groups x {} identical prompts",
            g.num_groups, g.prompts_per_group
        ),
        Dataset::NoReuse => format!(
            "no reuse, {} distinct prompts",
            g.num_groups * g.prompts_per_group
        ),
        Dataset::Mooncake => "Mooncake trace".to_string(),
    }
}

fn chart_title(plan: &Plan, server: &ServerFlags, simulated: &[&str]) -> String {
    let g = &plan.gsp;
    if g.dataset == Dataset::Mooncake {
        return format!(
            "dpserve bench: Mooncake trace ({} tok/block, {}x time), dp {}{}",
            plan.trace.block_tokens,
            plan.trace.time_compression,
            server.cluster().dp_size,
            if simulated.is_empty() {
                ""
            } else {
                ", SIMULATED ranks"
            },
        );
    }
    format!(
        "dpserve bench: {} (sys {}, q {}, out {}), dp {}{}",
        shape(g),
        g.system_prompt_len,
        g.question_len,
        g.output_len,
        server.cluster().dp_size,
        if simulated.is_empty() {
            ""
        } else {
            ", SIMULATED ranks"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> BenchArgs {
        Cli::parse_from(std::iter::once("bench").chain(args.iter().copied())).bench
    }

    #[test]
    fn defaults_are_bench_serving_s() {
        let (plan, server) = parse(&[]).resolve().unwrap();
        assert_eq!(plan.gsp, DEFAULT_GSP);
        assert!(plan.request_rate.is_infinite());
        assert_eq!(plan.max_concurrency, None);
        assert!(
            server.cluster.argv().is_empty(),
            "nothing set, nothing passed on"
        );
        assert_eq!(server.cluster().dp_size, crate::up::DEFAULT_DP_SIZE);
    }

    #[test]
    fn explicit_flags_win_over_the_preset() {
        let (plan, server) = parse(&[
            "--preset",
            "cpu-small",
            "--gsp-output-len",
            "4",
            "--dp-size",
            "3",
            "--request-rate",
            "2.5",
        ])
        .resolve()
        .unwrap();
        let p = Preset::CpuSmall.values();
        assert_eq!(plan.gsp.output_len, 4);
        assert_eq!(plan.gsp.num_groups, p.gsp.num_groups);
        assert_eq!(plan.max_concurrency, Some(p.max_concurrency));
        assert_eq!(server.cluster().dp_size, 3);
        assert_eq!(server.cluster().serve.max_total_tokens, p.max_total_tokens);
        let argv: Vec<String> = server
            .cluster
            .argv()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let argv = argv.join(" ");
        assert!(argv.contains("--dp-size 3"), "{argv}");
        assert!(argv.contains(&format!(
            "--max-total-tokens {}",
            p.max_total_tokens.unwrap()
        )));
        assert!(argv.contains("--builtin-size base"), "{argv}");
        assert_eq!(plan.request_rate, 2.5);
    }

    #[test]
    fn sglang_8gpu_is_the_published_workload_on_eight_simulated_ranks() {
        let (plan, server) = parse(&["--preset", "sglang-8gpu"]).resolve().unwrap();
        let g = &plan.gsp;
        assert_eq!(
            (g.num_groups, g.prompts_per_group, g.system_prompt_len),
            (16, 32, 4096)
        );
        assert_eq!((g.question_len, g.output_len), (128, 256));
        assert!(!g.send_routing_key, "SGLang's run sent no routing key");
        assert_eq!(plan.max_concurrency, Some(64));
        assert_eq!(server.cluster().dp_size, 8);
        assert_eq!(
            server.up_args,
            ["--device", "sim", "--sim-lock-step", "true"]
        );
        assert_eq!(
            server.cluster().serve.max_total_tokens,
            None,
            "the simulated GPU sizes the pool"
        );
        // The user's own --device wins over the preset's.
        let (_, server) = parse(&["--preset", "sglang-8gpu", "--up-arg=--device=cpu"])
            .resolve()
            .unwrap();
        assert_eq!(server.up_args, ["--device=cpu"]);
    }

    #[test]
    fn trace_presets_replay_open_loop_and_keep_their_ranks_for_other_workloads() {
        let (plan, server) = parse(&["--preset", "mooncake-8gpu", "--dataset-path", "trace.jsonl"])
            .resolve()
            .unwrap();
        assert_eq!(plan.gsp.dataset, Dataset::Mooncake);
        assert_eq!(plan.num_prompts, Some(1000));
        assert_eq!(plan.max_concurrency, None, "a trace is replayed open loop");
        assert_eq!(plan.trace.block_tokens, 512);
        assert_eq!(plan.trace.time_compression, 4.0);
        assert_eq!(plan.trace.path.as_deref(), Some(Path::new("trace.jsonl")));
        assert_eq!(server.cluster().dp_size, 8);
        assert!(server
            .sim_config
            .as_deref()
            .unwrap()
            .contains("context_len = 131072"));
        // The same ranks with a generated workload: its own size, the preset's concurrency.
        let (plan, server) = parse(&["--preset", "mooncake-8gpu", "--dataset-name", "hot-prefix"])
            .resolve()
            .unwrap();
        assert_eq!(plan.gsp.dataset, Dataset::HotPrefix);
        assert_eq!((plan.num_prompts, plan.max_concurrency), (None, Some(64)));
        assert_eq!(server.cluster().dp_size, 8);
        // The user's own scaling and sim profile win.
        let (plan, server) = parse(&[
            "--preset",
            "mooncake-16gpu",
            "--trace-time-compression",
            "2",
            "--num-prompts",
            "50",
            "--up-arg=--sim-profile=cpu-calibrated",
        ])
        .resolve()
        .unwrap();
        assert_eq!(server.cluster().dp_size, 16);
        assert_eq!(
            (plan.trace.time_compression, plan.num_prompts),
            (2.0, Some(50))
        );
        assert_eq!(server.sim_config, None);
        // The user's own device: no simulated profile for it either.
        let (_, server) = parse(&["--preset", "mooncake-8gpu", "--up-arg=--device=cpu"])
            .resolve()
            .unwrap();
        assert_eq!(server.up_args, ["--device=cpu"]);
        assert_eq!(server.sim_config, None);
        let (plan, server) = parse(&["--preset", "mooncake-cpu"]).resolve().unwrap();
        assert_eq!((plan.trace.block_tokens, plan.num_prompts), (2, Some(400)));
        assert_eq!(plan.trace.time_compression, 4.0);
        assert_eq!(server.cluster().dp_size, 2);
        assert!(
            server.sim_config.is_none() && server.up_args.is_empty(),
            "CPU ranks"
        );
        for m in EVERY_METHOD.split(',') {
            use clap::ValueEnum;
            assert!(
                controller::policy::Method::from_str(m, false).is_ok(),
                "{m} is a load-balance method"
            );
        }
    }

    #[test]
    fn slo_and_trace_flags_are_checked() {
        let (plan, _) = parse(&["--slo-ttft-ms", "500", "--slo-itl-ms", "40"])
            .resolve()
            .unwrap();
        assert_eq!((plan.slo.ttft_ms, plan.slo.itl_ms), (500.0, 40.0));
        assert_eq!(parse(&[]).resolve().unwrap().0.slo, Slo::default());
        assert!(parse(&["--slo-ttft-ms", "0"]).resolve().is_err());
        assert!(parse(&["--slo-itl-ms", "nan"]).resolve().is_err());
        let e = parse(&["--dataset-path", "x.jsonl"]).resolve().unwrap_err();
        assert!(e.to_string().contains("--dataset-name mooncake"), "{e}");
    }

    #[test]
    fn cpu_small_kv_fits_own_groups_but_not_all() {
        let p = Preset::CpuSmall.values();
        let max_total_tokens = p.max_total_tokens.unwrap();
        let g = &p.gsp;
        let own = g.num_groups.div_ceil(p.dp_size as usize) * g.system_prompt_len;
        let running =
            p.max_concurrency.div_ceil(p.dp_size as usize) * (g.question_len + g.output_len);
        assert!(
            own + running <= max_total_tokens,
            "own groups + running fit"
        );
        assert!(
            g.num_groups * g.system_prompt_len > max_total_tokens,
            "all groups do not"
        );
    }

    #[test]
    fn workload_flags_resolve_over_the_preset() {
        let (plan, _) = parse(&["--preset", "cpu-small"]).resolve().unwrap();
        assert!(plan.gsp.send_routing_key, "the preset sends keys");
        let (plan, _) = parse(&["--preset", "cpu-small", "--gsp-send-routing-key", "false"])
            .resolve()
            .unwrap();
        assert!(
            !plan.gsp.send_routing_key,
            "false turns the preset's keys off"
        );
        let (plan, _) = parse(&["--gsp-send-routing-key"]).resolve().unwrap();
        assert!(plan.gsp.send_routing_key, "the bare flag is true");
        let (plan, _) = parse(&["--dataset-name", "multi-turn", "--gsp-zipf", "1.1"])
            .resolve()
            .unwrap();
        assert_eq!(plan.gsp.dataset, Dataset::MultiTurn);
        assert_eq!(plan.gsp.zipf, Some(1.1));
        assert!(
            workload::generate(&plan.gsp, 512, None, 1).is_err(),
            "Zipf popularity is for the shared-prefix workload"
        );
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(Cli::try_parse_from(["bench", "--dataset-name", "sharegpt"]).is_err());
        assert!(
            parse(&["--gsp-zipf=-1"]).resolve().is_ok(),
            "checked by generate"
        );
        assert!(parse(&["--max-concurrency", "0"]).resolve().is_err());
        assert!(parse(&["--request-rate", "0"]).resolve().is_err());
    }
}
