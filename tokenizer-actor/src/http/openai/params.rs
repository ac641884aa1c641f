//! Checking the body of `/v1/completions` and `/v1/chat/completions`, read into its type by
//! `body`, and turning it into what the rest of the server understands. Ranges follow OpenAI's API (temperature ≤ 2, penalties
//! in [-2, 2], logit bias in [-100, 100], at most 4 stop strings, 1 ≤ n ≤ 128); every error
//! names its `param`. SGLang/vLLM extensions (`top_k`, `min_p`, `repetition_penalty`,
//! `stop_token_ids`, `ignore_eos`, `routing_key`, `data_parallel_rank`, `rid`,
//! `return_cached_tokens_details`) are accepted;
//! unknown fields are ignored. Features this server does not have are refused by name
//! (`functions`, tools on completions, suffix, best_of > n), never faked. Structured output
//! (`response_format`) and a forced tool choice become the request's constraint.

use protocol::SamplingParams;
use serde_json::Value;

use crate::chat_template::ChatMessage;
use crate::http::body;
use crate::http::error::ApiError;
use crate::http::schema::fields::Prompt;
use crate::http::schema::requests::{
    ChatCompletionRequest, ChatMessage as RequestMessage, CompletionRequest, OpenAiSampling,
};
use crate::http::validate::{self, HeaderInputs};
use crate::http::validation_error::ValidationError;

/// Largest `n` (OpenAI's limit), and most choices per request including batched prompts.
pub const MAX_N: usize = 128;
/// Completions' `logprobs` and chat's `top_logprobs` limits.
const MAX_COMPLETION_LOGPROBS: u32 = 5;
const MAX_CHAT_TOP_LOGPROBS: u32 = 20;
/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completions,
    Chat,
}

/// A valid OpenAI request, before tokenization.
#[derive(Debug, Clone)]
pub struct OpenAiRequest {
    pub model: Option<String>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// `max_new_tokens` is set from `max_tokens` when given; see `max_tokens`.
    pub sampling: SamplingParams,
    /// `None` for chat without a limit: the rest of the context.
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub logprobs: bool,
    /// With `logprobs`: alternatives per token (completions' `logprobs: k`, chat's
    /// `top_logprobs`).
    pub top_logprobs: u32,
    pub echo: bool,
    pub dispatch: validate::Dispatch,
    pub prompts: Vec<Prompt>,
    pub messages: Vec<ChatMessage>,
    pub add_generation_prompt: bool,
    /// SGLang's `return_cached_tokens_details`: answer `sglext.cached_tokens_details`.
    pub return_cached_tokens_details: bool,
    /// Chat: the request's tools (see `tools`).
    pub tools: Option<super::tools::Tools>,
}

fn refuse(param: &'static str, what: &'static str) -> ApiError {
    ValidationError::Unsupported { param, what }.into()
}

/// The request body, read into its type and checked.
pub fn parse(body: &[u8], headers: &HeaderInputs, kind: Kind) -> Result<OpenAiRequest, ApiError> {
    match kind {
        Kind::Completions => completions(body::read(body)?, headers),
        Kind::Chat => chat(body::read(body)?, headers),
    }
}

/// What the two endpoints spell differently, checked by each; the rest is [`shared`]'s.
struct Own {
    kind: Kind,
    max_tokens: Option<u32>,
    /// Whether log-probabilities are asked for, and how many alternatives per token.
    logprobs: (bool, u32),
    best_of: Option<i64>,
    echo: Option<bool>,
    suffix: Option<String>,
}

fn completions(body: CompletionRequest, headers: &HeaderInputs) -> Result<OpenAiRequest, ApiError> {
    let logprobs = match body.logprobs {
        None => (false, 0),
        Some(got) if got > MAX_COMPLETION_LOGPROBS => {
            let max = MAX_COMPLETION_LOGPROBS;
            return Err(ValidationError::Logprobs { max, got }.into());
        }
        Some(k) => (true, k),
    };
    let own = Own {
        kind: Kind::Completions,
        max_tokens: Some(
            at_least_one("max_tokens", body.max_tokens)?.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS),
        ),
        logprobs,
        best_of: body.best_of,
        echo: body.echo,
        suffix: body.suffix,
    };
    let mut r = shared(body.sampling, own, headers)?;
    let prompts = body
        .prompt
        .ok_or(ValidationError::Required { param: "prompt" })?
        .items;
    if prompts.len() * r.n > MAX_N {
        let got = prompts.len() * r.n;
        return Err(ValidationError::TooManyChoices { max: MAX_N, got }.into());
    }
    r.prompts = prompts;
    Ok(r)
}

