//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json` and kept in the repo
//! as `docs/openapi.json`. Operations come from the `#[utoipa::path]` on each handler and bodies
//! from the types in `super::schema`; what every operation shares (its error answers, the
//! `Retry-After` of a 429 or 503, the path aliases) is added here once, from one table.
//!
//! The committed file must equal [`document`]'s output: `cargo test -p tokenizer-actor openapi`
//! fails otherwise, and `DPSERVE_BLESS=1` on that command rewrites it.

use actix_web::HttpResponse;
use serde_json::{json, Value};
use utoipa::OpenApi;

use super::schema::{requests, responses};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dpserve",
        description = "Data-parallel LLM serving: SGLang-native and OpenAI-compatible endpoints. \
            Unknown JSON fields are ignored and a null is the same as an absent field; a known \
            field of the wrong type or out of range is a 400 naming it (`error.param`). With \
            `--api-key`, every endpoint but `/health` wants `Authorization: Bearer <key>` (else \
            401). Limits that depend on the model (vocabulary size, context length) and on the \
            cluster (live ranks) are checked per request and answered with a 400 saying which; \
            `/get_server_info` reports them.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        super::generate::generate,
        super::openai::completions,
        super::openai::chat_completions,
        super::embeddings::embeddings,
        super::embeddings::encode,
        super::info::abort_request,
        super::info::flush_cache,
        super::info::health,
        super::info::server_info,
        super::info::model_info,
        super::info::models,
        super::info::metrics,
        serve,
    ),
    components(schemas(
        responses::ErrorResponse,
        requests::GenerateRequest,
        requests::CompletionRequest,
        requests::ChatCompletionRequest,
        requests::EmbeddingRequest,
        requests::EncodeRequest,
        requests::AbortRequest,
        responses::ChatCompletionChunk,
    )),
    tags(
        (name = "sglang", description = "SGLang-native endpoints"),
        (name = "openai", description = "OpenAI-compatible endpoints"),
        (name = "operations", description = "Health, information, metrics and control"),
    ),
)]
struct ApiDoc;

/// Second paths to the same handler (SGLang serves both names).
const ALIASES: &[(&str, &str)] = &[
    ("/health_generate", "/health"),
    ("/server_info", "/get_server_info"),
    ("/model_info", "/get_model_info"),
];

/// The error answers an operation can give besides its own: generation and embedding
/// endpoints read a body (413), admit a request (429), need a live rank (503) and wait for it
/// (504).
fn shared_errors(path: &str) -> &'static [u16] {
    match path {
        "/generate" | "/v1/completions" | "/v1/chat/completions" | "/v1/embeddings" | "/encode" => {
            &[400, 401, 413, 429, 503, 504]
        }
        "/abort_request" => &[400, 401, 413, 503],
        "/flush_cache" => &[400, 401, 503],
        "/health" => &[503],
        _ => &[401],
    }
}

fn error_description(status: u16) -> &'static str {
    match status {
        400 => {
            "Bad input: malformed JSON, a field of the wrong type or out of range, or a \
                limit of the model or the cluster; `error.param` names the field"
        }
        401 => "With --api-key: the key is missing or wrong",
        413 => "The body exceeds --max-request-bytes",
        429 => "The server is at its limit of requests in flight; retry after Retry-After",
        503 => {
            "No live rank, the controller not heard from recently, or the server shutting \
                down; retry after Retry-After"
        }
        504 => "No answer within --request-timeout-s",
        _ => "Error",
    }
}

fn error_response(status: u16) -> Value {
    let mut resp = json!({
        "description": error_description(status),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    });
    if status == 429 || status == 503 {
        resp["headers"] = json!({"Retry-After": {
            "description": "Seconds to wait before retrying",
            "required": true,
            "schema": {"type": "integer", "minimum": 0},
        }});
    }
    resp
}

