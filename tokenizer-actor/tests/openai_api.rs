//! In-process HTTP tests of the OpenAI endpoints, stop strings, `/abort_request`, `/metrics`
//! and `--api-key`, against the fake controller in `common`.

mod common;

use std::time::{Duration, Instant};

use common::{builtin_ids, Harness};
use serde_json::{json, Value};
use tokenizer_actor::OpenEndpoint;

const STORY: &str = "there was a little dog . the dog said xyzzy";
const STORY_TEXT: &str = " there was a little dog . the dog said <unk>";

fn story() -> Harness {
    Harness::start(None, builtin_ids(STORY), 30)
}

fn requests(h: &Harness) -> Vec<protocol::GenerateReq> {
    h.fake.script.lock().unwrap().requests.clone()
}

#[test]
fn completions_non_stream_shape_and_usage() {
    let h = story();
    let (status, v) = h.post(
        "/v1/completions",
        &json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "m");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["text"], STORY_TEXT);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["choices"][0]["logprobs"].is_null());
    let n_out = builtin_ids(STORY).len();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": n_out, "total_tokens": 5 + n_out,
               "prompt_tokens_details": {"cached_tokens": 2}})
    );
    let req = &requests(&h)[0];
    assert_eq!(req.rid, v["id"]);
    assert_eq!(req.sampling.max_new_tokens, 16);
    assert_eq!(req.sampling.temperature, 0.0);
    // OpenAI's default max_tokens for completions.
    let (_, _) = h.post("/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(requests(&h)[1].sampling.max_new_tokens, 16);
}

#[test]
fn completions_stream_with_usage() {
    let h = story();
    let body = json!({"prompt": "Once upon a time", "stream": true,
                      "stream_options": {"include_usage": true}});
    let (status, events) = h.stream_at("/v1/completions", &body);
    assert_eq!(status, 200);
    let (usage_ev, chunks) = events.split_last().unwrap();
    assert_eq!(usage_ev["choices"], json!([]));
    assert_eq!(usage_ev["usage"]["prompt_tokens"], 5);
    assert_eq!(
        usage_ev["usage"]["prompt_tokens_details"]["cached_tokens"],
        2
    );
    let text: String = chunks
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, STORY_TEXT);
    for e in chunks {
        assert_eq!(e["object"], "text_completion");
        assert!(e["usage"].is_null() && e.get("usage").is_some());
    }
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(chunks[0]["choices"][0]["finish_reason"].is_null());
    // Without include_usage there is no usage event and no usage key.
    let (_, events) = h.stream_at("/v1/completions", &json!({"prompt": "hi", "stream": true}));
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

#[test]
fn chat_uses_the_template_and_streams_deltas() {
    let h = story();
    let body = json!({"model": "x", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 20});
    let (status, v) = h.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    let req = &requests(&h)[0];
    // The built-in template writes <s>; encoding adds one more; exactly one is left.
    use tokenizer_actor::tokenizer::{BuiltinTokenizer, TextTokenizer};
    let want = BuiltinTokenizer::new()
        .encode("system: be brief\nuser: hi\nassistant:")
        .unwrap();
    assert_eq!(req.input_ids, want);
    assert_eq!(req.sampling.max_new_tokens, 20);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (status, events) = h.stream_at("/v1/chat/completions", &sbody);
    assert_eq!(status, 200);
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = events
        .iter()
        .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(content, v["choices"][0]["message"]["content"]);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    // Without a limit, chat may use the rest of the context.
    h.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    let req = requests(&h).pop().unwrap();
    assert_eq!(
        req.sampling.max_new_tokens as usize + req.input_ids.len(),
        protocol::builtin::CONTEXT_LEN
    );
}

#[test]
fn stop_strings_trim_and_abort_stream_or_not() {
    let h = story();
    for stream in [false, true] {
        let rid = format!("stop-{stream}");
        let body = json!({"prompt": "Once upon a time", "stop": ["dog", "zzz"], "rid": rid,
                          "stream": stream});
        let (text, finish, matched) = if stream {
            let (status, events) = h.stream_at("/v1/completions", &body);
            assert_eq!(status, 200);
            let text: String = events
                .iter()
                .map(|e| e["choices"][0]["text"].as_str().unwrap())
                .collect();
            let last = &events.last().unwrap()["choices"][0];
            (
                text,
                last["finish_reason"].clone(),
                last["matched_stop"].clone(),
            )
        } else {
            let (status, v) = h.post("/v1/completions", &body);
            assert_eq!(status, 200, "{v}");
            let c = &v["choices"][0];
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].clone(),
                c["matched_stop"].clone(),
            )
        };
        assert_eq!(text, " there was a little ");
        assert_eq!(finish, "stop");
        assert_eq!(matched, "dog");
        // The worker would have gone on: it is told to stop.
        h.wait_abort(&rid);
    }
    // /generate takes stop strings in sampling_params.
    let (status, v) = h.post(
        "/generate",
        &json!({"text": "Once upon a time", "sampling_params": {"stop": "little"}}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["text"], " there was a ");
    assert_eq!(
        v["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": "little"})
    );
}

