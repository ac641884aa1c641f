//! End to end with the built-in model (no files needed): health and server info, concurrent
//! requests, bad input answered with 4xx while the server keeps serving, garbage frames dropped.

use crate::common;

use common::Server;
use serde_json::{json, Value};

fn tiny() -> Server {
    tiny_with_env(&[])
}

/// Two ranks of the tiny built-in model, round robin, with extra environment variables.
fn tiny_with_env(env: &[(&str, &str)]) -> Server {
    Server::tiny_with_env(&["--load-balance-method", "round_robin"], env)
}

#[test]
fn builtin_model_serves_readable_text_on_both_ranks() {
    let server = tiny();
    let (status, health) = server.get("/health");
    assert_eq!(status, 200, "{health}");
    let (status, info) = server.get("/get_server_info");
    assert_eq!(status, 200);
    assert_eq!(info["dp_size"], 2);
    assert_eq!(info["live_ranks"].as_array().map(Vec::len), Some(2));
    let (_, alias) = server.get("/server_info");
    assert_eq!(alias["dp_size"], 2);

    let mut ranks = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (status, resp) = server.post(
            "/generate",
            &json!({"text": "hello world", "sampling_params": {"max_new_tokens": 8, "temperature": 0.7, "seed": 3, "ignore_eos": true}}),
        );
        assert_eq!(status, 200, "{resp}");
        assert_eq!(resp["output_ids"].as_array().unwrap().len(), 8);
        let text = resp["text"].as_str().unwrap();
        assert!(
            text.chars().all(|c| !c.is_control() && c != '\u{fffd}'),
            "unreadable text {text:?}"
        );
        assert!(!text.trim().is_empty());
        ranks.insert(resp["meta_info"]["dp_rank"].as_u64().unwrap());
    }
    assert_eq!(ranks.len(), 2, "round robin uses both ranks");
}

#[test]
fn greedy_is_the_same_on_every_rank_and_alone_or_concurrent() {
    let server = tiny();
    let body = |rank: u64| {
        json!({"text": "the quick brown fox", "routed_dp_rank": rank,
               "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": true}})
    };
    let (_, alone) = server.post("/generate", &body(0));
    let expected = alone["output_ids"].clone();
    // 16 concurrent requests over both ranks, mixed with other prompts.
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let url = server.url("/generate");
            let req = if i % 2 == 0 {
                body((i / 2) % 2)
            } else {
                json!({"text": format!("other prompt number {i}"),
                       "sampling_params": {"max_new_tokens": 10 + i, "temperature": 0.9}})
            };
            std::thread::spawn(move || {
                let resp = Server::client().post(url).json(&req).send().unwrap();
                (i, resp.status().as_u16(), resp.json::<Value>().unwrap())
            })
        })
        .collect();
    for h in handles {
        let (i, status, resp) = h.join().unwrap();
        assert_eq!(status, 200, "request {i}: {resp}");
        if i % 2 == 0 {
            assert_eq!(
                resp["output_ids"], expected,
                "request {i} differs from alone"
            );
        }
    }
}

#[test]
fn bad_input_is_a_clear_4xx_and_the_server_keeps_serving() {
    let server = tiny();
    let cases: Vec<(&str, Value)> = vec![
        ("wrong type", json!({"text": 5})),
        ("no prompt", json!({"sampling_params": {}})),
        (
            "negative max_new_tokens",
            json!({"text": "a", "sampling_params": {"max_new_tokens": -1}}),
        ),
        (
            "beyond context",
            json!({"text": "a", "sampling_params": {"max_new_tokens": 10_000_000}}),
        ),
        ("token outside vocab", json!({"input_ids": [1, 999_999]})),
        ("empty input_ids", json!({"input_ids": []})),
        (
            "negative temperature",
            json!({"text": "a", "sampling_params": {"temperature": -1}}),
        ),
        (
            "top_p out of range",
            json!({"text": "a", "sampling_params": {"top_p": 1.5}}),
        ),
        ("rank not live", json!({"text": "a", "routed_dp_rank": 7})),
        (
            "wrong type of rank",
            json!({"text": "a", "routed_dp_rank": "zero"}),
        ),
    ];
    for (what, body) in cases {
        let (status, resp) = server.post("/generate", &body);
        assert!((400..500).contains(&status), "{what}: got {status} {resp}");
        let message = resp["error"]["message"]
            .as_str()
            .or_else(|| resp["error"].as_str())
            .unwrap_or_default();
        assert!(!message.is_empty(), "{what}: no error message in {resp}");
    }
    let (status, resp) = server.post_raw("/generate", "{not json");
    assert!(
        (400..500).contains(&status),
        "malformed JSON: {status} {resp}"
    );

    // An empty text is BOS alone, a one-token prompt (as in SGLang and vLLM), not an error.
    let (status, resp) = server.post(
        "/generate",
        &json!({"text": "", "sampling_params": {"max_new_tokens": 2}}),
    );
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["meta_info"]["prompt_tokens"], 1, "{resp}");

    // Unknown fields are ignored, as gateways send many.
    let (status, resp) = server.post(
        "/generate",
        &json!({"text": "a b c", "return_hidden_states": false, "log_metrics": true,
                "sampling_params": {"max_new_tokens": 2, "some_future_knob": 1}}),
    );
    assert_eq!(status, 200, "{resp}");
}