/// The routing headers of the endpoints that route a request (they win over the body); the
/// generation endpoints also take the one that asks for the decision.
fn routing_headers(path: &str) -> Value {
    let mut headers = json!([
        {"name": "X-Data-Parallel-Rank", "in": "header", "required": false,
         "description": "Pin a live rank (wins over the body's routed_dp_rank; not live: 400)",
         "schema": {"type": "string", "pattern": "^[ \\t]*[0-9]{1,9}[ \\t]*$"}},
        {"name": "x-smg-routing-key", "in": "header", "required": false,
         "description": "Routing key (a non-empty one wins over the body's routing_key)",
         "schema": {"type": "string", "pattern": "^[\\t\\x20-\\x7e]*$"}},
    ]);
    if ["/generate", "/v1/completions", "/v1/chat/completions"].contains(&path) {
        headers.as_array_mut().expect("a list").push(json!(
            {"name": "x-dpserve-return-routing", "in": "header", "required": false,
             "description": "1 or true: answer the routing decision (wins over the body's \
                             return_routing)",
             "schema": {"type": "string", "enum": ["1", "0", "true", "false"]}}
        ));
    }
    headers
}

/// Each event of a stream: `data:` is a JSON chunk (`chunk`, a component), an error body
/// (after the stream started), or `[DONE]` at the end.
fn sse_event(chunk: &str) -> Value {
    json!({
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [
            {"type": "string", "enum": ["[DONE]"]},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": {"oneOf": [
                {"$ref": format!("#/components/schemas/{chunk}")},
                {"$ref": "#/components/schemas/ErrorResponse"},
            ]}},
        ]}},
    })
}

/// The chunk of each streaming endpoint's events.
fn stream_chunk(path: &str) -> Option<&'static str> {
    match path {
        "/generate" => Some("GenerateResponse"),
        "/v1/completions" => Some("CompletionResponse"),
        "/v1/chat/completions" => Some("ChatCompletionChunk"),
        _ => None,
    }
}

/// Exactly one of `fields` present (and not null).
fn exactly_one_of(fields: &[&str], schemas: &Value) -> Value {
    let branches: Vec<Value> = fields
        .iter()
        .map(|f| {
            let mut prop = schemas[*f].clone();
            // The branch wants the field itself, not its null.
            if let Some(one_of) = prop.get_mut("oneOf").and_then(Value::as_array_mut) {
                one_of.retain(|s| s["type"] != "null");
            }
            if let Some(types) = prop.get_mut("type").and_then(Value::as_array_mut) {
                types.retain(|t| t != "null");
            }
            json!({"required": [f], "properties": {*f: prop}})
        })
        .collect();
    json!(branches)
}

/// The properties a body declares itself: its own, or those of the object in its `allOf` (a
/// body that flattens shared fields, such as `Routing`, is their `allOf`).
fn own_properties(schema: &Value) -> &Value {
    match schema["allOf"].as_array() {
        Some(parts) => parts
            .iter()
            .map(|p| &p["properties"])
            .find(|p| p.is_object())
            .unwrap_or(&Value::Null),
        None => &schema["properties"],
    }
}

