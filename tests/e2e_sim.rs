//! End to end: `dpserve up --device sim --dp-size 8` (real processes: tokenizer, controller and
//! eight simulated GPU ranks) serves requests with exactly the tokens asked for, routes a shared
//! prefix to the rank that cached it, labels itself simulated in `/get_server_info`, and gives
//! every KV slot back.

use crate::common;

use std::time::{Duration, Instant};

use common::Server;
use serde_json::{json, Value};

const PROFILE: &str = "h100-qwen3.5-122b-a10b-fp8";

/// A 300-token system prompt of group `g` and a 12-token question `q`.
fn prompt(g: u32, q: u32) -> Vec<u32> {
    let system = (0..300u32).map(|i| 3 + (i * 7919 + g * 104_729) % 8000);
    let question = (0..12u32).map(|i| 3 + (i * 31 + q * 977 + 5000) % 8000);
    system.chain(question).collect()
}

fn body(ids: &[u32], max_new_tokens: u32, routing_key: Option<&str>) -> Value {
    // EOS is not ignored: a simulated rank never emits it, so the length must hold anyway.
    let mut b = json!({"input_ids": ids,
                       "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.7}});
    if let Some(key) = routing_key {
        b["routing_key"] = json!(key);
    }
    b
}

/// Polls `/get_server_info` until `ok` holds for it (the status of every rank arrives within
/// a second of it going idle); panics with the last answer after 20 s.
fn wait_info(server: &Server, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, info) = server.get("/get_server_info");
        if status == 200 && ok(&info) {
            return info;
        }
        assert!(Instant::now() < deadline, "{what}: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends every `(body, tokens)` at once; each must end with exactly its `tokens` (finish reason
/// `length`). Returns the ranks that served them.
fn generate_exactly(
    server: &Server,
    requests: impl Iterator<Item = (Value, u64)>,
) -> std::collections::BTreeSet<u64> {
    let (bodies, want): (Vec<Value>, Vec<u64>) = requests.unzip();
    let mut used_ranks = std::collections::BTreeSet::new();
    for (reply, want) in server
        .post_concurrently("/generate", bodies)
        .into_iter()
        .zip(want)
    {
        let reply = reply.join().unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        let meta = &reply.body["meta_info"];
        assert_eq!(meta["completion_tokens"], want, "{}", reply.body);
        assert_eq!(
            reply.body["output_ids"].as_array().unwrap().len() as u64,
            want
        );
        assert_eq!(meta["finish_reason"]["type"], "length", "{}", reply.body);
        used_ranks.insert(meta["dp_rank"].as_u64().unwrap());
    }
    used_ranks
}

fn ranks(info: &Value) -> &Vec<Value> {
    info["ranks"].as_array().expect("ranks")
}

#[test]
fn eight_simulated_ranks_serve_cache_and_say_they_are_simulated() {
    let server = Server::up(&["--device", "sim", "--dp-size", "8"]);

    let info = wait_info(&server, "every rank reports a simulated status", |i| {
        ranks(i).len() == 8 && ranks(i).iter().all(|r| r["status"]["simulated"] == PROFILE)
    });
    assert_eq!(info["device"], "sim", "{info}");
    assert_eq!(info["simulated"], true);
    assert_eq!(info["sim_profiles"], json!([PROFILE]));
    assert_eq!(info["dp_size"], 8);

    // Requests of several groups at once: each ends with exactly its max_new_tokens.
    let used_ranks = generate_exactly(
        &server,
        (0..16).map(|i| (body(&prompt(10 + i, 0), 8 + i, None), 8 + i as u64)),
    );
    assert!(
        used_ranks.len() > 1,
        "one rank took everything: {used_ranks:?}"
    );

    // A shared system prompt under one routing key: one rank, from its radix cache after the
    // first question, and the same question twice gives the same pseudo-tokens.
    let ask = |q: u32| {
        let (status, out) = server.post("/generate", &body(&prompt(1, q), 24, Some("sys-1")));
        assert_eq!(status, 200, "{out}");
        out
    };
    let first = ask(0);
    assert_eq!(first["meta_info"]["cached_tokens"], 0, "{first}");
    let holder = &first["meta_info"]["dp_rank"];
    for q in 1..4 {
        let out = ask(q);
        assert_eq!(&out["meta_info"]["dp_rank"], holder, "{out}");
        let cached = out["meta_info"]["cached_tokens"].as_u64().unwrap();
        assert!(cached >= 300, "question {q}: cached_tokens {cached}");
        assert_eq!(out["meta_info"]["completion_tokens"], 24);
    }
    let again = ask(0);
    assert!(again["meta_info"]["cached_tokens"].as_u64().unwrap() >= 311);
    assert_eq!(
        again["output_ids"], first["output_ids"],
        "pseudo-tokens are deterministic"
    );

    // Idle again: on every rank each slot is free or evictable.
    wait_info(&server, "pools whole once idle", |i| {
        ranks(i).iter().all(|r| {
            let s = &r["status"];
            s["num_running_reqs"] == 0
                && s["num_used_tokens"] == 0
                && s["num_free_tokens"].as_u64().unwrap()
                    + s["num_evictable_tokens"].as_u64().unwrap()
                    == s["max_total_tokens"].as_u64().unwrap()
        })
    });
}

/// `dpserve bench --launch --preset sglang-8gpu`, cut to 32 short requests: it starts eight
/// simulated ranks per method, runs SGLang's prompt shapes on them and labels every result
/// simulated (terminal table, compare.json, compare.md).
#[test]
fn the_sglang_preset_runs_on_simulated_ranks_and_says_so() {
    let out = tempfile::Builder::new()
        .prefix("dpsim")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args(["bench", "--launch", "--preset", "sglang-8gpu"])
        .args(["--num-prompts", "32", "--gsp-output-len", "8"])
        .args(["--compare", "round_robin,prefix_affinity"])
        .args(["--disable-progress-bar", "--startup-timeout", "60"])
        .arg("--output-dir")
        .arg(out.path())
        .env("DPSERVE_LOG", "warn")
        .output()
        .expect("run dpserve bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "dpserve bench failed: {}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains(&format!("SIMULATED ranks ({PROFILE}")),
        "{stdout}"
    );
    let compare: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("compare.json")).expect("compare.json"),
    )
    .expect("compare.json is JSON");
    assert_eq!(compare["simulated"], true, "{compare}");
    assert_eq!(compare["server"]["dp_size"], 8);
    assert_eq!(compare["workload"]["gsp_system_prompt_len"], 4096);
    for m in compare["methods"].as_array().expect("methods") {
        assert_eq!(m["status"], "ok", "{m}");
        let r = &m["result"];
        assert_eq!(
            (&r["completed"], &r["failed"]),
            (&json!(32), &json!(0)),
            "{r}"
        );
        assert_eq!(r["simulated"], true);
        assert_eq!(r["sim_profiles"], json!([PROFILE]));
        assert_eq!(r["dp_size"], 8);
    }
    let md = std::fs::read_to_string(out.path().join("compare.md")).expect("compare.md");
    assert!(md.starts_with("SIMULATED ranks"), "{md}");
    assert!(md.contains(&format!("model simulated ({PROFILE})")), "{md}");
}

/// `--sim-lock-step` (DP attention's rounds): two ranks stepping through one shared state file
/// serve concurrent requests of different lengths to completion, each with exactly its tokens.
#[test]
fn lock_step_ranks_serve_every_request() {
    let server = Server::up(&["--device", "sim", "--dp-size", "2", "--sim-lock-step"]);
    wait_info(&server, "both ranks report", |i| ranks(i).len() == 2);
    let used_ranks = generate_exactly(
        &server,
        (0..8).map(|i| (body(&prompt(40 + i, i), 4 + 3 * i, None), 4 + 3 * i as u64)),
    );
    assert_eq!(used_ranks.len(), 2, "both ranks stepped: {used_ranks:?}");
}

/// A small Mooncake-format trace: `n` requests 250 ms apart, four conversations whose prompts
/// grow by a 512-token block a turn, 24 output tokens each.
fn small_trace(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let (conv, turn) = (i % 4, i / 4);
            let blocks: Vec<u64> = (0..=turn + 1).map(|b| conv * 1000 + b).collect();
            json!({"timestamp": i * 250, "input_length": blocks.len() * 512 - 100,
                   "output_length": 24, "hash_ids": blocks})
            .to_string()
        })
        .collect();
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write the trace");
    path
}

