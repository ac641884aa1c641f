//! In-process HTTP tests of the tokenizer actor's native API (`/generate`, health, info),
//! against the fake controller in `common`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Duration;

use common::{builtin_ids, Harness};
use serde_json::{json, Value};

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
    // As SGLang: where the cached tokens were (a rank's own prefix cache).
    assert_eq!(
        meta["cached_tokens_details"],
        json!({"device": 2, "host": 0})
    );
    assert_eq!(meta["dp_rank"], 1);
    assert_eq!(meta["finish_reason"]["type"], "length");
    assert!(meta["e2e_latency"].as_f64().unwrap() >= 0.0);

    // Streamed as SGLang does by default: each chunk holds the whole text and every id so far,
    // so the last one is the answer.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (status, events) = h.stream(&sbody);
    assert_eq!(status, 200);
    assert_eq!(events.len(), outputs.len().div_ceil(3));
    for (before, after) in events.iter().zip(&events[1..]) {
        let text = |e: &Value| e["text"].as_str().unwrap().to_string();
        assert!(text(after).starts_with(&text(before)), "{after}");
        let ids = |e: &Value| e["output_ids"].as_array().unwrap().clone();
        assert!(ids(after).starts_with(&ids(before)), "{after}");
        assert!(ids(after).len() > ids(before).len(), "{after}");
    }
    let last = events.last().unwrap();
    assert_eq!(last["text"], resp["text"]);
    assert_eq!(last["output_ids"], resp["output_ids"]);
    for e in &events[..events.len() - 1] {
        assert!(e["meta_info"]["finish_reason"].is_null());
    }
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");

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

/// With `--incremental-streaming-output` (SGLang's flag), each chunk holds only its own
/// step's text, ids and log-probabilities; together they are the answer.
#[test]
fn incremental_streaming_output_streams_each_step_alone() {
    let outputs = builtin_ids("there was a little dog . the dog said xyzzy");
    let h = Harness::start_with(outputs.clone(), |a| {
        a.http.incremental_streaming_output = true
    });
    let body = json!({"text": "Once upon a time", "return_logprob": true,
                      "sampling_params": {"max_new_tokens": 16, "temperature": 0}});
    let (status, resp) = h.post("/generate", &body);
    assert_eq!(status, 200, "{resp}");
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
    let logprobs: Vec<Value> = events
        .iter()
        .flat_map(|e| {
            e["meta_info"]["output_token_logprobs"]
                .as_array()
                .unwrap()
                .clone()
        })
        .collect();
    assert_eq!(json!(logprobs), resp["meta_info"]["output_token_logprobs"]);
    for e in &events {
        let n = e["output_ids"].as_array().unwrap().len();
        assert!((1..=3).contains(&n), "one step's ids: {e}");
    }
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
    assert_eq!(info["ranks"][0]["device"], "cpu");
    assert_eq!(info["device"], "cpu");
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

    // The fake rank reports 3 running and 1 waiting: no flush (tests/e2e_concurrency.rs runs
    // the accepted flush against real workers).
    let (status, resp) = h.post("/flush_cache", &json!({}));
    assert_eq!(status, 400, "{resp}");
    let message = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("pending requests") && message.contains("#running-req: 3"),
        "{resp}"
    );
    assert_eq!(h.fake.script.lock().unwrap().flushes, 0, "FlushCache sent");
    // With SGLang's `timeout` it waits, and is refused only when the time is up.
    let asked = std::time::Instant::now();
    let (status, resp) = h.post("/flush_cache?timeout=0.3", &json!({}));
    assert_eq!(status, 400, "{resp}");
    assert!(
        asked.elapsed() >= Duration::from_millis(300),
        "no wait: {resp}"
    );
    let message = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Timed out after 0.3 s waiting for idle state.")
            && message.contains("#running-req: 3"),
        "{resp}"
    );
    let (status, resp) = h.post("/flush_cache?timeout=-1", &json!({}));
    assert_eq!(
        (status, &resp["error"]["param"]),
        (400, &json!("timeout")),
        "{resp}"
    );
    assert_eq!(h.fake.script.lock().unwrap().flushes, 0, "FlushCache sent");
    let (status, resp) = h.get("/no/such/path");
    assert_eq!(status, 404, "{resp}");
}

