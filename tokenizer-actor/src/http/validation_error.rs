//! Every rule a request can break that is a 400 naming a field: one variant each, carrying
//! what its message needs. The message is what the client reads, and [`ValidationError::param`]
//! the field it blames; the one `From` below makes the HTTP error of both. The checks
//! themselves stay with their endpoint (`validate`, `body`, `embeddings`, `info`, `openai`).

use serde_json::Value;

use super::error::ApiError;

/// A request that breaks one of the server's rules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    // Any body, as `body` reads it.
    /// A known field has the wrong type or shape; the message is the reader's.
    #[error("{message}")]
    BadField { param: String, message: String },

    // `/generate`, and what every endpoint shares (`validate`).
    /// `/generate` makes one choice.
    #[error("sampling_params.n > 1 is not supported on /generate; use /v1/completions")]
    GenerateN,
    /// `top_logprobs_num` is at most `max`.
    #[error("top_logprobs_num must be in [0, {max}], got {got}")]
    TopLogprobsNum { max: u32, got: u32 },
    /// A rid fits the protocol's limits; the message is `protocol::rid_problem`'s.
    #[error("{why}")]
    Rid { why: String },
    /// A rid is printable ASCII.
    #[error("rid must be printable ASCII (0x20 to 0x7e)")]
    RidNotPrintable,
    /// The rid of the last sub-request (`rid-index`) fits the protocol's limits too.
    #[error("{why} with the suffix -{index} of a batch or n > 1")]
    ChildRid { why: String, index: usize },
    /// A JSON Schema is an object, a bool or its JSON text.
    #[error("{field} must be a JSON Schema (an object, or its JSON text), got {got}")]
    NotJsonSchema { field: &'static str, got: Value },
    /// A GBNF grammar is one that can be written as Lark.
    #[error("{field}: {error}")]
    Gbnf { field: &'static str, error: String },
    /// Sampling parameters are finite numbers.
    #[error("{prefix}{name} must be a finite number")]
    NotFinite {
        prefix: &'static str,
        name: &'static str,
    },
    /// `temperature` is not negative.
    #[error("{prefix}temperature must be >= 0, got {got}")]
    NegativeTemperature { prefix: &'static str, got: f32 },
    /// `top_p` is in (0, 1].
    #[error("{prefix}top_p must be in (0, 1], got {got}")]
    TopP { prefix: &'static str, got: f32 },
    /// `min_p` is in [0, 1].
    #[error("{prefix}min_p must be in [0, 1], got {got}")]
    MinP { prefix: &'static str, got: f32 },
    /// `top_k` is -1 (off) or at least 1.
    #[error("{prefix}top_k must be -1 (off) or >= 1, got {got}")]
    TopK { prefix: &'static str, got: i32 },
    /// `repetition_penalty` is in (0, 2].
    #[error("{prefix}repetition_penalty must be in (0, 2], got {got}")]
    RepetitionPenalty { prefix: &'static str, got: f32 },
    /// `frequency_penalty` and `presence_penalty` are in [-2, 2].
    #[error("{prefix}{name} must be in [-2, 2], got {got}")]
    Penalty {
        prefix: &'static str,
        name: &'static str,
        got: f32,
    },
    /// Every prompt token id is in the vocabulary.
    #[error("input_ids[{index}] = {id} is out of range for vocabulary size {vocab}")]
    InputIdOutOfVocab { index: usize, id: u32, vocab: usize },
    /// Every stop token id is in the vocabulary.
    #[error("stop_token_ids: {id} is out of range for vocabulary size {vocab}")]
    StopTokenIdOutOfVocab { id: u32, vocab: usize },
    /// Every biased token id is in the vocabulary.
    #[error("logit_bias: token {id} is out of range for vocabulary size {vocab}")]
    LogitBiasOutOfVocab { id: u32, vocab: usize },
    /// The prompt and the tokens to generate fit the context.
    #[error(
        "prompt ({prompt_tokens} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the \
         context length {context_len}"
    )]
    ContextExceeded {
        prompt_tokens: usize,
        max_new_tokens: u32,
        context_len: usize,
    },

    // Embeddings (`embeddings`), and any text the tokenizer is given.
    /// A text is one the tokenizer can encode; the message is the tokenizer's.
    #[error("{error}")]
    Encode { param: &'static str, error: String },
    /// An input encodes to at least one token.
    #[error("{name} encodes to no tokens")]
    NoTokens { param: &'static str, name: String },
    /// Every token id of an input is in the vocabulary.
    #[error("{name}: token {index} = {id} is out of range for vocabulary size {vocab}")]
    EmbedIdOutOfVocab {
        param: &'static str,
        name: String,
        index: usize,
        id: u32,
        vocab: usize,
    },
    /// An input fits the context.
    #[error("{name} has {tokens} tokens, more than the context length {context_len}")]
    EmbedTooLong {
        param: &'static str,
        name: String,
        tokens: usize,
        context_len: usize,
    },
    /// At most `max` inputs per request.
    #[error("{param}: at most {max} inputs per request, got {got}")]
    TooManyInputs {
        param: &'static str,
        max: usize,
        got: usize,
    },
    /// The inputs (`input`, `prompt`) are given.
    #[error("{param}: is required")]
    Required { param: &'static str },
    /// `/v1/embeddings` takes no empty string.
    #[error("input: must not be empty")]
    EmptyText,
    /// `/encode`'s inputs are not an empty list.
    #[error("{param} is empty")]
    NoInputs { param: &'static str },
    /// None of `/encode`'s inputs is empty.
    #[error("{param}: inputs must not be empty")]
    EmptyInput { param: &'static str },
    /// The embedding size is the model's.
    #[error(
        "dimensions: choosing the embedding size is not supported by this server \
         (embeddings have the model's hidden size)"
    )]
    Dimensions,
    /// `encoding_format` is `float` or `base64`.
    #[error("encoding_format must be \"float\" or \"base64\", got {got:?}")]
    EncodingFormat { got: String },

    // Operations (`info`).
    /// `/flush_cache`'s query reads; the message is the reader's.
    #[error("timeout: {error}")]
    TimeoutQuery { error: String },
    /// `/flush_cache`'s `timeout` is a non-negative number of seconds.
    #[error("timeout must be a non-negative number of seconds, got {got}")]
    Timeout { got: f64 },
    /// `/abort_request`'s rid is not empty.
    #[error("rid must not be empty")]
    EmptyAbortRid,
    /// `/abort_request` names a rid or all.
    #[error("give rid (a string) or abort_all: true")]
    AbortTarget,

    // OpenAI's endpoints (`openai/params`, `openai`).
    /// A feature this server does not have is refused by name, never faked.
    #[error("{param}: {what} is not supported by this server")]
    Unsupported {
        param: &'static str,
        what: &'static str,
    },
    /// Completions' `logprobs` is at most `max`.
    #[error("logprobs must be in [0, {max}], got {got}")]
    Logprobs { max: u32, got: u32 },
    /// Prompts × `n` is at most `max` choices.
    #[error("at most {max} choices per request (prompts × n), got {got}")]
    TooManyChoices { max: usize, got: usize },
    /// Chat's `top_logprobs` is at most `max`.
    #[error("top_logprobs must be in [0, {max}], got {got}")]
    TopLogprobs { max: u32, got: u32 },
    /// Chat's `top_logprobs` comes with `logprobs`.
    #[error("top_logprobs requires logprobs to be true")]
    TopLogprobsWithoutLogprobs,
    /// `stream_options` comes with `stream`.
    #[error("stream_options is only allowed when stream is true")]
    StreamOptionsWithoutStream,
    /// A forced tool choice is the output's one constraint.
    #[error("a required or named tool_choice cannot be combined with response_format")]
    ToolChoiceWithResponseFormat,
    /// OpenAI's `temperature` is in [0, 2].
    #[error("temperature must be in [0, 2], got {got}")]
    Temperature { got: f32 },
    /// OpenAI's `top_p` is in [0, 1].
    #[error("top_p must be in [0, 1], got {got}")]
    OpenAiTopP { got: f32 },
    /// `n` is in [1, `max`].
    #[error("n must be in [1, {max}], got {got}")]
    N { max: usize, got: i64 },
    /// `best_of` is not below `n`.
    #[error("best_of must be >= n")]
    BestOfBelowN,
    /// `response_format` of type `json_schema` has its `json_schema`.
    #[error(
        "response_format.json_schema is required (an object with name and schema) when type is \
         json_schema"
    )]
    JsonSchemaRequired,
    /// `response_format.json_schema` has a name.
    #[error("response_format.json_schema.name is required (a string)")]
    JsonSchemaName,
    /// `response_format.type` is one this server has.
    #[error("response_format.type {got:?} is not supported (text, json_object or json_schema)")]
    ResponseFormatType { got: String },
    /// `response_format` has a type.
    #[error("response_format.type is required (text, json_object or json_schema)")]
    ResponseFormatTypeRequired,
    /// A completion limit (`max_tokens`, `max_completion_tokens`) is at least 1.
    #[error("{param} must be at least 1, got {got}")]
    AtLeastOne { param: &'static str, got: i64 },
    /// Chat has `messages`.
    #[error("messages is required")]
    MessagesRequired,
    /// Chat's `messages` is not empty.
    #[error("messages must not be empty")]
    MessagesEmpty,
    /// Every message has a role.
    #[error("messages[{index}].role is required")]
    MessageRole { index: usize },
    /// A message's `tool_calls` is a list of calls.
    #[error(
        "messages[{index}].tool_calls must be a list of calls \
         ({{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}})"
    )]
    MessageToolCalls { index: usize },
    /// The chat template renders the messages; the message is the template's.
    #[error("{error}")]
    ChatTemplate { error: String },
    /// `tool_choice` auto needs the model's tool-call format.
    #[error(
        "tool_choice auto needs the model's tool-call format, and this model's chat \
         template writes none: use tool_choice required or a named function"
    )]
    AutoToolChoiceWithoutFormat,

    // Tool calling (`openai/tools`).
    /// `tools` is a list.
    #[error("tools must be a list of functions")]
    ToolsNotList,
    /// A tool is of type `function`.
    #[error("tools[{index}].type: only type \"function\" is supported")]
    ToolType { index: usize },
    /// A tool has its `function` object.
    #[error("tools[{index}].function is required (an object)")]
    ToolFunction { index: usize },
    /// A function's name is 1 to 64 of a-z, A-Z, 0-9, _ and -.
    #[error(
        "tools[{index}].function.name: {name:?} is not a function name (1 to 64 of a-z, A-Z, \
         0-9, _ and -)"
    )]
    ToolName { index: usize, name: String },
    /// A function's `parameters` is a JSON Schema object.
    #[error("tools[{index}].function.parameters must be a JSON Schema object")]
    ToolParameters { index: usize },
    /// No two functions have one name.
    #[error("tools[{index}]: the function name {name:?} is given twice")]
    ToolNameTwice { index: usize, name: String },
    /// `tool_choice` as a string is `none`, `auto` or `required`.
    #[error("tool_choice {got:?} is not one of none, auto, required or a function")]
    ToolChoiceWord { got: String },
    /// `tool_choice` is a string or names a function.
    #[error(
        "tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": \
         {{\"name\": …}}}}"
    )]
    ToolChoiceShape,
    /// A named `tool_choice` is one of the tools.
    #[error("tool_choice names {name:?}, which is not among the tools")]
    ToolChoiceUnknown { name: String },
    /// `tool_choice` comes with tools.
    #[error("tool_choice needs tools")]
    ToolChoiceWithoutTools,
}

