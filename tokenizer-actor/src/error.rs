//! Errors of the tokenizer actor crate. Request-level problems become HTTP errors in
//! `http::error`; these are the ones that stop startup or fail one tokenizer call.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("cannot load tokenizer file {path}: {reason}")]
    TokenizerFile { path: PathBuf, reason: String },
    #[error("cannot read model config {path}: {reason}")]
    ConfigFile { path: PathBuf, reason: String },
    #[error("tokenization failed: {reason}")]
    Encode { reason: String },
    #[error("detokenization failed: {reason}")]
    Decode { reason: String },
    // Here and in `Io` the cause is in the message, so it is not also a `source` (`{:#}`
    // would print it twice).
    #[error("bad endpoint flag --{flag}: {error}")]
    Endpoint {
        flag: &'static str,
        error: protocol::ProtocolError,
    },
    #[error("cannot use --api-key-file {path}: {reason}")]
    ApiKeyFile { path: PathBuf, reason: String },
    #[error("cannot use --{flag} {path}: {reason}")]
    TlsFile {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("bad --{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error("bad chat template ({what}): {reason}")]
    ChatTemplate { what: String, reason: String },
    #[error(transparent)]
    Protocol(#[from] protocol::ProtocolError),
    #[error("tokenizer server thread {0}")]
    Thread(&'static str),
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
}

impl TokenizerError {
    /// A flag or file the operator must change before a restart can help (`dpserve` exits
    /// 78, EX_CONFIG, as for a worker's refusal).
    pub fn is_config_error(&self) -> bool {
        matches!(
            self,
            TokenizerError::ApiKeyFile { .. }
                | TokenizerError::TlsFile { .. }
                | TokenizerError::Flag { .. }
        ) || matches!(self, TokenizerError::Protocol(e) if e.is_config_error())
    }
}

pub type Result<T> = std::result::Result<T, TokenizerError>;
