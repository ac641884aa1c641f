//! The worker's errors. [`WorkerError`] is what ends or refuses something on this rank;
//! [`RequestError`] is why a request is refused at submission (the client gets it as a 400);
//! [`RowFreeError`] is a request row given back twice (a bug, refused rather than corrupting the
//! pool).
//! Model-file and forward-pass errors are [`crate::model::ModelError`].

use std::path::PathBuf;

use thiserror::Error;

use crate::model::ModelError;
use crate::sim::SimError;

/// What makes a worker stop or refuse an operation.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// A peer refused this worker: the controller (wrong model or protocol version, rank held)
    /// or a CURVE socket of the controller or the tokenizer (a key it does not list). The text
    /// names which (`refused by the tokenizer: …`). A configuration error that restarting will
    /// not fix.
    #[error("{0}")]
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
    UnsupportedModel { dir: PathBuf, reason: String },
    /// A flag's value, or two flags together, that this worker refuses at start.
    #[error("{0}")]
    Flag(String),
    // A cause printed in the message is not also a `source` (`{:#}` would print it twice).
    /// An address flag that does not parse.
    #[error("--{flag}: {error}")]
    Endpoint {
        flag: &'static str,
        error: protocol::ProtocolError,
    },
    /// A socket that cannot be bound at the address a flag gives.
    #[error("--{flag} {addr}: {error}")]
    Bind {
        flag: &'static str,
        addr: String,
        error: protocol::ProtocolError,
    },
    /// A model directory that cannot be read (a file missing or malformed).
    #[error("loading model from {}: {error}", dir.display())]
    Model { dir: PathBuf, error: ModelError },
    /// The first step of a GPU rank could not be planned.
    #[error(transparent)]
    Step(ModelError),
    /// A bad `--sim-profile`, `--sim-config` or a simulated pool that does not fit.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A file a flag names that cannot be opened (`--sim-lock-step`, `--trace-dir`).
    #[error("--{flag} {}: {error}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// Keys, sockets and frames.
    #[error(transparent)]
    Protocol(#[from] protocol::ProtocolError),
    /// A ZeroMQ call outside the protocol crate's helpers (inproc pipes, polling).
    #[error("{what}: {error}")]
    Socket {
        what: &'static str,
        error: zmq::Error,
    },
    /// The process could not set itself up (signal handlers, threads).
    #[error("{what}: {error}")]
    Os {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("building the compute thread pool: {0}")]
    ThreadPool(rayon::ThreadPoolBuildError),
    #[error("{0} thread panicked")]
    Panicked(&'static str),
}

impl WorkerError {
    /// The exit status for a configuration error ([`WorkerError::Refused`],
    /// [`WorkerError::DeviceUnavailable`], [`WorkerError::UnsupportedModel`]): `EX_CONFIG` from sysexits.h, so a systemd unit can
    /// stop restarting on it.
    pub const REFUSED_EXIT_CODE: u8 = 78;

    /// Whether restarting the worker cannot help (it exits [`Self::REFUSED_EXIT_CODE`]): a
    /// refusal, a device or model it cannot serve, or an address or key file the operator
    /// must change. A flag out of range exits 1, as for the other actors.
    pub fn is_config_error(&self) -> bool {
        match self {
            WorkerError::Refused(_)
            | WorkerError::DeviceUnavailable { .. }
            | WorkerError::UnsupportedModel { .. } => true,
            WorkerError::Endpoint { error, .. }
            | WorkerError::Bind { error, .. }
            | WorkerError::Protocol(error) => error.is_config_error(),
            _ => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, WorkerError>;

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