#[test]
fn completions_top_logprobs_list_the_likeliest_token_first() {
    let server = tiny();
    let (status, resp) = server.post(
        "/v1/completions",
        &json!({"prompt": "once upon a time", "max_tokens": 3, "logprobs": 5, "temperature": 0}),
    );
    assert_eq!(status, 200, "{resp}");
    let tops = resp["choices"][0]["logprobs"]["top_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no top_logprobs in {resp}"));
    assert_eq!(tops.len(), 3, "{resp}");
    for map in tops {
        // Parsed with the order kept (serde_json's preserve_order, as the server writes it).
        let values: Vec<f64> = map
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(!values.is_empty() && values.len() <= 5, "{map}");
        assert!(
            values.windows(2).all(|w| w[0] >= w[1]),
            "not likeliest first: {map}"
        );
    }
}

#[test]
fn garbage_frames_are_dropped_and_serving_continues() {
    let server = tiny();
    let ctx = zmq::Context::new();
    for socket in ["controller.sock", "tokenizer.sock"] {
        let push = ctx.socket(zmq::PUSH).unwrap();
        let path = server.runtime_dir.path().join(socket);
        push.connect(&format!("ipc://{}", path.display())).unwrap();
        for frame in [
            &b""[..],
            b"\xc1",
            b"\x81\xa1v\x01",
            b"garbage frame",
            &[0x82; 64],
        ] {
            push.send(frame, 0).unwrap();
        }
        // A well-formed envelope of a type nobody knows.
        push.send(&b"\x82\xa1v\x01\xa3msg\x81\xa7Unknown\x80"[..], 0)
            .unwrap();
        drop(push);
    }
    let (status, resp) = server.post(
        "/generate",
        &json!({"text": "still alive", "sampling_params": {"max_new_tokens": 3}}),
    );
    assert_eq!(status, 200, "{resp}");
}

/// `dpserve up` of one rank of the model at `model`, its runtime directory under `dir`.
fn up_one_rank(model: &std::path::Path, dir: &std::path::Path) -> std::process::Command {
    let mut up = std::process::Command::new(env!("CARGO_BIN_EXE_dpserve"));
    up.args([
        "up",
        "--dp-size",
        "1",
        "--port",
        &common::free_port().to_string(),
    ])
    .arg("--model-path")
    .arg(model)
    .arg("--runtime-dir")
    .arg(dir.join("rt"));
    up
}

#[test]
fn up_fails_clearly_when_a_child_dies_during_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = up_one_rank(&dir.path().join("no-such-model"), dir.path())
        .env("DPSERVE_LOG", "error")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exited during start"), "stderr: {stderr}");
}

