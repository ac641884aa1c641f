//! End to end: `dpserve bench --launch` starts a cluster per method (the tiny built-in model),
//! runs a small shared-prefix workload on each, and writes the comparison. Checks the JSON
//! it writes (counts, keys, per-rank shares), the routing picture of each method, and that an
//! unknown method is skipped with its reason instead of failing the comparison.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_launch_compares_methods_and_writes_json() {
    let out = tempfile::Builder::new()
        .prefix("dpsb")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let jsonl = out.path().join("results.jsonl");
    let status = Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args([
            "bench",
            "--launch",
            "--compare",
            "round_robin,no_such_method,prefix_affinity",
            "--builtin-size",
            "tiny",
            "--dp-size",
            "2",
            "--max-total-tokens",
            "4096",
            "--gsp-num-groups",
            "2",
            "--gsp-prompts-per-group",
            "4",
            "--gsp-system-prompt-len",
            "64",
            "--gsp-question-len",
            "8",
            "--gsp-output-len",
            "4",
            "--gsp-send-routing-key",
            "--max-concurrency",
            "4",
            "--seed",
            "7",
            "--disable-progress-bar",
            "--startup-timeout",
            "60",
        ])
        .arg("--output-dir")
        .arg(out.path())
        .arg("--output-file")
        .arg(&jsonl)
        .env("DPSERVE_LOG", "warn")
        .status()
        .expect("run dpserve bench");
    assert!(status.success(), "dpserve bench failed: {status}");

    let compare: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("compare.json")).unwrap())
            .expect("compare.json is JSON");
    let methods = compare["methods"].as_array().expect("methods");
    assert_eq!(methods.len(), 3);

    let bogus = &methods[1];
    assert_eq!(bogus["method"], "no_such_method");
    assert_eq!(bogus["status"], "skipped");
    assert!(!bogus["reason"].as_str().unwrap_or("").is_empty());

    for m in [&methods[0], &methods[2]] {
        assert_eq!(m["status"], "ok", "{m}");
        let r = &m["result"];
        assert_eq!(r["load_balance_method"], m["method"]);
        assert_eq!(r["completed"], 8);
        assert_eq!(r["failed"], 0);
        assert_eq!(r["total_input_tokens"], 8 * 72);
        assert_eq!(
            r["total_output_tokens"],
            8 * 4,
            "ignore_eos makes output lengths exact"
        );
        for key in [
            "request_throughput",
            "output_throughput",
            "mean_ttft_ms",
            "p99_ttft_ms",
            "mean_tpot_ms",
            "mean_itl_ms",
        ] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
        }
        let hit = r["cache_hit_rate"].as_f64().expect("cache_hit_rate");
        assert!((0.0..=1.0).contains(&hit));
        let shares: f64 = r["rank_share"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(Value::as_f64)
            .sum();
        assert!((shares - 1.0).abs() < 1e-9, "rank shares sum to 1: {r}");
    }
    // round_robin alternates the two ranks.
    assert_eq!(methods[0]["result"]["requests_per_rank"]["0"], 4);

    let lines = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(
        lines.lines().count(),
        2,
        "one JSON line per method that ran"
    );
    for line in lines.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        assert!(v["mean_ttft_ms"].is_number());
    }
    let md = std::fs::read_to_string(out.path().join("compare.md")).unwrap();
    assert!(md.contains("| round_robin |") && md.contains("skipped"));
    let svg = std::fs::read_to_string(out.path().join("compare.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("prefix_affinity"));
    // Each method that ran has its routing picture beside the tables, drawn from its cluster's
    // routing trace: a band per rank, and every decision counted.
    for method in ["round_robin", "prefix_affinity"] {
        let svg = std::fs::read_to_string(out.path().join(format!("routing-{method}.svg")))
            .unwrap_or_else(|e| panic!("routing-{method}.svg: {e}"));
        assert!(
            svg.contains(&format!("routing over time: {method}")),
            "{svg}"
        );
        assert!(svg.contains("class=\"area\" data-rank=\"0\""), "{svg}");
        assert!(svg.contains("class=\"area\" data-rank=\"1\""), "{svg}");
        // The workload's 8 requests, plus whatever the bench sends to learn the server.
        let decisions: usize = svg
            .split(" routing decisions")
            .next()
            .and_then(|s| s.rsplit('>').next())
            .and_then(|n| n.parse().ok())
            .expect("a decision count");
        assert!(decisions >= 8, "{svg}");
    }
    assert!(!out.path().join("routing-no_such_method.svg").exists());
}

/// `dpserve bench --engine` as the README runs it, scaled down: every supported kernel path in
/// its own process, a table each, the comparison, and one JSON line per path.
#[test]
fn bench_engine_compares_every_kernel_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let jsonl = dir.path().join("engine.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args([
            "bench",
            "--engine",
            "--kernel-path",
            "all",
            "--builtin-size",
            "tiny",
            "--engine-prompt-lens",
            "40,70",
            "--engine-batches",
            "1,3",
            "--engine-decode-steps",
            "5",
            "--engine-reps",
            "1",
            "--num-threads",
            "2",
            "--output-file",
        ])
        .arg(&jsonl)
        .env_remove("DPSERVE_KERNEL_PATH")
        .output()
        .expect("run dpserve bench --engine");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&jsonl)
        .expect("results written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert!(!lines.is_empty());
    assert_eq!(
        lines[0]["kernel_path"], "portable",
        "portable first: the baseline"
    );
    for r in &lines {
        let path = r["kernel_path"].as_str().unwrap();
        assert!(
            stdout.contains(&format!("kernel path {path}, 2 threads")),
            "{stdout}"
        );
        let tests: Vec<&str> = r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["test"].as_str().unwrap())
            .collect();
        assert_eq!(tests, ["pp40", "pp70", "tg5 b1", "tg5 b3"], "{path}");
        for row in r["rows"].as_array().unwrap() {
            assert!(row["tokens_per_s"].as_f64().unwrap() > 0.0, "{path}: {row}");
        }
        assert!(r["fma_peak_gflops"].as_f64().unwrap() > 0.0);
        assert!(r["copy_gbps"].as_f64().unwrap() > 0.0);
    }
    // The comparison table: one column per path, the baseline at 1.00×.
    assert!(
        stdout.contains("| pp40 |") && stdout.contains("(1.00×)"),
        "{stdout}"
    );

    // A path this CPU cannot run is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args(["bench", "--engine", "--kernel-path", "sse9"])
        .output()
        .expect("run dpserve bench --engine");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a kernel path"));
}
