//! `POST /generate` (SGLang-native): parse and validate, tokenize, send `GenerateReq` to the
//! controller, then answer with one JSON body or an SSE stream built from the request's
//! [`InFlight`] outputs.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures::StreamExt;
use protocol::{GenerateReq, Message};
use serde_json::json;

use super::error::ApiError;
use super::inflight::{Chunk, InFlight};
use super::validate::{self, GenerateInput, HeaderInputs, Prompt};
use crate::bridge::RequestGuard;
use crate::state::AppState;

pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

pub async fn generate(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let received_at = protocol::unix_time();
    let state = state.into_inner();
    let body = read_body(payload, state.args.max_request_bytes).await?;
    let input = validate::parse_generate(&body, &header_inputs(&req)?)?;

    let input_ids = match &input.prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(text) => state
            .tokenizer
            .encode(text)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    validate::check_limits(&input_ids, &input, &state.limits())?;

    let rid = input.rid.clone().unwrap_or_else(random_rid);
    let rx = state
        .bridge
        .register(&rid)
        .map_err(|_| ApiError::bad_request(format!("rid {rid:?} is already in flight")))?;
    // From here on the guard owns the rid: however this request ends, it is unregistered,
    // and aborted on the worker unless its final output arrived.
    let guard = RequestGuard::new(rid.clone(), state.bridge.clone());
    let mut inflight = InFlight::new(state.clone(), guard, rx, &input_ids, started);
    let stream = input.stream;
    let msg = Message::GenerateReq(to_wire(rid, input_ids, input, &state, received_at));
    if !state.bridge.send(msg) {
        return Err(ApiError::unavailable("tokenizer is shutting down"));
    }

    if stream {
        // Wait for the first output before committing to 200 + SSE, so an error the
        // controller answers at once (rank not live, no live rank) keeps its HTTP status.
        match inflight.next().await {
            Some(Ok(first)) => Ok(sse_response(first, inflight)),
            Some(Err(err)) => Err(err),
            None => Err(ApiError::internal("request ended without output")),
        }
    } else {
        collect(inflight).await
    }
}

fn header_inputs(req: &HttpRequest) -> Result<HeaderInputs, ApiError> {
    let get = |name: &str| -> Result<Option<String>, ApiError> {
        match req.headers().get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .map(|s| Some(s.to_string()))
                .map_err(|_| ApiError::bad_request(format!("header {name} is not visible ASCII"))),
        }
    };
    Ok(HeaderInputs {
        routing_key: get(ROUTING_KEY_HEADER)?,
        dp_rank: get(DP_RANK_HEADER)?,
    })
}

/// Read the body ourselves so an oversized one gets our JSON 413, not a bare one.
pub async fn read_body(mut payload: web::Payload, max_bytes: usize) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("cannot read request body: {e}")))?;
        if body.len() + chunk.len() > max_bytes {
            return Err(ApiError::new(
                413,
                format!("request body exceeds --max-request-bytes ({max_bytes} bytes)"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn random_rid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn to_wire(
    rid: String,
    input_ids: Vec<u32>,
    input: GenerateInput,
    state: &AppState,
    received_at: f64,
) -> GenerateReq {
    let mut sampling = input.sampling;
    if !sampling.ignore_eos {
        // The worker stops at its config's EOS; extra EOS ids (generation_config lists,
        // tokenizer_config's eos_token) are only known here.
        for id in &state.facts.eos_token_ids {
            if !sampling.stop_token_ids.contains(id) {
                sampling.stop_token_ids.push(*id);
            }
        }
    }
    GenerateReq {
        rid,
        input_ids,
        sampling,
        stream: input.stream,
        routing_key: input.routing_key,
        routed_dp_rank: input.routed_dp_rank,
        bootstrap_room: input.bootstrap_room,
        return_logprob: input.return_logprob,
        received_at,
    }
}

async fn collect(mut inflight: InFlight) -> Result<HttpResponse, ApiError> {
    let mut text = String::new();
    let mut output_ids = Vec::new();
    while let Some(step) = inflight.next().await {
        let chunk = step?;
        text.push_str(&chunk.text);
        output_ids.extend_from_slice(&chunk.output_ids);
        if chunk.finished {
            return Ok(HttpResponse::Ok().json(json!({
                "text": text,
                "output_ids": output_ids,
                "meta_info": chunk.meta_info,
            })));
        }
    }
    Err(ApiError::internal("request ended without a final output"))
}

fn sse_event(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

fn chunk_event(chunk: &Chunk) -> Bytes {
    sse_event(&json!({
        "text": chunk.text,
        "output_ids": chunk.output_ids,
        "meta_info": chunk.meta_info,
    }))
}

enum SsePhase {
    First(Chunk),
    Running,
    Done,
    Ended,
}

/// The SSE body. It owns the request's [`InFlight`], so a client that disconnects drops it
/// and the guard inside sends `Abort`.
fn sse_response(first: Chunk, inflight: InFlight) -> HttpResponse {
    let stream = futures::stream::unfold(
        (SsePhase::First(first), inflight),
        |(phase, mut inflight)| async move {
            let (bytes, next) = match phase {
                SsePhase::First(chunk) => {
                    let next = if chunk.finished {
                        SsePhase::Done
                    } else {
                        SsePhase::Running
                    };
                    (chunk_event(&chunk), next)
                }
                SsePhase::Running => match inflight.next().await {
                    Some(Ok(chunk)) => {
                        let next = if chunk.finished {
                            SsePhase::Done
                        } else {
                            SsePhase::Running
                        };
                        (chunk_event(&chunk), next)
                    }
                    Some(Err(err)) => (sse_event(&err.body()), SsePhase::Done),
                    None => (Bytes::from_static(SSE_DONE), SsePhase::Ended),
                },
                SsePhase::Done => (Bytes::from_static(SSE_DONE), SsePhase::Ended),
                SsePhase::Ended => return None,
            };
            Some((Ok::<Bytes, ApiError>(bytes), (next, inflight)))
        },
    );
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(stream)
}
