//! In-process HTTP tests of the tokenizer actor. A fake controller thread (test scaffolding
//! only; the real controller is its own crate) binds the controller's PULL, pushes outputs
//! and cluster status to the tokenizer, and records the aborts it receives.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protocol::{Capacity, ClusterStatus, Endpoint, FinishReason, Message, RankInfo, TokenOut};
use serde_json::{json, Value};
use tokenizer_actor::{SpawnedServer, TokenizerArgs};

/// What the fake controller does, shared with the test.
#[derive(Default)]
struct Script {
    live_ranks: Vec<u32>,
    /// Outputs for an ordinary request, sent in steps of `step` ids.
    outputs: Vec<u32>,
    step: usize,
    aborts: Vec<String>,
    requests: Vec<protocol::GenerateReq>,
    flushes: usize,
}

struct FakeController {
    script: Arc<Mutex<Script>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeController {
    /// Requests are answered by rid prefix: `err-` → a 400 error `TokenOut`, `hang-` → one
    /// step then silence, `silent-` → nothing; anything else → `outputs` then `length`.
    fn start(controller: &Endpoint, tokenizer: &Endpoint, script: Script) -> FakeController {
        let ctx = zmq::Context::new();
        let pull = protocol::socket::bind(&ctx, zmq::PULL, controller).unwrap();
        pull.set_rcvtimeo(20).unwrap();
        let push = protocol::socket::connect(&ctx, zmq::PUSH, tokenizer, None).unwrap();
        let script = Arc::new(Mutex::new(script));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (script.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut last_status = Instant::now() - Duration::from_secs(1);
            while !st.load(Ordering::Relaxed) {
                if last_status.elapsed() > Duration::from_millis(50) {
                    let live = s.lock().unwrap().live_ranks.clone();
                    protocol::socket::send(&push, &Message::ClusterStatus(cluster(&live))).unwrap();
                    last_status = Instant::now();
                }
                let Ok(frame) = pull.recv_bytes(0) else {
                    continue;
                };
                match protocol::decode(&frame).unwrap() {
                    Message::GenerateReq(req) => {
                        let mut sc = s.lock().unwrap();
                        sc.requests.push(req.clone());
                        for out in answer(&req, &sc) {
                            protocol::socket::send(&push, &Message::TokenOut(out)).unwrap();
                        }
                    }
                    Message::Abort(a) => s.lock().unwrap().aborts.push(a.rid.unwrap_or_default()),
                    Message::FlushCache(_) => s.lock().unwrap().flushes += 1,
                    other => panic!("unexpected {other:?}"),
                }
            }
        });
        FakeController {
            script,
            stop,
            thread: Some(thread),
        }
    }

    fn set_live(&self, live: &[u32]) {
        self.script.lock().unwrap().live_ranks = live.to_vec();
    }

