//! The JSON error every HTTP endpoint answers with:
//! `{"error": {"message", "type", "param", "code"}}` (the OpenAI shape, which SGLang clients
//! also understand). `param` names the offending request field when one is to blame.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use super::schema::responses::{ErrorDetail, ErrorKind, ErrorResponse};

/// A request-level failure: its HTTP status and a message saying what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// A 400 blaming request field `param`.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    fn kind(&self) -> ErrorKind {
        match self.status {
            401 => ErrorKind::AuthenticationError,
            404 => ErrorKind::NotFoundError,
            413 => ErrorKind::RequestTooLarge,
            400..=499 => ErrorKind::InvalidRequestError,
            503 => ErrorKind::ServiceUnavailable,
            504 => ErrorKind::Timeout,
            _ => ErrorKind::InternalError,
        }
    }

    /// The body, also sent as an SSE event when a stream fails after it started.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorResponse {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind(),
                param: self.param.clone(),
                code: self.status,
            },
        })
        .unwrap_or_default()
    }
}

/// `Retry-After` of a 503, in seconds: about how long a controller restart or a rank rejoining
/// takes.
pub const RETRY_AFTER_S: u64 = 1;

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        // A status outside 100..=999 from a peer would be a bug there; answer 500, not panic.
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        if self.status == 503 || self.status == 429 {
            // Every 503 here is transient (no live rank, controller unreachable, a rank
            // draining or gone), and a 429 is a full server: clients and gateways may retry
            // after a short pause.
            resp.insert_header(("Retry-After", RETRY_AFTER_S.to_string()));
        }
        resp.json(self.body())
    }
}

impl From<ApiError> for HttpResponse {
    fn from(err: ApiError) -> Self {
        err.error_response()
    }
}
