//! Many requests at once against small KV pools, over HTTP with real processes: 64 concurrent
//! `/generate` requests (streaming and not, shared prefixes, greedy) on 2 ranks whose pools are
//! far too small for what they run, so the cache evicts and decode retracts. Every request must
//! end with exactly one final response carrying the same tokens as when it ran alone, and the
//! ranks must end idle with every KV slot free or evictable. Also `/flush_cache`: refused while
//! a request runs (at once, or when its `timeout` is up), and then, with a `timeout` that waits
//! out the ranks' lagging status, empties every rank's cache at the first try.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{json, Value};

const RANKS: u64 = 2;
const MAX_RUNNING: usize = 8;
/// KV slots per rank: each request needs at most ~100, but 8 running need ~700.
const POOL: u64 = 320;
const REQUESTS: usize = 64;
const GROUPS: usize = 4;
const PREFIX_LEN: usize = 24;

/// One request of the workload.
#[derive(Clone, Debug)]
struct Case {
    input_ids: Vec<u32>,
    max_new_tokens: usize,
    ignore_eos: bool,
    stream: bool,
}

impl Case {
    fn body(&self, rid: &str) -> Value {
        json!({
            "rid": rid,
            "input_ids": self.input_ids,
            "stream": self.stream,
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": self.max_new_tokens,
                "ignore_eos": self.ignore_eos,
            },
        })
    }
}

/// 64 prompts in 4 groups sharing a 24-token prefix, each with its own 4–12 token suffix;
/// 12 to 60 new tokens; every other one ignores EOS, every third streams.
fn workload() -> Vec<Case> {
    // Token ids of the built-in vocabulary (8192), past the special ids.
    let token = |x: usize| 3 + (x % 8000) as u32;
    (0..REQUESTS)
        .map(|i| {
            let group = i % GROUPS;
            let mut input_ids: Vec<u32> = (0..PREFIX_LEN)
                .map(|j| token(group * 1009 + j * 37))
                .collect();
            input_ids.extend((0..4 + i % 9).map(|j| token(i * 7919 + j * 131 + 5)));
            Case {
                input_ids,
                max_new_tokens: [12, 28, 44, 60][(i / GROUPS) % 4],
                ignore_eos: i % 2 == 0,
                stream: i % 3 == 0,
            }
        })
        .collect()
}

/// What one request got back.
#[derive(Debug)]
struct Outcome {
    output_ids: Vec<u64>,
    /// The last response's `meta_info`.
    meta: Value,
}