    fn aborts(&self) -> Vec<String> {
        self.script.lock().unwrap().aborts.clone()
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn cluster(live: &[u32]) -> ClusterStatus {
    ClusterStatus {
        timestamp: protocol::unix_time(),
        load_balance_method: "prefix_affinity".into(),
        live_ranks: live
            .iter()
            .map(|&rank| RankInfo {
                rank,
                capacity: Capacity {
                    max_total_tokens: 4096,
                    max_running_requests: 8,
                    context_len: 0,
                    vocab_size: 0,
                },
                model_id: "test".into(),
                last_seen_s: 0.1,
                status: None,
            })
            .collect(),
    }
}

fn answer(req: &protocol::GenerateReq, sc: &Script) -> Vec<TokenOut> {
    let rid = req.rid.clone();
    if rid.starts_with("err-") {
        return vec![TokenOut::error(
            rid,
            400,
            "rank 5 is not live (live ranks: [0, 1])",
        )];
    }
    if rid.starts_with("silent-") {
        return vec![];
    }
    let base = TokenOut {
        rid: rid.clone(),
        prompt_tokens: req.input_ids.len() as u32,
        dp_rank: Some(1),
        ..TokenOut::error(rid.clone(), 0, "")
    };
    let base = TokenOut {
        error: None,
        finish_reason: None,
        ..base
    };
    let steps: Vec<&[u32]> = sc.outputs.chunks(sc.step.max(1)).collect();
    if rid.starts_with("hang-") {
        return vec![TokenOut {
            output_ids: steps[0].to_vec(),
            ..base
        }];
    }
    let mut outs = Vec::new();
    let mut done = 0;
    for (i, ids) in steps.iter().enumerate() {
        done += ids.len();
        let last = i + 1 == steps.len();
        outs.push(TokenOut {
            output_ids: ids.to_vec(),
            completion_tokens: done as u32,
            cached_tokens: 2,
            finish_reason: last.then_some(FinishReason::Length),
            ..base.clone()
        });
    }
    outs
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

struct Harness {
    server: Option<SpawnedServer>,
    fake: FakeController,
    dir: PathBuf,
}

impl Harness {
    fn start(model_path: Option<PathBuf>, outputs: Vec<u32>, timeout_s: u64) -> Harness {
        let dir = std::env::temp_dir().join(format!(
            "dpserve-tok-http-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let tok_ep = Endpoint::Ipc(dir.join("tok.sock"));
        let ctl_ep = Endpoint::Ipc(dir.join("ctl.sock"));
        let args = TokenizerArgs {
            model_path,
            tokenizer_addr: tok_ep.to_string(),
            controller_addr: ctl_ep.to_string(),
            dp_size: 2,
            request_timeout_s: timeout_s,
            ..TokenizerArgs::default()
        };
        let server = SpawnedServer::start(args).unwrap();
        let fake = FakeController::start(
            &ctl_ep,
            &tok_ep,
            Script {
                live_ranks: vec![0, 1],
                outputs,
                step: 3,
                ..Script::default()
            },
        );
        let h = Harness {
            server: Some(server),
            fake,
            dir,
        };
        h.wait_health(200);
        h
    }

    fn url(&self, path: &str) -> String {
        self.server.as_ref().unwrap().url(path)
    }

    fn client() -> reqwest::blocking::Client {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = Self::client()
            .post(self.url(path))
            .json(body)
            .send()
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap())
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let resp = Self::client().get(self.url(path)).send().unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap())
    }

    fn wait_health(&self, want: u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, _) = self.get("/health");
            if status == want {
                return;
            }
            assert!(Instant::now() < deadline, "/health never became {want}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_abort(&self, rid: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.fake.aborts().iter().any(|a| a == rid) {
            assert!(
                Instant::now() < deadline,
                "no Abort for {rid}: {:?}",
                self.fake.aborts()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The SSE events of a streaming request, `[DONE]` excluded; asserts it ends with it.
    fn stream(&self, body: &Value) -> (u16, Vec<Value>) {
        let resp = Self::client()
            .post(self.url("/generate"))
            .json(body)
            .send()
            .unwrap();
        let status = resp.status().as_u16();
        if status != 200 {
            return (status, vec![resp.json().unwrap()]);
        }
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ctype.starts_with("text/event-stream"), "{ctype}");
        let body = resp.text().unwrap();
        let mut events = Vec::new();
        let mut done = false;
        for block in body.split("\n\n").filter(|b| !b.is_empty()) {
            let data = block.strip_prefix("data: ").unwrap();
            assert!(!done, "event after [DONE]");
            if data == "[DONE]" {
                done = true;
            } else {
                events.push(serde_json::from_str(data).unwrap());
            }
        }
        assert!(done, "stream did not end with [DONE]: {body}");
        (status, events)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn builtin_ids(words: &str) -> Vec<u32> {
    use tokenizer_actor::tokenizer::{BuiltinTokenizer, TextTokenizer};
    BuiltinTokenizer::new().encode(words).unwrap()[1..].to_vec()
}

#[test]
fn generate_stream_and_non_stream_agree() {
    let outputs = builtin_ids("there was a little dog . the dog said xyzzy");
    let h = Harness::start(None, outputs.clone(), 30);
    let body = json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 16, "temperature": 0},
                      "return_hidden_states": false});
    let (status, resp) = h.post("/generate", &body);
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["text"], " there was a little dog . the dog said <unk>");
    assert_eq!(resp["output_ids"], json!(outputs));
    let meta = &resp["meta_info"];
    assert_eq!(meta["id"].as_str().unwrap().len(), 32);
    assert_eq!(meta["prompt_tokens"], 5);
    assert_eq!(meta["completion_tokens"], outputs.len());
    assert_eq!(meta["cached_tokens"], 2);
    assert_eq!(meta["dp_rank"], 1);
    assert_eq!(meta["finish_reason"]["type"], "length");
    assert!(meta["e2e_latency"].as_f64().unwrap() >= 0.0);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (status, events) = h.stream(&sbody);
    assert_eq!(status, 200);
    assert_eq!(events.len(), outputs.len().div_ceil(3));
    let text: String = events.iter().map(|e| e["text"].as_str().unwrap()).collect();
    assert_eq!(text, resp["text"]);
    let ids: Vec<u64> = events
        .iter()
        .flat_map(|e| {
            e["output_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
        })
        .collect();
    assert_eq!(json!(ids), resp["output_ids"]);
    for e in &events[..events.len() - 1] {
        assert!(e["meta_info"]["finish_reason"].is_null());
    }
    assert_eq!(
        events.last().unwrap()["meta_info"]["finish_reason"]["type"],
        "length"
    );

    // What the controller received: tokenized prompt with BOS, sampling params, EOS added.
    let reqs = h.fake.script.lock().unwrap().requests.clone();
    assert_eq!(reqs[0].input_ids[0], protocol::builtin::BOS_ID);
    assert_eq!(reqs[0].sampling.max_new_tokens, 16);
    assert_eq!(reqs[0].sampling.temperature, 0.0);
    assert!(reqs[0]
        .sampling
        .stop_token_ids
        .contains(&protocol::builtin::EOS_ID));
    assert!(reqs[1].stream && !reqs[0].stream);
}

#[test]
fn routing_headers_and_client_rid_are_forwarded() {
    let h = Harness::start(None, builtin_ids("hi there"), 30);
    let resp = Harness::client()
        .post(h.url("/generate"))
        .header("x-smg-routing-key", "conv-7")
        .header("X-Data-Parallel-Rank", "1")
        .json(
            &json!({"input_ids": [1, 5, 6], "routed_dp_rank": 0, "rid": "my-rid",
                      "bootstrap_room": 42, "sampling_params": {"max_new_tokens": 4}}),
        )
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().unwrap();
    assert_eq!(v["meta_info"]["id"], "my-rid");
    let req = h.fake.script.lock().unwrap().requests[0].clone();
    assert_eq!(req.rid, "my-rid");
    assert_eq!(req.input_ids, vec![1, 5, 6]);
    assert_eq!(req.routing_key.as_deref(), Some("conv-7"));
    assert_eq!(req.routed_dp_rank, Some(1));
    assert_eq!(req.bootstrap_room, Some(42));
    assert!(req.received_at > 0.0);
}

#[test]
fn controller_error_maps_to_its_status() {
    let h = Harness::start(None, builtin_ids("hi"), 30);
    for stream in [false, true] {
        let body = json!({"text": "hello", "rid": format!("err-{stream}"), "stream": stream});
        let (status, resp) = h.post("/generate", &body);
        assert_eq!(status, 400, "{resp}");
        assert_eq!(
            resp["error"]["message"],
            "rank 5 is not live (live ranks: [0, 1])"
        );
        assert_eq!(resp["error"]["code"], 400);
    }
    // The fast local check answers the same without a round trip.
    let (status, resp) = h.post("/generate", &json!({"text": "hello", "routed_dp_rank": 5}));
    assert_eq!(status, 400);
    assert_eq!(
        resp["error"]["message"],
        "rank 5 is not live (live ranks: [0, 1])"
    );
    assert!(h.fake.aborts().is_empty());
}

#[test]
fn validation_errors_keep_the_server_serving() {
    let h = Harness::start(None, builtin_ids("hi"), 30);
    let cases = [
        (
            json!({"input_ids": [1, 9000]}),
            "out of range for vocabulary size 8192",
        ),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": 9000}}),
            "context length 8192",
        ),
        (
            json!({"text": "a", "sampling_params": {"top_p": 0}}),
            "top_p",
        ),
        (json!({"prompt": "a"}), "one of text or input_ids"),
    ];
    for (body, want) in cases {
        let (status, resp) = h.post("/generate", &body);
        assert_eq!(status, 400, "{body}");
        let msg = resp["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{body}: {msg}");
        assert_eq!(resp["error"]["type"], "invalid_request_error");
    }
    let resp = Harness::client()
        .post(h.url("/generate"))
        .body("{not json")
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let (status, _) = h.post("/generate", &json!({"text": "still serving"}));
    assert_eq!(status, 200);
}

#[test]
fn health_and_info_follow_cluster_status() {
    let h = Harness::start(None, builtin_ids("hi"), 30);
    let (_, info) = h.get("/get_server_info");
    assert_eq!(info["dp_size"], 2);
    assert_eq!(info["live_ranks"], json!([0, 1]));
    assert_eq!(info["ranks"][0]["capacity"]["max_total_tokens"], 4096);
    assert_eq!(info["load_balance_method"], "prefix_affinity");
    assert_eq!(info["served_model_name"], protocol::builtin::MODEL_ID);
    assert!(info["version"].is_string());
    let (_, alias) = h.get("/server_info");
    assert_eq!(alias["dp_size"], 2);
    let (_, model) = h.get("/model_info");
    assert_eq!(model["is_generation"], true);
    let (_, models) = h.get("/v1/models");
    assert_eq!(models["data"][0]["id"], protocol::builtin::MODEL_ID);

    h.fake.set_live(&[]);
    h.wait_health(503);
    let (status, resp) = h.post("/generate", &json!({"text": "hi"}));
    assert_eq!(status, 503, "{resp}");
    h.fake.set_live(&[3]);
    h.wait_health(200);
    let (_, info) = h.get("/get_server_info");
    assert_eq!(info["live_ranks"], json!([3]));

    let (status, _) = h.post("/flush_cache", &json!({}));
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.fake.script.lock().unwrap().flushes == 0 {
        assert!(Instant::now() < deadline, "no FlushCache");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, resp) = h.get("/no/such/path");
    assert_eq!(status, 404, "{resp}");
}

#[test]
fn stream_disconnect_sends_abort() {
    let h = Harness::start(None, builtin_ids("there was a little dog"), 30);
    let resp = Harness::client()
        .post(h.url("/generate"))
        .json(&json!({"text": "hi", "stream": true, "rid": "hang-stream"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut reader = BufReader::new(resp);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: {"), "{line}");
    assert!(h.fake.aborts().is_empty());
    drop(reader);
    h.wait_abort("hang-stream");
}

#[test]
fn non_stream_disconnect_sends_abort() {
    let h = Harness::start(None, builtin_ids("there was"), 30);
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = client
        .post(h.url("/generate"))
        .json(&json!({"text": "hi", "rid": "hang-plain"}))
        .send();
    assert!(err.is_err());
    h.wait_abort("hang-plain");
}

#[test]
fn silent_request_times_out_with_504_and_abort() {
    let h = Harness::start(None, builtin_ids("hi"), 1);
    let (status, resp) = h.post("/generate", &json!({"text": "hi", "rid": "silent-1"}));
    assert_eq!(status, 504, "{resp}");
    assert!(resp["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no final output"));
    h.wait_abort("silent-1");
    // A stream that started and then went silent ends with an SSE error, then [DONE].
    let (status, events) = h.stream(&json!({"text": "hi", "rid": "hang-2", "stream": true}));
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap()["error"]["code"], 504);
    h.wait_abort("hang-2");
}

#[test]
fn stories260k_golden_text_over_http() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/stories260k");
    if !dir.join("tokenizer.json").exists() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let ids: Vec<u32> = serde_json::from_value(golden["greedy_token_ids"].clone()).unwrap();
    let h = Harness::start(Some(dir), ids.clone(), 30);
    let body = json!({"text": golden["prompt"], "sampling_params": {"max_new_tokens": 32, "temperature": 0}});
    let (status, resp) = h.post("/generate", &body);
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["text"], golden["greedy_text"]);
    assert_eq!(resp["meta_info"]["prompt_tokens"], 5);
    let req = h.fake.script.lock().unwrap().requests[0].clone();
    assert_eq!(json!(req.input_ids), golden["prompt_token_ids"]);
    let mut sbody = body;
    sbody["stream"] = json!(true);
    let (_, events) = h.stream(&sbody);
    let text: String = events.iter().map(|e| e["text"].as_str().unwrap()).collect();
    assert_eq!(text, golden["greedy_text"]);
    // Prompt + max_new_tokens beyond the 512-token context is refused.
    let (status, _) = h.post(
        "/generate",
        &json!({"text": "hi", "sampling_params": {"max_new_tokens": 600}}),
    );
    assert_eq!(status, 400);
}
