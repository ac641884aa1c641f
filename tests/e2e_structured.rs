//! Structured output end to end: `dpserve up` on the real stories260k model (two ranks), asked
//! through SGLang's `sampling_params.json_schema` / `regex` / `ebnf` and OpenAI's
//! `response_format`. Whatever the model would rather say, every finished text is a document
//! of its schema (or matches its regex, its grammar), streamed or not, on every rank; what
//! does not compile is a 400 naming the problem, and the server serves on. The built-in model
//! refuses constraints by name (its word-level tokenizer has no byte pieces).

use crate::common;

use common::{stories_dir, Server};
use serde_json::{json, Value};

const PERSON: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "friends": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}},
    "required": ["name", "age"], "additionalProperties": false}"#;

/// `text` is a document [`PERSON`] accepts.
fn assert_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text:?}"));
    assert!(
        o.keys()
            .all(|k| ["name", "age", "friends"].contains(&k.as_str())),
        "{text:?}"
    );
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 12),
        "{text:?}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text:?}");
    if let Some(f) = o.get("friends") {
        let f = f.as_array().unwrap_or_else(|| panic!("{text:?}"));
        assert!(f.len() <= 2, "{text:?}");
        assert!(
            f.iter()
                .all(|x| x.as_str().is_some_and(|s| s.chars().count() <= 8)),
            "{text:?}"
        );
    }
}

fn stories() -> Option<Server> {
    let dir = stories_dir()?;
    Some(Server::up(&[
        "--model-path",
        dir.to_str().unwrap(),
        "--dp-size",
        "2",
    ]))
}

#[test]
fn sglang_s_constraints_hold_on_every_rank_streamed_or_not() {
    let Some(server) = stories() else { return };
    for seed in 0..6u64 {
        let body = json!({
            "text": "Once upon a time",
            "sampling_params": {"temperature": 1.0, "seed": seed, "max_new_tokens": 120,
                                "json_schema": PERSON},
            "routed_dp_rank": seed % 2,
        });
        let (status, resp) = server.post("/generate", &body);
        assert_eq!(status, 200, "{resp}");
        assert_eq!(resp["meta_info"]["finish_reason"]["type"], "stop", "{resp}");
        assert_person(resp["text"].as_str().unwrap());
        // The stream ends with the same text.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let chunks = server.stream("/generate", &streamed);
        let got = common::generate::produced(&chunks, common::generate::Form::Cumulative);
        assert_eq!(got.text, resp["text"], "seed {seed}");
    }
    let regex = r"(yes|no), (a|the) [a-z]{3,8}\.";
    for seed in 0..4u64 {
        let (status, resp) = server.post(
            "/generate",
            &json!({"text": "Once upon a time",
                    "sampling_params": {"temperature": 1.0, "seed": seed, "regex": regex}}),
        );
        assert_eq!(status, 200, "{resp}");
        let t = resp["text"].as_str().unwrap();
        let (word, rest) = t.split_once(", ").unwrap_or_else(|| panic!("{t:?}"));
        assert!(["yes", "no"].contains(&word), "{t:?}");
        let (article, noun) = rest.split_once(' ').unwrap_or_else(|| panic!("{t:?}"));
        assert!(["a", "the"].contains(&article), "{t:?}");
        let noun = noun.strip_suffix('.').unwrap_or_else(|| panic!("{t:?}"));
        assert!(
            (3..=8).contains(&noun.len()) && noun.bytes().all(|b| b.is_ascii_lowercase()),
            "{t:?}"
        );
    }
    let (status, resp) = server.post(
        "/generate",
        &json!({"text": "Once", "sampling_params": {"temperature": 0,
                "ebnf": "start: greeting \" \" name\ngreeting: \"hello\" | \"hi\"\nname: /[A-Z][a-z]{2,6}/"}}),
    );
    assert_eq!(status, 200, "{resp}");
    let t = resp["text"].as_str().unwrap();
    let (greeting, name) = t.split_once(' ').unwrap_or_else(|| panic!("{t:?}"));
    assert!(["hello", "hi"].contains(&greeting), "{t:?}");
    assert!(
        name.starts_with(|c: char| c.is_ascii_uppercase()) && (3..=7).contains(&name.len()),
        "{t:?}"
    );
}

