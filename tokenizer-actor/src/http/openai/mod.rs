//! `POST /v1/completions` and `POST /v1/chat/completions`: OpenAI shapes over the same
//! [`InFlight`] requests as `/generate`.
//!
//! A request becomes one job per (prompt, choice): `n` > 1 and batched prompts fan out into
//! several `GenerateReq`s with derived rids (`<id>-<choice index>`) and seeds (`seed + i`, so
//! the choices differ yet reproduce), which the controller routes like any other request. The
//! answer merges the jobs' choices; a stream interleaves them as they come. `usage` counts a
//! prompt once however many choices it has.
//!
//! With SGLang's `return_cached_tokens_details`, the answer carries SGLang's `sglext` object:
//! `{"cached_tokens_details": {"device": N, "host": 0}}` when N > 0 prompt tokens came from a
//! rank's prefix cache (as `usage`, counted once per prompt), none when nothing was cached. A
//! stream carries it on its last chunk with a choice. SGLang sends it in one more chunk of its
//! own, with `choices: []`, which `sglang.bench_serving`'s completions reader (0.5.23) cannot
//! read: it takes `choices[0]` of every chunk.

mod collect;
pub(crate) mod params;
mod stream;
pub(crate) mod tools;

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use protocol::FinishReason;
use serde_json::{json, Value};

use super::error::ApiError;
use super::generate::{header_inputs, random_rid, read_body};
use super::inflight::{submit, InFlight, Submission, Usage};
use super::schema::fields::Prompt;
use super::validate;
use super::validation_error::ValidationError;
use crate::state::AppState;
use collect::collect_response;
pub use params::Kind;
use params::OpenAiRequest;
use stream::stream_response;

/// Complete prompts (OpenAI).
///
/// With `stream: true`, server-sent events of `CompletionResponse` chunks ending
/// `data: [DONE]`.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    request_body = crate::http::schema::requests::CompletionRequest,
    responses((status = 200, description = "The completion, or its stream", content(
        (crate::http::schema::responses::CompletionResponse = "application/json"),
        (String = "text/event-stream"),
    ))),
)]
pub async fn completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    serve(req, payload, state, Kind::Completions).await
}

/// Chat (OpenAI).
///
/// With `stream: true`, server-sent events of `ChatCompletionChunk`s ending `data: [DONE]`.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    request_body = crate::http::schema::requests::ChatCompletionRequest,
    responses((status = 200, description = "The chat completion, or its stream", content(
        (crate::http::schema::responses::ChatCompletionResponse = "application/json"),
        (String = "text/event-stream"),
    ))),
)]
pub async fn chat_completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    serve(req, payload, state, Kind::Chat).await
}

/// One (prompt, choice) pair of a request.
struct Job {
    index: usize,
    /// The first choice of its prompt carries the prompt's usage.
    first_of_prompt: bool,
    /// Prompt text to prepend (`echo`).
    echo: Option<String>,
    inflight: InFlight,
}

/// What every response object of one request shares.
struct Shape {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    /// Alternatives per token, with `logprobs`.
    top_logprobs: u32,
    /// SGLang's `return_cached_tokens_details`.
    cached_tokens_details: bool,
    /// Chat with tools whose calls are read back: the tools, and the model's call format.
    tools: Option<(tools::Tools, Option<tools::Format>)>,
}

impl Shape {
    /// One finished choice's message fields and finish reason: its content, or its calls
    /// (`finish_reason` `tool_calls`) when the request has tools and the text is calls.
    /// In a stream, `sent` bytes of `text` went out already as content: only the rest is
    /// content here, and none when the text ends in calls after it.
    fn answer(
        &self,
        text: &str,
        reason: Option<FinishReason>,
        stream: bool,
        sent: usize,
    ) -> (Value, Option<Value>, Option<&'static str>) {
        let rest = || json!(text.get(sent..).unwrap_or_default());
        let Some((tools, format)) = &self.tools else {
            return (rest(), None, finish_str(reason));
        };
        let reply = tools.read(text, reason == Some(FinishReason::Stop), *format);
        if reply.calls.is_empty() {
            return (rest(), None, finish_str(reason));
        }
        let calls = tools::calls_json(&reply.calls, stream);
        let content = match sent {
            0 => json!(reply.content),
            _ => Value::Null,
        };
        (content, Some(calls), Some("tool_calls"))
    }
}

