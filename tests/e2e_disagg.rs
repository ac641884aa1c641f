//! Prefill/decode disaggregation end to end: `dpserve up --prefill-dp-size 1 --decode-dp-size 1`
//! with real processes and the KV moving over a real socket. Greedy output equals a unified
//! worker's (streamed or not, prompts of several chunks, the prefix cache on the prefill side),
//! transfers wait in the decode worker's pre-allocation rows beyond its running cap, and a
//! prefill or decode worker killed mid-transfer fails each affected request once while the
//! survivor's pool comes back whole.

use crate::common;

use std::time::{Duration, Instant};

use common::{Reply, Server};
use serde_json::{json, Value};

/// Flags both deployments of a comparison share.
const SMALL_CHUNKS: &[&str] = &["--chunked-prefill-size", "16", "--max-total-tokens", "8192"];

fn pd(model: &[&str], extra: &[&str]) -> Server {
    let mut args = vec!["--prefill-dp-size", "1", "--decode-dp-size", "1"];
    args.extend_from_slice(model);
    args.extend_from_slice(extra);
    Server::up(&args)
}

fn unified(model: &[&str], extra: &[&str]) -> Server {
    let mut args = vec!["--dp-size", "1"];
    args.extend_from_slice(model);
    args.extend_from_slice(extra);
    Server::up(&args)
}

