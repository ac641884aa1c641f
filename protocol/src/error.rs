//! Errors of the protocol crate.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProtocolError {
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[cfg(feature = "transport")]
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
    #[error("CURVE key file {path}: {reason}")]
    CurveKey { path: String, reason: String },
    #[error("CURVE: {reason}")]
    Security { reason: String },
    #[error(
        "{endpoint} is beyond loopback, and ZeroMQ over TCP without keys lets anyone who reaches \
         the port join the deployment and read its traffic: give --curve-secret-key (make a \
         keypair with `dpserve keygen`; docs/SECURITY.md), or --insecure-tcp on a network \
         trusted otherwise"
    )]
    InsecureTcp { endpoint: String },
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A directory of ipc sockets another user could replace a socket in.
    #[error(
        "ipc socket directory {path} is not safe to use: {why}; another user could replace \
         its sockets (remove it, or choose another --runtime-dir or endpoint)"
    )]
    UnsafeDir { path: String, why: String },
}

pub type Result<T> = std::result::Result<T, ProtocolError>;

impl ProtocolError {
    /// A start refused for a flag or key file the operator must change: a restart cannot fix it.
    pub fn is_config_error(&self) -> bool {
        matches!(
            self,
            ProtocolError::CurveKey { .. }
                | ProtocolError::Security { .. }
                | ProtocolError::InsecureTcp { .. }
                | ProtocolError::UnsafeDir { .. }
        )
    }

    #[cfg(feature = "transport")]
    pub fn zmq(what: impl Into<String>, source: zmq::Error) -> Self {
        ProtocolError::Zmq {
            what: what.into(),
            source,
        }
    }
}
