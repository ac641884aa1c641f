//! Parsing and validating the body of `/v1/completions` and `/v1/chat/completions` into what
//! the rest of the server understands. Ranges follow OpenAI's API (temperature ≤ 2, penalties
//! in [-2, 2], logit bias in [-100, 100], at most 4 stop strings, 1 ≤ n ≤ 128); every error
//! names its `param`. SGLang/vLLM extensions (`top_k`, `min_p`, `repetition_penalty`,
//! `stop_token_ids`, `ignore_eos`, `routing_key`, `data_parallel_rank`, `rid`,
//! `return_cached_tokens_details`) are accepted;
//! unknown fields are ignored. Features this server does not have are refused by name
//! (tools, structured output, suffix, best_of > n), never faked.

use protocol::SamplingParams;
use serde_json::{Map, Value};

use crate::chat_template::ChatMessage;
use crate::http::error::ApiError;
use crate::http::validate::{self, field, HeaderInputs, Prompt};

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
    pub routing_key: Option<String>,
    pub routed_dp_rank: Option<u32>,
    pub bootstrap_room: Option<u64>,
    pub rid: Option<String>,
    pub prompts: Vec<Prompt>,
    pub messages: Vec<ChatMessage>,
    pub add_generation_prompt: bool,
    /// SGLang's `return_cached_tokens_details`: answer `sglext.cached_tokens_details`.
    pub return_cached_tokens_details: bool,
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::bad_request("request body must be a JSON object")),
    }
}

fn refuse(param: &str, what: &str) -> ApiError {
    ApiError::invalid_param(
        param,
        format!("{param}: {what} is not supported by this server"),
    )
}

/// The request body, checked; each check in the order its error is reported.
pub fn parse(body: &[u8], headers: &HeaderInputs, kind: Kind) -> Result<OpenAiRequest, ApiError> {
    let obj = object(body)?;
    let (temperature, top_p, top_k) = temperature_top_p_top_k(&obj)?;
    let n = choices(&obj)?;
    let max_tokens = max_tokens(&obj, kind)?;
    let (stream, include_usage) = streaming(&obj)?;
    let (logprobs, top_logprobs) = logprobs(&obj, kind)?;
    refuse_unsupported(&obj)?;
    let sampling = sampling(&obj, (temperature, top_p, top_k), max_tokens)?;
    let stop = validate::stop_strings(&obj, "")?;
    let (routing_key, routed_dp_rank) = validate::routing(&obj, headers)?;
    let rid = validate::rid(&obj)?;

    let (prompts, messages) = match kind {
        Kind::Completions => (prompt_list(&obj, "prompt")?, Vec::new()),
        Kind::Chat => (Vec::new(), chat_messages(&obj)?),
    };
    if prompts.len() * n > MAX_N {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "at most {MAX_N} choices per request (prompts × n), got {}",
                prompts.len() * n
            ),
        ));
    }
    let echo = field::<bool>(&obj, "", "echo")?.unwrap_or(false);
    if echo && kind == Kind::Chat {
        return Err(refuse("echo", "echo on chat completions"));
    }
    Ok(OpenAiRequest {
        model: field(&obj, "", "model")?,
        n,
        stream,
        include_usage,
        sampling,
        max_tokens,
        stop,
        logprobs,
        top_logprobs,
        echo,
        routing_key,
        routed_dp_rank,
        bootstrap_room: field(&obj, "", "bootstrap_room")?,
        rid,
        prompts,
        messages,
        add_generation_prompt: field(&obj, "", "add_generation_prompt")?.unwrap_or(true),
        return_cached_tokens_details: field(&obj, "", "return_cached_tokens_details")?
            .unwrap_or(false),
    })
}

fn f32_or(obj: &Map<String, Value>, name: &str, default: f32) -> Result<f32, ApiError> {
    Ok(validate::f32_field(obj, "", name)?.unwrap_or(default))
}

