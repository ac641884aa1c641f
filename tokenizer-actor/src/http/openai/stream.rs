//! The streaming answer: the jobs' outputs interleaved as server-sent events of chunks, each
//! choice's text (with tools, what is not a call) as it comes, and `usage` at the end when asked.

use actix_web::HttpResponse;
use bytes::Bytes;
use futures::stream::{self, LocalBoxStream};
use futures::StreamExt;
use serde_json::{json, Value};

use super::{add_usage, finish_str, usage_json, Job, Kind, LogprobsOf, Shape};
use crate::http::error::ApiError;
use crate::http::inflight::{Chunk, Matched, Usage};
use crate::http::sse;
use crate::state::AppState;

type JobEvent = (usize, bool, Option<String>, Result<Chunk, ApiError>);

/// The jobs' outputs interleaved as they arrive. Owning the jobs, the stream aborts them all
/// when the client goes away.
fn merged(jobs: Vec<Job>) -> LocalBoxStream<'static, JobEvent> {
    let streams: Vec<LocalBoxStream<'static, JobEvent>> = jobs
        .into_iter()
        .map(|job| {
            stream::unfold(job, |mut job| async move {
                let step = job.inflight.next().await?;
                let echo = job.echo.take();
                Some(((job.index, job.first_of_prompt, echo, step), job))
            })
            .boxed_local()
        })
        .collect();
    stream::select_all(streams).boxed_local()
}

struct StreamState {
    shape: Shape,
    state: std::sync::Arc<AppState>,
    events: LocalBoxStream<'static, JobEvent>,
    first: Option<JobEvent>,
    include_usage: bool,
    /// Chat: whether a choice's first delta (with the role) went out.
    started: Vec<bool>,
    /// Text bytes sent per choice (completions' `text_offset`).
    sent_len: Vec<usize>,
    /// Chat with tools: each choice's whole text (read for calls when it ends), and how much of
    /// it went out as content already.
    held: Vec<String>,
    held_sent: Vec<usize>,
    /// Choices whose final chunk has not come yet.
    unfinished: usize,
    usage: Usage,
    ended: bool,
}

impl StreamState {
    /// The SSE events for one job event (possibly none: an empty delta is not worth sending).
    fn events_for(&mut self, ev: JobEvent) -> Vec<Bytes> {
        let (index, first_of_prompt, echo, step) = ev;
        let chunk = match step {
            Ok(chunk) => chunk,
            Err(err) => {
                self.ended = true;
                return vec![sse::event(&err.body()), sse::done()];
            }
        };
        if chunk.finished {
            add_usage(&mut self.usage, &chunk.usage, first_of_prompt);
            self.unfinished = self.unfinished.saturating_sub(1);
        }
        let text = match echo {
            Some(e) => e + &chunk.text,
            None => chunk.text.clone(),
        };
        let (text, whole) = self.hold_back(index, text, chunk.finished);
        let first = !self.started[index];
        // Tokens whose text is held back (a partial character, a possible stop string) still
        // carry their log-probabilities, which the stream must not lose.
        let has_logprobs = self.shape.logprobs && !chunk.output_ids.is_empty();
        let announces_role = first && self.shape.kind == Kind::Chat;
        if text.is_empty() && !(chunk.finished || has_logprobs || announces_role) {
            return Vec::new();
        }
        self.started[index] = true;
        let of = LogprobsOf {
            ids: &chunk.output_ids,
            logprobs: chunk.logprobs.as_deref(),
            top: chunk.top_logprobs.as_deref(),
        };
        let logprobs = self.shape.logprobs(&self.state, of, self.sent_len[index]);
        self.sent_len[index] += text.len();
        let choice = self.choice(index, &text, whole.as_deref(), &chunk, first, logprobs);
        let mut body = self.shape.envelope(true, vec![choice]);
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        if chunk.finished && self.unfinished == 0 {
            if let Some(ext) = self.shape.sglext(&self.usage) {
                body["sglext"] = ext;
            }
        }
        vec![sse::event(&body)]
    }

