//! `POST /generate` (SGLang-native): parse and validate, tokenize, submit one `GenerateReq`,
//! then answer with one JSON body or an SSE stream built from the request's [`InFlight`].
//!
//! A stream is SGLang's: by default each chunk carries everything so far (`text`, `output_ids`
//! and the log-probability lists), so the last chunk is the whole answer; with
//! `--incremental-streaming-output` (SGLang's flag of that name) each chunk carries only its
//! own step's. [`StreamForm`] is the choice, [`Produced`] what a chunk carries.
//!
//! Log-probabilities come in SGLang's shape: `meta_info.output_token_logprobs` is one
//! `[logprob, token_id, text_or_null]` per output token, `meta_info.output_top_logprobs` one
//! list of such triples per output token (most likely first); the text is there only with
//! `return_text_in_logprobs`.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};

use super::error::ApiError;
use super::inflight::{submit, Chunk, InFlight, Submission};
use super::schema::fields::Prompt;
use super::sse;
use super::validate::{self, HeaderInputs};
use crate::state::AppState;

pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// Generate from a prompt (SGLang-native).
///
/// One JSON answer, or with `stream: true` server-sent events (`data: <GenerateResponse>` per
/// step, ending `data: [DONE]`; an error after the stream started is one more event with the
/// error body). As SGLang, each event carries the whole `text`, `output_ids` and
/// log-probabilities so far; with `--incremental-streaming-output`, only that step's.
#[utoipa::path(
    post,
    path = "/generate",
    tag = "sglang",
    request_body = crate::http::schema::requests::GenerateRequest,
    responses((status = 200, description = "The generation, or its stream", content(
        (crate::http::schema::responses::GenerateResponse = "application/json"),
        (String = "text/event-stream"),
    ))),
)]
pub async fn generate(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let received_at = protocol::unix_time();
    let state = state.into_inner();
    let body = read_body(payload, state.args.http.max_request_bytes).await?;
    let input = validate::parse_generate(&body, &header_inputs(&req)?)?;

    let input_ids = match &input.prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(text) => state
            .tokenizer
            .encode(text)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    };
    validate::check_limits(
        &input_ids,
        &input.sampling,
        input.dispatch.routed_dp_rank,
        &state.limits().await,
    )?;

    let sub = Submission {
        rid: input.dispatch.rid.clone().unwrap_or_else(random_rid),
        input_ids,
        sampling: input.sampling,
        stop: input.stop,
        stream: input.stream,
        return_logprob: input.return_logprob,
        top_logprobs_num: if input.return_logprob {
            input.top_logprobs_num
        } else {
            0
        },
        received_at,
        dispatch: input.dispatch,
    };
    let mut inflight = submit(&state, sub, started).await?;
    let lp = LogprobShape {
        state: state.clone(),
        with_text: input.return_text_in_logprobs,
        logprobs: input.return_logprob,
        top: input.return_logprob && input.top_logprobs_num > 0,
    };
    if input.stream {
        let form = StreamForm::of(&state.args.http);
        // Wait for the first output before committing to 200 + SSE, so an error the
        // controller answers at once (rank not live, no live rank) keeps its HTTP status.
        match inflight.next().await {
            Some(Ok(first)) => Ok(sse_response(first, inflight, lp, form)),
            Some(Err(err)) => Err(err),
            None => Err(ApiError::internal("request ended without output")),
        }
    } else {
        collect(inflight, lp).await
    }
}

/// Writes SGLang's `[logprob, token_id, text_or_null]` triples.
struct LogprobShape {
    state: std::sync::Arc<AppState>,
    with_text: bool,
    /// Which lists the request asked for (present, if empty, even before any token).
    logprobs: bool,
    top: bool,
}

impl LogprobShape {
    /// The asked-for lists, empty.
    fn empty(&self) -> Value {
        let mut lists = json!({});
        if self.logprobs {
            lists["output_token_logprobs"] = json!([]);
        }
        if self.top {
            lists["output_top_logprobs"] = json!([]);
        }
        lists
    }

    fn entry(&self, logprob: f32, id: u32) -> Value {
        let text = self
            .with_text
            .then(|| self.state.tokenizer.decode(&[id]).unwrap_or_default());
        json!([logprob, id, text])
    }

    /// Adds the entries of `ids` to `meta` (which may already hold earlier ones).
    fn extend(
        &self,
        meta: &mut Value,
        ids: &[u32],
        logprobs: Option<&[f32]>,
        top: Option<&[Vec<(u32, f32)>]>,
    ) {
        let push = |meta: &mut Value, key: &str, items: Vec<Value>| match meta[key].as_array_mut() {
            Some(list) => list.extend(items),
            None => meta[key] = Value::Array(items),
        };
        if let Some(lps) = logprobs {
            let items = lps.iter().zip(ids).map(|(&l, &id)| self.entry(l, id));
            push(meta, "output_token_logprobs", items.collect());
        }
        if let Some(top) = top {
            let items = top
                .iter()
                .map(|alts| Value::Array(alts.iter().map(|&(id, l)| self.entry(l, id)).collect()));
            push(meta, "output_top_logprobs", items.collect());
        }
    }
}

