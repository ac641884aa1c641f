//! `POST /v1/embeddings` (OpenAI) and `POST /encode` (SGLang-native). Each input becomes one
//! `EmbedReq`, routed like a generation (routing key, explicit rank, else the token-prefix
//! hash); the worker answers with the final-normed hidden state of the input's last token,
//! L2-normalised. The inputs of one request run concurrently and are answered in input order;
//! the first failure fails the request and aborts the others.

use std::sync::Arc;
use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use protocol::{EmbedReq, FinishReason, Message, TokenOut};
use serde_json::{json, Value};

use super::body;
use super::error::ApiError;
use super::generate::{header_inputs, random_rid, read_body};
use super::inflight::register;
use super::schema::fields::{EncodeIds, EncodeText, Prompt, Prompts};
use super::schema::requests::{EmbeddingRequest, EncodeRequest};
use super::validate::{self, HeaderInputs, Limits};
use super::validation_error::ValidationError;
use crate::bridge::RequestGuard;
use crate::state::AppState;

/// Most inputs per request (OpenAI's limit for `/v1/embeddings`).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// How `/v1/embeddings` writes each vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// A JSON list of numbers.
    Float,
    /// Base64 of the little-endian f32 bytes, as OpenAI writes it.
    Base64,
}

/// A valid embedding request, before tokenization.
#[derive(Debug, Clone, PartialEq)]
struct EmbedInput {
    prompts: Vec<Prompt>,
    /// The client sent a list (`/encode` answers a list then).
    batch: bool,
    /// The field the inputs came in (`input`, `text`, `input_ids`), named in errors.
    param: &'static str,
    routing_key: Option<String>,
    routed_dp_rank: Option<u32>,
    rid: Option<String>,
    model: Option<String>,
    encoding: Encoding,
}

/// One input, embedded.
struct Embedded {
    rid: String,
    embedding: Vec<f32>,
    prompt_tokens: usize,
    dp_rank: Option<u32>,
}

/// Embed inputs (OpenAI).
#[utoipa::path(
    post,
    path = "/v1/embeddings",
    tag = "openai",
    request_body = crate::http::schema::requests::EmbeddingRequest,
    responses((status = 200, description = "One embedding per input, in input order",
        body = crate::http::schema::responses::EmbeddingResponse)),
)]
pub async fn embeddings(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let state = state.into_inner();
    let body = read_body(payload, state.args.http.max_request_bytes).await?;
    let input = parse_openai(&body, &header_inputs(&req)?)?;
    let rid = format!("embd-{}", random_rid());
    let done = embed_all(&state, &input, rid, started).await?;
    let prompt_tokens: usize = done.iter().map(|e| e.prompt_tokens).sum();
    let data: Vec<Value> = done
        .iter()
        .enumerate()
        .map(|(index, e)| {
            let embedding = match input.encoding {
                Encoding::Float => json!(e.embedding),
                Encoding::Base64 => json!(base64_f32_le(&e.embedding)),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "object": "list",
        "data": data,
        "model": input.model.unwrap_or_else(|| state.served_model_name.clone()),
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })))
}

/// Embed inputs (SGLang-native).
#[utoipa::path(
    post,
    path = "/encode",
    tag = "sglang",
    request_body = crate::http::schema::requests::EncodeRequest,
    responses((status = 200, description = "The embedding, or a list for a list of inputs",
        body = crate::http::schema::responses::EncodeResponse)),
)]
pub async fn encode(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
    let state = state.into_inner();
    let body = read_body(payload, state.args.http.max_request_bytes).await?;
    let input = parse_encode(&body, &header_inputs(&req)?)?;
    let rid = input.rid.clone().unwrap_or_else(random_rid);
    let done = embed_all(&state, &input, rid, started).await?;
    let mut items: Vec<Value> = done
        .into_iter()
        .map(|e| {
            json!({
                "embedding": e.embedding,
                "meta_info": {"id": e.rid, "prompt_tokens": e.prompt_tokens, "dp_rank": e.dp_rank},
            })
        })
        .collect();
    if input.batch {
        Ok(HttpResponse::Ok().json(items))
    } else {
        Ok(HttpResponse::Ok().json(items.swap_remove(0)))
    }
}