#[test]
fn n_fans_out_with_derived_rids_and_seeds() {
    let h = story();
    let (status, v) = h.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "n": 3, "seed": 10, "rid": "fan", "temperature": 0.7}),
    );
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], STORY_TEXT);
    }
    let n_out = builtin_ids(STORY).len();
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 3 * n_out);
    let mut reqs = requests(&h);
    reqs.sort_by(|a, b| a.rid.cmp(&b.rid));
    let got: Vec<(String, Option<u64>)> = reqs
        .iter()
        .map(|r| (r.rid.clone(), r.sampling.seed))
        .collect();
    assert_eq!(
        got,
        vec![
            ("fan-0".into(), Some(10)),
            ("fan-1".into(), Some(11)),
            ("fan-2".into(), Some(12))
        ]
    );
    // Batched prompts × n, streaming: every choice index appears and finishes.
    let (status, events) = h.stream_at(
        "/v1/completions",
        &json!({"prompt": ["a", "b"], "n": 2, "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(status, 200);
    let mut finished: Vec<u64> = events
        .iter()
        .filter_map(|e| e["choices"].get(0))
        .filter(|c| !c["finish_reason"].is_null())
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    finished.sort();
    assert_eq!(finished, vec![0, 1, 2, 3]);
    assert_eq!(
        events.last().unwrap()["usage"]["completion_tokens"],
        4 * n_out
    );
}

#[test]
fn logprobs_of_chosen_tokens() {
    let h = story();
    let (status, v) = h.post("/v1/completions", &json!({"prompt": "hi", "logprobs": 0}));
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n_out = builtin_ids(STORY).len();
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n_out);
    assert_eq!(lp["token_logprobs"][0], json!(-0.1f32));
    assert_eq!(lp["tokens"][0], "there");
    assert!(requests(&h)[0].return_logprob);
    assert_eq!(requests(&h)[0].top_logprobs_num, 0);
    let (status, v) = h.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "max_tokens": 5}),
    );
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), n_out);
    assert_eq!(content[1]["token"], "was");
    assert_eq!(content[1]["top_logprobs"], json!([]));
    // Alternatives are asked of the worker: completions' `logprobs: k`, chat's `top_logprobs`.
    h.post("/v1/completions", &json!({"prompt": "hi", "logprobs": 5}));
    h.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 20}),
    );
    h.post(
        "/generate",
        &json!({"text": "hi", "return_logprob": true, "top_logprobs_num": 2}),
    );
    // Without return_logprob, SGLang ignores top_logprobs_num.
    h.post("/generate", &json!({"text": "hi", "top_logprobs_num": 2}));
    let reqs = requests(&h);
    let asked: Vec<(bool, u32)> = reqs[2..]
        .iter()
        .map(|r| (r.return_logprob, r.top_logprobs_num))
        .collect();
    assert_eq!(asked, vec![(true, 5), (true, 20), (true, 2), (false, 0)]);
}

#[test]
fn openai_errors_have_the_openai_shape() {
    let h = story();
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "a", "temperature": 3}),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 9000}),
            "max_tokens",
        ),
        ("/v1/completions", json!({"prompt": [1, 9000]}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": "a", "logit_bias": {"9000": 1}}),
            "logit_bias",
        ),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 0}),
            "n",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 6}),
            "logprobs",
        ),
        // Embeddings refused before anything reaches the controller.
        (
            "/v1/embeddings",
            json!({"input": "a", "dimensions": 16}),
            "dimensions",
        ),
        ("/v1/embeddings", json!({"input": [1, 9000]}), "input"),
        (
            "/v1/embeddings",
            json!({"input": vec![5; protocol::builtin::CONTEXT_LEN + 1]}),
            "input",
        ),
        ("/encode", json!({"text": ["a", 1]}), "text"),
        ("/encode", json!({"input_ids": [[1], [9000]]}), "input_ids"),
    ];
    for (path, body, param) in cases {
        let (status, v) = h.post(path, &body);
        assert_eq!(status, 400, "{body}: {v}");
        let e = &v["error"];
        assert_eq!(e["type"], "invalid_request_error", "{v}");
        assert_eq!(e["param"], param, "{body}: {v}");
        assert_eq!(e["code"], 400);
        assert!(e["message"].as_str().unwrap().len() > 5);
    }
    // A rank that is not live: 400 before anything streams.
    let (status, events) = h.stream_at(
        "/v1/completions",
        &json!({"prompt": "a", "stream": true, "data_parallel_rank": 7}),
    );
    assert_eq!(status, 400);
    assert!(events[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("rank 7 is not live"));
    let (status, _) = h.post("/v1/completions", &json!({"prompt": "still serving"}));
    assert_eq!(status, 200);
}

