//! End to end: `--load-balance-method cache_aware` routes by what the workers' radix caches
//! report (KV events), without a routing key and for prefixes far shorter than
//! prefix_affinity's 4096-token hash window.

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
    out
}

/// A prompt of `prefix` (300 tokens of group `g`) and a 20-token tail `t`.
fn prompt(g: u32, t: u32) -> Vec<u32> {
    let prefix = (0..300u32).map(|i| 3 + (i * 7919 + g * 104_729) % 8000);
    let tail = (0..20u32).map(|i| 3 + (i * 31 + t * 977 + 5000) % 8000);
    prefix.chain(tail).collect()
}

#[test]
fn prompts_sharing_a_short_prefix_follow_the_rank_that_cached_it() {
    let runtime = tempfile::tempdir().unwrap();
    let trace = runtime.path().join("route.jsonl");
    let trace_arg = trace.to_str().unwrap();
    let server = Server::tiny(&[
        "--load-balance-method",
        "cache_aware",
        "--trace-file",
        trace_arg,
    ]);
    // Group 0 warms whichever rank the cold path picks; group 1 is put on each rank in turn
    // by hand, so at least one group sits where the first-block hash alone would not send it.
    let first = generate(&server, &prompt(0, 0), None);
    let holder0 = first["meta_info"]["dp_rank"].as_u64().unwrap();
    for forced in [0u64, 1] {
        let group = 1 + forced as u32;
        generate(&server, &prompt(group, 0), Some(forced as u32));
        // The events leave with the worker's status as it goes idle; give them a moment.
        std::thread::sleep(std::time::Duration::from_millis(300));
        for t in 1..=3 {
            let out = generate(&server, &prompt(group, t), None);
            let meta = &out["meta_info"];
            assert_eq!(
                meta["dp_rank"],
                json!(forced),
                "group {group} tail {t}: {out}"
            );
            let cached = meta["cached_tokens"].as_u64().unwrap();
            assert!(
                cached >= 288,
                "group {group} tail {t}: cached_tokens {cached}"
            );
        }
    }
    for t in 1..=3 {
        let out = generate(&server, &prompt(0, t), None);
        assert_eq!(out["meta_info"]["dp_rank"], json!(holder0), "{out}");
        assert!(out["meta_info"]["cached_tokens"].as_u64().unwrap() >= 288);
    }

    // The routing trace says why: the holder was the cheapest, with its cached prefix.
    let records: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cached: Vec<&Value> = records.iter().filter(|r| r["branch"] == "cached").collect();
    assert_eq!(cached.len(), 9, "{records:?}");
    for r in cached {
        let best = &r["costs"][0];
        assert_eq!(best["rank"], r["rank"]);
        assert!(best["matched_tokens"].as_u64().unwrap() >= 288, "{r}");
    }
}