impl ValidationError {
    /// The request field to blame (the error's `param`).
    pub fn param(&self) -> String {
        let name = match self {
            Self::BadField { param, .. } => return param.clone(),
            Self::MessageRole { index } => return format!("messages[{index}].role"),
            Self::MessageToolCalls { index } => return format!("messages[{index}].tool_calls"),
            Self::NotJsonSchema { field, .. } | Self::Gbnf { field, .. } => *field,
            Self::NotFinite { name, .. } | Self::Penalty { name, .. } => *name,
            Self::Encode { param, .. }
            | Self::NoTokens { param, .. }
            | Self::EmbedIdOutOfVocab { param, .. }
            | Self::EmbedTooLong { param, .. }
            | Self::TooManyInputs { param, .. }
            | Self::Required { param }
            | Self::NoInputs { param }
            | Self::EmptyInput { param }
            | Self::Unsupported { param, .. }
            | Self::AtLeastOne { param, .. } => *param,
            Self::GenerateN | Self::N { .. } => "n",
            Self::TopLogprobsNum { .. } => "top_logprobs_num",
            Self::Rid { .. } | Self::RidNotPrintable | Self::ChildRid { .. } => "rid",
            Self::EmptyAbortRid | Self::AbortTarget => "rid",
            Self::NegativeTemperature { .. } | Self::Temperature { .. } => "temperature",
            Self::TopP { .. } | Self::OpenAiTopP { .. } => "top_p",
            Self::MinP { .. } => "min_p",
            Self::TopK { .. } => "top_k",
            Self::RepetitionPenalty { .. } => "repetition_penalty",
            Self::InputIdOutOfVocab { .. } => "input_ids",
            Self::StopTokenIdOutOfVocab { .. } => "stop_token_ids",
            Self::LogitBiasOutOfVocab { .. } => "logit_bias",
            Self::ContextExceeded { .. } => "max_tokens",
            Self::EmptyText => "input",
            Self::Dimensions => "dimensions",
            Self::EncodingFormat { .. } => "encoding_format",
            Self::TimeoutQuery { .. } | Self::Timeout { .. } => "timeout",
            Self::Logprobs { .. } => "logprobs",
            Self::TooManyChoices { .. } => "prompt",
            Self::TopLogprobs { .. } | Self::TopLogprobsWithoutLogprobs => "top_logprobs",
            Self::StreamOptionsWithoutStream => "stream_options",
            Self::BestOfBelowN => "best_of",
            Self::JsonSchemaRequired
            | Self::JsonSchemaName
            | Self::ResponseFormatType { .. }
            | Self::ResponseFormatTypeRequired => "response_format",
            Self::MessagesRequired | Self::MessagesEmpty | Self::ChatTemplate { .. } => "messages",
            Self::ToolsNotList
            | Self::ToolType { .. }
            | Self::ToolFunction { .. }
            | Self::ToolName { .. }
            | Self::ToolParameters { .. }
            | Self::ToolNameTwice { .. } => "tools",
            Self::ToolChoiceWithResponseFormat
            | Self::AutoToolChoiceWithoutFormat
            | Self::ToolChoiceWord { .. }
            | Self::ToolChoiceShape
            | Self::ToolChoiceUnknown { .. }
            | Self::ToolChoiceWithoutTools => "tool_choice",
        };
        name.to_string()
    }
}

