//! Tools checked, forced choices' constraints, and answers read back in each model's format
//! (the texts are what Qwen2.5/Qwen3, Llama 3.1 and Mistral write, per their chat templates).

use super::*;

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}])
}

fn tools(choice: Value) -> Tools {
    parse(Some(&weather()), Some(&choice), None)
        .unwrap()
        .unwrap()
}

#[test]
fn tools_and_the_choice_are_checked() {
    let t = tools(json!("auto"));
    assert_eq!(t.tools.len(), 2);
    assert_eq!(
        t.tools[1].parameters,
        json!({"type": "object", "properties": {}})
    );
    assert_eq!(t.spec, weather());
    assert_eq!(
        parse(Some(&weather()), None, None).unwrap().unwrap().choice,
        ToolChoice::Auto
    );
    assert_eq!(parse(None, None, None).unwrap(), None);
    assert_eq!(
        parse(Some(&json!([])), Some(&json!("none")), None).unwrap(),
        None
    );
    let named = json!({"type": "function", "function": {"name": "now"}});
    assert_eq!(tools(named).choice, ToolChoice::Named("now".into()));
    let err = |tools: Value, choice: Value| {
        parse(Some(&tools), Some(&choice), None)
            .unwrap_err()
            .message
    };
    assert!(err(json!([{"type": "retrieval"}]), json!("auto")).contains("only type \"function\""));
    assert!(err(
        json!([{"type": "function", "function": {"name": "a b"}}]),
        json!("auto")
    )
    .contains("not a function name"));
    assert!(err(
        json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]),
        json!("auto")
    )
    .contains("JSON Schema"));
    let twice = json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]);
    assert!(err(twice, json!("auto")).contains("given twice"));
    assert!(err(weather(), json!("sometimes")).contains("not one of"));
    assert!(err(
        weather(),
        json!({"type": "function", "function": {"name": "nope"}})
    )
    .contains("not among the tools"));
    assert!(err(json!([]), json!("required")).contains("needs tools"));
    assert!(err(json!({"a": 1}), json!("auto")).contains("a list"));
}

#[test]
fn a_forced_choice_is_a_constraint_and_auto_is_none() {
    assert_eq!(tools(json!("auto")).constraint(), None);
    assert_eq!(tools(json!("none")).constraint(), None);
    let Some(Constraint::JsonSchema(named)) =
        tools(json!({"type": "function", "function": {"name": "get_weather"}})).constraint()
    else {
        panic!()
    };
    assert_eq!(
        serde_json::from_str::<Value>(&named).unwrap(),
        weather()[0]["function"]["parameters"]
    );
    let Some(Constraint::JsonSchema(required)) = tools(json!("required")).constraint() else {
        panic!()
    };
    let required: Value = serde_json::from_str(&required).unwrap();
    assert_eq!(required["minItems"], 1);
    assert!(required.get("maxItems").is_none());
    assert_eq!(
        required["items"]["anyOf"][0]["properties"]["name"]["const"],
        "get_weather"
    );
    let single = parse(Some(&weather()), Some(&json!("required")), Some(false))
        .unwrap()
        .unwrap();
    let Some(Constraint::JsonSchema(single)) = single.constraint() else {
        panic!()
    };
    assert_eq!(
        serde_json::from_str::<Value>(&single).unwrap()["maxItems"],
        1
    );
}

fn call(name: &str, arguments: &str) -> Call {
    Call {
        name: name.into(),
        arguments: arguments.into(),
    }
}

