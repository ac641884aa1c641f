//! Errors of the protocol crate.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProtocolError {
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("zmq error on {what}: {source}")]
    Zmq {
        what: String,
        #[source]
        source: zmq::Error,
    },
    #[error(
        "{endpoint} is already served by a running process (another controller or tokenizer \
         of this deployment?); stop that one first, or give this one another address"
    )]
    EndpointInUse { endpoint: String },
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, ProtocolError>;

impl ProtocolError {
    pub fn zmq(what: impl Into<String>, source: zmq::Error) -> Self {
        ProtocolError::Zmq {
            what: what.into(),
            source,
        }
    }
}