/// Tokenize and check every input, then embed them all at once; results in input order.
async fn embed_all(
    state: &Arc<AppState>,
    input: &EmbedInput,
    rid: String,
    started: Instant,
) -> Result<Vec<Embedded>, ApiError> {
    let received_at = protocol::unix_time();
    let limits = state.limits().await;
    // A batch (even of one): each rid gets its index.
    let last = input.batch.then(|| input.prompts.len().saturating_sub(1));
    validate::check_child_rids(&rid, last)?;
    let mut reqs = Vec::with_capacity(input.prompts.len());
    for (i, prompt) in input.prompts.iter().enumerate() {
        let ids = match prompt {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(text) => state.tokenizer.encode(text).map_err(|e| {
                let error = e.to_string();
                ValidationError::Encode {
                    param: input.param,
                    error,
                }
            })?,
        };
        let name = if input.batch {
            format!("{}[{i}]", input.param)
        } else {
            input.param.to_string()
        };
        check_ids(&ids, input.param, &name, &limits)?;
        reqs.push(EmbedReq {
            rid: validate::child_rid(&rid, input.batch.then_some(i)),
            input_ids: ids,
            routing_key: input.routing_key.clone(),
            routed_dp_rank: input.routed_dp_rank,
            received_at,
            dispatch_seq: 0,      // the controller numbers it
            submission_seq: None, // the bridge numbers it as it sends it
        });
    }
    validate::check_rank(input.routed_dp_rank, &limits)?;
    // The first error drops the other futures, whose guards abort their requests.
    futures::future::try_join_all(reqs.into_iter().map(|r| embed_one(state, r, started))).await
}

/// What the worker checks too, answered here with the field to blame: not empty, ids in the
/// vocabulary, and no longer than the context (an embedding generates nothing, so the whole
/// context is the prompt's).
fn check_ids(
    ids: &[u32],
    param: &'static str,
    name: &str,
    limits: &Limits,
) -> Result<(), ApiError> {
    if ids.is_empty() {
        let name = name.to_string();
        return Err(ValidationError::NoTokens { param, name }.into());
    }
    let vocab = limits.vocab_size;
    if let Some((index, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        let name = name.to_string();
        return Err(ValidationError::EmbedIdOutOfVocab {
            param,
            name,
            index,
            id,
            vocab,
        }
        .into());
    }
    if ids.len() > limits.context_len {
        return Err(ValidationError::EmbedTooLong {
            param,
            name: name.to_string(),
            tokens: ids.len(),
            context_len: limits.context_len,
        }
        .into());
    }
    Ok(())
}

/// Send one `EmbedReq` and wait for its final `TokenOut`.
async fn embed_one(
    state: &Arc<AppState>,
    req: EmbedReq,
    started: Instant,
) -> Result<Embedded, ApiError> {
    let rid = req.rid.clone();
    let prompt_tokens = req.input_ids.len();
    let mut rx = register(state, &rid, started).await?;
    // However this ends, the guard unregisters the rid, and aborts it unless it finished.
    let mut guard = RequestGuard::new(rid.clone(), state.bridge.clone());
    if !state.bridge.send(Message::EmbedReq(req)) {
        return Err(ApiError::unavailable("tokenizer is shutting down"));
    }
    let timeout_s = state.args.http.request_timeout_s;
    let deadline =
        tokio::time::Instant::from_std(started) + std::time::Duration::from_secs(timeout_s);
    loop {
        let out: TokenOut = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(out)) => out,
            Ok(None) => return Err(ApiError::internal("output channel closed")),
            Err(_) => {
                return Err(ApiError::new(
                    504,
                    format!("embedding {rid} got no answer within {timeout_s} s"),
                ))
            }
        };
        if let Some(err) = out.error {
            guard.finish();
            return Err(ApiError::new(err.status, err.message));
        }
        let Some(reason) = out.finish_reason else {
            continue; // not final: an embedding has one answer, the final one
        };
        guard.finish();
        return match (out.embedding, reason) {
            (Some(embedding), _) => Ok(Embedded {
                rid,
                embedding,
                prompt_tokens: match out.prompt_tokens {
                    0 => prompt_tokens,
                    n => n as usize,
                },
                dp_rank: out.dp_rank,
            }),
            (None, FinishReason::Abort) => Err(ApiError::unavailable(format!(
                "embedding {rid} was aborted"
            ))),
            (None, _) => Err(ApiError::internal(format!(
                "embedding {rid} ended without an embedding"
            ))),
        };
    }
}