/// A flush with a timeout asked while the rank is busy goes through as soon as its status says
/// idle, without a second try.
#[test]
fn flush_with_a_timeout_waits_for_the_ranks_to_report_idle() {
    let h = Harness::start(None, builtin_ids("hi"), 30);
    let url = h.url("/flush_cache?timeout=20");
    let flush = std::thread::spawn(move || {
        let resp = Harness::client().post(url).send().unwrap();
        let answered = std::time::Instant::now();
        (
            resp.status().as_u16(),
            resp.json::<Value>().unwrap(),
            answered,
        )
    });
    // Nothing tells a client that a flush is waiting: give the request time to arrive (on
    // loopback, far more than it needs) before the rank turns idle.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!flush.is_finished(), "answered while the rank is busy");
    assert_eq!(h.fake.script.lock().unwrap().flushes, 0);
    let idle_at = std::time::Instant::now();
    h.fake.set_idle(true);
    let (status, resp, answered) = flush.join().unwrap();
    assert_eq!(status, 200, "{resp}");
    assert!(answered >= idle_at, "answered before the rank was idle");
    assert_eq!(resp["ranks"], json!([0, 1]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.fake.script.lock().unwrap().flushes == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no FlushCache reached the controller"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// A request sent just before the controller went quiet (after its last status) that nothing
/// answers most likely went into a dead connection: once the controller counts as gone it
/// ends with a 503, not at the request timeout.
#[test]
fn a_request_lost_with_the_controller_gets_503_once_it_is_gone() {
    let h = Harness::start(None, builtin_ids("hi"), 60);
    h.fake.mute_status();
    // The last status has arrived (none for 200 ms, four periods): the request below is sent
    // after it, but while it is still fresh.
    loop {
        let (_, info) = h.get("/get_server_info");
        if info["cluster_status_age_s"].as_f64().unwrap() >= 0.2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = std::time::Instant::now();
    let (status, resp) = h.post("/generate", &json!({"text": "hi", "rid": "silent-lost"}));
    assert_eq!(status, 503, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("controller is unreachable"),
        "{resp}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        h.fake
            .script
            .lock()
            .unwrap()
            .requests
            .iter()
            .any(|r| r.rid == "silent-lost"),
        "the request did reach the (now silent) controller"
    );
    // And from now on, every request is refused at once.
    let (status, resp) = h.post("/generate", &json!({"text": "hi"}));
    assert_eq!(status, 503, "{resp}");
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
    // Each chunk holds the whole text so far (SGLang's stream); the last one all of it.
    assert_eq!(events.last().unwrap()["text"], golden["greedy_text"]);
    // Prompt + max_new_tokens beyond the 512-token context is refused.
    let (status, _) = h.post(
        "/generate",
        &json!({"text": "hi", "sampling_params": {"max_new_tokens": 600}}),
    );
    assert_eq!(status, 400);
}

/// The value of the `/metrics` sample `series` (name and labels as the encoder writes them),
/// or `None` while it has none.
fn sample(h: &Harness, series: &str) -> Option<f64> {
    let text = h.metrics();
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
        .next()
}

/// With the only in-flight slot held by a stream, `/generate` and `/v1/completions` are
/// refused with a 429 and `Retry-After`; each refusal is one observation of
/// `request_refusal_seconds{reason="overloaded"}`, beside the `requests_refused_total` count,
/// and a request admitted once the slot is free is not one.
#[test]
fn a_refusal_past_max_in_flight_is_timed_in_the_refusal_histogram() {
    let h = Harness::start_with(builtin_ids("there was a little dog"), |a| {
        a.http.max_in_flight_requests = 1
    });
    let count = "dpserve:request_refusal_seconds_count{reason=\"overloaded\"}";
    let inf = "dpserve:request_refusal_seconds_bucket{reason=\"overloaded\",le=\"+Inf\"}";
    let sum = "dpserve:request_refusal_seconds_sum{reason=\"overloaded\"}";
    let counter = "dpserve:requests_refused_total{reason=\"overloaded\"}";
    assert_eq!(sample(&h, count), None, "no refusal yet");
    let held = Harness::client()
        .post(h.url("/generate"))
        .json(&json!({"text": "hi", "stream": true, "rid": "hang-held"}))
        .send()
        .unwrap();
    assert_eq!(held.status().as_u16(), 200);
    let mut reader = BufReader::new(held);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: {"), "{line}");
    for (i, (path, body)) in [
        ("/generate", json!({"text": "hi"})),
        ("/v1/completions", json!({"prompt": "hi"})),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = Harness::client()
            .post(h.url(path))
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 429, "{path}");
        assert_eq!(resp.headers()["retry-after"], "1", "{path}");
        let refusals = Some((i + 1) as f64);
        for series in [count, inf, counter] {
            assert_eq!(sample(&h, series), refusals, "{series} after {path}");
        }
        assert!(sample(&h, sum).unwrap() > 0.0);
    }
    drop(reader);
    h.wait_abort("hang-held");
    // The slot comes free once the stream's guard is dropped; then requests are admitted
    // and leave the histogram alone.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, resp) = h.post("/generate", &json!({"text": "hi"}));
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{resp}");
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never came free"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = sample(&h, counter);
    assert_eq!(sample(&h, count), refused, "one observation per refusal");
    let (status, resp) = h.post("/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        sample(&h, count),
        refused,
        "an admitted request is not observed"
    );
}
