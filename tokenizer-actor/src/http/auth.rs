//! `--api-key`: every endpoint but `/health` wants `Authorization: Bearer <key>`. Health stays
//! open so load balancers and gateways can probe without the secret.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};

use super::error::ApiError;
use crate::state::AppState;

/// Paths served without a key.
const OPEN_PATHS: &[&str] = &["/health"];

pub async fn require_api_key(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let expected = req
        .app_data::<web::Data<AppState>>()
        .and_then(|s| s.args.http.api_key.clone());
    if let Some(key) = expected {
        if !OPEN_PATHS.contains(&req.path()) {
            let given = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                })
                .map(str::trim);
            if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
                let resp: HttpResponse = ApiError::new(
                    401,
                    "missing or wrong API key: send Authorization: Bearer <key>",
                )
                .into();
                return Ok(req.into_response(resp));
            }
        }
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

/// Compares without an early exit, so timing does not reveal how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_compares() {
        assert!(super::constant_time_eq(b"abc", b"abc"));
        assert!(!super::constant_time_eq(b"abc", b"abd"));
        assert!(!super::constant_time_eq(b"abc", b"ab"));
    }
}