    /// With tools, what may be a call waits for the end; the rest streams as content. The text
    /// to send now of choice `index`'s new `text`, and the choice's whole text when it finished.
    fn hold_back(
        &mut self,
        index: usize,
        mut text: String,
        finished: bool,
    ) -> (String, Option<String>) {
        let mut whole = None;
        if let Some((tools, format)) = &self.shape.tools {
            let held = &mut self.held[index];
            held.push_str(&text);
            let sent = self.held_sent[index];
            if finished {
                whole = Some(std::mem::take(held));
            } else {
                let upto = tools.streamable(held, *format).max(sent);
                text = held[sent..upto].to_string();
                self.held_sent[index] = upto;
            }
        }
        (text, whole)
    }

    /// Choice `index` of a chunk: its `text` (chat: its delta, the role on its `first`; with
    /// tools at the end, its `whole` text read for calls) and `logprobs`.
    fn choice(
        &self,
        index: usize,
        text: &str,
        whole: Option<&str>,
        chunk: &Chunk,
        first: bool,
        logprobs: Value,
    ) -> Value {
        let finish = finish_str(chunk.finish_reason);
        let matched = chunk.matched.as_ref().map(Matched::to_json);
        let mut choice = match self.shape.kind {
            Kind::Completions => json!({
                "index": index, "text": text, "logprobs": logprobs,
                "finish_reason": finish, "matched_stop": matched,
            }),
            Kind::Chat => {
                let (content, calls, finish) = match whole {
                    Some(whole) => {
                        let sent = self.held_sent[index];
                        self.shape.answer(whole, chunk.finish_reason, true, sent)
                    }
                    None => (json!(text), None, finish),
                };
                let mut delta = match first {
                    true => json!({"role": "assistant", "content": content}),
                    false => json!({"content": content}),
                };
                if let Some(calls) = calls {
                    delta["tool_calls"] = calls;
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs,
                       "finish_reason": finish, "matched_stop": matched})
            }
        };
        // A choice's decision goes out once, on its final chunk.
        if let (true, Some(routing)) = (chunk.finished, &chunk.routing) {
            choice["routing"] = routing.clone();
        }
        choice
    }

    fn closing(&mut self) -> Vec<Bytes> {
        self.ended = true;
        let mut out = Vec::new();
        if self.include_usage {
            let mut body = self.shape.envelope(true, Vec::new());
            body["usage"] = usage_json(&self.usage);
            out.push(sse::event(&body));
        }
        out.push(sse::done());
        out
    }
}

/// The answer to a streaming request: 200 and its events once the first output came.
pub(super) async fn stream_response(
    shape: Shape,
    jobs: Vec<Job>,
    include_usage: bool,
    state: std::sync::Arc<AppState>,
) -> Result<HttpResponse, ApiError> {
    let choices = jobs.len();
    let mut events = merged(jobs);
    // Wait for the first output before committing to 200 + SSE, so an error the controller
    // answers at once (rank not live, no live rank) keeps its HTTP status.
    let first = match events.next().await {
        Some((_, _, _, Err(err))) => return Err(err),
        Some(ev) => ev,
        None => return Err(ApiError::internal("request ended without output")),
    };
    let st = StreamState {
        shape,
        state,
        events,
        first: Some(first),
        include_usage,
        started: vec![false; choices],
        sent_len: vec![0; choices],
        held: vec![String::new(); choices],
        held_sent: vec![0; choices],
        unfinished: choices,
        usage: Usage::default(),
        ended: false,
    };
    let body = stream::unfold(st, |mut st| async move {
        if st.ended {
            return None;
        }
        let next = match st.first.take() {
            Some(ev) => Some(ev),
            None => st.events.next().await,
        };
        let out = match next {
            Some(ev) => st.events_for(ev),
            None => st.closing(),
        };
        Some((stream::iter(out), st))
    })
    .flatten();
    Ok(sse::response(body))
}
