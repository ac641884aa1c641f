//! Server-sent events as every streaming endpoint writes them: `data: <json>\n\n` per event,
//! `data: [DONE]\n\n` at the end, and an error after the stream started as one more event
//! with the error body (the status line is already sent by then).

use actix_web::HttpResponse;
use bytes::Bytes;
use futures::Stream;
use serde_json::Value;

use super::error::ApiError;

pub const DONE: &[u8] = b"data: [DONE]\n\n";

pub fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

pub fn done() -> Bytes {
    Bytes::from_static(DONE)
}

/// A 200 `text/event-stream` response over `events`. The stream owns the request state, so a
/// client that disconnects drops it (and its guards abort the requests).
pub fn response(events: impl Stream<Item = Bytes> + 'static) -> HttpResponse {
    use futures::StreamExt;
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(events.map(Ok::<Bytes, ApiError>))
}
