//! `--api-key` / `--api-key-file`: every endpoint but `--open-endpoints` (default `/health`, so
//! load balancers and gateways can probe without the secret) wants `Authorization: Bearer
//! <key>`, one of the accepted keys.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};

use super::error::ApiError;
use crate::state::AppState;

pub async fn require_api_key(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let refused = req.app_data::<web::Data<AppState>>().is_some_and(|s| {
        if s.api_keys.is_empty() || s.open_paths.contains(&req.path()) {
            return false;
        }
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        !given.is_some_and(|g| accepted(g.as_bytes(), &s.api_keys))
    });
    if refused {
        let resp: HttpResponse = ApiError::new(
            401,
            "missing or wrong API key: send Authorization: Bearer <key>",
        )
        .into();
        return Ok(req.into_response(resp));
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

/// Whether `given` is one of `keys`. Every key is compared, each without an early exit, so
/// the time taken depends on the keys' lengths only, not on which key matched or how much
/// of a guess was right.
fn accepted(given: &[u8], keys: &[String]) -> bool {
    keys.iter().fold(false, |any, key| {
        any | constant_time_eq(given, key.as_bytes())
    })
}

/// Compares every byte of `key` (a shorter guess reads as zeros past its end), so the time
/// is `key`'s length whatever `given` is.
fn constant_time_eq(given: &[u8], key: &[u8]) -> bool {
    let lengths_differ = u8::from(given.len() != key.len());
    let diff = key.iter().enumerate().fold(lengths_differ, |acc, (i, k)| {
        acc | (k ^ given.get(i).copied().unwrap_or(0))
    });
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::{accepted, constant_time_eq};

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
        assert!(!constant_time_eq(b"ab\0", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn any_of_several_keys_is_accepted() {
        let keys = ["first".to_string(), "second-key".to_string()];
        assert!(accepted(b"first", &keys));
        assert!(accepted(b"second-key", &keys));
        assert!(!accepted(b"second", &keys));
        assert!(!accepted(b"", &keys));
        assert!(!accepted(b"first", &[]));
    }
}