async fn serve(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    kind: Kind,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let received_at = protocol::unix_time();
    let state = state.into_inner();
    let body = read_body(payload, state.args.http.max_request_bytes).await?;
    let r = params::parse(&body, &header_inputs(&req)?, kind)?;

    let prompts = tokenize(&state, &r, kind)?;
    let tool_format = state.chat_template.tool_format;
    let tools = read_tools(&r, tool_format)?;
    let limits = state.limits().await;
    let prefix = match kind {
        Kind::Completions => "cmpl-",
        Kind::Chat => "chatcmpl-",
    };
    let id = r
        .dispatch
        .rid
        .clone()
        .unwrap_or_else(|| format!("{prefix}{}", random_rid()));
    let total = prompts.len() * r.n;
    // Several sub-requests: each rid gets its index.
    let indexed = total > 1;
    validate::check_child_rids(&id, indexed.then(|| total - 1))?;
    let mut jobs = Vec::with_capacity(total);
    for (p, (ids, echo)) in prompts.into_iter().enumerate() {
        let sampling = params::prompt_sampling(&r, &ids, &limits, kind)?;
        for i in 0..r.n {
            let index = p * r.n + i;
            let mut sampling = sampling.clone();
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
            let rid = validate::child_rid(&id, indexed.then_some(index));
            let sub = submission(&r, rid, ids.clone(), sampling, received_at);
            let inflight = submit(&state, sub, started).await?;
            jobs.push(Job {
                index,
                first_of_prompt: i == 0,
                echo: echo.clone(),
                inflight,
            });
        }
    }
    let shape = Shape {
        kind,
        id,
        created: received_at as u64,
        model: r
            .model
            .clone()
            .unwrap_or_else(|| state.served_model_name.clone()),
        logprobs: r.logprobs,
        top_logprobs: r.top_logprobs,
        cached_tokens_details: r.return_cached_tokens_details,
        tools: tools.map(|t| (t, tool_format)),
    };
    if r.stream {
        stream_response(shape, jobs, r.include_usage, state).await
    } else {
        collect_response(shape, jobs, state).await
    }
}

/// The request's tools whose calls are read back, if any: `tool_choice` `auto` needs the
/// model's tool-call `format`.
fn read_tools(
    r: &OpenAiRequest,
    format: Option<tools::Format>,
) -> Result<Option<tools::Tools>, ApiError> {
    let tools = r.tools.clone().filter(tools::Tools::reads_calls);
    if let Some(t) = &tools {
        if t.choice == tools::ToolChoice::Auto && format.is_none() {
            return Err(ValidationError::AutoToolChoiceWithoutFormat.into());
        }
    }
    Ok(tools)
}

/// One job's request to the controller: `rid` generating from `input_ids` under `sampling`.
fn submission(
    r: &OpenAiRequest,
    rid: String,
    input_ids: Vec<u32>,
    sampling: protocol::SamplingParams,
    received_at: f64,
) -> Submission {
    Submission {
        rid,
        input_ids,
        sampling,
        stop: r.stop.clone(),
        stream: r.stream,
        return_logprob: r.logprobs,
        top_logprobs_num: if r.logprobs { r.top_logprobs } else { 0 },
        received_at,
        dispatch: r.dispatch.clone(),
    }
}

/// A prompt's token ids, and its text when `echo` wants it back.
type TokenizedPrompt = (Vec<u32>, Option<String>);

/// Token ids of each prompt, and its text when `echo` wants it back.
fn tokenize(
    state: &AppState,
    r: &OpenAiRequest,
    kind: Kind,
) -> Result<Vec<TokenizedPrompt>, ApiError> {
    let encode = |text: &str| {
        state
            .tokenizer
            .encode(text)
            .map_err(|e| ValidationError::Encode {
                param: "prompt",
                error: e.to_string(),
            })
    };
    match kind {
        Kind::Completions => r
            .prompts
            .iter()
            .map(|p| {
                let (ids, text) = match p {
                    Prompt::Text(t) => (encode(t)?, t.clone()),
                    Prompt::Ids(ids) => (
                        ids.clone(),
                        state
                            .tokenizer
                            .decode(ids)
                            .map_err(|e| ApiError::internal(e.to_string()))?,
                    ),
                };
                Ok((ids, r.echo.then_some(text)))
            })
            .collect(),
        Kind::Chat => {
            let text = state
                .chat_template
                .render(
                    &r.messages,
                    r.add_generation_prompt,
                    r.tools.as_ref().map(|t| &t.spec),
                )
                .map_err(|error| ValidationError::ChatTemplate { error })?;
            let ids =
                crate::chat_template::prompt_ids(state.tokenizer.as_ref(), &state.facts, &text)
                    .map_err(|e| ValidationError::Encode {
                        param: "messages",
                        error: e.to_string(),
                    })?;
            Ok(vec![(ids, None)])
        }
    }
}