pub fn header_inputs(req: &HttpRequest) -> Result<HeaderInputs, ApiError> {
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
        return_routing: get(validate::RETURN_ROUTING_HEADER)?,
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

pub fn random_rid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// How the chunks of a `/generate` stream relate (SGLang's `--incremental-streaming-output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamForm {
    /// Each chunk carries the whole text, every output id and every log-probability so far
    /// (SGLang's default): a client shows the latest chunk's `text`.
    Cumulative,
    /// Each chunk carries only its own step's: a client appends.
    Incremental,
}

impl StreamForm {
    pub fn of(http: &crate::args::HttpArgs) -> StreamForm {
        if http.incremental_streaming_output {
            StreamForm::Incremental
        } else {
            StreamForm::Cumulative
        }
    }
}

/// What a `/generate` body carries: the chunks pushed so far (all of a request's for the
/// answer and for a cumulative chunk; one for an incremental chunk).
struct Produced {
    text: String,
    output_ids: Vec<u32>,
    /// The asked-for log-probability lists, keyed as in `meta_info`.
    logprobs: Value,
}

impl Produced {
    fn new(lp: &LogprobShape) -> Self {
        Produced {
            text: String::new(),
            output_ids: Vec::new(),
            logprobs: lp.empty(),
        }
    }

    fn push(&mut self, chunk: &Chunk, lp: &LogprobShape) {
        self.text.push_str(&chunk.text);
        self.output_ids.extend_from_slice(&chunk.output_ids);
        lp.extend(
            &mut self.logprobs,
            &chunk.output_ids,
            chunk.logprobs.as_deref(),
            chunk.top_logprobs.as_deref(),
        );
    }

    /// The SGLang body, with `meta_info` (the latest chunk's) holding the log-probabilities.
    fn body(&self, meta_info: &Value) -> Value {
        let mut meta = meta_info.clone();
        if let (Value::Object(meta), Value::Object(lps)) = (&mut meta, &self.logprobs) {
            meta.extend(lps.clone());
        }
        json!({
            "text": self.text,
            "output_ids": self.output_ids,
            "meta_info": meta,
        })
    }
}

async fn collect(mut inflight: InFlight, lp: LogprobShape) -> Result<HttpResponse, ApiError> {
    let mut produced = Produced::new(&lp);
    while let Some(step) = inflight.next().await {
        let chunk = step?;
        produced.push(&chunk, &lp);
        if chunk.finished {
            return Ok(HttpResponse::Ok().json(produced.body(&chunk.meta_info)));
        }
    }
    Err(ApiError::internal("request ended without a final output"))
}

/// One stream's state between events.
struct Streamed {
    inflight: InFlight,
    lp: LogprobShape,
    form: StreamForm,
    produced: Produced,
}

impl Streamed {
    fn event(&mut self, chunk: &Chunk) -> Bytes {
        if self.form == StreamForm::Incremental {
            self.produced = Produced::new(&self.lp);
        }
        self.produced.push(chunk, &self.lp);
        sse::event(&self.produced.body(&chunk.meta_info))
    }
}

enum SsePhase {
    /// Boxed: a chunk is large (its JSON maps keep their order) and the other phases are empty.
    First(Box<Chunk>),
    Running,
    Done,
    Ended,
}

/// The SSE body; it owns the request's [`InFlight`] (see [`sse::response`]).
fn sse_response(
    first: Chunk,
    inflight: InFlight,
    lp: LogprobShape,
    form: StreamForm,
) -> HttpResponse {
    let streamed = Streamed {
        inflight,
        produced: Produced::new(&lp),
        lp,
        form,
    };
    let stream = futures::stream::unfold(
        (SsePhase::First(Box::new(first)), streamed),
        |(phase, mut st)| async move {
            let after = |chunk: &Chunk| {
                if chunk.finished {
                    SsePhase::Done
                } else {
                    SsePhase::Running
                }
            };
            let (bytes, next) = match phase {
                SsePhase::First(chunk) => (st.event(&chunk), after(&chunk)),
                SsePhase::Running => match st.inflight.next().await {
                    Some(Ok(chunk)) => (st.event(&chunk), after(&chunk)),
                    Some(Err(err)) => (sse::event(&err.body()), SsePhase::Done),
                    None => (sse::done(), SsePhase::Ended),
                },
                SsePhase::Done => (sse::done(), SsePhase::Ended),
                SsePhase::Ended => return None,
            };
            Some((bytes, (next, st)))
        },
    );
    sse::response(stream)
}
