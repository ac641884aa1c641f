//! The worker's errors. [`WorkerError`] is what ends or refuses something on this rank;
//! [`RequestError`] is why a request is refused at submission (the client gets it as a 400);
//! [`RowFreeError`] is a request row given back twice (a bug, refused rather than corrupting the
//! pool).
//! Model-file and forward-pass errors are [`crate::model::ModelError`].

use thiserror::Error;

/// What makes a worker stop or refuse an operation.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The controller refused this worker (wrong model or protocol version): a configuration
    /// error that restarting will not fix.
    #[error("refused by the controller: {0}")]
    Refused(String),
    /// `flush_cache` while requests hold parts of the cache (they must finish first).
    #[error("cannot flush the cache while {running} requests are running or queued")]
    FlushBusy { running: usize },
    /// The device `--device` names cannot be used here (no driver, no such GPU, or no model
    /// path for it yet): a configuration error that restarting will not fix.
    #[error("--device {device}: {why}")]
    DeviceUnavailable { device: String, why: String },
    /// The model directory holds a family, an option or a tensor the model code does not
    /// implement ([`crate::model::ModelError::is_unsupported`]): a configuration error that
    /// restarting will not fix.
    #[error("loading model from {}: {reason}", dir.display())]
    UnsupportedModel {
        dir: std::path::PathBuf,
        reason: String,
    },
}

impl WorkerError {
    /// The exit status for a configuration error ([`WorkerError::Refused`],
    /// [`WorkerError::DeviceUnavailable`], [`WorkerError::UnsupportedModel`]): `EX_CONFIG` from sysexits.h, so a systemd unit can
    /// stop restarting on it.
    pub const REFUSED_EXIT_CODE: u8 = 78;

    /// Whether restarting the worker cannot help (it exits [`Self::REFUSED_EXIT_CODE`]).
    pub fn is_config_error(&self) -> bool {
        matches!(
            self,
            WorkerError::Refused(_)
                | WorkerError::DeviceUnavailable { .. }
                | WorkerError::UnsupportedModel { .. }
        )
    }
}

/// Why a request is refused before it is queued.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutsideVocab { id: u32, vocab: usize },
    #[error(
        "prompt ({prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context length \
         {context_len}"
    )]
    LongerThanContext {
        prompt: usize,
        max_new_tokens: u32,
        context_len: usize,
    },
    #[error("prompt ({prompt} tokens) does not fit in this rank's KV pool ({pool} tokens)")]
    LargerThanPool { prompt: usize, pool: usize },
    #[error(
        "data parallel rank {rank} has {cap} requests waiting (--max-queued-requests); retry later"
    )]
    QueueFull { rank: u32, cap: usize },
}

impl RequestError {
    /// The HTTP status the client sees: 400 for a request that can never run here, 503 (with
    /// `Retry-After` from the tokenizer) for a full queue.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::QueueFull { .. } => 503,
            _ => 400,
        }
    }
}

/// A request row given back that the pool does not hand out (`ReqToTokenPool::free`): a
/// bookkeeping bug in the caller, refused so that the row is never handed to two requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RowFreeError {
    #[error("request row {row} freed while it is free (a double free)")]
    NotHeld { row: usize },
    #[error("request row {row} is not one of the pool's {rows}")]
    OutOfRange { row: usize, rows: usize },
}