#[test]
fn routing_inputs_reach_the_controller_from_openai_endpoints() {
    let h = story();
    let resp = Harness::client()
        .post(h.url("/v1/chat/completions"))
        .header("x-smg-routing-key", "conv-9")
        .header("X-Data-Parallel-Rank", "1")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (status, _) = h.post(
        "/v1/completions",
        &json!({"prompt": "hi", "data_parallel_rank": 0, "routing_key": "body-key",
                "return_hidden_states": false, "bootstrap_room": 5}),
    );
    assert_eq!(status, 200);
    let reqs = requests(&h);
    assert_eq!(reqs[0].routing_key.as_deref(), Some("conv-9"));
    assert_eq!(reqs[0].routed_dp_rank, Some(1));
    assert_eq!(reqs[1].routing_key.as_deref(), Some("body-key"));
    assert_eq!(reqs[1].routed_dp_rank, Some(0));
    assert_eq!(reqs[1].bootstrap_room, Some(5));
}

#[test]
fn abort_request_ends_a_running_request() {
    let h = story();
    let url = h.url("/v1/completions");
    let waiter = std::thread::spawn(move || {
        let resp = Harness::client()
            .post(url)
            .json(&json!({"prompt": "hi", "rid": "hang-a", "n": 2}))
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.json::<Value>().unwrap())
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while requests(&h).len() < 2 {
        assert!(Instant::now() < deadline, "requests never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, v) = h.post("/abort_request", &json!({"rid": "hang-a"}));
    assert_eq!(status, 200, "{v}");
    let mut aborted: Vec<String> = serde_json::from_value(v["aborted"].clone()).unwrap();
    aborted.sort();
    assert_eq!(aborted, vec!["hang-a-0", "hang-a-1"]);
    let (status, v) = waiter.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "abort");
    assert_eq!(v["choices"][1]["finish_reason"], "abort");
    let (status, v) = h.post("/abort_request", &json!({"nope": 1}));
    assert_eq!((status, v["error"]["param"].clone()), (400, json!("rid")));
}

#[test]
fn metrics_are_prometheus_text_and_move() {
    let h = story();
    h.post("/v1/completions", &json!({"prompt": "Once upon a time"}));
    let text = h.metrics();
    for want in [
        "dpserve:num_running_reqs{dp_rank=\"0\"} 3",
        "dpserve:num_queue_reqs{dp_rank=\"1\"} 1",
        "dpserve:token_usage{dp_rank=\"0\"} 0.25",
        "dpserve:cache_hit_rate{dp_rank=\"0\"} 0.5",
        "dpserve:gen_throughput{dp_rank=\"1\"} 12.5",
        "dpserve:prompt_tokens_total{dp_rank=\"1\"} 5",
        "dpserve:cached_tokens_total{dp_rank=\"1\"} 2",
        "dpserve:time_to_first_token_seconds_count{dp_rank=\"1\"} 1",
        "dpserve:e2e_request_latency_seconds_count{dp_rank=\"1\"} 1",
        "dpserve:requests_total{dp_rank=\"1\",finish_reason=\"length\"} 1",
        "# TYPE dpserve:inter_token_latency_seconds histogram",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    h.post("/generate", &json!({"text": "Once upon a time"}));
    let text = h.metrics();
    assert!(
        text.contains("dpserve:prompt_tokens_total{dp_rank=\"1\"} 10"),
        "{text}"
    );
}

#[test]
fn every_key_of_the_key_file_is_accepted_and_open_endpoints_are_served_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api-keys");
    std::fs::write(&file, "# one key per client\nalpha-key\n\n  beta-key  \n").unwrap();
    let h = Harness::start_with(builtin_ids(STORY), |a| {
        a.http.api_key = Some("sekrit".into());
        a.http.api_key_file = Some(file.clone());
        a.http.open_endpoints = vec![OpenEndpoint::Metrics];
    });
    let c = Harness::client();
    let status = |path: &str, key: Option<&str>| {
        let req = c.get(h.url(path));
        let req = match key {
            Some(k) => req.bearer_auth(k),
            None => req,
        };
        req.send().unwrap().status().as_u16()
    };
    for key in ["sekrit", "alpha-key", "beta-key"] {
        assert_eq!(status("/v1/models", Some(key)), 200, "{key}");
        assert_eq!(status("/health", Some(key)), 200, "{key}");
    }
    for wrong in [
        None,
        Some("# one key per client"),
        Some("alpha"),
        Some("alpha-key2"),
    ] {
        assert_eq!(status("/v1/models", wrong), 401, "{wrong:?}");
    }
    // /metrics left open, /health keyed like the rest.
    assert_eq!(status("/metrics", None), 200);
    assert_eq!(status("/health", None), 401);
    let info: Value = c
        .get(h.url("/get_server_info"))
        .bearer_auth("beta-key")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(info["api_key_required"], true);

    // `none`: every endpoint wants a key.
    let h = Harness::start_with(builtin_ids(STORY), |a| {
        a.http.api_key_file = Some(file.clone());
        a.http.open_endpoints = vec![OpenEndpoint::None];
    });
    for path in ["/health", "/metrics"] {
        let resp = c.get(h.url(path)).send().unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
        let resp = c.get(h.url(path)).bearer_auth("alpha-key").send().unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
    }
}

#[test]
fn api_key_guards_everything_but_health() {
    let h = Harness::start_with(builtin_ids(STORY), |a| {
        a.http.api_key = Some("sekrit".into())
    });
    let c = Harness::client();
    assert_eq!(
        c.get(h.url("/health")).send().unwrap().status().as_u16(),
        200
    );
    for path in ["/v1/models", "/metrics", "/get_server_info"] {
        let resp = c.get(h.url(path)).send().unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
        let v: Value = resp.json().unwrap();
        assert_eq!(v["error"]["type"], "authentication_error");
        let resp = c.get(h.url(path)).bearer_auth("wrong").send().unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
        let resp = c.get(h.url(path)).bearer_auth("sekrit").send().unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
    }
    let resp = c
        .post(h.url("/v1/completions"))
        .json(&json!({"prompt": "hi"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = c
        .post(h.url("/v1/completions"))
        .bearer_auth("sekrit")
        .json(&json!({"prompt": "hi"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // Embeddings too; with the key, a bad body reaches validation (and no further).
    for (path, body) in [
        ("/v1/embeddings", json!({"input": "hi", "dimensions": 4})),
        ("/encode", json!({"text": 5})),
    ] {
        let resp = c.post(h.url(path)).json(&body).send().unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{path}");
        let resp = c
            .post(h.url(path))
            .bearer_auth("sekrit")
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{path}");
    }
}

/// SGLang's `sglext` with `return_cached_tokens_details` (what `bench_serving --cache-report`
/// asks), streamed and not, on both endpoints: the cached prompt tokens (the fake worker
/// reports 2) as `device`, once per prompt; absent unless asked.
#[test]
fn cached_tokens_details_come_in_sglext_when_asked() {
    let h = story();
    let details = json!({"cached_tokens_details": {"device": 2, "host": 0}});
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8});
    let completion = json!({"prompt": "Once upon a time", "max_tokens": 8});
    for (path, body) in [
        ("/v1/completions", &completion),
        ("/v1/chat/completions", &chat),
    ] {
        let (status, v) = h.post(path, body);
        assert_eq!(status, 200, "{v}");
        assert!(v.get("sglext").is_none(), "{path}: not asked: {v}");
        let mut asked = body.clone();
        asked["return_cached_tokens_details"] = json!(true);
        let (status, v) = h.post(path, &asked);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["sglext"], details, "{path}");

        // Streamed: on the last chunk with a choice (the one that finishes it), and only there.
        asked["stream"] = json!(true);
        asked["stream_options"] = json!({"include_usage": true});
        let (status, events) = h.stream_at(path, &asked);
        assert_eq!(status, 200);
        let with: Vec<usize> = (0..events.len())
            .filter(|&i| events[i].get("sglext").is_some())
            .collect();
        let last_choice = events
            .iter()
            .rposition(|e| !e["choices"].as_array().unwrap().is_empty())
            .unwrap();
        assert_eq!(with, [last_choice], "{path}: {events:?}");
        assert_eq!(events[last_choice]["sglext"], details, "{path}");
        assert!(!events[last_choice]["choices"][0]["finish_reason"].is_null());
    }
    // Two prompts: counted once each, as `usage` is.
    let body = json!({"prompt": ["a", "b"], "n": 2, "max_tokens": 4,
                      "return_cached_tokens_details": true});
    let (status, v) = h.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(v["sglext"]["cached_tokens_details"]["device"], 4);
    let (status, v) = h.post(
        "/v1/completions",
        &json!({"prompt": "a", "return_cached_tokens_details": "yes"}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "return_cached_tokens_details");
}
