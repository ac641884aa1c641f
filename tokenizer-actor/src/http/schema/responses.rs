//! Response bodies. The small endpoints (`info`, errors) serialize these types directly; the
//! generation and embedding answers are built incrementally as JSON (streams, logprob shapes)
//! and are checked against these schemas by the schemathesis test (`tests/e2e_schemathesis.rs`),
//! so those types are only described, never constructed.
#![allow(dead_code)]

use serde::Serialize;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use super::literal;

/// The error every endpoint answers with (the OpenAI shape).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// What is wrong, for a person.
    pub message: String,
    #[serde(rename = "type")]
    pub kind: ErrorKind,
    /// The request field to blame, when one is.
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    AuthenticationError,
    NotFoundError,
    RequestTooLarge,
    InvalidRequestError,
    ServiceUnavailable,
    Timeout,
    InternalError,
}

/// `GET /health`.
#[derive(Serialize, ToSchema)]
pub struct HealthResponse {
    pub status: HealthStatus,
    pub live_ranks: Vec<u32>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
}

/// `GET /get_server_info` (alias `/server_info`): what SGLang's gateway reads, and this
/// server's own state.
#[derive(Serialize, ToSchema)]
pub struct ServerInfo {
    /// Live ranks now, or `--dp-size` while none is known live.
    pub dp_size: u32,
    pub tp_size: u32,
    pub model_path: String,
    pub tokenizer_path: String,
    pub served_model_name: String,
    pub live_ranks: Vec<u32>,
    /// Each live rank as the controller reports it (`capacity`, last `status`, `gpu` for a GPU
    /// rank: `ordinal`, `name`, `compute_capability`, `total_memory_bytes`), with its `device`:
    /// `cuda:N`, `sim` or `cpu`.
    #[schema(value_type = Vec<Object>)]
    pub ranks: serde_json::Value,
    pub load_balance_method: Option<String>,
    pub cluster_status_age_s: Option<f64>,
    /// `sim` when some live rank is simulated (`--device sim`), else `cuda` when some live
    /// rank computes on a GPU, else `cpu`. Each rank's own is in `ranks`.
    pub device: String,
    /// Whether any live rank is simulated: its timings come from a cost model, not a model.
    pub simulated: bool,
    /// The cost-model profiles of the simulated live ranks, each once.
    pub sim_profiles: Vec<String>,
    pub version: String,
    pub context_length: usize,
    pub vocab_size: usize,
    pub max_request_bytes: usize,
    pub request_timeout_s: u64,
    pub tokenizer_addr: String,
    pub controller_addr: String,
    pub requests_in_flight: usize,
    pub frames_dropped: u64,
    pub chat_template: String,
    pub api_key_required: bool,
    /// How this tokenizer's ZeroMQ endpoints are secured: `curve` (CURVE on every TCP
    /// endpoint), `local` (no keys: ipc and loopback TCP only), or `insecure` (no keys, TCP
    /// beyond loopback allowed by `--insecure-tcp`).
    pub zmq_security: String,
    /// What the tokenizer's ledger check found broken since start (the first few): a request
    /// it still waits on though the controller took every request, counts none in flight and
    /// every live rank is idle. Empty while the check holds. Each rank's own checks are in
    /// `ranks` (`invariant_violations`, and its `status`'s).
    pub invariant_violations: Vec<String>,
}

/// `GET /get_model_info` (alias `/model_info`).
#[derive(Serialize, ToSchema)]
pub struct ModelInfo {
    pub model_path: String,
    pub tokenizer_path: String,
    pub is_generation: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListObject {
    List,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelObject {
    Model,
}

/// `GET /v1/models`: the one served model.
#[derive(Serialize, ToSchema)]
pub struct ModelList {
    pub object: ListObject,
    pub data: Vec<ModelCard>,
}

#[derive(Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: ModelObject,
    pub owned_by: String,
    pub root: String,
    pub max_model_len: usize,
}

/// `POST /flush_cache`.
#[derive(Serialize, ToSchema)]
pub struct FlushCacheResponse {
    pub message: String,
    pub ranks: Vec<u32>,
}

/// `POST /abort_request`: `"all"` or the rids sent an abort.
#[derive(Serialize, ToSchema)]
pub struct AbortResponse {
    #[schema(schema_with = aborted)]
    pub aborted: serde_json::Value,
}

fn aborted() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [{"type": "string", "enum": ["all"]}, {"type": "array", "items": {"type": "string"}}],
    }))
}

/// Why a generation ended (`meta_info.finish_reason`): `{type, matched?, length?, message?}`.
fn generate_finish_reason() -> RefOr<Schema> {
    literal(serde_json::json!({
        "type": ["object", "null"],
        "required": ["type"],
        "properties": {
            "type": {"enum": ["stop", "length", "abort", "error"]},
            "matched": {"type": ["integer", "string"]},
            "length": {"type": "integer", "minimum": 0},
            "message": {"type": "string"},
        },
    }))
}

