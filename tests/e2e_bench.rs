//! End to end: `dpserve bench --launch` starts a cluster per method (the tiny built-in model),
//! runs a small shared-prefix workload on each, and writes the comparison. Checks the JSON
//! it writes (counts, keys, per-rank shares) and that an unknown method is skipped with its
//! reason instead of failing the comparison.

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
}
