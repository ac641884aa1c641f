//! What a benchmark run prints and writes: bench_serving's result table and JSON-line keys for
//! one run, and the comparison across load-balance methods (terminal table, Markdown, JSON).
//! Formatting, and appending a JSON line to a results file: nothing here measures or talks to
//! a server.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde_json::{json, Map, Value};

use super::metrics::{BenchMetrics, Dist};
use super::mooncake::TraceConfig;
use super::workload::GspConfig;

/// The method every comparison is measured against.
pub const BASELINE_METHOD: &str = "round_robin";

/// What a run was, besides what it measured.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub backend: String,
    pub gsp: GspConfig,
    /// The trace and its scaling, for a replayed trace.
    pub trace: Option<TraceConfig>,
    pub num_prompts: usize,
    pub request_rate: f64,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub load_balance_method: Option<String>,
    pub dp_size: Option<u64>,
    /// Per-rank cache hit rate the workers report (`/get_server_info` ranks[].status); `None`
    /// when the server has no `/get_server_info` (not dpserve).
    pub server_rank_cache_hit_rate: Option<Map<String, Value>>,
    /// The vocabulary the prompts were drawn from, and where its size came from.
    pub vocab_size: u32,
    pub vocab_size_from: String,
    /// The OpenAI `model` sent (`None`: the client's default), and where it came from.
    pub model: Option<String>,
    pub model_from: String,
    /// What the run assumed because the server did not say it (printed under the table).
    pub notes: Vec<String>,
    /// The cost-model profiles of the server's simulated ranks (`--device sim`); empty when
    /// every rank runs a model. Its timings are then the cost model's, not a GPU's.
    pub sim_profiles: Vec<String>,
}

fn dist_keys(out: &mut Map<String, Value>, name: &str, d: &Dist) {
    out.insert(format!("mean_{name}_ms"), json!(d.mean));
    out.insert(format!("median_{name}_ms"), json!(d.median));
    out.insert(format!("std_{name}_ms"), json!(d.std));
    out.insert(format!("p90_{name}_ms"), json!(d.p90));
    out.insert(format!("p95_{name}_ms"), json!(d.p95));
    out.insert(format!("p99_{name}_ms"), json!(d.p99));
}

/// A request rate as JSON: a number, or `"inf"` for a burst (JSON has no infinity).
fn rate_json(rate: f64) -> Value {
    if rate.is_finite() {
        json!(rate)
    } else {
        json!("inf")
    }
}

/// One result as a JSON object with bench_serving's keys plus dpserve's.
pub fn result_json(info: &RunInfo, m: &BenchMetrics) -> Value {
    let mut o = Map::new();
    run_keys(&mut o, info);
    metric_keys(&mut o, m);
    rank_keys(&mut o, info, m);
    Value::Object(o)
}

/// What was run: the workload, the server and the model, in bench_serving's key order.
fn run_keys(o: &mut Map<String, Value>, info: &RunInfo) {
    o.insert("backend".into(), json!(info.backend));
    o.insert("dataset_name".into(), json!(info.gsp.dataset.name()));
    o.insert("request_rate".into(), rate_json(info.request_rate));
    o.insert("max_concurrency".into(), json!(info.max_concurrency));
    o.insert("num_prompts".into(), json!(info.num_prompts));
    o.insert("seed".into(), json!(info.seed));
    o.insert("gsp_num_groups".into(), json!(info.gsp.num_groups));
    o.insert(
        "gsp_prompts_per_group".into(),
        json!(info.gsp.prompts_per_group),
    );
    o.insert(
        "gsp_system_prompt_len".into(),
        json!(info.gsp.system_prompt_len),
    );
    o.insert("gsp_question_len".into(), json!(info.gsp.question_len));
    o.insert("gsp_output_len".into(), json!(info.gsp.output_len));
    o.insert("gsp_range_ratio".into(), json!(info.gsp.range_ratio));
    o.insert(
        "gsp_send_routing_key".into(),
        json!(info.gsp.send_routing_key),
    );
    o.insert("gsp_zipf".into(), json!(info.gsp.zipf));
    if let Some(t) = &info.trace {
        o.insert(
            "dataset_path".into(),
            json!(t.path.as_ref().map(|p| p.display().to_string())),
        );
        o.insert("trace_block_tokens".into(), json!(t.block_tokens));
        o.insert("trace_time_compression".into(), json!(t.time_compression));
        o.insert("trace_start_ms".into(), json!(t.start_ms));
        o.insert("trace_output_scale".into(), json!(t.output_scale));
    }
    o.insert(
        "load_balance_method".into(),
        json!(info.load_balance_method),
    );
    o.insert("dp_size".into(), json!(info.dp_size));
    o.insert("simulated".into(), json!(!info.sim_profiles.is_empty()));
    o.insert("sim_profiles".into(), json!(info.sim_profiles));
    o.insert("model".into(), json!(info.model));
    o.insert("model_from".into(), json!(info.model_from));
    o.insert("vocab_size".into(), json!(info.vocab_size));
    o.insert("vocab_size_from".into(), json!(info.vocab_size_from));
}

