//! The HTTP API's request and response bodies as types, for the OpenAPI document
//! (`super::openapi`). Requests in `requests`, responses in `responses`, the union-typed fields
//! both read and describe in `fields`.

pub mod fields;
pub mod requests;
pub mod responses;

use serde_json::Value;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType};
use utoipa::openapi::RefOr;

/// The extension that carries a [`literal`] schema until [`expand_literals`] puts it in place.
const LITERAL: &str = "x-dpserve-literal";

/// A schema written as JSON, for the unions (a string or a list, ids or lists of ids) whose
/// exact shape the derive cannot say. utoipa's `Schema` does not model every JSON Schema
/// keyword (`const`, `propertyNames`, `prefixItems`), so the JSON travels in an extension of a
/// placeholder, which [`expand_literals`] replaces with it.
fn literal(value: Value) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .extensions(Some(ExtensionsBuilder::new().add(LITERAL, value).build()))
        .into()
}

/// Replaces every [`literal`] placeholder in `doc` with its schema.
pub fn expand_literals(doc: &mut Value) {
    match doc {
        Value::Object(map) => {
            if let Some(schema) = map.remove(LITERAL) {
                *doc = schema;
                return;
            }
            map.values_mut().for_each(expand_literals);
        }
        Value::Array(items) => items.iter_mut().for_each(expand_literals),
        _ => {}
    }
}