/// Send one request; panics unless it ends with exactly one final response.
fn send(client: &reqwest::blocking::Client, url: &str, case: &Case, rid: &str) -> Outcome {
    let resp = client
        .post(url)
        .json(&case.body(rid))
        .send()
        .unwrap_or_else(|e| panic!("{rid}: {e}"));
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_else(|e| panic!("{rid}: body: {e}"));
    assert_eq!(status, 200, "{rid}: {text}");
    if !case.stream {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{rid}: {e}"));
        let output_ids = ids(&v["output_ids"]);
        return Outcome {
            output_ids,
            meta: v["meta_info"].clone(),
        };
    }
    // SSE: chunks of every id so far (as SGLang); exactly one carries a finish reason and it is
    // the last; then one [DONE] and nothing after it.
    let mut chunks = Vec::new();
    let mut finals = 0;
    let mut meta = Value::Null;
    let mut done = 0;
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        assert_eq!(done, 0, "{rid}: data after [DONE]: {text}");
        if data == "[DONE]" {
            done += 1;
            continue;
        }
        assert_eq!(finals, 0, "{rid}: a chunk after the final one: {text}");
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{rid}: {e}"));
        assert!(chunk.get("error").is_none(), "{rid}: {chunk}");
        if !chunk["meta_info"]["finish_reason"].is_null() {
            finals += 1;
        }
        meta = chunk["meta_info"].clone();
        chunks.push(chunk);
    }
    assert_eq!(finals, 1, "{rid}: final chunks: {text}");
    assert_eq!(done, 1, "{rid}: no [DONE]: {text}");
    let output_ids =
        common::generate::produced(&chunks, common::generate::Form::Cumulative).output_ids;
    Outcome { output_ids, meta }
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// Poll `/get_server_info` until `settled` holds for it, or fail with the last one seen.
fn wait_info(server: &Server, what: &str, settled: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, info) = server.get("/get_server_info");
        if status == 200 && settled(&info) {
            return info;
        }
        assert!(Instant::now() < deadline, "{what}: {info:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each live rank's last status.
fn rank_statuses(info: &Value) -> Vec<Value> {
    info["ranks"]
        .as_array()
        .map(|ranks| ranks.iter().map(|r| r["status"].clone()).collect())
        .unwrap_or_default()
}

/// Both ranks idle (nothing in flight, running or queued) with every slot free or evictable.
fn idle_and_whole(info: &Value) -> bool {
    let statuses = rank_statuses(info);
    info["requests_in_flight"] == 0
        && statuses.len() == RANKS as usize
        && statuses.iter().all(|s| {
            let n = |k: &str| s[k].as_u64().unwrap_or(u64::MAX);
            n("num_running_reqs") == 0
                && n("num_waiting_reqs") == 0
                && n("num_free_tokens").saturating_add(n("num_evictable_tokens"))
                    == n("max_total_tokens")
        })
}

/// `(rid, event)` of every event line in the workers' message traces, in each file's order.
fn worker_events(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut events = Vec::new();
    for rank in 0..RANKS {
        let path = dir.join(format!("worker-{rank}.jsonl"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("trace line");
            if let (Some("event"), Some(kind), Some(rid)) =
                (v["dir"].as_str(), v["type"].as_str(), v["rid"].as_str())
            {
                events.push((rid.to_string(), kind.to_string()));
            }
        }
    }
    events
}

#[test]
fn sixty_four_concurrent_requests_on_small_pools_all_end_once_with_their_alone_tokens() {
    let traces = tempfile::tempdir().expect("temp dir");
    let trace_dir = traces.path().display().to_string();
    let pool = POOL.to_string();
    let running = MAX_RUNNING.to_string();
    let mut server = Server::up(&[
        "--builtin-size",
        "tiny",
        "--dp-size",
        "2",
        "--max-running-requests",
        &running,
        "--max-total-tokens",
        &pool,
        "--trace-dir",
        &trace_dir,
    ]);
    let (_, info) = server.get("/get_server_info");
    for rank in info["ranks"].as_array().expect("ranks") {
        assert_eq!(
            rank["capacity"]["max_total_tokens"], POOL,
            "an explicit --max-total-tokens wins: {rank}"
        );
    }
    let cases = workload();
    let url = server.url("/generate");
    let client = Server::client();

    // Alone: one at a time, so nothing is batched and the pool is never short mid-request.
    let alone: Vec<Outcome> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| send(&client, &url, case, &format!("alone-{i}")))
        .collect();

    // The burst: all 64 released at once.
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let handles: Vec<_> = cases
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, case)| {
            let (client, url, barrier) = (client.clone(), url.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                send(&client, &url, &case, &format!("burst-{i}"))
            })
        })
        .collect();
    let burst: Vec<Outcome> = handles
        .into_iter()
        .map(|h| h.join().expect("request thread"))
        .collect();

    let mut ranks = BTreeSet::new();
    let mut cached = 0;
    for (i, ((case, a), b)) in cases.iter().zip(&alone).zip(&burst).enumerate() {
        for (what, o) in [("alone", a), ("burst", b)] {
            assert_eq!(
                o.meta["completion_tokens"].as_u64(),
                Some(o.output_ids.len() as u64),
                "{what}-{i}: {:?}",
                o.meta
            );
            assert_eq!(
                o.meta["prompt_tokens"].as_u64(),
                Some(case.input_ids.len() as u64),
                "{what}-{i}"
            );
            let reason = o.meta["finish_reason"]["type"].as_str().unwrap_or_default();
            if case.ignore_eos {
                assert_eq!(o.output_ids.len(), case.max_new_tokens, "{what}-{i}");
                assert_eq!(reason, "length", "{what}-{i}");
            } else {
                assert!(
                    matches!(reason, "length" | "stop")
                        && o.output_ids.len() <= case.max_new_tokens,
                    "{what}-{i}: {reason} after {} tokens",
                    o.output_ids.len()
                );
            }
        }
        assert_eq!(
            b.output_ids, a.output_ids,
            "request {i} (stream {}): greedy tokens in the burst differ from alone",
            case.stream
        );
        assert_eq!(
            b.meta["finish_reason"], a.meta["finish_reason"],
            "request {i}"
        );
        ranks.insert(b.meta["dp_rank"].as_u64().expect("dp_rank"));
        cached += b.meta["cached_tokens"].as_u64().unwrap_or(0);
    }
    assert_eq!(ranks.len(), RANKS as usize, "the burst used both ranks");
    assert!(cached > 0, "no prefix was reused in the burst");

    // Idle again, nothing held: every slot free or evictable.
    wait_info(
        &server,
        "ranks did not settle idle and whole",
        idle_and_whole,
    );
    assert!(server.stop(), "dpserve up did not stop cleanly");

    // The pressure was real: some burst request was retracted after it had decoded (admitted
    // again after its first token), and still produced its alone tokens above.
    let mut first_token: HashMap<String, bool> = HashMap::new();
    let mut retracted = BTreeSet::new();
    for (rid, kind) in worker_events(traces.path()) {
        if !rid.starts_with("burst-") {
            continue;
        }
        match kind.as_str() {
            "first_token" => {
                first_token.insert(rid, true);
            }
            "admitted" if first_token.get(&rid) == Some(&true) => {
                retracted.insert(rid);
            }
            _ => {}
        }
    }
    assert!(
        !retracted.is_empty(),
        "no request was retracted during decode; the pool did not pressure the burst"
    );
    eprintln!(
        "{} of {REQUESTS} burst requests were retracted during decode and resumed",
        retracted.len()
    );
}