/// What was measured: counts, throughputs, latency distributions, cache hits and goodput.
fn metric_keys(o: &mut Map<String, Value>, m: &BenchMetrics) {
    if let Some(d) = &m.details {
        o.insert("details".into(), json!(d));
    }
    o.insert("duration".into(), json!(m.duration));
    o.insert("completed".into(), json!(m.completed));
    o.insert("failed".into(), json!(m.failed));
    o.insert("total_input_tokens".into(), json!(m.total_input_tokens));
    o.insert("total_output_tokens".into(), json!(m.total_output_tokens));
    o.insert("request_throughput".into(), json!(m.request_throughput));
    o.insert("input_throughput".into(), json!(m.input_throughput));
    o.insert("output_throughput".into(), json!(m.output_throughput));
    o.insert("total_throughput".into(), json!(m.total_throughput));
    o.insert("concurrency".into(), json!(m.concurrency));
    dist_keys(o, "e2e_latency", &m.e2e);
    dist_keys(o, "ttft", &m.ttft);
    dist_keys(o, "tpot", &m.tpot);
    dist_keys(o, "itl", &m.itl);
    o.insert("cache_hit_rate".into(), json!(m.cache_hit_rate));
    o.insert("slo_ttft_ms".into(), json!(m.slo.ttft_ms));
    o.insert("slo_itl_ms".into(), json!(m.slo.itl_ms));
    o.insert("goodput".into(), json!(m.goodput));
    o.insert("goodput_share".into(), json!(m.goodput_share));
    o.insert("refused".into(), json!(m.refused));
    let c = m.ceilings.as_ref();
    o.insert(
        "cache_hit_ceiling_unlimited".into(),
        json!(c.map(|c| c.unlimited)),
    );
    o.insert(
        "cache_hit_ceiling_pooled_lru".into(),
        json!(c.and_then(|c| c.pooled_lru)),
    );
    o.insert(
        "cache_hit_ceiling_pooled_tokens".into(),
        json!(c.and_then(|c| c.pooled_tokens)),
    );
    o.insert(
        "cache_hit_ceiling_granularity".into(),
        json!(c.map(|c| c.granularity)),
    );
    o.insert(
        "prompt_load_max_over_mean".into(),
        json!(m.prompt_load_max_over_mean),
    );
}

/// Where requests went, per rank, then the notes, errors and the time of the run.
fn rank_keys(o: &mut Map<String, Value>, info: &RunInfo, m: &BenchMetrics) {
    // Unknown (no rank reported) is null, never an empty map that reads as "no requests".
    let known = |map: Map<String, Value>| {
        if map.is_empty() {
            Value::Null
        } else {
            Value::Object(map)
        }
    };
    let per_rank: Map<String, Value> = m
        .requests_per_rank
        .iter()
        .map(|(r, n)| (r.to_string(), json!(n)))
        .collect();
    o.insert("requests_per_rank".into(), known(per_rank));
    let share: Map<String, Value> = m
        .rank_share
        .iter()
        .map(|(r, s)| (r.to_string(), json!(s)))
        .collect();
    o.insert("rank_share".into(), known(share));
    let prompt_tokens: Map<String, Value> = m
        .prompt_tokens_per_rank
        .iter()
        .map(|(r, n)| (r.to_string(), json!(n)))
        .collect();
    o.insert("prompt_tokens_per_rank".into(), known(prompt_tokens));
    o.insert(
        "server_rank_cache_hit_rate".into(),
        json!(info.server_rank_cache_hit_rate),
    );
    o.insert("notes".into(), json!(info.notes));
    o.insert("errors".into(), json!(m.errors));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    o.insert("timestamp".into(), json!(now));
}

