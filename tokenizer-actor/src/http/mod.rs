//! The HTTP server: routes and the actix-web setup. Handlers live one file per idea
//! (`generate`, `openai`, `embeddings`, `info`); a body is read into its type (`schema`) by
//! `body` and checked by its handler's parser (`validate` for `/generate`), each broken rule a
//! variant of `validation_error`'s `ValidationError`; per-request state in `inflight`; SSE
//! framing in `sse`; `--api-key` in `auth`; the OpenAPI document of it all in `openapi`.

mod auth;
mod body;
mod embeddings;
pub mod error;
mod generate;
mod inflight;
mod info;
mod openai;
pub mod openapi;
mod schema;
mod sse;
pub mod validate;
mod validation_error;

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{web, App, HttpResponse, HttpServer, Resource, Route};

use crate::state::AppState;
use error::ApiError;

/// How long responses already ended (SIGTERM fails every open request at once) get to reach
/// their clients before the server stops.
const SHUTDOWN_TIMEOUT_S: u64 = 5;

/// Every path served (each documented in `openapi`, which a test checks).
pub const ROUTES: &[&str] = &[
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/encode",
    "/abort_request",
    "/metrics",
    "/health",
    "/health_generate",
    "/get_server_info",
    "/server_info",
    "/get_model_info",
    "/model_info",
    "/v1/models",
    "/flush_cache",
    "/openapi.json",
];

/// `path` served by `route` alone: another method on it is a 405 with `Allow` and a JSON error
/// (not the 404 of an unknown path).
fn endpoint(path: &str, allow: &'static str, route: Route) -> Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(move || async move { method_not_allowed(allow) }))
}

fn method_not_allowed(allow: &'static str) -> HttpResponse {
    let mut resp: HttpResponse =
        ApiError::new(405, format!("method not allowed; this path takes {allow}")).into();
    resp.headers_mut().insert(
        actix_web::http::header::ALLOW,
        actix_web::http::header::HeaderValue::from_static(allow),
    );
    resp
}

/// Build the server on `listener` (HTTPS with `tls`); must be called inside an actix `System`.
/// It does not handle signals itself: the caller stops it (see `crate::serve`), after ending
/// open requests.
pub fn server(
    state: Arc<AppState>,
    listener: TcpListener,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<Server> {
    let data = web::Data::from(state);
    let server = HttpServer::new(move || {
        let post = |path, route: Route| endpoint(path, "POST", route);
        let get = |path, route: Route| endpoint(path, "GET", route);
        App::new()
            .app_data(data.clone())
            .wrap(actix_web::middleware::from_fn(auth::require_api_key))
            .service(post("/generate", web::post().to(generate::generate)))
            .service(post("/v1/completions", web::post().to(openai::completions)))
            .service(post(
                "/v1/chat/completions",
                web::post().to(openai::chat_completions),
            ))
            .service(post(
                "/v1/embeddings",
                web::post().to(embeddings::embeddings),
            ))
            .service(post("/encode", web::post().to(embeddings::encode)))
            .service(post("/abort_request", web::post().to(info::abort_request)))
            .service(get("/metrics", web::get().to(info::metrics)))
            .service(get("/health", web::get().to(info::health)))
            .service(get("/health_generate", web::get().to(info::health)))
            .service(get("/get_server_info", web::get().to(info::server_info)))
            .service(get("/server_info", web::get().to(info::server_info)))
            .service(get("/get_model_info", web::get().to(info::model_info)))
            .service(get("/model_info", web::get().to(info::model_info)))
            .service(get("/v1/models", web::get().to(info::models)))
            .service(post("/flush_cache", web::post().to(info::flush_cache)))
            .service(get("/openapi.json", web::get().to(openapi::serve)))
            .default_service(web::to(info::not_found))
    })
    .shutdown_timeout(SHUTDOWN_TIMEOUT_S)
    // A client that closes its side has gone away (HTTP clients do not half-close): drop the
    // handler future or SSE stream at once, so the request guard sends `Abort`. With the
    // default (half-close allowed) actix notices only when a write fails.
    .h1_allow_half_closed(false)
    .disable_signals();
    let server = match tls {
        Some(config) => server.listen_rustls_0_23(listener, config)?,
        None => server.listen(listener)?,
    };
    Ok(server.run())
}