/// One output token's log-probability as SGLang writes it: `[logprob, token_id, text or null]`.
fn triple() -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "minItems": 3,
        "maxItems": 3,
        "items": {"type": ["number", "string", "null"]},
    })
}

fn logprob_triples() -> RefOr<Schema> {
    literal(serde_json::json!({"type": "array", "items": triple()}))
}

fn top_logprob_triples() -> RefOr<Schema> {
    literal(serde_json::json!({
        "type": "array",
        "items": {"type": "array", "items": triple()},
    }))
}

/// SGLang's breakdown of the cached prompt tokens by where they were cached: every one here
/// is in a rank's own prefix cache (`device`); dpserve has no host tier (`host` is 0).
#[derive(Serialize, ToSchema)]
pub struct CachedTokensDetails {
    pub device: usize,
    pub host: usize,
}

/// SGLang's extension object of the OpenAI answers.
#[derive(Serialize, ToSchema)]
pub struct SglExt {
    /// With `return_cached_tokens_details`, when some prompt token was cached (as `usage`,
    /// once per prompt).
    pub cached_tokens_details: Option<CachedTokensDetails>,
}

/// The controller's decision for one request, answered with `return_routing`: the routing
/// trace's record (docs/TRACING.md). A disaggregated request's is its prefill leg's, with its
/// decode leg's under `decode`.
#[derive(Serialize, ToSchema)]
pub struct RoutingDecision {
    pub rid: String,
    /// Unix seconds.
    pub time: f64,
    /// The `--load-balance-method` (or `--decode-load-balance-method`) that chose.
    pub method: String,
    /// Where the key came from: `routing_key`, `token_prefix`, `explicit`, `none`.
    pub key_source: String,
    pub key_digest: Option<String>,
    /// Live ranks in HRW order (the affinity methods).
    pub hrw_order: Vec<u32>,
    /// Every live rank's load at decision time: `{rank, active_requests, active_tokens}`.
    #[schema(value_type = Vec<Object>)]
    pub loads: Vec<serde_json::Value>,
    /// The overload guard's threshold on active requests.
    pub threshold: Option<f64>,
    pub rank: Option<u32>,
    /// The method's branch: `affinity`, `spill`, `cached`, `cold`, `max_score`, ...
    pub branch: Option<String>,
    pub fallback: Option<String>,
    /// `prefill` or `decode` in a disaggregated deployment.
    pub leg: Option<String>,
    /// `cache_aware`: per live rank its cached prefix (`matched_tokens`), the tokens it would
    /// compute, its backlog, prefill rate and predicted `cost` in seconds, cheapest first.
    #[schema(value_type = Option<Vec<Object>>)]
    pub costs: Option<Vec<serde_json::Value>>,
    /// The peers' methods: per live rank the terms of the method's rule (`rule` names it).
    #[schema(value_type = Option<Vec<Object>>)]
    pub scores: Option<Vec<serde_json::Value>>,
    /// The chosen rank's lead over the best other one by the method's own measure (negative:
    /// a guard overruled it); absent without a per-rank measure.
    pub margin: Option<f64>,
    /// A disaggregated request's decode leg.
    #[schema(value_type = Option<Object>)]
    pub decode: Option<serde_json::Value>,
}

/// `meta_info` of a `/generate` answer or stream chunk.
#[derive(Serialize, ToSchema)]
pub struct GenerateMetaInfo {
    pub id: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// When some prompt token was cached (as SGLang).
    pub cached_tokens_details: Option<CachedTokensDetails>,
    /// Null until the request ends.
    #[schema(schema_with = generate_finish_reason)]
    pub finish_reason: Option<serde_json::Value>,
    pub dp_rank: Option<u32>,
    pub e2e_latency: f64,
    /// With `return_logprob`.
    #[schema(schema_with = logprob_triples)]
    pub output_token_logprobs: Option<Vec<serde_json::Value>>,
    /// With `return_logprob` and `top_logprobs_num` > 0.
    #[schema(schema_with = top_logprob_triples)]
    pub output_top_logprobs: Option<Vec<serde_json::Value>>,
    /// With `return_routing`, once the first output brought it.
    pub routing: Option<RoutingDecision>,
}

/// `POST /generate`: the whole answer, or (streaming) one chunk: as SGLang, everything so far
/// (the last chunk is the whole answer); with `--incremental-streaming-output`, that step's
/// text, ids and log-probabilities only.
#[derive(Serialize, ToSchema)]
pub struct GenerateResponse {
    pub text: String,
    pub output_ids: Vec<u32>,
    pub meta_info: GenerateMetaInfo,
}

#[derive(Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// OpenAI `usage`; a prompt counts once however many choices it has.
#[derive(Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

