//! One accepted generation request between its `GenerateReq` and its final output: the
//! channel of its `TokenOut`s, its detokenizer, its stop strings, its deadline, its metrics
//! and what it produced so far. Every endpoint (`/generate`, `/v1/completions`,
//! `/v1/chat/completions`), streaming or not, is built from [`InFlight::next`], so they cannot
//! disagree on the text.

use std::sync::Arc;
use std::time::Instant;

use protocol::{FinishReason, GenerateReq, Message, SamplingParams, TokenOut};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::validate::Dispatch;
use crate::bridge::{RegisterError, RequestGuard};
use crate::detokenize::IncrementalDetokenizer;
use crate::metrics::{Finished, RefusalReason};
use crate::state::AppState;
use crate::stop::StopMatcher;

/// What a request asks for, tokenized and validated; becomes one `GenerateReq`.
#[derive(Debug, Clone)]
pub struct Submission {
    pub rid: String,
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// Stop strings, applied here (the worker sees token ids only).
    pub stop: Vec<String>,
    pub stream: bool,
    pub return_logprob: bool,
    /// With `return_logprob`: alternatives per output token (0: none).
    pub top_logprobs_num: u32,
    /// Unix seconds when the HTTP request arrived.
    pub received_at: f64,
    /// Where it goes and what its client learns of it (routing, room, `return_routing`).
    pub dispatch: Dispatch,
}

/// Register the rid, send the request to the controller and return its [`InFlight`].
pub async fn submit(
    state: &Arc<AppState>,
    sub: Submission,
    started: Instant,
) -> Result<InFlight, ApiError> {
    if let Some(c) = &sub.sampling.constraint {
        check_constraint(state, c, sub.sampling.ignore_eos).await?;
    }
    let rid = sub.rid.clone();
    let rx = register(state, &rid, started).await?;
    // Log lines about this request while it is handed on carry its rid.
    let _span = tracing::info_span!("request", rid = %rid).entered();
    // From here on the guard owns the rid: however this request ends, it is unregistered,
    // and aborted on the worker unless its final output arrived.
    let guard = RequestGuard::new(rid.clone(), state.bridge.clone());
    let inflight = InFlight::new(state.clone(), guard, rx, &sub, started);
    if !state.bridge.send(Message::GenerateReq(to_wire(sub, state))) {
        return Err(ApiError::unavailable("tokenizer is shutting down"));
    }
    Ok(inflight)
}

/// A constraint is compiled here before the request is routed, so one that does not compile,
/// or that this model's vocabulary cannot spell, is a 400 naming the problem (the first one
/// also reads the vocabulary: off the HTTP threads).
async fn check_constraint(
    state: &Arc<AppState>,
    c: &protocol::Constraint,
    ignore_eos: bool,
) -> Result<(), ApiError> {
    if ignore_eos {
        return Err(ApiError::bad_request(
            "ignore_eos cannot be combined with a structured output constraint (the constraint decides where the text ends)",
        ));
    }
    let (grammars, c) = (state.grammars.clone(), c.clone());
    match actix_web::web::block(move || grammars.compile(&c).map(drop)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ApiError::bad_request(e.to_string())),
        Err(e) => Err(ApiError::internal(format!("compiling the constraint: {e}"))),
    }
}

/// Route the outputs of `rid` to the returned channel; the caller's [`RequestGuard`]
/// unregisters it. A refusal is timed from `started`, when the handler began on the request.
pub async fn register(
    state: &AppState,
    rid: &str,
    started: Instant,
) -> Result<UnboundedReceiver<TokenOut>, ApiError> {
    state.bridge.register(rid).await.map_err(|e| match e {
        RegisterError::RidInUse => {
            ApiError::bad_request(format!("rid {rid:?} is already in flight"))
        }
        RegisterError::Stopped => ApiError::unavailable("tokenizer is shutting down"),
        RegisterError::Full { cap } => {
            state
                .metrics
                .refused(RefusalReason::Overloaded, started.elapsed());
            ApiError::new(
                429,
                format!("the server is at its limit of {cap} requests in flight; retry later"),
            )
        }
    })
}

