//! Reading a JSON request body into its type (`schema::requests`, which also describes it in
//! the OpenAPI document). A known field of the wrong type is a 400 naming it by its path
//! (`sampling_params.top_k: invalid type: …`); unknown fields are ignored and a null is an
//! absent field (every optional field is an `Option`). A number written with a zero fraction
//! (`7.0`) is the integer it equals, as JSON Schema's `integer` has it.
//! The field types whose JSON is a union are `schema::fields`'; ranges are checked after
//! reading (`validate`).

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::schema::fields::integral;
use super::validation_error::ValidationError;

/// A request body as `T`: malformed JSON, a body that is not an object, or a field of the
/// wrong type is a 400.
pub fn read<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    match value {
        Value::Object(obj) => from_object(obj),
        _ => Err(ApiError::bad_request("request body must be a JSON object")),
    }
}

/// `obj` as `T`; see [`read`].
pub fn from_object<T: DeserializeOwned>(obj: Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(integral(Value::Object(obj))).map_err(|e| {
        // A flattened part (`schema::fields::flat`) reports its own path at the head of its message.
        let message = e.to_string();
        let path = match e.path().to_string() {
            root if root == "." => message.split_once(": ").map(|(p, _)| p.to_string()),
            path => Some(path),
        };
        match path {
            Some(path) => ValidationError::BadField {
                param: param(&path).to_string(),
                message,
            }
            .into(),
            None => ApiError::bad_request(message),
        }
    })
}

/// The `param` a 400 names for the field at `path`: its name (`top_k` of
/// `sampling_params.top_k`), or its path from a list it is in (`messages[0].role`); never an
/// index into the field itself (`stop_token_ids`, not `stop_token_ids[1]`).
fn param(path: &str) -> &str {
    let mut field = path;
    while let Some(head) = field.strip_suffix(']').and_then(|p| p.rsplit_once('[')) {
        field = head.0;
    }
    if field.contains('[') {
        field
    } else {
        field.rsplit('.').next().unwrap_or(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_400_names_the_field_by_its_path_and_param_by_its_name() {
        assert_eq!(param("top_k"), "top_k");
        assert_eq!(param("sampling_params.top_k"), "top_k");
        assert_eq!(param("stop_token_ids[1]"), "stop_token_ids");
        assert_eq!(param("messages[0].role"), "messages[0].role");
        assert_eq!(param("messages[0].content[2]"), "messages[0].content");
    }
}