/// A rate in percent, or "unknown" when the server did not report it (not 0%).
pub(super) fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "unknown".to_string(), |r| format!("{:.1}%", r * 100.0))
}

/// The two ceilings, "37.0% / 21.5%" (the pool "?" when the capacity is unknown).
fn ceilings(m: &BenchMetrics) -> String {
    match &m.ceilings {
        None => "unknown".into(),
        Some(c) => format!(
            "{} / {}",
            pct(Some(c.unlimited)),
            c.pooled_lru.map_or("?".into(), |p| pct(Some(p)))
        ),
    }
}

fn shares(m: &BenchMetrics) -> String {
    if m.rank_share.is_empty() {
        return "unknown".to_string();
    }
    m.rank_share
        .iter()
        .map(|(r, s)| format!("r{r} {:.0}%", s * 100.0))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// bench_serving's end-of-run table.
pub fn result_table(info: &RunInfo, m: &BenchMetrics) -> String {
    let mut rows = summary_rows(info, m);
    for (title, name, d) in [
        ("End-to-End Latency", "E2E Latency", &m.e2e),
        ("Time to First Token", "TTFT", &m.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", &m.tpot),
        ("Inter-Token Latency", "ITL", &m.itl),
    ] {
        rows.push((format!("-- {title} --"), String::new()));
        rows.push((format!("Mean {name} (ms)"), format!("{:.2}", d.mean)));
        rows.push((format!("Median {name} (ms)"), format!("{:.2}", d.median)));
        rows.push((format!("P90 {name} (ms)"), format!("{:.2}", d.p90)));
        rows.push((format!("P99 {name} (ms)"), format!("{:.2}", d.p99)));
    }
    let width = 56;
    let mut s = format!("{:=^width$}\n", " Serving Benchmark Result ");
    if !info.sim_profiles.is_empty() {
        s.push_str(&format!(
            "{:^width$}\n",
            format!("SIMULATED ranks ({})", info.sim_profiles.join(", "))
        ));
    }
    for (k, v) in rows {
        if v.is_empty() {
            s.push_str(&format!(
                "{:-^width$}\n",
                format!(" {} ", k.trim_matches(|c| c == '-' || c == ' '))
            ));
        } else {
            s.push_str(&format!("{k:<44}{v:>12}\n"));
        }
    }
    s.push_str(&"=".repeat(width));
    s.push('\n');
    for note in &info.notes {
        s.push_str(&format!("note: {note}\n"));
    }
    for e in &m.errors {
        s.push_str(&format!("error: {e}\n"));
    }
    s
}

/// The table's rows above the latency sections, in bench_serving's order.
fn summary_rows(info: &RunInfo, m: &BenchMetrics) -> Vec<(String, String)> {
    vec![
        ("Backend".into(), info.backend.clone()),
        (
            "Load-balance method".into(),
            info.load_balance_method
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        ),
        (
            "Traffic request rate".into(),
            if info.request_rate.is_finite() {
                format!("{}", info.request_rate)
            } else {
                "inf".into()
            },
        ),
        (
            "Max request concurrency".into(),
            info.max_concurrency
                .map_or("not set".into(), |c| c.to_string()),
        ),
        ("Successful requests".into(), m.completed.to_string()),
        ("Failed requests".into(), m.failed.to_string()),
        (
            "Benchmark duration (s)".into(),
            format!("{:.2}", m.duration),
        ),
        (
            "Total input tokens".into(),
            m.total_input_tokens.to_string(),
        ),
        (
            "Total generated tokens".into(),
            m.total_output_tokens.to_string(),
        ),
        (
            "Request throughput (req/s)".into(),
            format!("{:.2}", m.request_throughput),
        ),
        (
            "Input token throughput (tok/s)".into(),
            format!("{:.2}", m.input_throughput),
        ),
        (
            "Output token throughput (tok/s)".into(),
            format!("{:.2}", m.output_throughput),
        ),
        (
            "Total token throughput (tok/s)".into(),
            format!("{:.2}", m.total_throughput),
        ),
        ("Concurrency".into(), format!("{:.2}", m.concurrency)),
        ("Cache hit rate (server)".into(), pct(m.cache_hit_rate)),
        ("Hit ceiling: unlimited / pooled LRU".into(), ceilings(m)),
        ("Requests per rank".into(), shares(m)),
        (
            "Prompt tokens per rank, max/mean".into(),
            m.prompt_load_max_over_mean
                .map_or("unknown".into(), |x| format!("{x:.2}")),
        ),
        ("Refused (429/503)".into(), m.refused.to_string()),
        (
            format!(
                "Goodput (req/s, TTFT≤{}ms ITL≤{}ms)",
                m.slo.ttft_ms, m.slo.itl_ms
            ),
            format!("{:.2}", m.goodput),
        ),
        (
            "Goodput share of requests".into(),
            format!("{:.1}%", m.goodput_share * 100.0),
        ),
    ]
}

/// One method's outcome in a comparison: its metrics, or why it was skipped.
#[derive(Debug, Clone)]
pub struct MethodResult {
    pub method: String,
    pub result: Result<BenchMetrics, String>,
}

/// `x / base` as "1.23x", or "" when there is no baseline.
fn ratio(x: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}x", x / b),
        _ => String::new(),
    }
}