/// The document as served and committed.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    super::schema::expand_literals(&mut doc);
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    let paths = doc["paths"].as_object_mut().expect("paths");
    for (path, item) in paths.iter_mut() {
        for (_, op) in item.as_object_mut().expect("path item").iter_mut() {
            if shared_errors(path).contains(&413) && path != "/abort_request" {
                op["parameters"] = routing_headers(path);
            }
            if let Some(chunk) = stream_chunk(path) {
                op["responses"]["200"]["content"]["text/event-stream"]["schema"] = sse_event(chunk);
            }
            let resps = op["responses"].as_object_mut().expect("responses");
            for &status in shared_errors(path) {
                resps
                    .entry(status.to_string())
                    .or_insert_with(|| error_response(status));
            }
        }
    }
    for (alias, of) in ALIASES {
        let mut item = paths[*of].clone();
        for (_, op) in item.as_object_mut().expect("path item").iter_mut() {
            let id = op["operationId"].as_str().unwrap_or_default();
            op["operationId"] = json!(format!("{id}_{}", alias.trim_start_matches('/')));
        }
        paths.insert((*alias).to_string(), item);
    }
    let schemas = &mut doc["components"]["schemas"];
    for name in ["GenerateRequest", "EncodeRequest"] {
        let one_of = exactly_one_of(&["text", "input_ids"], own_properties(&schemas[name]));
        schemas[name]["oneOf"] = one_of;
    }
    schemas["AbortRequest"]["anyOf"] = json!([
        {"required": ["abort_all"], "properties": {"abort_all": {"type": "boolean", "enum": [true]}}},
        {"required": ["rid"], "properties": {"rid": {"type": "string", "minLength": 1}}},
    ]);
    // Rules between fields, as the parsers apply them.
    let stream_options_needs_stream = json!({
        "if": {"required": ["stream_options"],
               "properties": {"stream_options": {"type": "object"}}},
        "then": {"required": ["stream"], "properties": {"stream": {"enum": [true]}}},
    });
    for name in ["CompletionRequest", "ChatCompletionRequest"] {
        let all_of = schemas[name]["allOf"].as_array_mut().expect("allOf");
        all_of.push(stream_options_needs_stream.clone());
    }
    let all_of = schemas["ChatCompletionRequest"]["allOf"]
        .as_array_mut()
        .expect("allOf");
    all_of.push(json!({
        "if": {"required": ["top_logprobs"],
               "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"enum": [true]}}},
    }));
    doc
}

/// The document as committed: pretty, with a final newline.
pub fn document_text() -> String {
    let mut text = serde_json::to_string_pretty(&document()).expect("the document serializes");
    text.push('\n');
    text
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API",
        content_type = "application/json", body = Object)),
)]
pub async fn serve() -> HttpResponse {
    HttpResponse::Ok().json(document())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json`, from this crate.
    fn committed_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
    }

    #[test]
    fn the_committed_document_is_what_the_code_generates() {
        let generated = document_text();
        let path = committed_path();
        if std::env::var_os("DPSERVE_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write docs/openapi.json");
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json differs from what the code generates; regenerate it with \
             `DPSERVE_BLESS=1 cargo test -p tokenizer-actor openapi` and commit it"
        );
    }

    /// The limits written on the request types are the parsers' own.
    #[test]
    fn documented_limits_are_the_parsers_constants() {
        use crate::http::embeddings::MAX_EMBED_INPUTS;
        use crate::http::openai::params::MAX_N;
        use crate::http::schema::fields::MAX_STOP_STRINGS;
        use crate::http::validate::MAX_TOP_LOGPROBS_NUM;
        let doc = document();
        let s = &doc["components"]["schemas"];
        let sampling = own_properties(&s["OpenAiSampling"]);
        assert_eq!(sampling["n"]["maximum"], json!(MAX_N));
        assert_eq!(
            sampling["stop"]["oneOf"][2]["maxItems"],
            json!(MAX_STOP_STRINGS)
        );
        let completions = own_properties(&s["CompletionRequest"]);
        assert_eq!(completions["best_of"]["maximum"], json!(MAX_N));
        assert_eq!(completions["prompt"]["oneOf"][1]["maxItems"], json!(MAX_N));
        assert_eq!(
            own_properties(&s["GenerateRequest"])["top_logprobs_num"]["maximum"],
            json!(MAX_TOP_LOGPROBS_NUM)
        );
        assert_eq!(
            own_properties(&s["EmbeddingRequest"])["input"]["oneOf"][1]["maxItems"],
            json!(MAX_EMBED_INPUTS)
        );
    }

    #[test]
    fn every_route_is_documented() {
        let doc = document();
        for path in super::super::ROUTES {
            assert!(
                doc["paths"].get(*path).is_some(),
                "{path} is not documented"
            );
        }
        assert_eq!(
            doc["paths"].as_object().unwrap().len(),
            super::super::ROUTES.len()
        );
    }
}
