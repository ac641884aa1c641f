//! Structured output end to end: `dpserve up` on the real stories260k model (two ranks), asked
//! through SGLang's `sampling_params.json_schema` / `regex` / `ebnf` and OpenAI's
//! `response_format`. Whatever the model would rather say, every finished text is a document
//! of its schema (or matches its regex, its grammar), streamed or not, on every rank; what
//! does not compile is a 400 naming the problem, and the server serves on. The built-in model
//! refuses constraints by name (its word-level tokenizer has no byte pieces).

mod common;

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
        (json!({"ebnf": "root ::= \"a\""}), "GBNF"),
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
