//! Request bodies: each endpoint's one type, read by `super::super::body` (a field of the wrong
//! type is a 400 naming it), checked by its handler's parser (`validate`, `openai::params`,
//! `embeddings`: ranges and rules between fields) and described in the OpenAPI document
//! (`ToSchema`; the limits written on the types are the parsers' own, which a unit test in
//! `super::super::openapi` checks against their constants). Unknown fields are accepted and
//! ignored, and a null is the same as an absent field, so every optional field is nullable.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use super::fields::{
    flat, wide_f32, Content, EncodeIds, EncodeText, LogitBias, OneIds, OneText, Prompts, Stop,
};
use super::literal;

/// A token id: a u32 (the vocabulary bound is the model's, checked per request: 400).
fn token_id() -> serde_json::Value {
    serde_json::json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})
}

/// `stop`: one string or up to 4 (`validate::MAX_STOP_STRINGS`), none empty.
pub fn stop_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "description": "A stop string or a list of up to 4; the text ends before the first match.",
        "oneOf": [
            {"type": "null"},
            {"type": "string", "minLength": 1},
            {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}},
        ],
    }))
}

/// `logit_bias`: token id (a decimal string) to a bias in [-100, 100].
pub fn logit_bias_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "description": "Token id (decimal) to a bias in [-100, 100] added to its logit. Ids \
                        outside the model's vocabulary are a 400.",
        "type": ["object", "null"],
        "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    }))
}

/// A list of token ids, not empty.
pub fn token_ids_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "type": ["array", "null"],
        "minItems": 1,
        "items": token_id(),
    }))
}

/// `stop_token_ids`: possibly empty.
pub fn stop_token_ids_schema() -> RefOr<Schema> {
    literal(serde_json::json!({"type": ["array", "null"], "items": token_id()}))
}

/// Completions' `prompt` and embeddings' `input`: a string, strings, token ids, or lists of
/// token ids; no list empty.
/// `min_length`: embeddings refuse an empty text, completions take it (BOS alone).
pub fn prompt_schema(max_items: usize, min_length: usize) -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [
            {"type": "string", "minLength": min_length},
            {"type": "array", "minItems": 1, "maxItems": max_items,
             "items": {"type": "string", "minLength": min_length}},
            {"type": "array", "minItems": 1, "items": token_id()},
            {"type": "array", "minItems": 1, "maxItems": max_items,
             "items": {"type": "array", "minItems": 1, "items": token_id()}},
        ],
    }))
}

fn completions_prompt() -> RefOr<Schema> {
    prompt_schema(128, 0)
}

fn embeddings_input() -> RefOr<Schema> {
    prompt_schema(2048, 1)
}

/// `top_k` on `/generate`: -1 (off) or at least 1.
fn generate_top_k() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [
            {"type": "null"},
            {"type": "integer", "enum": [-1]},
            {"type": "integer", "minimum": 1, "maximum": i32::MAX},
        ],
    }))
}

/// `/encode`'s `text`: one string or a list, none empty.
fn encode_text() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [
            {"type": "null"},
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "maxItems": 2048,
             "items": {"type": "string", "minLength": 1}},
        ],
    }))
}

/// `/encode`'s `input_ids`: ids, or a list of lists of ids.
fn encode_ids() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [
            {"type": "null"},
            {"type": "array", "minItems": 1, "items": token_id()},
            {"type": "array", "minItems": 1, "maxItems": 2048,
             "items": {"type": "array", "minItems": 1, "items": token_id()}},
        ],
    }))
}

/// `rid`: 1 to `protocol::MAX_RID_LEN` bytes (ASCII here keeps bytes = characters).
fn rid() -> RefOr<Schema> {
    literal(serde_json::json!({
        "description": "Request id chosen by the client; the same rid may not be in flight \
                        twice (400). Sub-requests (n > 1, batches) append -<index>.",
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": protocol::MAX_RID_LEN,
        "pattern": "^[\\x20-\\x7e]*$",
    }))
}