fn to_wire(sub: Submission, state: &AppState) -> GenerateReq {
    let mut sampling = sub.sampling;
    if !sampling.ignore_eos {
        // The worker stops at its config's EOS; extra EOS ids (generation_config lists,
        // tokenizer_config's eos_token) are only known here.
        for id in &state.facts.eos_token_ids {
            if !sampling.stop_token_ids.contains(id) {
                sampling.stop_token_ids.push(*id);
            }
        }
    }
    // The rest is not the tokenizer's to set: the controller numbers `dispatch_seq`, pairs
    // `disagg` in a disaggregated deployment and answers `routing` when asked; the bridge
    // numbers `submission_seq` as it sends the request.
    let mut req = GenerateReq {
        sampling,
        stream: sub.stream,
        return_logprob: sub.return_logprob,
        top_logprobs_num: sub.top_logprobs_num,
        received_at: sub.received_at,
        ..GenerateReq::new(sub.rid, sub.input_ids)
    };
    sub.dispatch.write(&mut req);
    req
}

/// The routing records as the client reads them: the decision's record (the routing trace's
/// line: method, rank, branch, every live rank's load and the method's per-rank terms, the
/// margin to the runner-up); a disaggregated request's is its prefill leg's, with its decode
/// leg's under `decode`.
fn routing_json(records: Vec<protocol::route_record::RouteRecord>) -> Value {
    let mut records = records.into_iter().map(|r| json!(r));
    let mut first = records.next().unwrap_or(Value::Null);
    if let Some(decode) = records.next() {
        first["decode"] = decode;
    }
    first
}

/// Token counts of a request, as OpenAI `usage` needs them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    /// SGLang's `cached_tokens_details`: where the cached prompt tokens came from. Here every
    /// one is from a rank's own prefix cache (`device`: dpserve has no host or storage tier).
    /// `None` when none was cached, as SGLang sends it.
    pub fn cached_tokens_details(&self) -> Option<Value> {
        (self.cached_tokens > 0).then(|| json!({"device": self.cached_tokens, "host": 0}))
    }
}

/// What ended a request early or late: a stop token id or a stop string.
#[derive(Debug, Clone, PartialEq)]
pub enum Matched {
    Token(u32),
    Text(String),
}

impl Matched {
    pub fn to_json(&self) -> Value {
        match self {
            Matched::Token(id) => json!(id),
            Matched::Text(s) => json!(s),
        }
    }
}

/// What one `TokenOut` with tokens (or the final one) adds to the response.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub text: String,
    pub output_ids: Vec<u32>,
    /// One per id in `output_ids`, when asked for.
    pub logprobs: Option<Vec<f32>>,
    /// Per id in `output_ids`, the most likely `(id, logprob)` pairs, when asked for.
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    pub finished: bool,
    /// Set when `finished`.
    pub finish_reason: Option<FinishReason>,
    pub matched: Option<Matched>,
    pub usage: Usage,
    /// The SGLang-native `meta_info` of `/generate`.
    pub meta_info: Value,
    /// The routing decision, when the client asked and it has arrived (the first output
    /// brings it).
    pub routing: Option<Value>,
}

pub struct InFlight {
    state: Arc<AppState>,
    guard: RequestGuard,
    rx: UnboundedReceiver<TokenOut>,
    detok: IncrementalDetokenizer,
    stop: StopMatcher,
    started: Instant,
    deadline: tokio::time::Instant,
    prompt_len: usize,
    completion_tokens: usize,
    last: Option<TokenOut>,
    /// When the latest output with tokens arrived (TTFT, then inter-token latency).
    last_token_at: Option<Instant>,
    /// A stop string ended the request here, before the worker did.
    stopped_here: bool,
    done: bool,
    /// The routing decision, once an output brought it ([`routing_json`]).
    routing: Option<Value>,
}