#[test]
fn up_refuses_with_its_worker_when_the_worker_refuses_the_model() {
    // A real checkpoint whose config names an architecture no family implements: the worker
    // refuses it (EX_CONFIG), and `up` refuses with it: exit 78, the refusal its last line.
    let Some(stories) = common::stories_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("gpt2ish");
    std::fs::create_dir(&model).unwrap();
    for entry in std::fs::read_dir(&stories).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, model.join(path.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["architectures"] = json!(["GPT2LMHeadModel"]);
    config["model_type"] = json!("gpt2");
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let out = up_one_rank(&model, dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "stderr: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("dpserve: error: worker 0 refused to start: ") && last.contains("gpt2"),
        "the refusal is up's last line, whole: {stderr}"
    );
}

#[test]
fn a_repeated_long_prompt_is_served_from_the_prefix_cache() {
    let server = tiny();
    let prompt: Vec<u32> = (0..600u32).map(|i| 3 + (i * 7919) % 8000).collect();
    let body = json!({"input_ids": prompt, "routed_dp_rank": 1,
                      "sampling_params": {"max_new_tokens": 4, "temperature": 0}});
    let (status, first) = server.post("/generate", &body);
    assert_eq!(status, 200, "{first}");
    let (_, second) = server.post("/generate", &body);
    assert_eq!(first["meta_info"]["cached_tokens"], 0);
    let cached = second["meta_info"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 599, "cached_tokens {cached} < prompt length - 1");
    assert_eq!(
        first["output_ids"], second["output_ids"],
        "cache changes nothing"
    );

    // Once idle, every slot is free or evictable (the status is throttled: poll briefly).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, info) = server.get("/get_server_info");
        let rank = info["ranks"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["rank"] == 1).cloned())
            .unwrap_or(Value::Null);
        let s = &rank["status"];
        let whole = s["num_free_tokens"].as_u64().unwrap_or(0)
            + s["num_evictable_tokens"].as_u64().unwrap_or(0)
            == s["max_total_tokens"].as_u64().unwrap_or(1);
        if whole && s["num_evictable_tokens"].as_u64().unwrap_or(0) >= 599 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "pool not whole: {s}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_forced_kernel_path_serves_and_each_rank_reports_its_path() {
    let server = tiny_with_env(&[("DPSERVE_KERNEL_PATH", "portable")]);
    let body = json!({"text": "once upon a time",
                      "sampling_params": {"max_new_tokens": 4, "temperature": 0}});
    let (status, resp) = server.post("/generate", &body);
    assert_eq!(status, 200, "{resp}");
    // Workers send a status on start and after steps: both ranks name their path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, info) = server.get("/get_server_info");
        let paths: Vec<String> = info["ranks"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|r| {
                        r["status"]["kernel_path"]
                            .as_str()
                            .unwrap_or("")
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default();
        if paths == ["portable", "portable"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ranks report {paths:?}: {info}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_worker_refuses_a_kernel_path_this_cpu_cannot_run() {
    for (path, why) in [
        ("sse9", "is not a kernel path"),
        ("neon", "not supported by this CPU"),
    ] {
        if path == "neon" && cfg!(target_arch = "aarch64") {
            continue;
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpserve"))
            .args([
                "worker",
                "--rank",
                "0",
                "--builtin-size",
                "tiny",
                "--kernel-path",
                path,
            ])
            .output()
            .expect("run dpserve worker");
        assert!(!out.status.success(), "{path} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(why) && err.contains("--kernel-path"),
            "{path}: {err}"
        );
    }
}

/// `/generate` streams as SGLang does: by default each chunk holds the whole text and every id
/// so far; `dpserve up --incremental-streaming-output` (SGLang's flag) streams each step alone.
/// Either way the stream adds up to the non-streamed answer.
#[test]
fn generate_streams_everything_so_far_unless_incremental_streaming_output() {
    use common::generate::{produced, Form};
    let body = json!({"text": "once upon a time", "sampling_params":
                      {"max_new_tokens": 12, "temperature": 0, "ignore_eos": true}});
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    for (flag, form) in [
        (None, Form::Cumulative),
        (Some("--incremental-streaming-output"), Form::Incremental),
    ] {
        let mut args = vec!["--builtin-size", "tiny", "--dp-size", "1"];
        args.extend(flag);
        let server = Server::up(&args);
        let (status, whole) = server.post("/generate", &body);
        assert_eq!(status, 200, "{whole}");
        let chunks = server.stream("/generate", &streamed);
        assert!(chunks.len() > 1, "{flag:?}: one chunk only: {chunks:?}");
        let got = produced(&chunks, form);
        assert_eq!(got.text, whole["text"].as_str().unwrap(), "{flag:?}");
        assert_eq!(json!(got.output_ids), whole["output_ids"], "{flag:?}");
        let first = chunks[0]["output_ids"].as_array().unwrap().len();
        let last = chunks.last().unwrap()["output_ids"]
            .as_array()
            .unwrap()
            .len();
        match form {
            Form::Cumulative => assert_eq!(last, 12, "the last chunk holds every id"),
            Form::Incremental => assert!(first + last <= 12, "{chunks:?}"),
        }
    }
}

/// `return_routing` (body) or `x-dpserve-return-routing: 1` (header) answers the controller's
/// decision: `meta_info.routing` on `/generate` (streamed too), `routing` on each OpenAI choice
/// (each its own request, each its own decision); without it nothing is added; the header on
/// embeddings and a bad header value are refused.
#[test]
fn return_routing_answers_the_decision_that_placed_the_request() {
    let server = Server::tiny(&["--load-balance-method", "cache_aware"]);
    let params = json!({"max_new_tokens": 4, "temperature": 0});
    let check = |routing: &Value, rank: &Value| {
        assert_eq!(routing["method"], "cache_aware", "{routing}");
        assert_eq!(&routing["rank"], rank, "{routing}");
        assert!(routing["branch"].is_string(), "{routing}");
        assert_eq!(
            routing["loads"].as_array().map(Vec::len),
            Some(2),
            "{routing}"
        );
        let costs = routing["costs"].as_array().expect("cache_aware's costs");
        assert_eq!(costs.len(), 2, "{routing}");
        assert!(
            costs.iter().all(|c| c["matched_tokens"].is_u64()),
            "{routing}"
        );
        assert!(routing["margin"].is_f64(), "{routing}");
    };
    let (status, resp) = server.post(
        "/generate",
        &json!({"text": "tell me where you went", "sampling_params": params,
                "return_routing": true}),
    );
    assert_eq!(status, 200, "{resp}");
    check(&resp["meta_info"]["routing"], &resp["meta_info"]["dp_rank"]);

    let resp: Value = Server::client()
        .post(server.url("/generate"))
        .header("x-dpserve-return-routing", "1")
        .json(&json!({"text": "and by header", "sampling_params": params}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    check(&resp["meta_info"]["routing"], &resp["meta_info"]["dp_rank"]);

    let (_, plain) = server.post(
        "/generate",
        &json!({"text": "no routing asked", "sampling_params": params}),
    );
    assert!(plain["meta_info"].get("routing").is_none(), "{plain}");

    let chunks = server.stream(
        "/generate",
        &json!({"text": "streamed", "sampling_params": params, "stream": true,
                "return_routing": true}),
    );
    let last = chunks.last().unwrap();
    check(&last["meta_info"]["routing"], &last["meta_info"]["dp_rank"]);

    let (status, chat) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2,
                "temperature": 0, "return_routing": true}),
    );
    assert_eq!(status, 200, "{chat}");
    for choice in chat["choices"].as_array().unwrap() {
        let routing = &choice["routing"];
        assert!(routing["rank"].is_u64(), "{chat}");
        check(routing, &routing["rank"]);
        assert!(routing["rid"]
            .as_str()
            .unwrap()
            .ends_with(&format!("-{}", choice["index"])));
    }
    let chunks = server.stream(
        "/v1/completions",
        &json!({"prompt": "once upon", "max_tokens": 4, "stream": true, "return_routing": true}),
    );
    let finals: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finals.len(), 1);
    check(
        &finals[0]["choices"][0]["routing"],
        &finals[0]["choices"][0]["routing"]["rank"],
    );
    assert!(
        chunks
            .iter()
            .filter(|c| c["choices"][0].get("routing").is_some())
            .count()
            == 1,
        "once, on the final chunk"
    );

    let resp = Server::client()
        .post(server.url("/v1/embeddings"))
        .header("x-dpserve-return-routing", "1")
        .json(&json!({"input": "x"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400, "embeddings refuse the header");
    let resp = Server::client()
        .post(server.url("/generate"))
        .header("x-dpserve-return-routing", "yes")
        .json(&json!({"text": "bad header"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}
