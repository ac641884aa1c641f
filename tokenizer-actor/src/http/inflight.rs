//! One accepted `/generate` request between its `GenerateReq` and its final output: the
//! channel of its `TokenOut`s, its detokenizer, its deadline and what it produced so far.
//! Streaming and non-streaming responses are both built from [`InFlight::next`], so they
//! cannot disagree on the text.

use std::sync::Arc;
use std::time::Instant;

use protocol::{FinishReason, TokenOut};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use crate::bridge::RequestGuard;
use crate::detokenize::IncrementalDetokenizer;
use crate::state::AppState;

/// What one `TokenOut` with tokens (or the final one) adds to the response.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub text: String,
    pub output_ids: Vec<u32>,
    pub meta_info: Value,
    pub finished: bool,
}

pub struct InFlight {
    state: Arc<AppState>,
    guard: RequestGuard,
    rx: UnboundedReceiver<TokenOut>,
    detok: IncrementalDetokenizer,
    started: Instant,
    deadline: tokio::time::Instant,
    prompt_len: usize,
    completion_tokens: usize,
    last: Option<TokenOut>,
    done: bool,
}

impl InFlight {
    pub fn new(
        state: Arc<AppState>,
        guard: RequestGuard,
        rx: UnboundedReceiver<TokenOut>,
        input_ids: &[u32],
        started: Instant,
    ) -> Self {
        let timeout = std::time::Duration::from_secs(state.args.request_timeout_s);
        InFlight {
            deadline: tokio::time::Instant::from_std(started) + timeout,
            state,
            guard,
            rx,
            detok: IncrementalDetokenizer::new(input_ids),
            started,
            prompt_len: input_ids.len(),
            completion_tokens: 0,
            last: None,
            done: false,
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
                    return Some(Err(ApiError::new(
                        504,
                        format!(
                            "request {} got no final output within {} s",
                            self.rid(),
                            self.state.args.request_timeout_s
                        ),
                    )));
                }
            };
            if let Some(err) = &out.error {
                self.done = true;
                self.guard.finish();
                return Some(Err(ApiError::new(err.status, err.message.clone())));
            }
            if out.finish_reason == Some(FinishReason::Error) {
                self.done = true;
                self.guard.finish();
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

    fn chunk(&mut self, out: TokenOut) -> Result<Chunk, ApiError> {
        let tok = &*self.state.tokenizer;
        let decode_err = |e: crate::TokenizerError| ApiError::internal(e.to_string());
        let mut text = self.detok.push(tok, &out.output_ids).map_err(decode_err)?;
        let finished = out.finish_reason.is_some();
        if finished {
            text.push_str(&self.detok.finish(tok).map_err(decode_err)?);
            self.done = true;
            self.guard.finish();
        }
        self.completion_tokens += out.output_ids.len();
        let output_ids = out.output_ids.clone();
        self.remember(out);
        Ok(Chunk {
            text,
            output_ids,
            meta_info: self.meta_info(),
            finished,
        })
    }

    /// Keep the latest counters; a peer that leaves a counter at 0 gets ours.
    fn remember(&mut self, out: TokenOut) {
        let dp_rank = out.dp_rank.or(self.last.as_ref().and_then(|l| l.dp_rank));
        self.last = Some(TokenOut { dp_rank, ..out });
    }

    fn meta_info(&self) -> Value {
        let last = self.last.as_ref();
        let nonzero = |v: u32, fallback: usize| if v > 0 { v as usize } else { fallback };
        let completion = nonzero(
            last.map_or(0, |l| l.completion_tokens),
            self.completion_tokens,
        );
        let finish_reason = last.and_then(|l| {
            l.finish_reason.map(|reason| match reason {
                FinishReason::Stop => match l.matched_stop {
                    Some(id) => json!({"type": "stop", "matched": id}),
                    None => json!({"type": "stop"}),
                },
                FinishReason::Length => json!({"type": "length", "length": completion}),
                FinishReason::Abort => json!({"type": "abort", "message": "aborted"}),
                FinishReason::Error => json!({"type": "error"}),
            })
        });
        json!({
            "id": self.rid(),
            "prompt_tokens": nonzero(last.map_or(0, |l| l.prompt_tokens), self.prompt_len),
            "completion_tokens": completion,
            "cached_tokens": last.map_or(0, |l| l.cached_tokens),
            "finish_reason": finish_reason,
            "dp_rank": last.and_then(|l| l.dp_rank),
            "e2e_latency": self.started.elapsed().as_secs_f64(),
        })
    }
}