/// `dpserve bench --preset mooncake-8gpu` on a small trace at `--sim-speed speed`: the run's
/// compare.json and its terminal output.
fn trace_run(dir: &std::path::Path, trace: &std::path::Path, speed: &str) -> (Value, String) {
    let out = dir.join(format!("speed-{speed}"));
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args([
            "bench",
            "--launch",
            "--preset",
            "mooncake-8gpu",
            "--dataset-path",
        ])
        .arg(trace)
        .args([
            "--num-prompts",
            "24",
            "--compare",
            "cache_aware",
            "--sim-speed",
            speed,
        ])
        .args(["--disable-progress-bar", "--startup-timeout", "60"])
        .arg("--output-dir")
        .arg(&out)
        .env("DPSERVE_LOG", "warn")
        .output()
        .expect("run dpserve bench");
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(
        run.status.success(),
        "dpserve bench failed: {}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let compare = std::fs::read_to_string(out.join("compare.json")).expect("compare.json");
    (serde_json::from_str(&compare).expect("JSON"), stdout)
}

/// `--sim-speed`: the ranks run the modelled time faster and the bench multiplies what it
/// measures back, so a run at speed 3 reads the same times per output token as one in real
/// time (within what the host's unscaled time per step adds), not a third of them (the bench
/// not scaling) nor three times (the ranks not running faster); and it says so.
#[test]
fn a_faster_simulation_reads_in_modelled_time() {
    let dir = tempfile::Builder::new()
        .prefix("dpsimspeed")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let trace = small_trace(dir.path(), 24);
    let itl = |c: &Value| {
        let r = &c["methods"][0]["result"];
        assert_eq!(
            (&r["completed"], &r["failed"]),
            (&json!(24), &json!(0)),
            "{r}"
        );
        r["median_itl_ms"].as_f64().expect("median_itl_ms")
    };
    let (real, _) = trace_run(dir.path(), &trace, "1");
    let (fast, stdout) = trace_run(dir.path(), &trace, "3");
    let (real, fast) = (itl(&real), itl(&fast));
    assert!(
        (0.75 * real..1.5 * real).contains(&fast),
        "median ITL {fast} ms at speed 3 against {real} ms in real time"
    );
    assert!(stdout.contains("run 3x faster than modelled"), "{stdout}");
}