fn finish_str(reason: Option<FinishReason>) -> Option<&'static str> {
    reason.map(|r| r.as_str())
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Adds one finished job's usage: prompt and cached tokens once per prompt.
fn add_usage(total: &mut Usage, job: &Usage, first_of_prompt: bool) {
    total.completion_tokens += job.completion_tokens;
    if first_of_prompt {
        total.prompt_tokens += job.prompt_tokens;
        total.cached_tokens += job.cached_tokens;
    }
}

impl Shape {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completions, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// SGLang's `sglext` for the request's `usage`, when asked for and there is something in it.
    fn sglext(&self, usage: &Usage) -> Option<Value> {
        let details = usage
            .cached_tokens_details()
            .filter(|_| self.cached_tokens_details)?;
        Some(json!({"cached_tokens_details": details}))
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// Log-probabilities of `ids` in this endpoint's shape, with the alternatives `top` (one
    /// list per id) when asked for; `offset` is where their text starts.
    fn logprobs(&self, state: &AppState, lp: LogprobsOf<'_>, offset: usize) -> Value {
        let Some(lps) = lp.logprobs.filter(|_| self.logprobs) else {
            return Value::Null;
        };
        let text = |id: u32| state.tokenizer.decode(&[id]).unwrap_or_default();
        let tokens: Vec<String> = lp.ids.iter().map(|&id| text(id)).collect();
        // Per token its alternatives; none when not asked (or a peer sent none).
        let tops: Vec<&[(u32, f32)]> = match lp.top.filter(|_| self.top_logprobs > 0) {
            Some(top) => top.iter().map(Vec::as_slice).collect(),
            None => Vec::new(),
        };
        match self.kind {
            Kind::Completions => {
                let mut offsets = Vec::with_capacity(tokens.len());
                let mut at = offset;
                for t in &tokens {
                    offsets.push(at);
                    at += t.len();
                }
                // OpenAI's legacy shape: one {token text: logprob} map per token, likeliest
                // first (JSON maps keep their order: serde_json's `preserve_order`), as OpenAI,
                // SGLang and vLLM send it. Two ids with the same text keep the likelier one.
                let top = if self.top_logprobs > 0 && tops.len() == tokens.len() {
                    json!(tops
                        .iter()
                        .map(|alts| {
                            let mut alts = alts.to_vec();
                            alts.sort_by(|a, b| b.1.total_cmp(&a.1));
                            let mut map = serde_json::Map::new();
                            for (id, l) in alts {
                                map.entry(text(id)).or_insert(json!(l));
                            }
                            Value::Object(map)
                        })
                        .collect::<Vec<_>>())
                } else {
                    Value::Null
                };
                json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets})
            }
            Kind::Chat => json!({"content": tokens.iter().zip(lps).enumerate().map(|(i, (t, lp))| {
                let top: Vec<Value> = tops.get(i).map_or(&[][..], |a| *a).iter().map(|&(id, l)| {
                    let t = text(id);
                    json!({"token": t, "logprob": l, "bytes": t.as_bytes()})
                }).collect();
                json!({"token": t, "logprob": lp, "bytes": t.as_bytes(), "top_logprobs": top})
            }).collect::<Vec<_>>()}),
        }
    }
}

/// The tokens of one step or one whole choice, with their log-probabilities.
#[derive(Clone, Copy)]
struct LogprobsOf<'a> {
    ids: &'a [u32],
    logprobs: Option<&'a [f32]>,
    top: Option<&'a [Vec<(u32, f32)>]>,
}