#[test]
fn openai_s_response_format_on_completions_streamed_or_not() {
    let Some(server) = stories() else { return };
    let schema: Value = serde_json::from_str(PERSON).unwrap();
    let body = json!({
        "prompt": "Once upon a time", "max_tokens": 120, "temperature": 1.0, "seed": 3, "n": 3,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "person", "strict": true, "schema": schema}},
    });
    let (status, resp) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{resp}");
    for choice in resp["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "stop", "{choice}");
        assert_person(choice["text"].as_str().unwrap());
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["n"] = json!(1);
    let mut text = String::new();
    for chunk in server.stream("/v1/completions", &streamed) {
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap_or(""));
    }
    assert_person(&text);
    let (status, resp) = server.post(
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": 60, "temperature": 0.8, "seed": 1,
                "response_format": {"type": "json_object"}}),
    );
    assert_eq!(status, 200, "{resp}");
    let text = resp["choices"][0]["text"].as_str().unwrap();
    if resp["choices"][0]["finish_reason"] == "stop" {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text:?}");
    } else {
        assert!(text.starts_with('{'), "{text:?}");
    }
}

#[test]
fn what_does_not_compile_is_a_400_naming_it_and_the_server_serves_on() {
    let Some(server) = stories() else { return };
    let cases = [
        (
            json!({"json_schema": "{\"type\": \"foo\"}"}),
            "the JSON schema does not compile",
        ),
        (json!({"json_schema": "{not json"}), "not JSON"),
        (
            json!({"regex": "[a-z"}),
            "the regular expression does not compile",
        ),
        (
            json!({"ebnf": "start: nowhere"}),
            "the grammar does not compile",
        ),
        (
            json!({"ebnf": "root ::= <think>"}),
            "GBNF: token references",
        ),
        (json!({"regex": "a", "json_schema": "{}"}), "at most one"),
        (json!({"regex": "a", "ignore_eos": true}), "ignore_eos"),
    ];
    for (params, want) in cases {
        let (status, resp) = server.post(
            "/generate",
            &json!({"text": "a", "sampling_params": params}),
        );
        assert_eq!(status, 400, "{params}: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{params}: {msg}");
    }
    let (status, resp) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}}),
    );
    assert_eq!(status, 400, "{resp}");
    let (status, resp) = server.post(
        "/generate",
        &json!({"text": "Once", "sampling_params": {"max_new_tokens": 4, "regex": "[a-z ]+"}}),
    );
    assert_eq!(status, 200, "serves on: {resp}");
}

#[test]
fn the_built_in_model_refuses_constraints_by_name() {
    let server = Server::tiny(&[]);
    for params in [
        json!({"regex": "yes|no"}),
        json!({"json_schema": "{\"type\": \"object\"}"}),
    ] {
        let (status, resp) = server.post(
            "/generate",
            &json!({"text": "a", "sampling_params": params}),
        );
        assert_eq!(status, 400, "{resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("built-in model") && msg.contains("--model-path"),
            "{msg}"
        );
    }
    let (status, _) = server.post(
        "/generate",
        &json!({"text": "a", "sampling_params": {"max_new_tokens": 2}}),
    );
    assert_eq!(status, 200);
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                       "required": ["city", "days"]}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}])
}

/// `call` is a call of one of [`weather_tools`] with arguments its schema accepts.
fn assert_call(call: &Value) {
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    assert_eq!(call["type"], "function", "{call}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{call}: {e}"));
    match call["function"]["name"].as_str() {
        Some("get_weather") => {
            assert!(
                args["city"]
                    .as_str()
                    .is_some_and(|c| c.chars().count() <= 12),
                "{call}"
            );
            assert!(
                args["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)),
                "{call}"
            );
        }
        Some("now") => assert_eq!(args, json!({}), "{call}"),
        other => panic!("{other:?}: {call}"),
    }
}