/// SGLang's `sampling_params` of `/generate`.
#[derive(Deserialize, ToSchema)]
#[serde(expecting = "an object")]
pub struct GenerateSamplingParams {
    /// Tokens to generate at most; prompt plus this must fit the context (else 400).
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    pub max_new_tokens: Option<u32>,
    /// 0 is greedy; at most the largest `f32`.
    #[schema(minimum = 0, maximum = 3.4028234663852886e38)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub temperature: Option<f32>,
    #[schema(exclusive_minimum = 0, maximum = 1)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub top_p: Option<f32>,
    #[schema(schema_with = generate_top_k)]
    pub top_k: Option<i32>,
    #[schema(minimum = 0, maximum = 1)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub min_p: Option<f32>,
    #[schema(minimum = 0, maximum = 18446744073709551615_u64)]
    pub seed: Option<u64>,
    #[schema(exclusive_minimum = 0, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub repetition_penalty: Option<f32>,
    #[schema(minimum = -2, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub frequency_penalty: Option<f32>,
    #[schema(minimum = -2, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub presence_penalty: Option<f32>,
    #[schema(schema_with = stop_token_ids_schema)]
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    #[schema(schema_with = logit_bias_schema)]
    pub logit_bias: Option<LogitBias>,
    #[schema(schema_with = stop_schema)]
    pub stop: Option<Stop>,
    /// Only 1: `n` > 1 is for `/v1/completions`.
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u32>,
    /// Structured output: the text is a JSON document this JSON Schema accepts (the schema as a
    /// string, as SGLang takes it, or as an object). One of `json_schema`, `regex`, `ebnf`.
    #[schema(schema_with = json_schema_param)]
    pub json_schema: Option<Value>,
    /// Structured output: the whole text matches this regular expression.
    pub regex: Option<String>,
    /// Structured output: the text matches this grammar, in llguidance's Lark dialect
    /// (`start: ...`); GBNF's `::=` rules are refused.
    pub ebnf: Option<String>,
}

/// `sampling_params.json_schema`: a JSON Schema, as a string or an object.
pub fn json_schema_param() -> RefOr<Schema> {
    literal(serde_json::json!({
        "description": "A JSON Schema the output must match, as JSON text (SGLang) or an object.",
        "oneOf": [{"type": "null"}, {"type": "string"}, {"type": "object"}, {"type": "boolean"}],
    }))
}

/// The routing fields of every body that runs on a rank; the routing headers win over them.
#[derive(Deserialize, ToSchema)]
pub struct Routing {
    pub routing_key: Option<String>,
    /// Pin a live rank (not live: 400); the `X-Data-Parallel-Rank` header wins.
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    pub routed_dp_rank: Option<u32>,
    /// SGLang's name for `routed_dp_rank` (`routed_dp_rank` wins when both are given).
    #[schema(minimum = 0, maximum = 4294967295_u64)]
    pub data_parallel_rank: Option<u32>,
}

/// `POST /generate` (SGLang-native). Exactly one of `text` and `input_ids`.
#[derive(Deserialize, ToSchema)]
pub struct GenerateRequest {
    #[schema(value_type = Option<String>)]
    pub text: Option<OneText>,
    #[schema(schema_with = token_ids_schema)]
    pub input_ids: Option<OneIds>,
    #[schema(inline)]
    pub sampling_params: Option<GenerateSamplingParams>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    #[serde(flatten, deserialize_with = "flat")]
    pub dispatch: DispatchFields,
    pub return_logprob: Option<bool>,
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs_num: Option<u32>,
    pub return_text_in_logprobs: Option<bool>,
}

/// Where the request goes and what its client learns of it, the same on `/generate` and both
/// OpenAI endpoints.
// Checked into `validate::Dispatch`, which the endpoints carry whole to the wire: a new field
// of this kind is added here, there and in `Dispatch::write`.
#[derive(Deserialize, ToSchema)]
pub struct DispatchFields {
    #[serde(flatten, deserialize_with = "flat")]
    pub routing: Routing,
    /// Answer the routing decision: `/generate` in `meta_info.routing`, the OpenAI endpoints
    /// in each choice's `routing` (the `x-dpserve-return-routing` header wins).
    pub return_routing: Option<bool>,
    #[schema(minimum = 0, maximum = 18446744073709551615_u64)]
    pub bootstrap_room: Option<u64>,
    #[schema(schema_with = rid)]
    pub rid: Option<String>,
}