fn chat(body: ChatCompletionRequest, headers: &HeaderInputs) -> Result<OpenAiRequest, ApiError> {
    // Both checked, though max_completion_tokens wins: a bad field is a 400 wherever it is.
    let legacy = at_least_one("max_tokens", body.max_tokens)?;
    let max_tokens = at_least_one("max_completion_tokens", body.max_completion_tokens)?.or(legacy);
    let on = body.logprobs.unwrap_or(false);
    let logprobs = match body.top_logprobs {
        None | Some(0) => (on, 0),
        Some(got) if got > MAX_CHAT_TOP_LOGPROBS => {
            let max = MAX_CHAT_TOP_LOGPROBS;
            return Err(ValidationError::TopLogprobs { max, got }.into());
        }
        Some(_) if !on => return Err(ValidationError::TopLogprobsWithoutLogprobs.into()),
        Some(k) => (true, k),
    };
    let own = Own {
        kind: Kind::Chat,
        max_tokens,
        logprobs,
        best_of: body.best_of,
        echo: body.echo,
        suffix: body.suffix,
    };
    let mut r = shared(body.sampling, own, headers)?;
    r.messages = chat_messages(body.messages)?;
    r.add_generation_prompt = body.add_generation_prompt.unwrap_or(true);
    Ok(r)
}

/// The fields both endpoints take, checked; no prompt yet.
fn shared(s: OpenAiSampling, own: Own, headers: &HeaderInputs) -> Result<OpenAiRequest, ApiError> {
    let n = choices(s.n, own.best_of)?;
    let include_usage = match &s.stream_options {
        None => false,
        Some(_) if s.stream != Some(true) => {
            return Err(ValidationError::StreamOptionsWithoutStream.into())
        }
        Some(o) => o.include_usage.unwrap_or(false),
    };
    refuse_unsupported(&s, own.suffix.as_deref())?;
    let mut sampling = sampling(&s, own.max_tokens)?;
    let tools = super::tools::parse(
        s.tools.as_ref(),
        s.tool_choice.as_ref(),
        s.parallel_tool_calls,
    )?;
    if let Some(tools) = &tools {
        if own.kind == Kind::Completions {
            return Err(refuse(
                "tools",
                "tool calling on completions (use chat completions)",
            ));
        }
        if let Some(c) = tools.constraint() {
            if sampling.constraint.is_some() {
                return Err(ValidationError::ToolChoiceWithResponseFormat.into());
            }
            sampling.constraint = Some(c);
        }
    }
    let dispatch = s.dispatch.check(headers)?;
    let echo = own.echo.unwrap_or(false);
    if echo && own.kind == Kind::Chat {
        return Err(refuse("echo", "echo on chat completions"));
    }
    Ok(OpenAiRequest {
        model: s.model,
        n,
        stream: s.stream.unwrap_or(false),
        include_usage,
        sampling,
        max_tokens: own.max_tokens,
        stop: s.stop.unwrap_or_default().0,
        logprobs: own.logprobs.0,
        top_logprobs: own.logprobs.1,
        echo,
        dispatch,
        prompts: Vec::new(),
        messages: Vec::new(),
        add_generation_prompt: false,
        return_cached_tokens_details: s.return_cached_tokens_details.unwrap_or(false),
        tools,
    })
}

/// `temperature`, `top_p` and `top_k` in range, with vLLM's `top_k: 0` as off and `top_p: 0`
/// as greedy.
fn temperature_top_p_top_k(s: &OpenAiSampling) -> Result<(f32, f32, i32), ApiError> {
    let temperature = s.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ValidationError::Temperature { got: temperature }.into());
    }
    let mut top_p = s.top_p.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&top_p) {
        return Err(ValidationError::OpenAiTopP { got: top_p }.into());
    }
    let mut top_k = s.top_k.unwrap_or(-1);
    if top_k == 0 {
        top_k = -1; // vLLM's spelling of "off"
    }
    if top_p == 0.0 {
        // Only the most likely token is left: greedy.
        top_p = 1.0;
        top_k = 1;
    }
    Ok((temperature, top_p, top_k))
}

/// `n` in [1, MAX_N], and `best_of`, which may only equal it.
fn choices(n: Option<i64>, best_of: Option<i64>) -> Result<usize, ApiError> {
    let n = n.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(ValidationError::N { max: MAX_N, got: n }.into());
    }
    if let Some(best_of) = best_of {
        if best_of < n {
            return Err(ValidationError::BestOfBelowN.into());
        }
        if best_of != n {
            return Err(refuse("best_of", "best_of greater than n"));
        }
    }
    Ok(n as usize)
}