const COMPARE_HEADERS: [&str; 17] = [
    "method",
    "req/s",
    "out tok/s",
    "vs rr",
    "goodput req/s",
    "good %",
    "p50 TTFT ms",
    "p90 TTFT ms",
    "vs rr",
    "p99 TTFT ms",
    "p50 ITL ms",
    "p99 ITL ms",
    "p99 E2E ms",
    "cache hit",
    "ceiling",
    "load max/mean",
    "refused",
];

/// Rows of the comparison (one per method; skipped methods say why).
pub fn compare_rows(results: &[MethodResult]) -> Vec<Vec<String>> {
    let base = results
        .iter()
        .find(|r| r.method == BASELINE_METHOD)
        .and_then(|r| r.result.as_ref().ok());
    results
        .iter()
        .map(|r| match &r.result {
            Ok(m) => vec![
                r.method.clone(),
                format!("{:.2}", m.request_throughput),
                format!("{:.1}", m.output_throughput),
                ratio(m.output_throughput, base.map(|b| b.output_throughput)),
                format!("{:.2}", m.goodput),
                format!("{:.1}%", m.goodput_share * 100.0),
                format!("{:.0}", m.ttft.median),
                format!("{:.0}", m.ttft.p90),
                ratio(m.ttft.p90, base.map(|b| b.ttft.p90)),
                format!("{:.0}", m.ttft.p99),
                format!("{:.1}", m.itl.median),
                format!("{:.1}", m.itl.p99),
                format!("{:.0}", m.e2e.p99),
                pct(m.cache_hit_rate),
                ceilings(m),
                m.prompt_load_max_over_mean
                    .map_or("unknown".into(), |x| format!("{x:.2}")),
                m.refused.to_string(),
            ],
            Err(reason) => {
                let mut row = vec![r.method.clone(), format!("skipped: {reason}")];
                row.resize(COMPARE_HEADERS.len(), String::new());
                row
            }
        })
        .collect()
}

/// The comparison as an aligned terminal table.
pub fn compare_table(results: &[MethodResult]) -> String {
    let rows = compare_rows(results);
    let skipped = |row: &Vec<String>| row[1].starts_with("skipped");
    let mut widths: Vec<usize> = COMPARE_HEADERS.iter().map(|h| h.len()).collect();
    for row in rows.iter().filter(|r| !skipped(r)) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                s.push_str(&format!("{cell:<w$}"));
            } else {
                s.push_str(&format!("  {cell:>w$}"));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(COMPARE_HEADERS.iter().map(|s| s.to_string()).collect());
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for row in rows {
        if skipped(&row) {
            out.push_str(&format!("{:<w$}  {}\n", row[0], row[1], w = widths[0]));
        } else {
            out.push_str(&line(row));
            out.push('\n');
        }
    }
    out.push_str(
        "ratios: against round_robin (throughput: higher is better; p90 TTFT: lower is better); \
         ceiling: the workload's own hit rate with an unlimited cache (a bound) / through one \
         LRU pool of every rank's KV (a reference); load: prompt tokens per rank, max over mean\n",
    );
    out
}

