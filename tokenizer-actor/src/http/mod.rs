//! The HTTP server: routes and the actix-web setup. Handlers live one file per idea
//! (`generate`, `openai`, `info`); request validation in `validate`; per-request state in
//! `inflight`; SSE framing in `sse`; `--api-key` in `auth`.

mod auth;
mod embeddings;
pub mod error;
mod generate;
mod inflight;
mod info;
mod openai;
mod sse;
pub mod validate;

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};

use crate::state::AppState;

/// How long responses already ended (SIGTERM fails every open request at once) get to reach
/// their clients before the server stops.
const SHUTDOWN_TIMEOUT_S: u64 = 5;

/// Build the server on `listener`; must be called inside an actix `System`. It does not handle
/// signals itself: the caller stops it (see `crate::serve`), after ending open requests.
pub fn server(state: Arc<AppState>, listener: TcpListener) -> std::io::Result<Server> {
    let data = web::Data::from(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .wrap(actix_web::middleware::from_fn(auth::require_api_key))
            .route("/generate", web::post().to(generate::generate))
            .route("/v1/completions", web::post().to(openai::completions))
            .route(
                "/v1/chat/completions",
                web::post().to(openai::chat_completions),
            )
            .route("/v1/embeddings", web::post().to(embeddings::embeddings))
            .route("/encode", web::post().to(embeddings::encode))
            .route("/abort_request", web::post().to(info::abort_request))
            .route("/metrics", web::get().to(info::metrics))
            .route("/health", web::get().to(info::health))
            .route("/health_generate", web::get().to(info::health))
            .route("/get_server_info", web::get().to(info::server_info))
            .route("/server_info", web::get().to(info::server_info))
            .route("/get_model_info", web::get().to(info::model_info))
            .route("/model_info", web::get().to(info::model_info))
            .route("/v1/models", web::get().to(info::models))
            .route("/flush_cache", web::post().to(info::flush_cache))
            .default_service(web::to(info::not_found))
    })
    .shutdown_timeout(SHUTDOWN_TIMEOUT_S)
    // A client that closes its side has gone away (HTTP clients do not half-close): drop the
    // handler future or SSE stream at once, so the request guard sends `Abort`. With the
    // default (half-close allowed) actix notices only when a write fails.
    .h1_allow_half_closed(false)
    .disable_signals()
    .listen(listener)?;
    Ok(server.run())
}
