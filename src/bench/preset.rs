//! `--preset`: named workloads and cluster sizes for a machine class, and the defaults a run
//! without one starts from (bench_serving's workload, the methods `--launch` compares).

use worker::model::BuiltinSize;

use super::mooncake::TraceConfig;
use super::workload::{Dataset, GspConfig};

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

/// dpserve's methods and the peers' (SGLang's own three, vLLM's, SMG's two, Dynamo's, llm-d's):
/// what the trace presets compare.
pub const EVERY_METHOD: &str = "round_robin,total_requests,total_tokens,prefix_affinity,\
                                cache_aware,vllm_dp,smg_cache_aware,dynamo_kv,llmd_prefix,\
                                smg_power_of_two";

/// The default simulated profile with the context its model serves (Qwen3.5: 262k; the trace's
/// longest prompt is 126k tokens), for the trace presets: written beside the results and given
/// to every rank as `--sim-config`.
const SIM_LONG_CONTEXT: &str = "# written by dpserve bench --preset mooncake-*\n\
                                base = \"h100-qwen3.5-122b-a10b-fp8\"\n\
                                context_len = 131072\n";

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
    /// time compressed 4x, open loop; every method, dpserve's and the peers'. A Bailian
    /// trace (`--dataset-name bailian`) is replayed the same way; with `--sweep` (no rates),
    /// the first 400 requests at time compressions 1, 1.5, 2 and 2.5, and up to four more
    /// while the capacities are not yet bracketed (`--sweep-extend`; the sweep at
    /// `--sim-speed 4` unless given). With another
    /// `--dataset-name`, that workload (64 × 8 requests, system 4096 + question 128, output
    /// 256, concurrency 64) on the same ranks.
    #[value(name = "mooncake-8gpu")]
    Mooncake8Gpu,
    /// As `mooncake-8gpu` on 16 simulated ranks, time compressed 8x (twice the ranks, twice
    /// the rate: the same load per rank); `--sweep`: 2, 3, 4 and 5 (at `--sim-speed 2`
    /// unless given).
    #[value(name = "mooncake-16gpu")]
    Mooncake16Gpu,
    /// The Mooncake conversation trace on 2 CPU ranks of the built-in `base` model: 400
    /// requests from the trace's start (reuse grows with the window: conversations span
    /// minutes), 2 tokens per block (prompts ≈ 47 tokens on average), outputs x0.02, time
    /// compressed 4x (≈ 12 requests/s, a load two CPU ranks serve: at 8x, ≈ 24/s, they sat
    /// at their limit and no two runs ordered the methods alike); finishes in under ten
    /// minutes for every method. `--sweep`: time compressions 2, 4, 6 and 8.
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
    /// What `--sweep` with no rates runs (the trace presets).
    pub sweep: Option<SweepPreset>,
}

/// A preset's capacity sweep: its rates (time compressions of the trace) and its window, shorter
/// than one run's so that every method's sweep fits in a sitting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepPreset {
    pub rates: &'static [f64],
    pub num_prompts: usize,
    /// `--sim-speed` unless given: simulated ranks run this many times faster than modelled
    /// (1: real time, and always for real ranks).
    pub sim_speed: f64,
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

/// A trace preset on `dp_size` simulated ranks, time compressed `compression` times; its sweep
/// runs the trace's first 400 requests at `sweep_rates`.
fn sim_trace_preset(
    dp_size: u32,
    compression: f64,
    sweep_rates: &'static [f64],
    sweep_speed: f64,
) -> PresetValues {
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
        sweep: Some(SweepPreset {
            rates: sweep_rates,
            num_prompts: 400,
            sim_speed: sweep_speed,
        }),
    }
}

impl Preset {
    pub fn values(self) -> PresetValues {
        match self {
            Preset::CpuSmall => cpu_small(),
            Preset::Sglang8Gpu => sglang_8gpu(),
            // 8 ranks four times faster: a sweep of five methods in about half an hour
            // (estimated from its runs' lengths), reading as real time does within a run's
            // spread (docs/BENCHMARKS.md, "--sim-speed against real time"). 16 ranks twice as
            // fast: at 4x the 2-core host falls behind them (p50 ITL 11-14 ms against 10.6 in
            // real time at the trace's 4x), at 2x it keeps up.
            Preset::Mooncake8Gpu => sim_trace_preset(8, 4.0, &[1.0, 1.5, 2.0, 2.5], 4.0),
            Preset::Mooncake16Gpu => sim_trace_preset(16, 8.0, &[2.0, 3.0, 4.0, 5.0], 2.0),
            Preset::MooncakeCpu => mooncake_cpu(),
        }
    }
}

/// `cpu-small`: a shared-prefix workload whose groups outgrow one rank's KV pool.
fn cpu_small() -> PresetValues {
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
        sweep: None,
    }
}

/// `sglang-8gpu`: the workload of SGLang's data_parallel_controller benchmark
/// (bench_serving --dataset-name generated-shared-prefix, 8 × H100 80GB with DP attention):
/// 512 prompts, no routing key, so prefix_affinity hashes the first 4096 tokens, which are
/// exactly the system prompt.
fn sglang_8gpu() -> PresetValues {
    PresetValues {
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
        sweep: None,
    }
}

/// `mooncake-cpu`: the trace on two CPU ranks of the built-in model.
fn mooncake_cpu() -> PresetValues {
    // The trace's first 600 requests span 200 s; compressed 8x, ~24 requests/s arrive
    // for 25 s.
    PresetValues {
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
        // With finish-first on by default every method meets the target up to 10-12x and
        // none at 18x (docs/BENCHMARKS.md, 2026-12-07): rates around that knee; five methods,
        // three repeats, ~15-20 min by the runs' lengths (not yet timed whole).
        sweep: Some(SweepPreset {
            rates: &[10.0, 12.0, 14.0, 16.0],
            num_prompts: 400,
            sim_speed: 1.0,
        }),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
