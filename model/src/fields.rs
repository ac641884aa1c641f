//! Reading `config.json`: typed access to its fields, every failure naming file and field, and
//! the refusal of a value the model code does not implement. Below every reader of it
//! (`config.rs`, `support.rs`, `gemma.rs`, `moe.rs`, `rope_config.rs`).

use std::path::Path;

use serde_json::Value;

use super::error::{ModelError, Result};

/// Typed access to one JSON object, every failure naming file and field.
pub(super) struct Fields<'a> {
    pub file: &'a Path,
    pub v: &'a Value,
}

impl Fields<'_> {
    /// The field's value; `None` when absent or null.
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.v.get(field).filter(|v| !v.is_null())
    }
    /// The field's value, null included (where null means something other than absent).
    pub fn raw(&self, field: &str) -> Option<&Value> {
        self.v.get(field)
    }
    pub fn missing(&self, field: &str) -> ModelError {
        ModelError::MissingField {
            file: self.file.into(),
            field: field.into(),
        }
    }
    pub fn usize_req(&self, field: &str) -> Result<usize> {
        self.usize_opt(field)?.ok_or_else(|| self.missing(field))
    }
    pub fn usize_opt(&self, field: &str) -> Result<Option<usize>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.missing(field)),
        }
    }
    pub fn f32_opt(&self, field: &str) -> Result<Option<f32>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.missing(field)),
        }
    }
    pub fn bool_opt(&self, field: &str) -> Result<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.missing(field)),
        }
    }
    /// A token id given as an integer or a list of integers.
    pub fn ids_opt(&self, field: &str) -> Result<Option<Vec<u32>>> {
        let to_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| to_id(x).ok_or_else(|| self.missing(field)))
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => to_id(v)
                .map(|x| Some(vec![x]))
                .ok_or_else(|| self.missing(field)),
        }
    }
}

pub(super) fn unsupported(
    f: &Fields<'_>,
    field: &str,
    value: &Value,
    why: impl Into<String>,
) -> ModelError {
    ModelError::Unsupported {
        file: f.file.into(),
        field: field.into(),
        value: value.to_string(),
        why: why.into(),
    }
}

/// Whether an option's value leaves the math as without it (absent, null, false, 0).
pub(super) fn is_off(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}