fn check_count(prompts: &[Prompt], param: &'static str) -> Result<(), ApiError> {
    if prompts.len() > MAX_EMBED_INPUTS {
        return Err(ValidationError::TooManyInputs {
            param,
            max: MAX_EMBED_INPUTS,
            got: prompts.len(),
        }
        .into());
    }
    Ok(())
}

/// `/v1/embeddings`: `input`, `model`, `encoding_format`; `dimensions` is refused (the size is
/// the model's hidden size); `user` and unknown fields are ignored.
fn parse_openai(body: &[u8], headers: &HeaderInputs) -> Result<EmbedInput, ApiError> {
    let body: EmbeddingRequest = body::read(body)?;
    let Prompts {
        items: prompts,
        batch,
    } = body
        .input
        .ok_or(ValidationError::Required { param: "input" })?;
    // OpenAI's embeddings refuse an empty string (completions take it as BOS alone).
    if prompts
        .iter()
        .any(|p| matches!(p, Prompt::Text(t) if t.is_empty()))
    {
        return Err(ValidationError::EmptyText.into());
    }
    check_count(&prompts, "input")?;
    if body.dimensions.is_some() {
        return Err(ValidationError::Dimensions.into());
    }
    let encoding = match body.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            let got = other.to_string();
            return Err(ValidationError::EncodingFormat { got }.into());
        }
    };
    validate::refuse_return_routing(headers)?;
    let (routing_key, routed_dp_rank) = body.routing.resolve(headers)?;
    Ok(EmbedInput {
        prompts,
        batch,
        param: "input",
        routing_key,
        routed_dp_rank,
        rid: None,
        model: body.model,
        encoding,
    })
}

/// `/encode`: `text` (a string or a list of strings) or `input_ids` (a list of ids or a list
/// of such lists), `routing_key`, `routed_dp_rank` / `data_parallel_rank`, `rid`.
fn parse_encode(body: &[u8], headers: &HeaderInputs) -> Result<EmbedInput, ApiError> {
    let body: EncodeRequest = body::read(body)?;
    let (
        Prompts {
            items: prompts,
            batch,
        },
        param,
    ) = match (body.text, body.input_ids) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give either text or input_ids, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "one of text or input_ids is required",
            ))
        }
        (Some(EncodeText(t)), None) => (t, "text"),
        (None, Some(EncodeIds(i))) => (i, "input_ids"),
    };
    if prompts.is_empty() {
        return Err(ValidationError::NoInputs { param }.into());
    }
    if prompts.iter().any(|p| match p {
        Prompt::Text(t) => t.is_empty(),
        Prompt::Ids(i) => i.is_empty(),
    }) {
        return Err(ValidationError::EmptyInput { param }.into());
    }
    check_count(&prompts, param)?;
    validate::refuse_return_routing(headers)?;
    let (routing_key, routed_dp_rank) = body.routing.resolve(headers)?;
    Ok(EmbedInput {
        prompts,
        batch,
        param,
        routing_key,
        routed_dp_rank,
        rid: validate::check_rid(body.rid)?,
        model: None,
        encoding: Encoding::Float,
    })
}

