//! `dpserve bench`'s command line: every flag of the benchmark, the engine benchmark's and the
//! launched clusters' (`ServerFlags`), resolved into a run by `plan`.

use std::path::PathBuf;

use super::client::Backend;
use super::engine;
use super::launch::ServerFlags;
use super::metrics::Slo;
use super::preset::Preset;
use super::workload::Dataset;

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
    /// sent when the previous one finished); a Mooncake trace or a Qwen-Bailian trace of
    /// sessions, each turn after its parent (`--dataset-path`, `--trace-*`); or a router's
    /// failure case: one hot system prompt, bursts of identical prompts, no reuse
    /// (shaped by the `--gsp-*` flags). [default: generated-shared-prefix, or the preset's]
    #[arg(long, value_enum)]
    pub dataset_name: Option<Dataset>,
    /// The trace file of `--dataset-name mooncake` (one JSON object a line: timestamp ms,
    /// input_length, output_length, hash_ids of 512-token blocks) or `bailian` (chat_id,
    /// parent_chat_id, timestamp s, input_length, output_length, hash_ids of 16-token blocks).
    #[arg(long, env = "DPSERVE_BENCH_DATASET_PATH")]
    pub dataset_path: Option<PathBuf>,
    /// [trace] Tokens each of the trace's blocks becomes (prompt lengths scale with it)
    /// [default: the trace's own, 512 (Mooncake) or 16 (Bailian); a preset's, stated for
    /// 512-token blocks, scales a Bailian trace's by the same share].
    #[arg(long)]
    pub trace_block_tokens: Option<usize>,
    /// [trace] Divide the trace's timestamps by this [default: 1, or the preset's].
    #[arg(long)]
    pub trace_time_compression: Option<f64>,
    /// [trace] Start the window at this timestamp (ms); earlier requests are skipped.
    #[arg(long)]
    pub trace_start_ms: Option<u64>,
    /// [trace] Multiply output lengths by this (at least 1 token) [default: 1, or the
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
    /// Put every request's numbers in the result (`details`: prompt and output lengths, TTFT,
    /// when it was sent and ended, its rank, its error), as bench_serving's flag does.
    #[arg(long)]
    pub output_details: bool,
    /// No progress bar.
    #[arg(long)]
    pub disable_progress_bar: bool,
    /// Start a fresh cluster per method (`dpserve up`) instead of using --base-url. Its
    /// `/generate` streams each step alone (`--incremental-streaming-output`).
    #[arg(long)]
    pub launch: bool,
    /// [simulated ranks a trace preset launches] Run the ranks' modelled time this many times
    /// faster (1-16), send the workload that much faster and multiply every time measured back:
    /// the results are in modelled time, a run takes 1/K of it. What does not scale (HTTP,
    /// tokenizing, routing) reads K times larger (docs/SIM.md) [default: 4 for the
    /// `--sweep` of `--preset mooncake-8gpu`, 2 for that of `mooncake-16gpu`, else 1].
    #[arg(long, value_name = "K")]
    pub sim_speed: Option<f64>,
    /// [--launch] Comma-separated load-balance methods to compare. `METHOD@<P>p<D>d` (e.g.
    /// `round_robin@1p1d`) runs a disaggregated deployment of P prefill and D decode workers
    /// instead of the unified `--dp-size` ranks (the deployment axis).
    /// [default: round_robin,total_requests,total_tokens,prefix_affinity, or the preset's]
    #[arg(long)]
    pub compare: Option<String>,
    /// [--launch] Directory for compare.json, compare.md, compare.svg and the cluster logs.
    #[arg(long, default_value = "bench-results")]
    pub output_dir: PathBuf,
    /// [--launch] Capacity at SLO: run every --compare method at each of these rates (a
    /// trace: its time compression; a generated workload: --request-rate), a fresh cluster
    /// per run, and report each method's highest rate with --slo-attainment of its requests
    /// within the SLO (sweep.json, sweep.md, sweep.svg). With no value: the preset's rates.
    #[arg(long, value_delimiter = ',', num_args = 0.., value_name = "RATES")]
    pub sweep: Option<Vec<f64>>,
    /// [--sweep] Runs per method and rate (the median counts).
    #[arg(long, default_value_t = 3)]
    pub sweep_repeats: usize,
    /// [--sweep] Run every rate for every method; by default a method stops after its first
    /// rate whose median attainment misses the target (higher rates would too, but for noise).
    #[arg(long)]
    pub sweep_all_rates: bool,
    /// [--sweep] Add up to this many rates: while some method still meets the target at the
    /// highest rate, one 1.5 times higher (its capacity is then measured rather than bounded
    /// below); while every method misses it at the lowest, one 1.5 times lower (default: 4
    /// when the rates are a preset's, 0 when --sweep names them).
    #[arg(long, value_name = "N")]
    pub sweep_extend: Option<usize>,
    /// [--sweep] The share of requests a rate must serve within the SLO.
    #[arg(long, default_value_t = 0.9)]
    pub slo_attainment: f64,
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
    /// [--engine] Also decode each batch under this JSON Schema (a file), every sequence's
    /// logits masked by its constraint each step (structured output's cost per token; needs a
    /// model directory's tokenizer.json).
    #[arg(long)]
    pub engine_json_schema: Option<PathBuf>,
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
            compute_dtype: cluster.model.compute_dtype,
            threads: cluster.serve.num_threads,
            kernel_path: self.kernel_path.trim().to_string(),
            prompt_lens: self.engine_prompt_lens.clone(),
            batches: self.engine_batches.clone(),
            decode_steps: self.engine_decode_steps,
            chunk,
            reps: self.engine_reps,
            json_schema: self.engine_json_schema.clone(),
            output_file: self.output_file.clone(),
        })
    }
}