#[test]
fn a_forced_tool_choice_returns_calls_whose_arguments_validate_streamed_or_not() {
    let Some(server) = stories() else { return };
    let ask = |choice: Value, extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                              "max_tokens": 120, "temperature": 1.0, "seed": 5,
                              "tools": weather_tools(), "tool_choice": choice});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for seed in 0..4 {
        let (status, resp) = server.post(
            "/v1/chat/completions",
            &ask(named.clone(), json!({"seed": seed})),
        );
        assert_eq!(status, 200, "{resp}");
        let choice = &resp["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
        assert_eq!(choice["message"]["content"], Value::Null, "{choice}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_call(&calls[0]);
    }
    let (status, resp) = server.post(
        "/v1/chat/completions",
        &ask(
            json!("required"),
            json!({"parallel_tool_calls": false, "n": 3}),
        ),
    );
    assert_eq!(status, 200, "{resp}");
    for choice in resp["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "parallel_tool_calls false: {choice}");
        assert_call(&calls[0]);
    }
    // Streamed: the call comes in the OpenAI delta form, on the choice's last chunk.
    let chunks = server.stream(
        "/v1/chat/completions",
        &ask(
            json!("required"),
            json!({"stream": true, "parallel_tool_calls": false, "max_tokens": 300}),
        ),
    );
    let mut calls = Vec::new();
    let mut finish = None;
    for chunk in &chunks {
        let c = &chunk["choices"][0];
        if let Some(list) = c["delta"]["tool_calls"].as_array() {
            calls.extend(list.iter().cloned());
        }
        if !c["finish_reason"].is_null() {
            finish = Some(c["finish_reason"].clone());
        }
    }
    assert_eq!(finish, Some(json!("tool_calls")));
    assert!(!calls.is_empty());
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["index"], i);
        assert_call(call);
    }
}

#[test]
fn tools_reach_the_template_and_what_cannot_be_served_is_a_400() {
    let Some(server) = stories() else { return };
    // A history with a call and its answer is a prompt like any other.
    let (status, resp) = server.post(
        "/v1/chat/completions",
        &json!({"messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "now", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "noon"}],
            "tools": weather_tools(), "tool_choice": "none", "max_tokens": 4}),
    );
    assert_eq!(status, 200, "{resp}");
    assert!(
        resp["choices"][0]["message"].get("tool_calls").is_none(),
        "{resp}"
    );
    let cases = [
        // stories260k's template (the plain fallback) writes no tool-call format.
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": weather_tools()}),
            "tool-call format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": weather_tools(),
            "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": weather_tools(),
            "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "not among the tools",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "tools": weather_tools()}),
            "completions",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
            "tool_choice": "required"}),
            "does not compile",
        ),
    ];
    for (path, body, want) in cases {
        let (status, resp) = server.post(path, &body);
        assert_eq!(status, 400, "{body}: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{body}: {msg}");
    }
}

#[test]
fn with_a_tool_call_parser_auto_answers_stream_as_content_until_a_call_starts() {
    let Some(dir) = stories_dir() else { return };
    let server = Server::up(&[
        "--model-path",
        dir.to_str().unwrap(),
        "--dp-size",
        "2",
        "--tool-call-parser",
        "hermes",
    ]);
    let body = json!({"messages": [{"role": "user", "content": "Tell me a story."}],
                      "tools": weather_tools(), "max_tokens": 24, "temperature": 0});
    let (status, resp) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{resp}");
    let choice = &resp["choices"][0];
    // stories260k writes a story, not <tool_call>: content.
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
    let content = choice["message"]["content"].as_str().unwrap();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = server.stream("/v1/chat/completions", &streamed);
    let pieces: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    assert!(pieces.len() > 1, "content streams as it comes: {pieces:?}");
    assert_eq!(pieces.concat(), content);
}
