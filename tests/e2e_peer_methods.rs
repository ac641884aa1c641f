//! End to end: the peers' routing rules (`vllm_dp`, `smg_cache_aware`, `dynamo_kv`,
//! `llmd_prefix`) serve through `dpserve up`, route as their rules say on a real deployment,
//! and trace each decision with every rank's terms.

use crate::common;

use common::Server;
use serde_json::{json, Value};

fn generate(server: &Server, ids: &[u32], rank: Option<u32>) -> Value {
    let mut body = json!({"input_ids": ids,
                          "sampling_params": {"max_new_tokens": 2, "temperature": 0}});
    if let Some(r) = rank {
        body["routed_dp_rank"] = json!(r);
    }
    let (status, out) = server.post("/generate", &body);
    assert_eq!(status, 200, "{out}");
    // The rank's status (finished rid, KV events) follows its last token; let it land, so
    // the next decision sees the rank idle and its cache as it is.
    std::thread::sleep(std::time::Duration::from_millis(300));
    out
}

/// A prompt of a 300-token prefix shared by every tail `t`, and a 20-token tail.
fn prompt(t: u32) -> Vec<u32> {
    let prefix = (0..300u32).map(|i| 3 + (i * 7919) % 8000);
    let tail = (0..20u32).map(|i| 3 + (i * 31 + t * 977 + 5000) % 8000);
    prefix.chain(tail).collect()
}

fn up(method: &str, trace: &std::path::Path) -> Server {
    Server::tiny(&[
        "--load-balance-method",
        method,
        "--trace-file",
        trace.to_str().unwrap(),
    ])
}

fn records(trace: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn each_peer_rule_routes_as_documented_and_traces_every_ranks_terms() {
    // (method, the branch of its unforced decisions, whether it reads the KV index).
    let cases = [
        ("vllm_dp", "least_loaded", false),
        ("smg_cache_aware", "matched", false),
        ("dynamo_kv", "lowest_cost", true),
        ("llmd_prefix", "max_score", true),
    ];
    for (method, branch, kv_events) in cases {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("route.jsonl");
        let server = up(method, &trace);
        // KV-event rules learn the cache wherever it is: put the prefix on rank 1 by hand.
        // The others start from their own rule (idle ranks: rank 0).
        let warm = generate(&server, &prompt(0), kv_events.then_some(1));
        let holder = warm["meta_info"]["dp_rank"].clone();
        assert_eq!(holder, json!(if kv_events { 1 } else { 0 }), "{method}");
        for t in 1..=3 {
            let out = generate(&server, &prompt(t), None);
            let meta = &out["meta_info"];
            assert_eq!(meta["dp_rank"], holder, "{method} tail {t}: {out}");
            let cached = meta["cached_tokens"].as_u64().unwrap();
            assert!(cached >= 288, "{method} tail {t}: cached_tokens {cached}");
        }
        let recs = records(&trace);
        let unforced: Vec<&Value> = recs.iter().filter(|r| r["branch"] == branch).collect();
        assert!(unforced.len() >= 3, "{method}: {recs:?}");
        for r in unforced {
            assert_eq!(r["method"], method);
            let scores = r["scores"].as_array().expect("scores");
            assert_eq!(scores.len(), 2, "{r}");
            assert!(scores.iter().all(|s| s["rule"] == method), "{r}");
        }
    }
}

#[test]
fn a_method_that_records_its_terms_as_data_serves_and_traces_them() {
    // SMG's power_of_two: two ranks drawn, the one with fewer active requests; its records
    // carry each drawn rank's terms as named numbers (`RankScore::Terms`).
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("route.jsonl");
    let server = up("smg_power_of_two", &trace);
    for t in 0..4 {
        let out = generate(&server, &prompt(t), None);
        assert!(out["meta_info"]["dp_rank"].as_u64().unwrap() < 2, "{out}");
    }
    let recs = records(&trace);
    assert_eq!(recs.len(), 4, "{recs:?}");
    for r in &recs {
        assert_eq!(
            (&r["method"], &r["branch"]),
            (&json!("smg_power_of_two"), &json!("least_loaded"))
        );
        let scores = r["scores"].as_array().expect("scores");
        assert_eq!(scores.len(), 2, "{r}");
        for s in scores {
            assert_eq!(s["rule"], "smg_power_of_two", "{r}");
            assert_eq!(s["terms"][1][0], "active_requests", "{r}");
            assert_eq!(s["terms"][1][1], s["cost"], "{r}");
        }
    }
}
