//! The command line resolved into a run: explicit flags over the preset over the defaults,
//! for the workload (`Plan`) and for the clusters `--launch` starts (`ServerFlags`).

use super::args::BenchArgs;
use super::bailian::BAILIAN_BLOCK_TOKENS;
use super::client::Backend;
use super::launch::ServerFlags;
use super::metrics::Slo;
use super::mooncake::{TraceConfig, TRACE_BLOCK_TOKENS};
use super::preset::{Preset, PresetValues, DEFAULT_GSP};
use super::sweep_spec::{SweepSpec, DEFAULT_SWEEP_EXTEND};
use super::workload::{Dataset, GspConfig};

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
    /// `--sweep`: the rates, repeats and target of a capacity sweep.
    pub sweep: Option<SweepSpec>,
    /// `--output-details`: every request's numbers in the result.
    pub output_details: bool,
    /// `--sim-speed`: how many times faster than modelled the simulated ranks run; the
    /// workload is sent that much faster and every time measured is multiplied back (1: real
    /// time).
    pub sim_speed: f64,
}

impl BenchArgs {
    /// The plan and the server flags, with explicit flags over the preset over the defaults.
    pub fn resolve(&self) -> anyhow::Result<(Plan, ServerFlags)> {
        self.check_rate_and_slo()?;
        let preset = self.preset.map(Preset::values);
        let preset = preset.as_ref();
        let dataset = self
            .dataset_name
            .or(preset.map(|p| p.dataset))
            .unwrap_or(Dataset::GeneratedSharedPrefix);
        let trace = self.trace_config(
            dataset,
            preset.map_or_else(TraceConfig::default, |p| p.trace.clone()),
        );
        anyhow::ensure!(
            dataset.is_trace() || self.dataset_path.is_none(),
            "--dataset-path is for --dataset-name mooncake or bailian (this run's dataset is {})",
            dataset.name()
        );
        let gsp = self.gsp_config(dataset, preset.map_or(DEFAULT_GSP, |p| p.gsp.clone()));
        let mut server = self.server_flags(preset);
        let sweep = self.sweep_spec(preset)?;
        let sim_speed = self.sim_speed(&mut server, sweep.as_ref().and(preset))?;
        // A trace is replayed open loop, and a sweep sets the rate: the preset's concurrency
        // is for one run of a generated workload.
        let max_concurrency = self.max_concurrency.or(preset
            .filter(|_| !dataset.is_trace() && sweep.is_none())
            .map(|p| p.max_concurrency));
        // A preset's window is the trace's (a shorter one for a sweep's many runs); generated
        // workloads keep their own size.
        let num_prompts = self
            .num_prompts
            .or(preset
                .filter(|_| dataset.is_trace())
                .and_then(|p| match (&sweep, &p.sweep) {
                    (Some(_), Some(s)) => Some(s.num_prompts),
                    _ => p.num_prompts,
                }));
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
            sweep,
            output_details: self.output_details,
            sim_speed,
        };
        Ok((plan, server))
    }

    /// `--sim-speed`, checked, written into the simulated ranks' profile; without it, the
    /// speed of the `sweeping` preset's sweep where the preset's simulated ranks run, else 1.
    fn sim_speed(
        &self,
        server: &mut ServerFlags,
        sweeping: Option<&PresetValues>,
    ) -> anyhow::Result<f64> {
        let preset_speed = sweeping
            .and_then(|p| p.sweep.as_ref())
            .map(|s| s.sim_speed)
            .filter(|_| server.sim_config.is_some());
        let Some(speed) = self.sim_speed.or(preset_speed).filter(|&k| k != 1.0) else {
            return Ok(1.0);
        };
        anyhow::ensure!(
            speed.is_finite() && (1.0..=16.0).contains(&speed),
            "--sim-speed must be a number from 1 to 16, got {speed}"
        );
        let toml = server.sim_config.as_mut().filter(|_| self.launch);
        let Some(toml) = toml else {
            anyhow::bail!(
                "--sim-speed runs the simulated ranks a trace preset launches: it needs --launch \
                 with --preset mooncake-8gpu or mooncake-16gpu and no --device or --sim-* up-arg \
                 of your own"
            );
        };
        toml.push_str(&format!("speed = {speed:?}\n"));
        Ok(speed)
    }

    /// `--sweep`'s spec (`None` without it): the rates given, or the preset's.
    fn sweep_spec(&self, preset: Option<&PresetValues>) -> anyhow::Result<Option<SweepSpec>> {
        let Some(rates) = &self.sweep else {
            return Ok(None);
        };
        anyhow::ensure!(
            self.launch,
            "--sweep starts a fresh cluster per run: add --launch"
        );
        let preset_rates = preset.and_then(|p| p.sweep.as_ref()).map(|s| s.rates);
        let mut spec =
            SweepSpec::new(rates, preset_rates, self.sweep_repeats, self.slo_attainment)?;
        spec.all_rates = self.sweep_all_rates;
        spec.extend = self.sweep_extend.unwrap_or(if rates.is_empty() {
            DEFAULT_SWEEP_EXTEND
        } else {
            0
        });
        Ok(Some(spec))
    }

    /// `--request-rate` and the SLO's bounds must be positive.
    fn check_rate_and_slo(&self) -> anyhow::Result<()> {
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
        Ok(())
    }

    /// The trace and its scaling: the `--dataset-path` and `--trace-*` flags over `base` (a
    /// preset's scaling, stated for Mooncake's 512-token blocks: a Bailian trace's 16-token
    /// blocks are scaled by the same share, at least one token each).
    fn trace_config(&self, dataset: Dataset, base: TraceConfig) -> TraceConfig {
        let native = match dataset {
            Dataset::Bailian => BAILIAN_BLOCK_TOKENS,
            _ => TRACE_BLOCK_TOKENS,
        };
        let base_block = (base.block_tokens * native)
            .div_ceil(base.native_block_tokens.max(1))
            .max(1);
        TraceConfig {
            path: self.dataset_path.clone(),
            block_tokens: self.trace_block_tokens.unwrap_or(base_block),
            native_block_tokens: native,
            time_compression: self.trace_time_compression.unwrap_or(base.time_compression),
            start_ms: self.trace_start_ms.unwrap_or(base.start_ms),
            output_scale: self.trace_output_scale.unwrap_or(base.output_scale),
        }
    }

    /// The generated workload of `dataset`: the `--gsp-*` flags over `base`.
    fn gsp_config(&self, dataset: Dataset, base: GspConfig) -> GspConfig {
        GspConfig {
            dataset,
            num_groups: self.gsp_num_groups.unwrap_or(base.num_groups),
            prompts_per_group: self.gsp_prompts_per_group.unwrap_or(base.prompts_per_group),
            system_prompt_len: self.gsp_system_prompt_len.unwrap_or(base.system_prompt_len),
            question_len: self.gsp_question_len.unwrap_or(base.question_len),
            output_len: self.gsp_output_len.unwrap_or(base.output_len),
            range_ratio: self.gsp_range_ratio.unwrap_or(base.range_ratio),
            send_routing_key: self.gsp_send_routing_key.unwrap_or(base.send_routing_key),
            zipf: self.gsp_zipf.or(base.zipf),
        }
    }

    /// The server flags with the preset's cluster sizes, `up` arguments and simulated profile
    /// wherever the user's own flags leave them unset.
    fn server_flags(&self, preset: Option<&PresetValues>) -> ServerFlags {
        let mut server = self.server.clone();
        let Some(p) = preset else {
            return server;
        };
        // The user's own --device wins, and then none of the preset's simulation setup applies;
        // the user's own --sim-* flags replace the preset's profile file.
        let own_device = server
            .up_args
            .iter()
            .any(|a| a == "--device" || a.starts_with("--device="));
        let own_sim = server.up_args.iter().any(|a| a.starts_with("--sim-"));
        default_cluster_sizes(&mut server, p);
        add_up_args(&mut server, p.up_args, own_device);
        if let Some(toml) = p.sim_config {
            if !own_device && !own_sim {
                server.sim_config = Some(toml.to_string());
            }
        }
        server
    }
}