/// `temperature`, `top_p` and `top_k` in range, with vLLM's `top_k: 0` as off and `top_p: 0`
/// as greedy.
fn temperature_top_p_top_k(obj: &Map<String, Value>) -> Result<(f32, f32, i32), ApiError> {
    let temperature = f32_or(obj, "temperature", 1.0)?;
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("temperature must be in [0, 2], got {temperature}"),
        ));
    }
    let mut top_p = f32_or(obj, "top_p", 1.0)?;
    if !(0.0..=1.0).contains(&top_p) {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("top_p must be in [0, 1], got {top_p}"),
        ));
    }
    let mut top_k = field::<i32>(obj, "", "top_k")?.unwrap_or(-1);
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
fn choices(obj: &Map<String, Value>) -> Result<usize, ApiError> {
    let n = field::<i64>(obj, "", "n")?.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be in [1, {MAX_N}], got {n}"),
        ));
    }
    if let Some(best_of) = field::<i64>(obj, "", "best_of")? {
        if best_of < n {
            return Err(ApiError::invalid_param("best_of", "best_of must be >= n"));
        }
        if best_of != n {
            return Err(refuse("best_of", "best_of greater than n"));
        }
    }
    Ok(n as usize)
}

/// The completion limit: completions default to OpenAI's 16; chat has none unless given.
fn max_tokens(obj: &Map<String, Value>, kind: Kind) -> Result<Option<u32>, ApiError> {
    Ok(match kind {
        Kind::Completions => {
            Some(max_tokens_field(obj, "max_tokens")?.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS))
        }
        // Both checked, though max_completion_tokens wins: a bad field is a 400 wherever it is.
        Kind::Chat => {
            let legacy = max_tokens_field(obj, "max_tokens")?;
            max_tokens_field(obj, "max_completion_tokens")?.or(legacy)
        }
    })
}

/// `stream`, and `stream_options.include_usage` (only with `stream`).
fn streaming(obj: &Map<String, Value>) -> Result<(bool, bool), ApiError> {
    let stream = field::<bool>(obj, "", "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            if !stream {
                return Err(ApiError::invalid_param(
                    "stream_options",
                    "stream_options is only allowed when stream is true",
                ));
            }
            field::<bool>(o, "stream_options.", "include_usage")?.unwrap_or(false)
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "stream_options",
                "stream_options: expected an object",
            ))
        }
    };
    Ok((stream, include_usage))
}

/// Whether log-probabilities are asked for, and how many alternatives per token: completions'
/// `logprobs: k`, chat's `logprobs` with `top_logprobs`.
fn logprobs(obj: &Map<String, Value>, kind: Kind) -> Result<(bool, u32), ApiError> {
    Ok(match kind {
        Kind::Completions => match field::<u32>(obj, "", "logprobs")? {
            None => (false, 0),
            Some(k) if k > MAX_COMPLETION_LOGPROBS => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    format!("logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {k}"),
                ))
            }
            Some(k) => (true, k),
        },
        Kind::Chat => {
            let on = field::<bool>(obj, "", "logprobs")?.unwrap_or(false);
            match field::<u32>(obj, "", "top_logprobs")? {
                None | Some(0) => (on, 0),
                Some(k) if k > MAX_CHAT_TOP_LOGPROBS => {
                    return Err(ApiError::invalid_param(
                        "top_logprobs",
                        format!("top_logprobs must be in [0, {MAX_CHAT_TOP_LOGPROBS}], got {k}"),
                    ))
                }
                Some(_) if !on => {
                    return Err(ApiError::invalid_param(
                        "top_logprobs",
                        "top_logprobs requires logprobs to be true",
                    ))
                }
                Some(k) => (true, k),
            }
        }
    })
}

/// Features this server does not have: refused by name rather than ignored.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let non_empty = |name: &str| {
        obj.get(name)
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
    };
    if non_empty("tools") || non_empty("functions") {
        return Err(refuse("tools", "tool calling"));
    }
    if let Some(rf) = obj.get("response_format").filter(|v| !v.is_null()) {
        if rf.get("type").and_then(Value::as_str) != Some("text") {
            return Err(refuse("response_format", "structured output"));
        }
    }
    if field::<String>(obj, "", "suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(refuse("suffix", "suffix"));
    }
    // Ignored, but of its documented type.
    field::<String>(obj, "", "user")?;
    Ok(())
}

/// The sampling parameters, with the SGLang/vLLM extensions, checked as `/generate`'s are.
fn sampling(
    obj: &Map<String, Value>,
    (temperature, top_p, top_k): (f32, f32, i32),
    max_tokens: Option<u32>,
) -> Result<SamplingParams, ApiError> {
    let seed = field::<i64>(obj, "", "seed")?.map(|s| s as u64);
    let d = SamplingParams::default();
    let sampling = SamplingParams {
        max_new_tokens: max_tokens.unwrap_or(d.max_new_tokens),
        temperature,
        top_p,
        top_k,
        min_p: f32_or(obj, "min_p", d.min_p)?,
        seed,
        repetition_penalty: f32_or(obj, "repetition_penalty", d.repetition_penalty)?,
        frequency_penalty: f32_or(obj, "frequency_penalty", d.frequency_penalty)?,
        presence_penalty: f32_or(obj, "presence_penalty", d.presence_penalty)?,
        stop_token_ids: field(obj, "", "stop_token_ids")?.unwrap_or_default(),
        ignore_eos: field(obj, "", "ignore_eos")?.unwrap_or(false),
        logit_bias: validate::logit_bias(obj, "")?,
    };
    validate::check_sampling(&sampling, "")?;
    Ok(sampling)
}