fn finish_reason() -> RefOr<Schema> {
    literal(serde_json::json!({"enum": ["stop", "length", "abort", "error", null]}))
}

/// The stop string or token id that ended the choice.
fn matched_stop() -> RefOr<Schema> {
    literal(serde_json::json!({"type": ["integer", "string", "null"]}))
}

/// OpenAI's legacy completions log-probabilities.
#[derive(Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Per token a `{text: logprob}` map, with `logprobs` > 0.
    #[schema(value_type = Option<Vec<Object>>)]
    pub top_logprobs: Option<serde_json::Value>,
    pub text_offset: Vec<usize>,
}

#[derive(Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    #[schema(schema_with = finish_reason)]
    pub finish_reason: Option<String>,
    #[schema(schema_with = matched_stop)]
    pub matched_stop: Option<serde_json::Value>,
    /// With `return_routing`: this choice's decision (each choice is its own request); in a
    /// stream, on the choice's final chunk.
    pub routing: Option<RoutingDecision>,
}

/// `POST /v1/completions`: the answer, or (streaming) one chunk; the last chunk of a stream with
/// `include_usage` has no choices and the usage.
#[derive(Serialize, ToSchema)]
pub struct CompletionResponse {
    pub id: String,
    pub object: CompletionObject,
    pub created: u64,
    pub model: String,
    #[schema(value_type = Option<String>)]
    pub system_fingerprint: Option<String>,
    pub choices: Vec<CompletionChoice>,
    pub usage: Option<Usage>,
    /// With `return_cached_tokens_details`; in a stream, on the last chunk with a choice.
    pub sglext: Option<SglExt>,
}

#[derive(Serialize, ToSchema)]
pub enum CompletionObject {
    #[serde(rename = "text_completion")]
    TextCompletion,
}

#[derive(Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Serialize, ToSchema)]
pub struct ChatResponseMessage {
    pub role: String,
    pub content: String,
}

#[derive(Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    #[schema(schema_with = finish_reason)]
    pub finish_reason: Option<String>,
    #[schema(schema_with = matched_stop)]
    pub matched_stop: Option<serde_json::Value>,
    /// With `return_routing`: this choice's decision (each choice is its own request); in a
    /// stream, on the choice's final chunk.
    pub routing: Option<RoutingDecision>,
}

#[derive(Serialize, ToSchema)]
pub enum ChatObject {
    #[serde(rename = "chat.completion")]
    ChatCompletion,
}

/// `POST /v1/chat/completions` without `stream`.
#[derive(Serialize, ToSchema)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: ChatObject,
    pub created: u64,
    pub model: String,
    #[schema(value_type = Option<String>)]
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// With `return_cached_tokens_details`.
    pub sglext: Option<SglExt>,
}

#[derive(Serialize, ToSchema)]
pub struct ChatDelta {
    /// In a choice's first chunk only.
    pub role: Option<String>,
    pub content: String,
}

#[derive(Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    #[schema(schema_with = finish_reason)]
    pub finish_reason: Option<String>,
    #[schema(schema_with = matched_stop)]
    pub matched_stop: Option<serde_json::Value>,
    /// With `return_routing`: this choice's decision (each choice is its own request); in a
    /// stream, on the choice's final chunk.
    pub routing: Option<RoutingDecision>,
}

#[derive(Serialize, ToSchema)]
pub enum ChatChunkObject {
    #[serde(rename = "chat.completion.chunk")]
    ChatCompletionChunk,
}

/// One `data:` event of a streamed chat completion.
#[derive(Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: ChatChunkObject,
    pub created: u64,
    pub model: String,
    #[schema(value_type = Option<String>)]
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChatChunkChoice>,
    pub usage: Option<Usage>,
    /// With `return_cached_tokens_details`, on the last chunk with a choice.
    pub sglext: Option<SglExt>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingObject {
    Embedding,
}

/// A list of floats, or base64 of their little-endian f32 bytes.
fn embedding_vector() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}],
    }))
}

#[derive(Serialize, ToSchema)]
pub struct Embedding {
    pub object: EmbeddingObject,
    pub index: usize,
    #[schema(schema_with = embedding_vector)]
    pub embedding: serde_json::Value,
}

#[derive(Serialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// `POST /v1/embeddings`.
#[derive(Serialize, ToSchema)]
pub struct EmbeddingResponse {
    pub object: ListObject,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Serialize, ToSchema)]
pub struct EncodeMetaInfo {
    pub id: String,
    pub prompt_tokens: usize,
    pub dp_rank: Option<u32>,
}

#[derive(Serialize, ToSchema)]
pub struct EncodeItem {
    pub embedding: Vec<f32>,
    pub meta_info: EncodeMetaInfo,
}

/// `POST /encode`: one item, or a list for a list of inputs.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum EncodeResponse {
    One(EncodeItem),
    Many(Vec<EncodeItem>),
}
