//! `--launch`: a fresh cluster per load-balance method (or deployment), the same workload on
//! each, and one comparison of them (terminal table, `compare.json`, `compare.md`,
//! `compare.svg`, and each method's routing picture).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use super::args::BenchArgs;
use super::launch::{self, ServerFlags};
use super::metrics::BenchMetrics;
use super::plan::Plan;
use super::preset::DEFAULT_COMPARE;
use super::report::append_jsonl;
use super::report::{self, MethodResult, RunInfo};
use super::runner::run_once;
use super::workload::{Dataset, GspConfig};
use super::{chart, routes};

/// `--launch`: a fresh cluster per method, the same workload on each, one comparison.
pub fn run_compare(
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
pub(super) fn compare_methods(args: &BenchArgs) -> anyhow::Result<Vec<String>> {
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
pub(super) fn with_sim_config(server: &ServerFlags, out_dir: &Path) -> anyhow::Result<ServerFlags> {
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

/// A method's metrics, or why it was skipped.
type Outcome = Result<BenchMetrics, String>;

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
    let (outcome, line) = match launch::start(method, &server, runtime_root, out_dir) {
        Err(reason) => (Err(reason), None),
        Ok(cluster) => run_on_cluster(cluster, method, args, plan, rt)?,
    };
    let (mut routing, mut picture) = (None, None);
    if let Err(reason) = &outcome {
        eprintln!("== {method}: skipped: {reason}");
    } else if traced {
        (routing, picture) = routing_of(method, &route_trace, out_dir);
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

/// Runs the workload against a started cluster and stops it: the method's outcome and, when
/// the run gave metrics, its result line.
fn run_on_cluster(
    mut cluster: launch::Cluster,
    method: &str,
    args: &BenchArgs,
    plan: &Plan,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(Outcome, Option<Value>)> {
    eprintln!(
        "== {method}: ready at {}; running the workload",
        cluster.base_url
    );
    let run = rt.block_on(run_once(&cluster.base_url, plan));
    cluster.stop(Duration::from_secs(15));
    match run {
        Ok((info, m)) => {
            let (outcome, line) = record_run(method, args, info, m)?;
            Ok((outcome, Some(line)))
        }
        Err(e) => Ok((Err(format!("{e:#}")), None)),
    }
}

/// Prints one method's result under the entry asked for, appends it to `--output-file`, and
/// returns it with the outcome (a run that completed nothing is skipped).
fn record_run(
    method: &str,
    args: &BenchArgs,
    mut info: RunInfo,
    m: BenchMetrics,
) -> anyhow::Result<(Outcome, Value)> {
    // The entry we asked for, even if the server did not report one (and with its
    // deployment, which the server's method does not say).
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
    let outcome = match m.none_completed() {
        Some(reason) => Err(reason),
        None => Ok(m),
    };
    Ok((outcome, result))
}

/// The routing summary and picture of a method's trace; each is left out, with a line saying
/// why, when the trace cannot be read or drawn.
fn routing_of(
    method: &str,
    route_trace: &Path,
    out_dir: &Path,
) -> (Option<routes::RouteSummary>, Option<String>) {
    let routing = match routes::RouteSummary::read(route_trace) {
        Ok(summary) => {
            eprintln!("== {method}: routing: {}", summary.line());
            Some(summary)
        }
        Err(e) => {
            eprintln!("== {method}: no routing summary: {e:#}");
            None
        }
    };
    let svg = out_dir.join(format!("routing-{method}.svg"));
    let picture = match chart::write_routing_svg(route_trace, method, &svg) {
        Ok(path) => Some(path),
        Err(e) => {
            eprintln!("== {method}: no routing picture: {e:#}");
            None
        }
    };
    (routing, picture)
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
    json!({
        "workload": workload_json(plan),
        "server": server_json(server),
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

/// The workload of a run, as compare.json and sweep.json state it.
pub(super) fn workload_json(plan: &Plan) -> Value {
    json!({
        "dataset_name": plan.gsp.dataset.name(),
        "dataset_path": plan.gsp.dataset.is_trace()
            .then(|| plan.trace.path.as_ref().map(|p| p.display().to_string())),
        "trace": plan.gsp.dataset.is_trace().then(|| json!({
            "block_tokens": plan.trace.block_tokens,
            "native_block_tokens": plan.trace.native_block_tokens,
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
    })
}

/// The cluster every method ran on, as compare.json and sweep.json state it.
pub(super) fn server_json(server: &ServerFlags) -> Value {
    let cluster = server.cluster();
    json!({
        "dp_size": cluster.dp_size,
        "builtin_size": cluster.model.builtin_size.to_string(),
        "model_path": cluster.model.model_path.as_ref().map(|p| p.display().to_string()),
        "max_total_tokens": cluster.serve.max_total_tokens,
        "max_running_requests": cluster.serve.max_running_requests,
        "up_args": server.up_args,
    })
}

/// One line saying what was compared.
/// What ran where, in words; results from simulated ranks (their `sim_profiles`) open with a
/// line saying so.
pub(super) fn describe(plan: &Plan, server: &ServerFlags, simulated: &[&str]) -> String {
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
            "SIMULATED ranks ({}; docs/SIM.md): every timing below is a cost model's{}.\n",
            profiles.join(", "),
            if plan.sim_speed == 1.0 {
                String::new()
            } else {
                format!(
                    ", run {}x faster than modelled and multiplied back (--sim-speed)",
                    plan.sim_speed
                )
            }
        ),
    };
    let workload = match g.dataset {
        Dataset::Mooncake | Dataset::Bailian => format!(
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
        Dataset::Mooncake | Dataset::Bailian => "the trace's".to_string(),
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
        Dataset::Bailian => "Bailian trace".to_string(),
    }
}

fn chart_title(plan: &Plan, server: &ServerFlags, simulated: &[&str]) -> String {
    format!(
        "dpserve bench: {}{}",
        workload_title(plan, server),
        if simulated.is_empty() {
            ""
        } else {
            ", SIMULATED ranks"
        },
    )
}

/// The workload and cluster in a chart title's few words.
pub(super) fn workload_title(plan: &Plan, server: &ServerFlags) -> String {
    let g = &plan.gsp;
    let dp = server.cluster().dp_size;
    if g.dataset.is_trace() {
        return format!(
            "{} ({} tok/block, {}x time), dp {dp}",
            shape(g),
            plan.trace.block_tokens,
            plan.trace.time_compression,
        );
    }
    format!(
        "{} (sys {}, q {}, out {}), dp {dp}",
        shape(g),
        g.system_prompt_len,
        g.question_len,
        g.output_len,
    )
}