fn greedy(text: &str, max_new_tokens: u32) -> Value {
    json!({"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
}

/// Output ids of a request, and its `meta_info`.
fn generate(server: &Server, body: &Value) -> (Vec<u64>, Value) {
    let (status, resp) = server.post("/generate", body);
    assert_eq!(status, 200, "{resp}");
    (ids(&resp), resp["meta_info"].clone())
}

fn ids(resp: &Value) -> Vec<u64> {
    resp["output_ids"]
        .as_array()
        .expect("output_ids")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// The same request streamed: the ids its chunks carry (each all so far, as SGLang).
fn streamed(server: &Server, body: &Value) -> Vec<u64> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let chunks = server.stream("/generate", &body);
    common::generate::produced(&chunks, common::generate::Form::Cumulative).output_ids
}

/// A prompt of about `words` words.
fn long_text(words: usize) -> String {
    let story =
        "once upon a time there was a little girl named lily who loved to play in the park \
                 with her big red ball and her small brown dog";
    story
        .split(' ')
        .cycle()
        .take(words)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Per rank of `/get_server_info`: its status.
fn statuses(server: &Server) -> Vec<Value> {
    let (_, info) = server.get("/get_server_info");
    info["ranks"]
        .as_array()
        .map(|ranks| ranks.iter().map(|r| r["status"].clone()).collect())
        .unwrap_or_default()
}

fn status_of(server: &Server, mode: &str) -> Option<Value> {
    statuses(server)
        .into_iter()
        .find(|s| s["disagg"]["mode"] == mode)
}

/// Polls until `check` holds (or panics after `within`).
fn wait_for(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pool of the rank of `mode` is whole: nothing held, no transfer queued or under way,
/// no row beyond the running cap.
fn assert_whole(server: &Server, mode: &str) {
    wait_for(
        &format!("the {mode} pool to be whole"),
        Duration::from_secs(10),
        || {
            let Some(s) = status_of(server, mode) else {
                return false;
            };
            let free = s["num_free_tokens"].as_u64().unwrap_or(0)
                + s["num_evictable_tokens"].as_u64().unwrap_or(0);
            free == s["max_total_tokens"].as_u64().unwrap_or(u64::MAX)
                && s["num_used_tokens"] == 0
                && s["disagg"]["num_bootstrap_reqs"] == 0
                && s["disagg"]["num_transfer_reqs"] == 0
                && s["disagg"]["rows_beyond_running"] == 0
        },
    );
}

/// Greedy through 1P + 1D is the unified worker's, token for token.
fn same_output_as_unified(model: &[&str]) {
    let prompts = [
        "hello".to_string(),
        long_text(120), // several 16-token chunks
        long_text(40),
        format!("{} and then", long_text(40)), // its prefix is cached on the prefill side
    ];
    let extra = |prompts: &[String]| {
        [
            json!({"text": prompts[2], "return_logprob": true, "top_logprobs_num": 2,
                   "sampling_params": {"max_new_tokens": 6, "temperature": 0}}),
            json!({"text": prompts[1], "sampling_params": {"max_new_tokens": 8,
                   "temperature": 0.8, "top_p": 0.9, "seed": 42}}),
        ]
    };
    let (expected, unified_extra): (Vec<Vec<u64>>, Vec<Value>) = {
        let server = unified(model, SMALL_CHUNKS);
        let greedy_ids = prompts
            .iter()
            .map(|p| generate(&server, &greedy(p, 12)).0)
            .collect();
        let extra = extra(&prompts)
            .iter()
            .map(|ask| server.post("/generate", ask).1)
            .collect();
        (greedy_ids, extra)
    };
    let server = pd(model, SMALL_CHUNKS);
    for (prompt, want) in prompts.iter().zip(&expected) {
        let (got, meta) = generate(&server, &greedy(prompt, 12));
        assert_eq!(&got, want, "{prompt:?}");
        assert_eq!(meta["dp_rank"], 1, "the decode rank answers");
        assert_eq!(
            &streamed(&server, &greedy(prompt, 12)),
            want,
            "{prompt:?} streamed"
        );
    }
    // Log-probabilities (the first token's come from the prefill worker) and seeded sampling
    // (the decode worker continues the prefill worker's random stream) as a unified worker's.
    for (ask, want) in extra(&prompts).iter().zip(&unified_extra) {
        let (status, got) = server.post("/generate", ask);
        assert_eq!(status, 200, "{got}");
        assert_eq!(ids(&got), ids(want), "{ask}");
        for key in ["output_token_logprobs", "output_top_logprobs"] {
            assert_eq!(
                got["meta_info"][key], want["meta_info"][key],
                "{key} of {ask}"
            );
        }
    }
    // The same prompt again: its KV comes from the prefill worker's cache.
    let (_, meta) = generate(&server, &greedy(&prompts[1], 4));
    assert!(
        meta["cached_tokens"].as_u64().unwrap() > 0,
        "prefill-side prefix reuse: {meta}"
    );
    // Statuses reach /get_server_info within a second or so.
    wait_for(
        "the decode rank to report 9 transfers",
        Duration::from_secs(10),
        || {
            status_of(&server, "decode")
                .is_some_and(|s| s["disagg"]["transfers"].as_u64().unwrap_or(0) >= 9)
        },
    );
    let decode = status_of(&server, "decode").expect("a decode rank");
    assert_eq!(decode["disagg"]["frames_dropped"], 0, "{decode}");
    assert_eq!(decode["disagg"]["transfers_failed"], 0, "{decode}");
    assert_whole(&server, "decode");
    assert_whole(&server, "prefill");
}

#[test]
fn greedy_output_through_prefill_and_decode_workers_is_the_unified_one_builtin() {
    same_output_as_unified(&["--builtin-size", "tiny"]);
}

#[test]
fn greedy_output_through_prefill_and_decode_workers_is_the_unified_one_stories260k() {
    let Some(dir) = common::stories_dir() else {
        return;
    };
    same_output_as_unified(&["--model-path", dir.to_str().unwrap()]);
}

/// The bodies sent at once to `/generate`; their threads give (status, body).
fn concurrently(server: &Server, bodies: Vec<Value>) -> Vec<std::thread::JoinHandle<Reply>> {
    server.post_concurrently("/generate", bodies)
}

#[test]
fn transfers_wait_in_rows_beyond_the_decode_running_cap_and_all_finish() {
    // The base model, so prefill takes long enough to watch the decode side wait.
    let flags = [
        "--max-running-requests",
        "4",
        "--chunked-prefill-size",
        "128",
        "--max-total-tokens",
        "16384",
    ];
    let bodies: Vec<Value> = (0..12)
        .map(|i| greedy(&format!("{i} {}", long_text(300)), 6))
        .collect();
    let expected: Vec<Vec<u64>> = {
        let server = unified(&[], &flags);
        concurrently(&server, bodies.clone())
            .into_iter()
            .map(|h| ids(&h.join().unwrap().body))
            .collect()
    };
    let server = pd(&[], &flags);
    let handles = concurrently(&server, bodies);
    for (h, want) in handles.into_iter().zip(&expected) {
        let Reply {
            status, body: resp, ..
        } = h.join().unwrap();
        assert_eq!(status, 200, "{resp}");
        assert_eq!(&ids(&resp), want);
    }
    wait_for(
        "more request rows than --max-running-requests 4 in use while transfers waited",
        Duration::from_secs(10),
        || {
            // (and, once the statuses after the last request are in, all 12 transfers)
            status_of(&server, "decode").is_some_and(|s| {
                let d = &s["disagg"];
                d["peak_rows_beyond_running"].as_u64().unwrap_or(0) > 0
                    && d["transfers"].as_u64().unwrap_or(0) >= 12
            })
        },
    );
    // The same in /metrics, per rank.
    let value = |series: &str| server.metric(series);
    assert!(value("dpserve:peak_rows_beyond_running{dp_rank=\"1\"}") > 0.0);
    assert!(value("dpserve:kv_transfers_total{dp_rank=\"1\"}") >= 12.0);
    assert!(value("dpserve:kv_transfer_bytes_total{dp_rank=\"0\"}") > 0.0);
    assert_eq!(
        value("dpserve:kv_transfers_failed_total{dp_rank=\"1\"}"),
        0.0
    );
    assert_whole(&server, "decode");
    assert_whole(&server, "prefill");
}

/// The pid of the deployment's worker of `mode`.
fn worker_pid(server: &Server, mode: &str) -> u32 {
    let pattern = format!(
        "{}.*--disaggregation-mode {mode}",
        server.runtime_dir.path().display()
    );
    let out = std::process::Command::new("pgrep")
        .args(["-f", &pattern])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {mode} worker"))
}

/// Kills the worker of `mode` with SIGKILL while a long prompt's KV is on its way: the request
/// gets one error, soon, and the other worker's pool comes back whole.
fn kill_mid_transfer(victim: &str, survivor: &str) {
    let server = pd(
        &[],
        &["--chunked-prefill-size", "64", "--worker-timeout", "1"],
    );
    // Warm: the pair works.
    generate(&server, &greedy("hello", 2));
    let mut handles = concurrently(&server, vec![greedy(&long_text(1500), 8)]);
    wait_for("the transfer to start", Duration::from_secs(30), || {
        status_of(&server, "decode")
            .is_some_and(|s| s["disagg"]["num_transfer_reqs"].as_u64().unwrap_or(0) > 0)
    });
    let killed = Instant::now();
    let pid = worker_pid(&server, victim);
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    let Reply {
        status, body: resp, ..
    } = handles.pop().unwrap().join().unwrap();
    assert!(
        status == 503 || status == 500,
        "one error for the request ({status}): {resp}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the error came {:?} after the kill",
        killed.elapsed()
    );
    assert_whole(&server, survivor);
}

#[test]
fn a_prefill_worker_killed_mid_transfer_fails_the_request_and_frees_the_decode_side() {
    kill_mid_transfer("prefill", "decode");
}

#[test]
fn a_decode_worker_killed_mid_transfer_fails_the_request_and_frees_the_prefill_side() {
    kill_mid_transfer("decode", "prefill");
}

#[test]
fn the_trace_of_a_request_shows_both_legs_and_the_transfer() {
    let traces = tempfile::tempdir().unwrap();
    let dir = traces.path().to_str().unwrap().to_string();
    let server = pd(
        &["--builtin-size", "tiny"],
        &["--chunked-prefill-size", "16", "--trace-dir", &dir],
    );
    let mut body = greedy(&long_text(30), 4);
    body["rid"] = json!("pd-traced");
    body["return_routing"] = json!(true);
    let (_, meta) = generate(&server, &body);
    // The client's copy of both decisions: the prefill leg's, with the decode leg's inside.
    let routing = &meta["routing"];
    assert_eq!(
        (&routing["leg"], &routing["rank"]),
        (&json!("prefill"), &json!(0)),
        "{meta}"
    );
    assert_eq!(
        (&routing["decode"]["leg"], &routing["decode"]["rank"]),
        (&json!("decode"), &json!(1)),
        "{meta}"
    );
    let svg = traces.path().join("pd.svg");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args(["trace", &dir, "--rid", "pd-traced", "--svg"])
        .arg(&svg)
        .output()
        .expect("dpserve trace");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    let has = |actor: &str, what: &str| lines.iter().any(|l| l.contains(actor) && l.contains(what));
    assert!(has("controller", "leg=prefill rank=0"), "{text}");
    assert!(has("controller", "leg=decode rank=1"), "{text}");
    assert!(has("worker[1]", "kv_ready"), "{text}");
    assert!(has("worker[0]", "prefill_chunk"), "{text}");
    assert!(has("worker[0]", "kv_sent"), "{text}");
    assert!(has("worker[1]", "kv_received"), "{text}");
    assert!(has("worker[1]", "first_token"), "{text}");
    let picture = std::fs::read_to_string(&svg).expect("the picture");
    assert!(
        picture.contains("KV received"),
        "the transfer is in the picture"
    );
}

#[test]
fn abort_request_mid_transfer_ends_both_legs_and_frees_both_pools() {
    let server = pd(&[], &["--chunked-prefill-size", "64"]);
    let mut body = greedy(&long_text(1500), 8);
    body["rid"] = json!("pd-aborted");
    let handle = concurrently(&server, vec![body]).pop().unwrap();
    wait_for("the transfer to start", Duration::from_secs(30), || {
        status_of(&server, "decode")
            .is_some_and(|s| s["disagg"]["num_transfer_reqs"].as_u64().unwrap_or(0) > 0)
    });
    let (status, resp) = server.post("/abort_request", &json!({"rid": "pd-aborted"}));
    assert_eq!(status, 200, "{resp}");
    let resp = handle.join().unwrap().body;
    assert_eq!(
        resp["meta_info"]["finish_reason"]["type"], "abort",
        "the request ends as aborted: {resp}"
    );
    assert_whole(&server, "decode");
    assert_whole(&server, "prefill");
    // Both workers still serve.
    generate(&server, &greedy("hello", 2));
}

#[test]
fn clients_sharing_a_bootstrap_room_each_get_their_own_answer() {
    // Before transfer rooms were the controller's own, a client's `bootstrap_room` named the
    // transfer: two clients giving the same one at once crossed answers (one timed out, the
    // other got the first one's continuation), and an `n: 2` request with a room timed out and
    // left slots held. Now the room only steers `follow_bootstrap_room`.
    let server = pd(&[], &["--max-total-tokens", "16384"]);
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("{i} {}", long_text(200 + 10 * i)))
        .collect();
    // Each prompt alone first: the answer each client must get.
    let expected: Vec<Vec<u64>> = prompts
        .iter()
        .map(|p| generate(&server, &greedy(p, 8)).0)
        .collect();
    let shared = |p: &String| {
        let mut body = greedy(p, 8);
        body["bootstrap_room"] = json!(7);
        body
    };
    for round in 0..2 {
        let handles = concurrently(&server, prompts.iter().map(shared).collect());
        for (i, (h, want)) in handles.into_iter().zip(&expected).enumerate() {
            let Reply { status, body, .. } = h.join().unwrap();
            assert_eq!(status, 200, "round {round}, client {i}: {body}");
            assert_eq!(
                &ids(&body),
                want,
                "round {round}, client {i}: its own answer"
            );
        }
    }
    // One request of two choices, both under the client's room.
    let (status, resp) = server.post(
        "/v1/completions",
        &json!({"prompt": long_text(120), "max_tokens": 6, "n": 2, "temperature": 0.7,
                "seed": 3, "bootstrap_room": 7}),
    );
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["choices"].as_array().map(Vec::len), Some(2), "{resp}");
    assert_whole(&server, "decode");
    assert_whole(&server, "prefill");
    for s in statuses(&server) {
        assert!(s.get("invariant_violations").is_none(), "ledger: {s}");
        assert_eq!(s["disagg"]["transfers_failed"], 0, "{s}");
    }
}