#[test]
fn forced_answers_are_read_when_complete() {
    let named = tools(json!({"type": "function", "function": {"name": "get_weather"}}));
    let r = named.read(r#"{"city":"Paris"}"#, true, None);
    assert_eq!(
        (r.content, r.calls),
        (None, vec![call("get_weather", r#"{"city":"Paris"}"#)])
    );
    // Cut by max_tokens: not a call, the text is the content.
    let r = named.read(r#"{"city":"Pa"#, false, None);
    assert_eq!(r.calls, vec![]);
    let required = tools(json!("required"));
    let r = required.read(
        r#"[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"now","arguments":{}}]"#,
        true,
        None,
    );
    assert_eq!(
        r.calls,
        vec![call("get_weather", r#"{"city":"Oslo"}"#), call("now", "{}")]
    );
}

#[test]
fn auto_answers_are_read_in_the_model_s_format() {
    let auto = tools(json!("auto"));
    let hermes = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let r = auto.read(hermes, true, Some(Format::Hermes));
    assert_eq!(r.content.as_deref(), Some("Let me look."));
    assert_eq!(
        r.calls,
        vec![
            call("get_weather", r#"{"city":"Paris"}"#),
            call("now", "{}")
        ]
    );
    let llama = r#"{"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "now", "parameters": {}}"#;
    let r = auto.read(llama, true, Some(Format::Llama3));
    assert_eq!((r.content, r.calls.len()), (None, 2));
    assert_eq!(r.calls[0], call("get_weather", r#"{"city":"Rome"}"#));
    let mistral = r#"[TOOL_CALLS] [{"name": "now", "arguments": {}}]"#;
    assert_eq!(
        auto.read(mistral, true, Some(Format::Mistral)).calls,
        vec![call("now", "{}")]
    );
    // Ordinary answers, and calls that do not parse, are content.
    for (text, f) in [
        ("It is sunny.", Format::Hermes),
        (
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": 1</tool_call>",
            Format::Hermes,
        ),
        ("{not json", Format::Llama3),
        ("Sure: [1, 2]", Format::Mistral),
    ] {
        let r = auto.read(text, true, Some(f));
        assert_eq!(
            (r.content.as_deref(), r.calls.len()),
            (Some(text), 0),
            "{text}"
        );
    }
    assert_eq!(
        tools(json!("none"))
            .read(hermes, true, Some(Format::Hermes))
            .calls,
        vec![]
    );
}

#[test]
fn formats_are_named_as_sglang_names_them_or_read_from_the_template() {
    assert_eq!(Format::parse("qwen25"), Ok(Format::Hermes));
    assert_eq!(Format::parse("llama3"), Ok(Format::Llama3));
    assert!(Format::parse("pythonic").unwrap_err().contains("hermes"));
    assert_eq!(
        Format::of_template("{{- '<tool_call>\\n' }}"),
        Some(Format::Hermes)
    );
    assert_eq!(
        Format::of_template("Environment: ipython"),
        Some(Format::Llama3)
    );
    assert_eq!(Format::of_template("{{ message.content }}"), None);
}

#[test]
fn history_arguments_given_as_text_reach_the_template_as_objects() {
    let calls = json!([{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}},
                       {"id": "c2", "type": "function", "function": {"name": "now", "arguments": {"tz": "CET"}}}]);
    let t = crate::chat_template::ChatMessage::tool_calls_for_template(&calls);
    assert_eq!(t[0]["function"]["arguments"], json!({"tz": "UTC"}));
    assert_eq!(t[1]["function"]["arguments"], json!({"tz": "CET"}));
    let out = calls_json(&[call("now", "{}")], true);
    assert!(
        out[0]["id"].as_str().unwrap().starts_with("call_")
            && out[0]["id"].as_str().unwrap().len() == 29
    );
    assert_eq!(out[0]["index"], 0);
    assert_eq!(out[0]["function"]["arguments"], "{}");
}

#[test]
fn a_stream_sends_content_until_a_call_may_be_starting() {
    let auto = tools(json!("auto"));
    let h = Some(Format::Hermes);
    assert_eq!(auto.streamable("It is sunny.", h), 12);
    assert_eq!(
        auto.streamable("Let me look.\n<tool", h),
        13,
        "a tail that may grow into <tool_call>"
    );
    assert_eq!(auto.streamable("Let me look.\n<tool_call>\n{\"na", h), 13);
    assert_eq!(
        auto.streamable("a < b", h),
        5,
        "a '<' that cannot begin it no longer waits"
    );
    assert_eq!(auto.streamable("é<", h), 2);
    let l = Some(Format::Llama3);
    assert_eq!(auto.streamable("  ", l), 0, "nothing to tell yet");
    assert_eq!(auto.streamable(" {\"name\"", l), 0);
    assert_eq!(auto.streamable("Sure, {x}", l), 9);
    assert_eq!(auto.streamable("[{", Some(Format::Mistral)), 0);
    assert_eq!(tools(json!("required")).streamable("[{\"name\"", h), 0);
    assert_eq!(tools(json!("none")).streamable("<tool_call>", h), 11);
}
