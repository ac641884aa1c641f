//! The controller library's error type: bad configuration (a startup error) and trace-file I/O.
//! Routing errors a client sees are [`crate::router::RouteError`], not these.

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
    /// A peer method's flag out of its range (`--smg-*`, `--dynamo-*`, `--llmd-*`).
    #[error("{flag} must be {rule}, got {got}")]
    PeerFlag {
        flag: &'static str,
        rule: &'static str,
        got: f64,
    },
    #[error("--worker-timeout must be a positive number of seconds, got {got}")]
    WorkerTimeout { got: f64 },
    #[error("cannot open trace file {path}: {source}")]
    TraceFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
