//! The non-streaming answer: every job's output gathered, then one response object with all
//! the choices and the request's `usage`.

use actix_web::HttpResponse;
use protocol::FinishReason;
use serde_json::{json, Value};

use super::{add_usage, finish_str, usage_json, Job, Kind, LogprobsOf, Shape};
use crate::http::error::ApiError;
use crate::http::inflight::{Matched, Usage};
use crate::state::AppState;

/// Everything one job produced, for a non-streaming answer.
struct Collected {
    index: usize,
    first_of_prompt: bool,
    text: String,
    ids: Vec<u32>,
    logprobs: Option<Vec<f32>>,
    top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    finish_reason: Option<FinishReason>,
    matched: Option<Matched>,
    usage: Usage,
    routing: Option<Value>,
}

/// One job's whole output, read to its final chunk.
async fn collect_job(mut job: Job) -> Result<Collected, ApiError> {
    let mut c = Collected {
        index: job.index,
        first_of_prompt: job.first_of_prompt,
        text: job.echo.take().unwrap_or_default(),
        ids: Vec::new(),
        logprobs: None,
        top_logprobs: None,
        finish_reason: None,
        matched: None,
        usage: Usage::default(),
        routing: None,
    };
    while let Some(step) = job.inflight.next().await {
        let chunk = step?;
        c.text.push_str(&chunk.text);
        c.ids.extend_from_slice(&chunk.output_ids);
        if let Some(lp) = &chunk.logprobs {
            c.logprobs
                .get_or_insert_with(Vec::new)
                .extend_from_slice(lp);
        }
        if let Some(top) = chunk.top_logprobs {
            c.top_logprobs.get_or_insert_with(Vec::new).extend(top);
        }
        if chunk.finished {
            c.finish_reason = chunk.finish_reason;
            c.matched = chunk.matched;
            c.usage = chunk.usage;
            c.routing = chunk.routing;
            return Ok(c);
        }
    }
    Err(ApiError::internal("request ended without a final output"))
}

/// The answer to a non-streaming request: its jobs' choices in order, with their usage.
pub(super) async fn collect_response(
    shape: Shape,
    jobs: Vec<Job>,
    state: std::sync::Arc<AppState>,
) -> Result<HttpResponse, ApiError> {
    // The first error drops the other jobs, whose guards abort them.
    let mut done = futures::future::try_join_all(jobs.into_iter().map(collect_job)).await?;
    done.sort_by_key(|c| c.index);
    let mut usage = Usage::default();
    let choices = done
        .iter()
        .map(|c| {
            add_usage(&mut usage, &c.usage, c.first_of_prompt);
            let of = LogprobsOf {
                ids: &c.ids,
                logprobs: c.logprobs.as_deref(),
                top: c.top_logprobs.as_deref(),
            };
            let logprobs = shape.logprobs(&state, of, 0);
            let matched = c.matched.as_ref().map(Matched::to_json);
            let mut choice = match shape.kind {
                Kind::Completions => json!({
                    "index": c.index, "text": c.text, "logprobs": logprobs,
                    "finish_reason": finish_str(c.finish_reason), "matched_stop": matched,
                }),
                Kind::Chat => {
                    let (content, calls, finish) = shape.answer(&c.text, c.finish_reason, false, 0);
                    let mut message = json!({"role": "assistant", "content": content});
                    if let Some(calls) = calls {
                        message["tool_calls"] = calls;
                    }
                    json!({
                        "index": c.index, "message": message, "logprobs": logprobs,
                        "finish_reason": finish, "matched_stop": matched,
                    })
                }
            };
            if let Some(routing) = &c.routing {
                choice["routing"] = routing.clone();
            }
            choice
        })
        .collect();
    let mut body = shape.envelope(false, choices);
    body["usage"] = usage_json(&usage);
    if let Some(ext) = shape.sglext(&usage) {
        body["sglext"] = ext;
    }
    Ok(HttpResponse::Ok().json(body))
}