#[test]
fn flush_cache_is_refused_while_a_request_runs_then_empties_every_rank() {
    // No --max-total-tokens: the pools are sized from --mem-fraction.
    let server = Server::up(&[
        "--builtin-size",
        "tiny",
        "--dp-size",
        "2",
        "--max-running-requests",
        "4",
    ]);
    let (_, info) = server.get("/get_server_info");
    let context = info["context_length"].as_u64().expect("context_length");
    for rank in info["ranks"].as_array().expect("ranks") {
        // 4 running + 8 pre-allocated rows (decode pre-allocation `auto`).
        let slots = rank["capacity"]["max_total_tokens"]
            .as_u64()
            .expect("slots");
        assert!(
            (context..=12 * context).contains(&slots),
            "derived pool {slots} outside [one context, rows × context]: {rank}"
        );
    }

    // Something in both ranks' caches.
    let prompt: Vec<u32> = (0..48u32).map(|i| 3 + (i * 613) % 8000).collect();
    for rank in 0..RANKS {
        let (status, resp) = server.post(
            "/generate",
            &json!({"input_ids": prompt, "routed_dp_rank": rank,
                    "sampling_params": {"max_new_tokens": 4, "temperature": 0}}),
        );
        assert_eq!(status, 200, "{resp}");
    }
    wait_info(&server, "caches did not fill", |info| {
        let s = rank_statuses(info);
        s.len() == RANKS as usize
            && s.iter()
                .all(|s| s["num_evictable_tokens"].as_u64().unwrap_or(0) >= 48)
    });

    // A long request in flight: the flush must be refused.
    let resp = Server::client()
        .post(server.url("/generate"))
        .json(
            &json!({"rid": "long-one", "input_ids": prompt, "stream": true,
                      "sampling_params": {"max_new_tokens": 8000, "ignore_eos": true,
                                          "temperature": 0}}),
        )
        .send()
        .expect("long request");
    assert_eq!(resp.status().as_u16(), 200);
    let mut stream = BufReader::new(resp);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(
            stream.read_line(&mut line).expect("stream") > 0,
            "stream ended"
        );
    }
    let (status, refusal) = server.post("/flush_cache", &json!({}));
    assert_eq!(status, 400, "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Cache not flushed because there are pending requests"),
        "{refusal}"
    );
    // The ranks' statuses report the running request a heartbeat after it started (longer on
    // a loaded machine): wait until a refusal counts it, so the timed refusal below must too.
    let seen = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, refusal) = server.post("/flush_cache", &json!({}));
        assert_eq!(status, 400, "{refusal}");
        let message = refusal["error"]["message"].as_str().unwrap_or_default();
        if message.contains("#running-req: 1") {
            break;
        }
        assert!(
            Instant::now() < seen,
            "no status counted the running request: {refusal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // With a timeout (SGLang's parameter) the flush waits for idle; the request runs on, so it
    // is refused when the time is up, not before.
    let asked = Instant::now();
    let (status, refusal) = server.post("/flush_cache?timeout=0.5", &json!({}));
    assert_eq!(status, 400, "{refusal}");
    assert!(asked.elapsed() >= Duration::from_millis(500), "no wait");
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Timed out after 0.5 s waiting for idle state.")
            && message.contains("#running-req: 1"),
        "{refusal}"
    );

    // Abort it; its stream ends with one final chunk, then [DONE].
    let (status, resp) = server.post("/abort_request", &json!({"rid": "long-one"}));
    assert_eq!(status, 200, "{resp}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stream, &mut rest).expect("rest of the stream");
    let finals: Vec<Value> = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|c| !c["meta_info"]["finish_reason"].is_null())
        .collect();
    assert_eq!(finals.len(), 1, "{rest}");
    assert_eq!(finals[0]["meta_info"]["finish_reason"]["type"], "abort");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");

    // Idle now, though the ranks' status may lag the abort by a report: a flush with a timeout
    // waits that out and goes through, at the first try...
    let (status, resp) = server.post("/flush_cache?timeout=60", &json!({}));
    assert_eq!(status, 200, "{resp}");
    // ...and every rank's pool is entirely free: nothing left in the caches.
    wait_info(&server, "caches not emptied", |info| {
        let s = rank_statuses(info);
        s.len() == RANKS as usize
            && s.iter().all(|s| {
                s["num_evictable_tokens"] == 0 && s["num_free_tokens"] == s["max_total_tokens"]
            })
    });
}