/// Standard base64 (with padding) of the little-endian bytes of `v`: what OpenAI sends for
/// `encoding_format: "base64"` and its clients decode as float32.
fn base64_f32_le(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai(body: &str) -> Result<EmbedInput, ApiError> {
        parse_openai(body.as_bytes(), &HeaderInputs::default())
    }

    fn native(body: &str) -> Result<EmbedInput, ApiError> {
        parse_encode(body.as_bytes(), &HeaderInputs::default())
    }

    #[test]
    fn base64_matches_known_vectors() {
        // Python: base64.b64encode(struct.pack("<3f", 1.0, -2.5, 0.0))
        assert_eq!(base64_f32_le(&[1.0, -2.5, 0.0]), "AACAPwAAIMAAAAAA");
        // 4 bytes: one padding pair.
        assert_eq!(base64_f32_le(&[1.0]), "AACAPw==");
        // 8 bytes: one '='.
        assert_eq!(base64_f32_le(&[0.5, 2.0]), "AAAAPwAAAEA=");
        assert_eq!(base64_f32_le(&[]), "");
    }

    #[test]
    fn openai_inputs_parse_in_every_shape() {
        let r = openai(r#"{"input": "hi", "model": "m", "user": "u", "extra": 1}"#).unwrap();
        assert_eq!(
            (r.prompts, r.batch, r.encoding),
            (vec![Prompt::Text("hi".into())], false, Encoding::Float)
        );
        assert_eq!(r.model.as_deref(), Some("m"));
        let r = openai(r#"{"input": ["a", "b"], "encoding_format": "base64"}"#).unwrap();
        assert_eq!(r.prompts.len(), 2);
        assert!(r.batch);
        assert_eq!(r.encoding, Encoding::Base64);
        let r = openai(r#"{"input": [1, 2, 3], "dimensions": null}"#).unwrap();
        assert_eq!(
            (r.prompts, r.batch),
            (vec![Prompt::Ids(vec![1, 2, 3])], false)
        );
        let r = openai(r#"{"input": [[1], [2, 3]], "data_parallel_rank": 1}"#).unwrap();
        assert_eq!(
            r.prompts,
            vec![Prompt::Ids(vec![1]), Prompt::Ids(vec![2, 3])]
        );
        assert_eq!(r.routed_dp_rank, Some(1));
        let headers = HeaderInputs {
            routing_key: Some("k".into()),
            dp_rank: Some("0".into()),
            ..Default::default()
        };
        let r = parse_openai(br#"{"input": "x", "routing_key": "b"}"#, &headers).unwrap();
        assert_eq!(
            (r.routing_key.as_deref(), r.routed_dp_rank),
            (Some("k"), Some(0))
        );
    }

    #[test]
    fn bad_openai_requests_name_their_param() {
        let too_many = format!(r#"{{"input": {:?}}}"#, vec!["a"; MAX_EMBED_INPUTS + 1]);
        let cases: &[(&str, &str)] = &[
            (r#"{"input": "hi", "dimensions": 8}"#, "dimensions"),
            (
                r#"{"input": "hi", "encoding_format": "int8"}"#,
                "encoding_format",
            ),
            (
                r#"{"input": "hi", "encoding_format": 1}"#,
                "encoding_format",
            ),
            (r#"{}"#, "input"),
            (r#"{"input": ""}"#, "input"),
            (r#"{"input": []}"#, "input"),
            (r#"{"input": [[]]}"#, "input"),
            (r#"{"input": 5}"#, "input"),
            (r#"{"input": ["a", 1]}"#, "input"),
            (r#"{"input": [1, -2]}"#, "input"),
            (r#"{"input": [{"a": 1}]}"#, "input"),
            (r#"{"input": "x", "model": 5}"#, "model"),
            (
                r#"{"input": "x", "routed_dp_rank": "one"}"#,
                "routed_dp_rank",
            ),
            (&too_many, "input"),
        ];
        for (body, param) in cases {
            let err = openai(body).expect_err(body);
            assert_eq!(err.status, 400, "{body}");
            assert_eq!(
                err.param.as_deref(),
                Some(*param),
                "{body}: {}",
                err.message
            );
        }
        assert_eq!(openai("[1]").unwrap_err().status, 400);
        assert_eq!(openai("{").unwrap_err().status, 400);
    }

    #[test]
    fn encode_inputs_parse_one_or_a_batch() {
        let r = native(r#"{"text": "hi", "rid": "e-1", "routing_key": "k"}"#).unwrap();
        assert_eq!((r.prompts.len(), r.batch), (1, false));
        assert_eq!(
            (r.rid.as_deref(), r.routing_key.as_deref()),
            (Some("e-1"), Some("k"))
        );
        let r = native(r#"{"text": ["a", "b", "c"], "routed_dp_rank": 1}"#).unwrap();
        assert_eq!(
            (r.prompts.len(), r.batch, r.routed_dp_rank),
            (3, true, Some(1))
        );
        let r = native(r#"{"input_ids": [5, 6]}"#).unwrap();
        assert_eq!((r.prompts, r.batch), (vec![Prompt::Ids(vec![5, 6])], false));
        let r = native(r#"{"input_ids": [[5], [6, 7]]}"#).unwrap();
        assert_eq!(
            r.prompts,
            vec![Prompt::Ids(vec![5]), Prompt::Ids(vec![6, 7])]
        );
        assert!(r.batch);
    }

    #[test]
    fn bad_encode_requests_are_400() {
        let cases: &[(&str, &str)] = &[
            (r#"{}"#, "one of text or input_ids"),
            (r#"{"text": "a", "input_ids": [1]}"#, "not both"),
            (r#"{"text": ""}"#, "must not be empty"),
            (r#"{"text": []}"#, "text is empty"),
            (r#"{"text": ["a", ""]}"#, "must not be empty"),
            (r#"{"text": 3}"#, "text: expected"),
            (r#"{"text": ["a", 3]}"#, "text: expected"),
            (r#"{"input_ids": []}"#, "input_ids: is empty"),
            (r#"{"input_ids": [[]]}"#, "must not be empty"),
            (r#"{"input_ids": [1, "2"]}"#, "input_ids:"),
            (r#"{"input_ids": [[1], 2]}"#, "input_ids:"),
            (r#"{"input_ids": "12"}"#, "input_ids: expected"),
            (r#"{"text": "a", "rid": ""}"#, "rid must be"),
            (
                r#"{"text": "a", "data_parallel_rank": -1}"#,
                "data_parallel_rank",
            ),
        ];
        for (body, want) in cases {
            let err = native(body).expect_err(body);
            assert_eq!(err.status, 400, "{body}");
            assert!(err.message.contains(want), "{body}: {}", err.message);
        }
    }

    #[test]
    fn ids_are_checked_against_the_limits() {
        let limits = Limits {
            vocab_size: 100,
            context_len: 4,
            live_ranks: Some(vec![0]),
        };
        assert!(check_ids(&[1, 2, 3, 4], "input", "input", &limits).is_ok());
        let cases: &[(&[u32], &str)] = &[
            (&[], "encodes to no tokens"),
            (&[1, 100], "token 1 = 100 is out of range"),
            (
                &[1, 2, 3, 4, 5],
                "has 5 tokens, more than the context length 4",
            ),
        ];
        for (ids, want) in cases {
            let err = check_ids(ids, "text", "text[2]", &limits).unwrap_err();
            assert_eq!((err.status, err.param.as_deref()), (400, Some("text")));
            assert!(err.message.contains(want), "{}", err.message);
            assert!(err.message.starts_with("text[2]"), "{}", err.message);
        }
    }
}