/// Features this server does not have: refused by name rather than ignored.
fn refuse_unsupported(s: &OpenAiSampling, suffix: Option<&str>) -> Result<(), ApiError> {
    let non_empty = |v: &Option<Value>| {
        v.as_ref()
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
    };
    if non_empty(&s.functions) {
        return Err(refuse("functions", "the deprecated functions (use tools)"));
    }
    if suffix.is_some_and(|s| !s.is_empty()) {
        return Err(refuse("suffix", "suffix"));
    }
    Ok(())
}

/// OpenAI's `response_format` as a constraint: none for `text`, any JSON object for
/// `json_object`, the given schema's documents for `json_schema` (with or without `strict`: the
/// output is enforced either way).
fn response_format(rf: Option<&Value>) -> Result<Option<protocol::Constraint>, ApiError> {
    let Some(rf) = rf.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(protocol::Constraint::JsonSchema(
            r#"{"type": "object"}"#.into(),
        ))),
        Some("json_schema") => {
            let Some(js) = rf.get("json_schema").filter(|v| v.is_object()) else {
                return Err(ValidationError::JsonSchemaRequired.into());
            };
            if !js.get("name").is_some_and(Value::is_string) {
                return Err(ValidationError::JsonSchemaName.into());
            }
            // OpenAI's default schema, when none is given, is any JSON value.
            let schema = js.get("schema").cloned().unwrap_or(Value::Bool(true));
            validate::json_schema_constraint(schema, "response_format.json_schema.schema").map(Some)
        }
        Some(other) => {
            let got = other.to_string();
            Err(ValidationError::ResponseFormatType { got }.into())
        }
        None => Err(ValidationError::ResponseFormatTypeRequired.into()),
    }
}

/// The sampling parameters, with the SGLang/vLLM extensions, checked as `/generate`'s are.
fn sampling(s: &OpenAiSampling, max_tokens: Option<u32>) -> Result<SamplingParams, ApiError> {
    let (temperature, top_p, top_k) = temperature_top_p_top_k(s)?;
    let d = SamplingParams::default();
    let sampling = SamplingParams {
        max_new_tokens: max_tokens.unwrap_or(d.max_new_tokens),
        temperature,
        top_p,
        top_k,
        min_p: s.min_p.unwrap_or(d.min_p),
        seed: s.seed.map(|s| s as u64),
        repetition_penalty: s.repetition_penalty.unwrap_or(d.repetition_penalty),
        frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
        stop_token_ids: s.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: s.ignore_eos.unwrap_or(false),
        logit_bias: s.logit_bias.clone().unwrap_or_default().0,
        constraint: response_format(s.response_format.as_ref())?,
    };
    validate::check_sampling(&sampling, "")?;
    Ok(sampling)
}

/// `name` (a completion limit), at least 1 when given; above `u32::MAX` it is `u32::MAX`.
fn at_least_one(name: &'static str, value: Option<i64>) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(None),
        Some(got) if got < 1 => Err(ValidationError::AtLeastOne { param: name, got }.into()),
        Some(m) => Ok(Some(m.min(u32::MAX as i64) as u32)),
    }
}

/// `messages`: not empty, each with a role.
fn chat_messages(messages: Option<Vec<RequestMessage>>) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = messages.ok_or(ValidationError::MessagesRequired)?;
    if messages.is_empty() {
        return Err(ValidationError::MessagesEmpty.into());
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(index, m)| {
            let role = m.role.ok_or(ValidationError::MessageRole { index })?;
            let tool_calls = m.tool_calls.filter(|v| !v.is_null());
            let is_call = |c: &Value| {
                c.pointer("/function/name").is_some_and(Value::is_string)
                    && c.pointer("/function/arguments")
                        .is_none_or(|a| a.is_string() || a.is_object())
                    && c.get("type").is_none_or(|t| t == "function")
                    && c.get("id").is_none_or(Value::is_string)
            };
            let calls_ok = tool_calls
                .as_ref()
                .is_none_or(|c| c.as_array().is_some_and(|l| l.iter().all(is_call)));
            if !calls_ok {
                return Err(ValidationError::MessageToolCalls { index }.into());
            }
            Ok(ChatMessage {
                role: role.as_str().to_string(),
                content: m.content.unwrap_or_default().0,
                tool_calls: tool_calls
                    .as_ref()
                    .map(ChatMessage::tool_calls_for_template),
                tool_call_id: m.tool_call_id,
                name: m.name,
            })
        })
        .collect()
}

