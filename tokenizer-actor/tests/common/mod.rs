//! Test scaffolding shared by the HTTP tests: a fake controller thread (the real controller
//! is its own crate) binds the controller's PULL, pushes outputs and cluster status to the
//! tokenizer, and records the requests and aborts it receives; a harness starts the server.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protocol::{Capacity, ClusterStatus, Endpoint, FinishReason, Message, RankInfo, TokenOut};
use serde_json::Value;
use tokenizer_actor::{SpawnedServer, TokenizerArgs};

/// What the fake controller does, shared with the test.
#[derive(Default)]
pub struct Script {
    pub live_ranks: Vec<u32>,
    /// Outputs for an ordinary request, sent in steps of `step` ids.
    pub outputs: Vec<u32>,
    pub step: usize,
    pub aborts: Vec<String>,
    pub requests: Vec<protocol::GenerateReq>,
    pub flushes: usize,
    /// Stop sending cluster status (a controller that died, as the tokenizer sees it), while
    /// still taking requests.
    pub mute_status: bool,
    /// Report every rank with nothing running or waiting (else 3 running and 1 waiting).
    pub idle: bool,
}

pub struct FakeController {
    pub script: Arc<Mutex<Script>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeController {
    /// Requests are answered by rid prefix: `err-` → a 400 error `TokenOut`, `hang-` → one
    /// step then silence (an `Abort` for it gets a final `abort` output, as a worker answers),
    /// `silent-` → nothing; anything else → `outputs` then `length`.
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
                let muted = s.lock().unwrap().mute_status;
                if last_status.elapsed() > Duration::from_millis(50) && !muted {
                    let (live, idle) = {
                        let sc = s.lock().unwrap();
                        (sc.live_ranks.clone(), sc.idle)
                    };
                    let status = cluster(&live, idle);
                    protocol::socket::send(&push, &Message::ClusterStatus(status)).unwrap();
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
                    Message::Abort(a) => {
                        let rid = a.rid.unwrap_or_default();
                        if rid.starts_with("hang-") {
                            let out = TokenOut {
                                finish_reason: Some(FinishReason::Abort),
                                error: None,
                                dp_rank: Some(1),
                                ..TokenOut::error(rid.clone(), 0, "")
                            };
                            protocol::socket::send(&push, &Message::TokenOut(out)).unwrap();
                        }
                        s.lock().unwrap().aborts.push(rid)
                    }
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

    pub fn set_live(&self, live: &[u32]) {
        self.script.lock().unwrap().live_ranks = live.to_vec();
    }

    pub fn set_idle(&self, idle: bool) {
        self.script.lock().unwrap().idle = idle;
    }

    pub fn mute_status(&self) {
        self.script.lock().unwrap().mute_status = true;
    }

    pub fn aborts(&self) -> Vec<String> {
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

fn cluster(live: &[u32], idle: bool) -> ClusterStatus {
    ClusterStatus {
        timestamp: protocol::unix_time(),
        load_balance_method: "prefix_affinity".into(),
        live_ranks: live
            .iter()
            .map(|&rank| RankInfo {
                disaggregation_mode: Default::default(),
                rank,
                capacity: Capacity {
                    max_total_tokens: 4096,
                    max_running_requests: 8,
                    context_len: 0,
                    vocab_size: 0,
                },
                model_id: "test".into(),
                last_seen_s: 0.1,
                status: Some(protocol::WorkerStatus {
                    rank,
                    num_running_reqs: if idle { 0 } else { 3 },
                    num_waiting_reqs: if idle { 0 } else { 1 },
                    num_used_tokens: 1024,
                    max_total_tokens: 4096,
                    cache_hit_rate: 0.5,
                    gen_throughput: 12.5,
                    ..Default::default()
                }),
                gpu: None,
                num_inflight: None,
                invariant_violations: Vec::new(),
            })
            .collect(),
        routing: Vec::new(),
        controller_id: None,
        regret: Vec::new(),
        // A controller that predates the ledger fields: the tokenizer never checks.
        taken_submission_seq: None,
        num_inflight: None,
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
    // Made-up log-probabilities, one per id: -(position + 1) / 10.
    let logprobs = |from: usize, n: usize| {
        req.return_logprob
            .then(|| (from..from + n).map(|i| -((i + 1) as f32) / 10.0).collect())
    };
    if rid.starts_with("hang-") {
        return vec![TokenOut {
            output_ids: steps[0].to_vec(),
            logprobs: logprobs(0, steps[0].len()),
            ..base
        }];
    }
    let mut outs = Vec::new();
    let mut done = 0;
    for (i, ids) in steps.iter().enumerate() {
        let from = done;
        done += ids.len();
        let last = i + 1 == steps.len();
        outs.push(TokenOut {
            output_ids: ids.to_vec(),
            logprobs: logprobs(from, ids.len()),
            completion_tokens: done as u32,
            cached_tokens: 2,
            finish_reason: last.then_some(FinishReason::Length),
            ..base.clone()
        });
    }
    outs
}

pub static NEXT: AtomicUsize = AtomicUsize::new(0);

pub struct Harness {
    pub server: Option<SpawnedServer>,
    pub fake: FakeController,
    pub dir: PathBuf,
    /// The key `/health` is asked with, where `--open-endpoints` keys it too.
    health_key: Option<String>,
}

impl Harness {
    pub fn start(model_path: Option<PathBuf>, outputs: Vec<u32>, timeout_s: u64) -> Harness {
        Self::start_with(outputs, |args| {
            args.model_path = model_path;
            args.http.request_timeout_s = timeout_s;
        })
    }

    /// Start with the defaults changed by `edit`.
    pub fn start_with(outputs: Vec<u32>, edit: impl FnOnce(&mut TokenizerArgs)) -> Harness {
        let dir = std::env::temp_dir().join(format!(
            "dpserve-tok-http-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let tok_ep = Endpoint::Ipc(dir.join("tok.sock"));
        let ctl_ep = Endpoint::Ipc(dir.join("ctl.sock"));
        let mut args = TokenizerArgs {
            tokenizer_addr: tok_ep.to_string(),
            controller_addr: ctl_ep.to_string(),
            dp_size: 2,
            ..TokenizerArgs::default()
        };
        edit(&mut args);
        // With /health keyed too, readiness is asked with a key.
        let health_key = (!args.http.open_paths().unwrap().contains(&"/health"))
            .then(|| args.http.api_keys().unwrap().into_iter().next())
            .flatten();
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
            health_key,
        };
        h.wait_health(200);
        h
    }

    pub fn url(&self, path: &str) -> String {
        self.server.as_ref().unwrap().url(path)
    }

    pub fn client() -> reqwest::blocking::Client {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = Self::client()
            .post(self.url(path))
            .json(body)
            .send()
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap())
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let resp = Self::client().get(self.url(path)).send().unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap())
    }

    /// The `/metrics` exposition text.
    pub fn metrics(&self) -> String {
        Self::client()
            .get(self.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    pub fn wait_health(&self, want: u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let req = Self::client().get(self.url("/health"));
            let req = match &self.health_key {
                Some(key) => req.bearer_auth(key),
                None => req,
            };
            if req.send().unwrap().status().as_u16() == want {
                return;
            }
            assert!(Instant::now() < deadline, "/health never became {want}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_abort(&self, rid: &str) {
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

    /// The SSE events of a streaming `/generate`, `[DONE]` excluded; asserts it ends with it.
    pub fn stream(&self, body: &Value) -> (u16, Vec<Value>) {
        self.stream_at("/generate", body)
    }

    pub fn stream_at(&self, path: &str, body: &Value) -> (u16, Vec<Value>) {
        let resp = Self::client()
            .post(self.url(path))
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

pub fn builtin_ids(words: &str) -> Vec<u32> {
    use tokenizer_actor::tokenizer::{BuiltinTokenizer, TextTokenizer};
    BuiltinTokenizer::new().encode(words).unwrap()[1..].to_vec()
}