/// The sampling and routing fields both OpenAI endpoints take (with SGLang/vLLM extensions).
#[derive(Deserialize, ToSchema)]
pub struct OpenAiSampling {
    pub model: Option<String>,
    #[schema(minimum = 0, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub temperature: Option<f32>,
    /// 0 is greedy.
    #[schema(minimum = 0, maximum = 1)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub top_p: Option<f32>,
    /// -1 or 0: off.
    #[schema(minimum = -1, maximum = 2147483647)]
    pub top_k: Option<i32>,
    #[schema(minimum = 0, maximum = 1)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub min_p: Option<f32>,
    #[schema(exclusive_minimum = 0, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub repetition_penalty: Option<f32>,
    #[schema(minimum = -2, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub frequency_penalty: Option<f32>,
    #[schema(minimum = -2, maximum = 2)]
    #[serde(default, deserialize_with = "wide_f32")]
    pub presence_penalty: Option<f32>,
    /// Choices per prompt; prompts × n at most 128.
    #[schema(minimum = 1, maximum = 128, value_type = Option<u32>)]
    pub n: Option<i64>,
    #[schema(minimum = -9223372036854775808_i64, maximum = 9223372036854775807_i64)]
    pub seed: Option<i64>,
    #[schema(schema_with = stop_schema)]
    pub stop: Option<Stop>,
    #[schema(schema_with = stop_token_ids_schema)]
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    #[schema(schema_with = logit_bias_schema)]
    pub logit_bias: Option<LogitBias>,
    pub stream: Option<bool>,
    /// Only with `stream: true`.
    #[schema(inline)]
    pub stream_options: Option<StreamOptions>,
    // Ignored, but of its documented type.
    #[allow(dead_code)]
    pub user: Option<String>,
    #[serde(flatten, deserialize_with = "flat")]
    pub dispatch: DispatchFields,
    /// SGLang's: answer `sglext.cached_tokens_details` (when some prompt token was cached).
    pub return_cached_tokens_details: Option<bool>,
    /// Chat: functions the model may call (`{"type": "function", "function": {"name",
    /// "description", "parameters"}}`), shown to the chat template; a call comes back in the
    /// message's `tool_calls` (docs/HTTP.md, "Tool calling"). Not on completions (400).
    #[schema(schema_with = tools_schema)]
    pub tools: Option<Value>,
    /// `none`, `auto` (the default with tools), `required`, or `{"type": "function",
    /// "function": {"name": …}}`: the last two constrain the output to calls.
    #[schema(schema_with = tool_choice_schema)]
    pub tool_choice: Option<Value>,
    /// With `tool_choice: "required"`: more than one call allowed (default true).
    pub parallel_tool_calls: Option<bool>,
    /// The deprecated `functions` are refused (400): use `tools`.
    #[schema(ignore)]
    pub functions: Option<Value>,
    /// Structured output: `{"type": "text"}` (none), `{"type": "json_object"}` (any JSON
    /// object) or `{"type": "json_schema", "json_schema": {"name": …, "schema": {…},
    /// "strict": …}}`; the output is enforced token by token either way.
    #[schema(schema_with = response_format_schema)]
    pub response_format: Option<Value>,
}

/// OpenAI's `tools`.
pub fn tools_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "description": "Functions the model may call.",
        "type": ["array", "null"],
        "items": {"type": "object", "required": ["type", "function"],
                  "properties": {"type": {"enum": ["function"]},
                                 "function": {"type": "object", "required": ["name"],
                                              "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                                                             "description": {"type": "string"},
                                                             "parameters": {"type": "object"},
                                                             "strict": {"type": ["boolean", "null"]}}}}},
    }))
}

/// An assistant message's `tool_calls`.
pub fn tool_calls_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "type": ["array", "null"],
        "items": {"type": "object", "required": ["function"],
                  "properties": {"id": {"type": "string"}, "type": {"enum": ["function"]},
                                 "function": {"type": "object", "required": ["name"],
                                              "properties": {"name": {"type": "string"},
                                                             "arguments": {"type": ["string", "object"]}}}}},
    }))
}

/// OpenAI's `tool_choice`.
pub fn tool_choice_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [
            {"type": "null"},
            {"enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"],
             "properties": {"type": {"enum": ["function"]},
                            "function": {"type": "object", "required": ["name"],
                                         "properties": {"name": {"type": "string"}}}}},
        ],
    }))
}

/// OpenAI's `response_format`.
pub fn response_format_schema() -> RefOr<Schema> {
    literal(serde_json::json!({
        "description": "The form of the output: text, any JSON object, or a JSON Schema's documents.",
        "oneOf": [
            {"type": "null"},
            {"type": "object", "required": ["type"],
             "properties": {"type": {"enum": ["text", "json_object"]}}},
            {"type": "object", "required": ["type", "json_schema"],
             "properties": {"type": {"enum": ["json_schema"]},
                            "json_schema": {"type": "object", "required": ["name"],
                                            "properties": {"name": {"type": "string"},
                                                           "description": {"type": "string"},
                                                           "schema": {"type": "object"},
                                                           "strict": {"type": ["boolean", "null"]}}}}},
        ],
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(expecting = "an object")]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and `usage: null` on the others).
    pub include_usage: Option<bool>,
}

/// `POST /v1/completions`.
#[derive(Deserialize, ToSchema)]
pub struct CompletionRequest {
    // Required; read as an `Option` so that a body without it is a 400 saying so.
    #[schema(schema_with = completions_prompt, required = true)]
    pub prompt: Option<Prompts>,
    /// Default 16; prompt plus this must fit the context (else 400).
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub max_tokens: Option<i64>,
    /// Alternatives per token, 0 to 5; present turns log-probabilities on.
    #[schema(minimum = 0, maximum = 5)]
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    /// Only equal to `n` (more is not supported: 400).
    #[schema(minimum = 1, maximum = 128)]
    pub best_of: Option<i64>,
    /// Only empty (a suffix is not supported: 400).
    #[schema(max_length = 0)]
    pub suffix: Option<String>,
    #[serde(flatten, deserialize_with = "flat")]
    pub sampling: OpenAiSampling,
}

/// One chat message; `content` a string or a list of `{type: "text", text}` parts.
#[derive(Deserialize, ToSchema)]
#[serde(expecting = "an object")]
pub struct ChatMessage {
    // Required; read as an `Option` so that a message without one is a 400 saying so.
    #[schema(value_type = ChatRole)]
    pub role: Option<ChatRole>,
    #[schema(schema_with = chat_content)]
    pub content: Option<Content>,
    /// An assistant's calls (`[{"id", "type": "function", "function": {"name", "arguments"}}]`,
    /// arguments as JSON text or an object): shown to the chat template.
    #[schema(schema_with = tool_calls_schema)]
    pub tool_calls: Option<Value>,
    /// A tool message: the call it answers.
    pub tool_call_id: Option<String>,
    /// A tool message: the function's name.
    pub name: Option<String>,
}

#[derive(Serialize, ToSchema, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
}

