//! Why a request stopped: in `TokenOut` and in a disaggregated request's `KvDone`, so in a file
//! of its own that both `messages` and `disagg` take it from.

use serde::{Deserialize, Serialize};

/// Why a request stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop token id (`matched_stop` says which).
    Stop,
    /// `max_new_tokens` or the context length was reached.
    Length,
    /// Aborted by the client or the operator.
    Abort,
    /// Failed; `error` says why.
    Error,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}