/// The comparison as a Markdown table.
pub fn compare_markdown(results: &[MethodResult]) -> String {
    let mut out = format!("| {} |\n", COMPARE_HEADERS.join(" | "));
    out.push_str(&format!(
        "|{}\n",
        COMPARE_HEADERS
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { " --- |" } else { " ---: |" })
            .collect::<String>()
    ));
    for row in compare_rows(results) {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// `rows` under `headers` as an aligned terminal table (the first column left-aligned, the
/// others right-aligned).
pub fn aligned_table(headers: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, (cell, &w)) in cells.iter().zip(&widths).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            if i == 0 {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers);
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// `rows` under `headers` as a Markdown table (numbers right-aligned: every column but the
/// first).
pub fn markdown_table(headers: &[String], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n|", headers.join(" | "));
    for i in 0..headers.len() {
        out.push_str(if i == 0 { " --- |" } else { " ---: |" });
    }
    out.push('\n');
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// Appends `line` to the JSON-lines file `path` (made, with its folder, if missing).
pub fn append_jsonl(path: &Path, line: &Value) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn metrics(out_tps: f64, ttft: f64) -> BenchMetrics {
        BenchMetrics {
            completed: 4,
            duration: 2.0,
            request_throughput: 2.0,
            output_throughput: out_tps,
            ttft: Dist {
                mean: ttft,
                p90: ttft,
                p99: ttft * 2.0,
                ..Dist::default()
            },
            cache_hit_rate: Some(0.5),
            rank_share: BTreeMap::from([(0, 0.25), (1, 0.75)]),
            requests_per_rank: BTreeMap::from([(0, 1), (1, 3)]),
            ..BenchMetrics::default()
        }
    }

    fn info() -> RunInfo {
        RunInfo {
            backend: "generate".into(),
            trace: None,
            gsp: GspConfig {
                dataset: super::super::workload::Dataset::GeneratedSharedPrefix,
                num_groups: 2,
                prompts_per_group: 2,
                system_prompt_len: 10,
                question_len: 2,
                output_len: 3,
                range_ratio: 1.0,
                send_routing_key: false,
                zipf: None,
            },
            num_prompts: 4,
            request_rate: f64::INFINITY,
            max_concurrency: Some(2),
            seed: 1,
            load_balance_method: Some("round_robin".into()),
            dp_size: Some(2),
            server_rank_cache_hit_rate: Some(Map::new()),
            vocab_size: 1000,
            vocab_size_from: "/get_server_info".into(),
            model: Some("m".into()),
            model_from: "/get_server_info".into(),
            notes: Vec::new(),
            sim_profiles: Vec::new(),
        }
    }

    #[test]
    fn simulated_results_say_so() {
        let m = metrics(100.0, 50.0);
        let real = result_table(&info(), &m);
        assert!(!real.contains("SIMULATED"), "{real}");
        assert_eq!(result_json(&info(), &m)["simulated"], false);
        let sim = RunInfo {
            sim_profiles: vec!["h100-qwen3.5-122b-a10b-fp8".into()],
            ..info()
        };
        let t = result_table(&sim, &m);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .contains("SIMULATED ranks (h100-qwen3.5-122b-a10b-fp8)"),
            "{t}"
        );
        let v = result_json(&sim, &m);
        assert_eq!(v["simulated"], true);
        assert_eq!(v["sim_profiles"][0], "h100-qwen3.5-122b-a10b-fp8");
    }

    #[test]
    fn json_line_has_bench_serving_keys() {
        let v = result_json(&info(), &metrics(100.0, 50.0));
        for key in [
            "request_throughput",
            "input_throughput",
            "output_throughput",
            "total_throughput",
            "mean_ttft_ms",
            "median_ttft_ms",
            "p99_ttft_ms",
            "mean_tpot_ms",
            "p99_tpot_ms",
            "mean_itl_ms",
            "p95_itl_ms",
            "mean_e2e_latency_ms",
            "completed",
            "duration",
            "total_input_tokens",
            "total_output_tokens",
            "load_balance_method",
            "cache_hit_rate",
            "goodput",
            "goodput_share",
            "slo_ttft_ms",
            "slo_itl_ms",
            "refused",
            "p90_ttft_ms",
            "median_itl_ms",
            "p99_e2e_latency_ms",
            "cache_hit_ceiling_unlimited",
            "cache_hit_ceiling_pooled_lru",
            "prompt_load_max_over_mean",
            "prompt_tokens_per_rank",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(
            v.get("trace_block_tokens").is_none(),
            "no trace, no trace keys"
        );
        let traced = RunInfo {
            trace: Some(TraceConfig {
                block_tokens: 16,
                ..TraceConfig::default()
            }),
            ..info()
        };
        assert_eq!(
            result_json(&traced, &metrics(1.0, 1.0))["trace_block_tokens"],
            16
        );
        assert_eq!(v["request_rate"], "inf");
        assert_eq!(v["mean_ttft_ms"], 50.0);
        assert_eq!(v["rank_share"]["1"], 0.75);
        assert_eq!(v["requests_per_rank"]["0"], 1);
        // One line when serialised.
        assert!(!v.to_string().contains('\n'));
    }

    #[test]
    fn table_names_the_metrics() {
        let t = result_table(&info(), &metrics(100.0, 50.0));
        for needle in [
            "Successful requests",
            "Mean TTFT (ms)",
            "P99 TPOT (ms)",
            "Median ITL (ms)",
            "50.0%",
            "r1 75%",
        ] {
            assert!(t.contains(needle), "{needle} in\n{t}");
        }
    }

    #[test]
    fn server_numbers_it_did_not_report_are_unknown_not_zero() {
        // A server that is not dpserve: no /get_server_info, no cached_tokens, no dp_rank.
        let m = BenchMetrics {
            cache_hit_rate: None,
            rank_share: BTreeMap::new(),
            requests_per_rank: BTreeMap::new(),
            ..metrics(100.0, 50.0)
        };
        let info = RunInfo {
            load_balance_method: None,
            dp_size: None,
            server_rank_cache_hit_rate: None,
            notes: vec!["GET /get_server_info: HTTP 404 Not Found".into()],
            ..info()
        };
        let t = result_table(&info, &m);
        for row in [
            "Load-balance method",
            "Cache hit rate (server)",
            "Requests per rank",
        ] {
            let line = t.lines().find(|l| l.starts_with(row)).unwrap();
            assert!(line.ends_with("unknown"), "{line}");
        }
        assert!(t.contains("note: GET /get_server_info: HTTP 404"), "{t}");
        let v = result_json(&info, &m);
        for key in [
            "cache_hit_rate",
            "requests_per_rank",
            "rank_share",
            "server_rank_cache_hit_rate",
            "load_balance_method",
        ] {
            assert!(v[key].is_null(), "{key} in {v}");
        }
        assert_eq!(v["notes"][0], "GET /get_server_info: HTTP 404 Not Found");
    }

    #[test]
    fn comparison_ratios_against_round_robin_and_skips() {
        let results = vec![
            MethodResult {
                method: "round_robin".into(),
                result: Ok(metrics(100.0, 200.0)),
            },
            MethodResult {
                method: "prefix_affinity".into(),
                result: Ok(metrics(150.0, 50.0)),
            },
            MethodResult {
                method: "bogus".into(),
                result: Err("up exited: unknown method".into()),
            },
        ];
        let rows = compare_rows(&results);
        assert_eq!(rows[0][3], "1.00x");
        assert_eq!(rows[1][3], "1.50x");
        assert_eq!(rows[1][8], "0.25x", "p90 TTFT against round robin");
        assert!(rows[2][1].starts_with("skipped: up exited"));
        let table = compare_table(&results);
        assert!(
            table.contains("prefix_affinity") && table.contains("skipped"),
            "{table}"
        );
        let md = compare_markdown(&results);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[1].starts_with("| --- |"));
        assert!(lines.iter().all(|l| l.starts_with('|') && l.ends_with('|')));
        assert_eq!(lines[0].matches('|').count(), lines[3].matches('|').count());
    }

    #[test]
    fn no_baseline_no_ratio() {
        let results = vec![MethodResult {
            method: "total_tokens".into(),
            result: Ok(metrics(1.0, 1.0)),
        }];
        assert_eq!(compare_rows(&results)[0][3], "");
    }
}