impl ChatRole {
    const ALL: [ChatRole; 6] = [
        ChatRole::System,
        ChatRole::Developer,
        ChatRole::User,
        ChatRole::Assistant,
        ChatRole::Tool,
        ChatRole::Function,
    ];

    /// As the chat template (and the JSON) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatRole::System => "system",
            ChatRole::Developer => "developer",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
            ChatRole::Tool => "tool",
            ChatRole::Function => "function",
        }
    }
}

impl<'de> Deserialize<'de> for ChatRole {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let Value::String(role) = Value::deserialize(d)? else {
            return Err(D::Error::custom("expected a string"));
        };
        ChatRole::ALL
            .into_iter()
            .find(|r| r.as_str() == role)
            .ok_or_else(|| D::Error::custom(format!("unknown role {role:?}")))
    }
}

fn chat_content() -> RefOr<Schema> {
    literal(serde_json::json!({
        "oneOf": [
            {"type": "null"},
            {"type": "string"},
            {"type": "array", "items": {
                "type": "object",
                "required": ["type", "text"],
                "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
            }},
        ],
    }))
}

/// `POST /v1/chat/completions`. Tools, functions and structured output are refused (400).
#[derive(Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    // Required (see `CompletionRequest::prompt`).
    #[schema(min_items = 1, value_type = Vec<ChatMessage>)]
    pub messages: Option<Vec<ChatMessage>>,
    /// Without it (or `max_tokens`): up to the end of the context.
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub max_completion_tokens: Option<i64>,
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub max_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    /// 0 to 20; above 0 needs `logprobs: true`.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
    /// Render the assistant's turn opening after the messages (default true).
    pub add_generation_prompt: Option<bool>,
    /// Completions' fields, read to be refused here by name (400) rather than ignored.
    #[schema(ignore)]
    pub echo: Option<bool>,
    #[schema(ignore)]
    pub best_of: Option<i64>,
    #[schema(ignore)]
    pub suffix: Option<String>,
    #[serde(flatten, deserialize_with = "flat")]
    pub sampling: OpenAiSampling,
}

// Described only: `encoding_format` is read as a string.
#[allow(dead_code)]
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// `POST /v1/embeddings`. `dimensions` is refused (400): embeddings have the model's size.
#[derive(Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    /// No input empty; at most 2048.
    // Required (see `CompletionRequest::prompt`).
    #[schema(schema_with = embeddings_input, required = true)]
    pub input: Option<Prompts>,
    pub model: Option<String>,
    // Read as a string, so that another value is a 400 naming the two there are.
    #[schema(value_type = Option<EncodingFormat>)]
    pub encoding_format: Option<String>,
    // Ignored, but of its documented type.
    #[allow(dead_code)]
    pub user: Option<String>,
    #[serde(flatten, deserialize_with = "flat")]
    pub routing: Routing,
    /// Read to be refused by name (400) rather than ignored.
    #[schema(ignore)]
    pub dimensions: Option<Value>,
}

/// `POST /encode` (SGLang-native). Exactly one of `text` and `input_ids`; a list answers a list.
#[derive(Deserialize, ToSchema)]
pub struct EncodeRequest {
    #[schema(schema_with = encode_text)]
    pub text: Option<EncodeText>,
    #[schema(schema_with = encode_ids)]
    pub input_ids: Option<EncodeIds>,
    #[serde(flatten, deserialize_with = "flat")]
    pub routing: Routing,
    #[schema(schema_with = rid)]
    pub rid: Option<String>,
}

/// `POST /abort_request`: a `rid` (and its `-<i>` sub-requests), or `abort_all: true`.
#[derive(Deserialize, ToSchema)]
pub struct AbortRequest {
    #[schema(min_length = 1)]
    pub rid: Option<String>,
    pub abort_all: Option<bool>,
}