impl InFlight {
    fn new(
        state: Arc<AppState>,
        guard: RequestGuard,
        rx: UnboundedReceiver<TokenOut>,
        sub: &Submission,
        started: Instant,
    ) -> Self {
        let timeout = std::time::Duration::from_secs(state.args.http.request_timeout_s);
        InFlight {
            deadline: tokio::time::Instant::from_std(started) + timeout,
            state,
            guard,
            rx,
            detok: IncrementalDetokenizer::new(&sub.input_ids),
            stop: StopMatcher::new(&sub.stop),
            started,
            prompt_len: sub.input_ids.len(),
            completion_tokens: 0,
            last: None,
            last_token_at: None,
            stopped_here: false,
            done: false,
            routing: None,
        }
    }

    pub fn rid(&self) -> &str {
        self.guard.rid()
    }

    /// The next chunk, an error (which ends the request), or `None` after the final chunk.
    pub async fn next(&mut self) -> Option<Result<Chunk, ApiError>> {
        while !self.done {
            let out = match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
                Ok(Some(out)) => out,
                Ok(None) => {
                    self.done = true;
                    return Some(Err(ApiError::internal("output channel closed")));
                }
                Err(_) => {
                    // Not `finish()`ed: dropping the guard aborts the request on the worker.
                    self.done = true;
                    self.record_end("abort");
                    return Some(Err(ApiError::new(
                        504,
                        format!(
                            "request {} got no final output within {} s",
                            self.rid(),
                            self.state.args.http.request_timeout_s
                        ),
                    )));
                }
            };
            if let Some(err) = &out.error {
                self.done = true;
                self.guard.finish();
                let err = ApiError::new(err.status, err.message.clone());
                self.remember(out);
                self.record_end("error");
                return Some(Err(err));
            }
            if out.finish_reason == Some(FinishReason::Error) {
                self.done = true;
                self.guard.finish();
                self.record_end("error");
                return Some(Err(ApiError::internal("request failed without a reason")));
            }
            if out.output_ids.is_empty() && out.finish_reason.is_none() {
                self.remember(out);
                continue;
            }
            return Some(self.chunk(out));
        }
        None
    }

    fn chunk(&mut self, mut out: TokenOut) -> Result<Chunk, ApiError> {
        let tok = &*self.state.tokenizer;
        let decode_err = |e: crate::error::TokenizerError| ApiError::internal(e.to_string());
        let mut raw = self.detok.push(tok, &out.output_ids).map_err(decode_err)?;
        let worker_finished = out.finish_reason.is_some();
        if worker_finished {
            raw.push_str(&self.detok.finish(tok).map_err(decode_err)?);
        }
        let text = self.stop.push(&raw, worker_finished);
        if self.stop.matched().is_some() && !worker_finished {
            // The worker would go on generating what nobody will read.
            self.stopped_here = true;
            self.guard.abort();
        }
        if worker_finished {
            self.guard.finish();
        }
        self.observe_latency(out.dp_rank, out.output_ids.len());
        self.completion_tokens += out.output_ids.len();
        let output_ids = out.output_ids.clone();
        // Moved out: `last` keeps only the counters.
        let logprobs = out.logprobs.take();
        let top_logprobs = out.top_logprobs.take();
        self.remember(out);
        let finished = worker_finished || self.stopped_here;
        let (finish_reason, matched) = self.finish();
        if finished {
            self.done = true;
            self.record_end(finish_reason.map_or("stop", |r| r.as_str()));
        }
        Ok(Chunk {
            text,
            output_ids,
            logprobs,
            top_logprobs,
            finished,
            finish_reason: finished.then_some(finish_reason).flatten(),
            matched: if finished { matched } else { None },
            usage: self.usage(),
            meta_info: self.meta_info(),
            routing: self.routing.clone(),
        })
    }

    fn observe_latency(&mut self, rank: Option<u32>, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        let metrics = &self.state.metrics;
        match self.last_token_at {
            None => metrics.observe_ttft(rank, (now - self.started).as_secs_f64()),
            Some(prev) => metrics.observe_itl(rank, (now - prev).as_secs_f64(), tokens),
        }
        self.last_token_at = Some(now);
    }

    fn record_end(&self, reason: &'static str) {
        let usage = self.usage();
        self.state.metrics.finished(Finished {
            dp_rank: self.last.as_ref().and_then(|l| l.dp_rank),
            prompt_tokens: usage.prompt_tokens as u64,
            completion_tokens: usage.completion_tokens as u64,
            cached_tokens: usage.cached_tokens as u64,
            finish_reason: reason,
            e2e_s: self.started.elapsed().as_secs_f64(),
        });
    }

    /// Keep the latest counters (a peer that leaves a counter at 0 gets ours) and the routing
    /// decision when this output brings it.
    fn remember(&mut self, mut out: TokenOut) {
        if !out.routing.is_empty() {
            self.routing = Some(routing_json(std::mem::take(&mut out.routing)));
        }
        let dp_rank = out.dp_rank.or(self.last.as_ref().and_then(|l| l.dp_rank));
        self.last = Some(TokenOut { dp_rank, ..out });
    }

    fn usage(&self) -> Usage {
        let last = self.last.as_ref();
        let nonzero = |v: u32, fallback: usize| if v > 0 { v as usize } else { fallback };
        Usage {
            prompt_tokens: nonzero(last.map_or(0, |l| l.prompt_tokens), self.prompt_len),
            // What the worker generated, which can exceed what was shown (a stop string).
            completion_tokens: if self.stopped_here {
                self.completion_tokens
            } else {
                nonzero(
                    last.map_or(0, |l| l.completion_tokens),
                    self.completion_tokens,
                )
            },
            cached_tokens: last.map_or(0, |l| l.cached_tokens as usize),
        }
    }

    /// The finish reason and what matched, from a stop string here or the worker's output.
    fn finish(&self) -> (Option<FinishReason>, Option<Matched>) {
        if let Some(s) = self.stop.matched() {
            return (Some(FinishReason::Stop), Some(Matched::Text(s.to_string())));
        }
        let last = self.last.as_ref();
        let reason = last.and_then(|l| l.finish_reason);
        let matched = last
            .and_then(|l| l.matched_stop)
            .filter(|_| reason == Some(FinishReason::Stop))
            .map(Matched::Token);
        (reason, matched)
    }

    fn meta_info(&self) -> Value {
        let usage = self.usage();
        let (reason, matched) = self.finish();
        let finish_reason = reason.map(|reason| match reason {
            FinishReason::Stop => match &matched {
                Some(m) => json!({"type": "stop", "matched": m.to_json()}),
                None => json!({"type": "stop"}),
            },
            FinishReason::Length => json!({"type": "length", "length": usage.completion_tokens}),
            FinishReason::Abort => json!({"type": "abort", "message": "aborted"}),
            FinishReason::Error => json!({"type": "error"}),
        });
        let mut meta = json!({
            "id": self.rid(),
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "finish_reason": if self.done || self.stopped_here { finish_reason } else { None },
            "dp_rank": self.last.as_ref().and_then(|l| l.dp_rank),
            "e2e_latency": self.started.elapsed().as_secs_f64(),
        });
        if let Some(details) = usage.cached_tokens_details() {
            meta["cached_tokens_details"] = details;
        }
        if let Some(routing) = &self.routing {
            meta["routing"] = routing.clone();
        }
        meta
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.done {
            // The client went away; the guard aborts the request on the worker.
            self.record_end("abort");
        }
    }
}