/// The one place a broken rule becomes the HTTP error: a 400 with the rule's message, naming
/// its field.
impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        ApiError::invalid_param(e.param(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_written_across_lines_or_with_braces_read_as_one_sentence() {
        let cases = [
            (
                ValidationError::ToolChoiceShape,
                "tool_choice",
                "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": …}}",
            ),
            (
                ValidationError::MessageToolCalls { index: 2 },
                "messages[2].tool_calls",
                "messages[2].tool_calls must be a list of calls ({\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}})",
            ),
            (
                ValidationError::ContextExceeded {
                    prompt_tokens: 3,
                    max_new_tokens: 8,
                    context_len: 10,
                },
                "max_tokens",
                "prompt (3 tokens) plus max_new_tokens (8) exceeds the context length 10",
            ),
            (
                ValidationError::ToolName {
                    index: 1,
                    name: "a b".into(),
                },
                "tools",
                "tools[1].function.name: \"a b\" is not a function name (1 to 64 of a-z, A-Z, 0-9, _ and -)",
            ),
            (
                ValidationError::JsonSchemaRequired,
                "response_format",
                "response_format.json_schema is required (an object with name and schema) when type is json_schema",
            ),
        ];
        for (rule, param, message) in cases {
            let err = ApiError::from(rule);
            assert_eq!(err, ApiError::invalid_param(param, message));
        }
    }
}