fn max_tokens_field(obj: &Map<String, Value>, name: &str) -> Result<Option<u32>, ApiError> {
    match field::<i64>(obj, "", name)? {
        None => Ok(None),
        Some(m) if m < 1 => Err(ApiError::invalid_param(
            name,
            format!("{name} must be at least 1, got {m}"),
        )),
        Some(m) => Ok(Some(m.min(u32::MAX as i64) as u32)),
    }
}

/// `obj[name]` (completions' `prompt`, embeddings' `input`): a string, a list of strings, a
/// list of token ids, or a list of such lists. Never empty, nor any list of ids in it.
pub fn prompt_list(obj: &Map<String, Value>, name: &str) -> Result<Vec<Prompt>, ApiError> {
    let err = |msg: &str| ApiError::invalid_param(name, format!("{name}: {msg}"));
    const SHAPE: &str = "expected a string, a list of strings or token ids";
    const IDS: &str = "token ids must be non-negative integers";
    let prompts = match obj.get(name) {
        None | Some(Value::Null) => return Err(err("is required")),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(err("is empty")),
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|i| i.as_str().map(|s| Prompt::Text(s.to_string())))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| err("a list must hold only strings or only token ids"))?,
            Value::Number(_) => vec![Prompt::Ids(ids(items).ok_or_else(|| err(IDS))?)],
            Value::Array(_) => items
                .iter()
                .map(|i| i.as_array().and_then(|a| ids(a)).map(Prompt::Ids))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| err(IDS))?,
            _ => return Err(err(SHAPE)),
        },
        Some(_) => return Err(err(SHAPE)),
    };
    // An empty text is a prompt (BOS alone, as in SGLang and vLLM; `check_limits` refuses it
    // if the tokenizer makes no tokens of it); an empty list of ids is not.
    if prompts
        .iter()
        .any(|p| matches!(p, Prompt::Ids(i) if i.is_empty()))
    {
        return Err(err("must not be empty"));
    }
    Ok(prompts)
}

fn ids(items: &[Value]) -> Option<Vec<u32>> {
    items.iter().map(validate::as_u32).collect()
}

const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// `messages`: each `{role, content}` with content a string, null, or a list of text parts.
fn chat_messages(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match obj.get("messages") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_param(
                "messages",
                "messages must not be empty",
            ))
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param("messages", "messages is required"))
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "messages",
                "messages: expected a list",
            ))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let bad =
            |what: &str, msg: String| ApiError::invalid_param(format!("messages[{i}].{what}"), msg);
        let Some(m) = m.as_object() else {
            return Err(ApiError::invalid_param(
                format!("messages[{i}]"),
                format!("messages[{i}]: expected an object"),
            ));
        };
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r) if ROLES.contains(&r) => r.to_string(),
            Some(r) => {
                return Err(bad(
                    "role",
                    format!("messages[{i}].role: unknown role {r:?}"),
                ))
            }
            None => return Err(bad("role", format!("messages[{i}].role is required"))),
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(bad(
                                "content",
                                format!(
                                    "messages[{i}].content: only text parts are supported, got {}",
                                    kind.unwrap_or("a part without type")
                                ),
                            ))
                        }
                    }
                }
                text
            }
            Some(_) => {
                return Err(bad(
                    "content",
                    format!("messages[{i}].content: expected a string or a list of parts"),
                ))
            }
        };
        out.push(ChatMessage { role, content });
    }
    Ok(out)
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
    validate::check_limits(ids, &sampling, r.routed_dp_rank, limits).map_err(|e| {
        match (e.param.as_deref(), kind) {
            (Some("input_ids"), _) => e.with_param("prompt"),
            (Some("max_tokens"), Kind::Chat) => e.with_param("max_completion_tokens"),
            _ => e,
        }
    })?;
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
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#,
                "response_format",
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
        assert_eq!(r.routed_dp_rank, Some(1));
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
