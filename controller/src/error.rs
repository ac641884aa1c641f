//! The controller library's error type: bad configuration and sockets (startup errors), trace
//! files, and the poll loop. Routing errors a client sees are [`crate::router::RouteError`],
//! not these.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("--prefix-affinity-max-load-skew must be a finite number >= 1.0, got {got}")]
    LoadSkew { got: f64 },
    #[error("--prefix-affinity-hash-tokens must be at least 1, got {got}")]
    HashTokens { got: usize },
    #[error("--cache-aware-max-load-skew must be a finite number >= 1.0, got {got}")]
    CacheAwareLoadSkew { got: f64 },
    #[error("--cache-aware-compute-weight must be a finite number >= 0, got {got}")]
    CacheAwareComputeWeight { got: f64 },
    #[error("--cache-aware-tpot-weight must be a finite number >= 0, got {got}")]
    CacheAwareTpotWeight { got: f64 },
    #[error("--cache-aware-work-weight must be a finite number >= 0, got {got}")]
    CacheAwareWorkWeight { got: f64 },
    #[error("--cache-aware-max-hold-ms must be at least 1")]
    CacheAwareMaxHold,
    /// A peer method's flag out of its range (`--smg-*`, `--dynamo-*`, `--llmd-*`).
    #[error("{flag} must be {rule}, got {got}")]
    PeerFlag {
        flag: &'static str,
        rule: &'static str,
        got: f64,
    },
    #[error("--worker-timeout must be a positive number of seconds, got {got}")]
    WorkerTimeout { got: f64 },
    // The cause is in the message, so it is not also a `source` (`{:#}` would print it twice).
    #[error("cannot open trace file {path}: {error}")]
    TraceFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--trace-dir {path}: {error}")]
    TraceDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--{flag}: {error}")]
    Endpoint {
        flag: &'static str,
        error: protocol::ProtocolError,
    },
    /// Sockets and their keys.
    #[error(transparent)]
    Protocol(#[from] protocol::ProtocolError),
    #[error("installing signal handler: {0}")]
    Signal(std::io::Error),
    #[error("polling the sockets: {0}")]
    Poll(zmq::Error),
}

impl Error {
    /// A key file or address the operator must change before a restart can help (`dpserve`
    /// exits 78, EX_CONFIG, as for a worker's refusal); a flag out of range exits 1.
    pub fn is_config_error(&self) -> bool {
        match self {
            Error::Endpoint { error, .. } | Error::Protocol(error) => error.is_config_error(),
            _ => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A peer method's flag: `got` when it is finite and `ok`, else the error naming the flag and
/// the `rule` it breaks.
pub(crate) fn peer_flag(flag: &'static str, rule: &'static str, got: f64, ok: bool) -> Result<f64> {
    if got.is_finite() && ok {
        Ok(got)
    } else {
        Err(Error::PeerFlag { flag, rule, got })
    }
}

/// A peer method's weight flag: a finite number >= 0.
pub(crate) fn peer_weight(flag: &'static str, got: f64) -> Result<f64> {
    peer_flag(flag, "a finite number >= 0", got, got >= 0.0)
}