/// The preset's DP size, built-in model (unless a `--model-path` is given) and KV pool, each
/// where the user set none.
fn default_cluster_sizes(server: &mut ServerFlags, p: &PresetValues) {
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
}

/// The preset's `up` arguments the user's `--up-arg`s do not name (none of its `--sim-*` ones
/// when the user chose the device).
fn add_up_args(server: &mut ServerFlags, up_args: &[(&str, &str)], own_device: bool) {
    for (flag, value) in up_args {
        let given = |a: &String| a == flag || a.starts_with(&format!("{flag}="));
        if own_device && flag.starts_with("--sim-") {
            continue;
        }
        if !server.up_args.iter().any(given) {
            server.up_args.extend([flag.to_string(), value.to_string()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::preset::EVERY_METHOD;
    use crate::bench::workload;
    use clap::Parser;
    use std::path::Path;

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
    fn sim_speed_goes_into_the_simulated_ranks_profile_or_is_refused() {
        let (plan, server) = parse(&["--launch", "--preset", "mooncake-8gpu", "--sim-speed", "4"])
            .resolve()
            .unwrap();
        assert_eq!(plan.sim_speed, 4.0);
        let toml = server.sim_config.expect("the preset's profile");
        assert!(toml.ends_with("speed = 4.0\n"), "{toml}");
        let (plan, _) = parse(&["--launch", "--preset", "mooncake-8gpu"])
            .resolve()
            .unwrap();
        assert_eq!(plan.sim_speed, 1.0, "one run: real time");
        // mooncake-8gpu's sweep runs its simulated ranks 4x unless told otherwise.
        let sweep = ["--launch", "--preset", "mooncake-8gpu", "--sweep"];
        let (plan, server) = parse(&sweep).resolve().unwrap();
        assert_eq!(plan.sim_speed, 4.0);
        assert!(server.sim_config.unwrap().ends_with("speed = 4.0\n"));
        let (plan, server) = parse(&[&sweep[..], &["--sim-speed", "1"]].concat())
            .resolve()
            .unwrap();
        assert_eq!(plan.sim_speed, 1.0);
        assert!(!server.sim_config.unwrap().contains("speed"));
        for own in [
            &[&sweep[..], &["--up-arg=--device=cpu"]].concat(),
            &["--launch", "--preset", "mooncake-cpu", "--sweep"][..],
        ] {
            assert_eq!(parse(own).resolve().unwrap().0.sim_speed, 1.0, "{own:?}");
        }
        // 16 ranks twice as fast: at 4x the host falls behind them.
        let sixteen = ["--launch", "--preset", "mooncake-16gpu", "--sweep"];
        assert_eq!(parse(&sixteen).resolve().unwrap().0.sim_speed, 2.0);
        for (args, want) in [
            (
                &["--preset", "mooncake-8gpu", "--sim-speed", "2"][..],
                "--launch",
            ),
            (
                &["--launch", "--preset", "cpu-small", "--sim-speed", "2"],
                "--launch",
            ),
            (
                &[
                    "--launch",
                    "--preset",
                    "mooncake-8gpu",
                    "--up-arg=--device=cpu",
                    "--sim-speed",
                    "2",
                ],
                "--device",
            ),
            (
                &[
                    "--launch",
                    "--preset",
                    "mooncake-8gpu",
                    "--sim-speed",
                    "0.5",
                ],
                "1 to 16",
            ),
            (
                &[
                    "--launch",
                    "--preset",
                    "mooncake-8gpu",
                    "--sim-speed",
                    "NaN",
                ],
                "1 to 16",
            ),
        ] {
            let err = parse(args).resolve().unwrap_err().to_string();
            assert!(
                err.contains("--sim-speed") && err.contains(want),
                "{args:?}: {err}"
            );
        }
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

    #[test]
    fn a_sweep_takes_the_presets_rates_and_window_and_no_concurrency_cap() {
        let e = parse(&["--sweep", "1,2"]).resolve().unwrap_err();
        assert!(format!("{e:#}").contains("add --launch"), "{e:#}");
        let e = parse(&["--launch", "--sweep"]).resolve().unwrap_err();
        assert!(format!("{e:#}").contains("names no rate"), "{e:#}");
        let (plan, _) = parse(&["--launch", "--preset", "mooncake-8gpu", "--sweep"])
            .resolve()
            .unwrap();
        let spec = plan.sweep.unwrap();
        assert_eq!(spec.rates, [1.0, 1.5, 2.0, 2.5]);
        assert_eq!(
            (spec.repeats, spec.attainment, spec.all_rates),
            (3, 0.9, false)
        );
        assert_eq!(plan.num_prompts, Some(400), "the sweep's window");
        assert_eq!(
            spec.extend, 4,
            "a preset's rates extend while a method still passes"
        );
        let (plan, _) = parse(&["--launch", "--preset", "mooncake-8gpu"])
            .resolve()
            .unwrap();
        assert_eq!(plan.num_prompts, Some(1000), "one run's window");
        // Given rates win; a generated workload's sweep sets the rate, not a concurrency cap.
        let (plan, _) = parse(&[
            "--launch",
            "--preset",
            "cpu-small",
            "--sweep",
            "4,2",
            "--sweep-repeats",
            "1",
            "--slo-attainment",
            "0.95",
        ])
        .resolve()
        .unwrap();
        let spec = plan.sweep.unwrap();
        assert_eq!(
            (spec.rates, spec.repeats, spec.attainment, spec.extend),
            (vec![2.0, 4.0], 1, 0.95, 0)
        );
        assert_eq!(plan.max_concurrency, None);
    }

    #[test]
    fn a_bailian_trace_scales_its_16_token_blocks_like_the_presets_512() {
        let trace = |args: &[&str]| parse(args).resolve().unwrap().0.trace;
        let t = trace(&["--dataset-name", "bailian"]);
        assert_eq!((t.block_tokens, t.native_block_tokens), (16, 16));
        let t = trace(&["--preset", "mooncake-8gpu", "--dataset-name", "bailian"]);
        assert_eq!((t.block_tokens, t.native_block_tokens), (16, 16));
        // mooncake-cpu's 2 tokens per 512-token block: 1/256, at least 1 token per block.
        let t = trace(&["--preset", "mooncake-cpu", "--dataset-name", "bailian"]);
        assert_eq!((t.block_tokens, t.native_block_tokens), (1, 16));
        let t = trace(&["--dataset-name", "bailian", "--trace-block-tokens", "4"]);
        assert_eq!(t.block_tokens, 4);
        let (plan, _) = parse(&["--preset", "mooncake-16gpu", "--dataset-name", "bailian"])
            .resolve()
            .unwrap();
        assert_eq!(
            plan.num_prompts,
            Some(1000),
            "the trace presets take a Bailian trace"
        );
        assert_eq!(plan.max_concurrency, None, "open loop");
    }
}