/// One prompt's sampling, checked against `limits` (no `max_tokens`: to the end of the
/// context, as OpenAI); a 400 names the field as this endpoint spells it.
pub(super) fn prompt_sampling(
    r: &OpenAiRequest,
    ids: &[u32],
    limits: &validate::Limits,
    kind: Kind,
) -> Result<protocol::SamplingParams, ApiError> {
    let mut sampling = r.sampling.clone();
    if r.max_tokens.is_none() {
        sampling.max_new_tokens = limits.context_len.saturating_sub(ids.len()).max(1) as u32;
    }
    validate::check_limits(ids, &sampling, r.dispatch.routed_dp_rank, limits).map_err(
        |e| match (e.param.as_deref(), kind) {
            (Some("input_ids"), _) => e.with_param("prompt"),
            (Some("max_tokens"), Kind::Chat) => e.with_param("max_completion_tokens"),
            _ => e,
        },
    )?;
    Ok(sampling)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_as(kind: Kind, body: &str) -> Result<OpenAiRequest, ApiError> {
        parse(body.as_bytes(), &HeaderInputs::default(), kind)
    }

    #[test]
    fn an_empty_prompt_text_is_a_prompt() {
        let r = parse_as(Kind::Completions, r#"{"prompt": ""}"#).unwrap();
        assert!(matches!(&r.prompts[..], [Prompt::Text(t)] if t.is_empty()));
        let max = protocol::MAX_RID_LEN;
        let body = format!(r#"{{"prompt": "a", "rid": "{}"}}"#, "r".repeat(max));
        assert!(
            parse_as(Kind::Completions, &body).is_ok(),
            "the one rid limit"
        );
    }

    #[test]
    fn bad_parameters_name_their_param() {
        let cases: &[(Kind, &str, &str)] = &[
            (
                Kind::Completions,
                r#"{"prompt": "a", "temperature": 3}"#,
                "temperature",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "top_p": 1.5}"#,
                "top_p",
            ),
            (Kind::Completions, r#"{"prompt": "a", "n": 0}"#, "n"),
            (Kind::Completions, r#"{"prompt": "a", "n": 129}"#, "n"),
            (
                Kind::Completions,
                r#"{"prompt": "a", "max_tokens": 0}"#,
                "max_tokens",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "max_tokens": "x"}"#,
                "max_tokens",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "presence_penalty": -2.5}"#,
                "presence_penalty",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "frequency_penalty": 9}"#,
                "frequency_penalty",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "logit_bias": {"1": 200}}"#,
                "logit_bias",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "stop": ["1","2","3","4","5"]}"#,
                "stop",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "logprobs": 6}"#,
                "logprobs",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "logprobs": -1}"#,
                "logprobs",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "best_of": 3}"#,
                "best_of",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "suffix": "x"}"#,
                "suffix",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "a", "stream_options": {"include_usage": true}}"#,
                "stream_options",
            ),
            (Kind::Completions, r#"{}"#, "prompt"),
            (Kind::Completions, r#"{"prompt": [1, "a"]}"#, "prompt"),
            (Kind::Completions, r#"{"prompt": [[]]}"#, "prompt"),
            (Kind::Chat, r#"{"messages": []}"#, "messages"),
            (
                Kind::Chat,
                r#"{"messages": [{"content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages[0].content",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
                "top_logprobs",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}"#,
                "top_logprobs",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
                "tools",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "structural_tag"}}"#,
                "response_format",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}"#,
                "response_format",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}"#,
                "response_format",
            ),
            (
                Kind::Completions,
                r#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}}"#,
                "response_format.json_schema.schema",
            ),
            (
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}"#,
                "max_completion_tokens",
            ),
        ];
        for (kind, body, param) in cases {
            let err = parse_as(*kind, body).expect_err(body);
            assert_eq!(err.status, 400, "{body}");
            assert_eq!(
                err.param.as_deref(),
                Some(*param),
                "{body}: {}",
                err.message
            );
        }
        let err = parse_as(
            Kind::Chat,
            r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
        )
        .unwrap_err();
        assert!(
            err.message.contains("requires logprobs to be true"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_field_of_the_wrong_shape_is_named_by_its_path() {
        let chat = |messages: &str| {
            let body = format!(r#"{{"messages": {messages}}}"#);
            parse_as(Kind::Chat, &body).unwrap_err()
        };
        let cases = [
            (
                r#"[{"role": "wizard"}]"#,
                r#"messages[0].role: unknown role "wizard""#,
            ),
            (r#"[{"role": 5}]"#, "messages[0].role: expected a string"),
            (r#"[{"role": "user"}, {}]"#, "messages[1].role is required"),
            (
                r#"[{"role": "user", "content": 5}]"#,
                "messages[0].content: expected a string or a list of parts",
            ),
        ];
        for (messages, want) in cases {
            assert_eq!(chat(messages).message, want, "{messages}");
        }
        // A field of a flattened part (the shared sampling fields, their routing fields).
        let err = parse_as(
            Kind::Completions,
            r#"{"prompt": "a", "routed_dp_rank": "x"}"#,
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("routed_dp_rank"));
        assert!(
            err.message.starts_with("routed_dp_rank: invalid type"),
            "{}",
            err.message
        );
        let err = parse_as(
            Kind::Completions,
            r#"{"prompt": "a", "stop_token_ids": [1, -1]}"#,
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("stop_token_ids"));
        assert!(
            err.message.starts_with("stop_token_ids[1]: "),
            "{}",
            err.message
        );
    }

    #[test]
    fn response_format_becomes_the_request_s_constraint() {
        use protocol::Constraint;
        let constraint = |rf: &str| {
            let body = format!(
                r#"{{"messages": [{{"role": "user", "content": "x"}}], "response_format": {rf}}}"#
            );
            parse_as(Kind::Chat, &body).unwrap().sampling.constraint
        };
        assert_eq!(constraint(r#"{"type": "text"}"#), None);
        assert_eq!(constraint("null"), None);
        assert_eq!(
            constraint(r#"{"type": "json_object"}"#),
            Some(Constraint::JsonSchema(r#"{"type": "object"}"#.into()))
        );
        assert_eq!(
            constraint(
                r#"{"type": "json_schema", "json_schema": {"name": "p", "strict": true, "schema": {"type": "integer"}}}"#
            ),
            Some(Constraint::JsonSchema(r#"{"type":"integer"}"#.into()))
        );
        // No schema: OpenAI's default, any JSON value.
        assert_eq!(
            constraint(r#"{"type": "json_schema", "json_schema": {"name": "p"}}"#),
            Some(Constraint::JsonSchema("true".into()))
        );
        let r = parse_as(
            Kind::Completions,
            r#"{"prompt": "x", "response_format": {"type": "json_object"}}"#,
        )
        .unwrap();
        assert!(r.sampling.constraint.is_some(), "completions too");
    }

    #[test]
    fn good_requests_parse() {
        let r = parse_as(
            Kind::Completions,
            r#"{"model": "m", "prompt": ["a", "b"], "n": 2, "stop": "x", "seed": 5, "top_p": 0,
                "logit_bias": {"7": -100}, "stream": true, "stream_options": {"include_usage": true},
                "logprobs": 0, "data_parallel_rank": 1, "user": "u", "extra_field": 1}"#,
        )
        .unwrap();
        assert_eq!(
            r.prompts,
            vec![Prompt::Text("a".into()), Prompt::Text("b".into())]
        );
        assert_eq!(
            (r.n, r.stream, r.include_usage, r.logprobs),
            (2, true, true, true)
        );
        assert_eq!(r.sampling.max_new_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS);
        assert_eq!((r.sampling.top_k, r.sampling.seed), (1, Some(5)));
        assert_eq!(r.sampling.logit_bias, vec![(7, -100.0)]);
        assert_eq!(r.dispatch.routed_dp_rank, Some(1));
        let r = parse_as(Kind::Completions, r#"{"prompt": [[1, 2], [3]]}"#).unwrap();
        assert_eq!(
            r.prompts,
            vec![Prompt::Ids(vec![1, 2]), Prompt::Ids(vec![3])]
        );
        let r = parse_as(
            Kind::Chat,
            r#"{"messages": [{"role": "system", "content": null},
                             {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                "max_tokens": 9, "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 0}"#,
        )
        .unwrap();
        assert_eq!(r.messages[1].content, "ab");
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!((r.logprobs, r.top_logprobs), (true, 0));
        let top = |kind, body: &str| {
            let r = parse_as(kind, body).unwrap();
            (r.logprobs, r.top_logprobs)
        };
        assert_eq!(
            top(Kind::Completions, r#"{"prompt": "a", "logprobs": 5}"#),
            (true, 5)
        );
        assert_eq!(top(Kind::Completions, r#"{"prompt": "a"}"#), (false, 0));
        assert_eq!(
            top(
                Kind::Chat,
                r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 20}"#
            ),
            (true, 20)
        );
        let r = parse_as(
            Kind::Chat,
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, None);
    }
}
