//! The field types of the request bodies whose JSON is a union (a string or a list of them, a
//! map of token ids, ids or lists of ids), each reporting its own shape, and the readers the
//! body types name in their serde attributes (`flat`, `wide_f32`). `http::body` reads a body
//! with them; `requests` describes them in the OpenAPI document.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// For `#[serde(flatten, deserialize_with = "flat")]`: serde's flatten loses the path of a
/// field that fails, so the part is read here with its own, put at the head of the message.
pub fn flat<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
    let map = Map::<String, Value>::deserialize(d)?;
    serde_path_to_error::deserialize(Value::Object(map)).map_err(D::Error::custom)
}

/// For `#[serde(default, deserialize_with = "wide_f32")]`: an `f32` read as the JSON's `f64`
/// ([`narrow`]).
pub fn wide_f32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f32>, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.map(narrow))
}

/// `v` as an `f32` such that a value too small for it (say `5e-324`) keeps its sign and stays
/// non-zero instead of rounding to 0 and failing a range like `(0, 2]` it is in. One too
/// large becomes infinite, which the range checks refuse.
pub fn narrow(v: f64) -> f32 {
    let narrowed = v as f32;
    if narrowed == 0.0 && v != 0.0 {
        f32::from_bits(1).copysign(narrowed)
    } else {
        narrowed
    }
}

/// `v` with every float that equals an integer (and fits an `i64` or `u64`) written as one.
pub fn integral(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => as_integer(&n).map_or(Value::Number(n), Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(integral).collect()),
        Value::Object(obj) => {
            Value::Object(obj.into_iter().map(|(k, v)| (k, integral(v))).collect())
        }
        other => other,
    }
}

fn as_integer(n: &serde_json::Number) -> Option<serde_json::Number> {
    let f = n.as_f64()?;
    // 2^63 and 2^64 are exact in f64; the bounds keep the casts exact.
    if f.fract() != 0.0 || !f.is_finite() {
        None
    } else if (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) {
        Some((f as i64).into())
    } else if (0.0..1.844_674_407_370_955_2e19).contains(&f) {
        Some((f as u64).into())
    } else {
        None
    }
}

/// A token id (or any `u32`) from JSON, `7.0` included.
pub fn as_u32(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| as_integer(n).and_then(|i| i.as_u64()))
            .and_then(|id| u32::try_from(id).ok()),
        _ => None,
    }
}

/// Most stop strings per request (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// `stop`: a string or a list of at most [`MAX_STOP_STRINGS`], none empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stop(pub Vec<String>);

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let shape = || D::Error::custom("expected a string or a list of strings");
        let stops = match Value::deserialize(d)? {
            Value::String(s) => vec![s],
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s),
                    _ => Err(shape()),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(shape()),
        };
        if stops.len() > MAX_STOP_STRINGS {
            return Err(D::Error::custom(format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                stops.len()
            )));
        }
        if stops.iter().any(String::is_empty) {
            return Err(D::Error::custom("stop strings must not be empty"));
        }
        Ok(Stop(stops))
    }
}

/// `logit_bias`: `{"<token id>": bias}` with bias in [-100, 100] (OpenAI's range).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBias(pub Vec<(u32, f32)>);

impl<'de> Deserialize<'de> for LogitBias {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Value::Object(map) = Value::deserialize(d)? else {
            return Err(D::Error::custom("expected an object of token id to bias"));
        };
        let mut out = Vec::with_capacity(map.len());
        for (key, value) in map {
            let Ok(id) = key.trim().parse::<u32>() else {
                return Err(D::Error::custom(format!("key {key:?} is not a token id")));
            };
            let Some(bias) = value.as_f64() else {
                return Err(D::Error::custom(format!("bias of {key} is not a number")));
            };
            if !(-100.0..=100.0).contains(&bias) {
                return Err(D::Error::custom(format!(
                    "bias of {key} must be in [-100, 100], got {bias}"
                )));
            }
            out.push((id, bias as f32));
        }
        Ok(LogitBias(out))
    }
}

/// `/generate`'s `text`: one string; a list (SGLang's batch) is read to be refused by name.
#[derive(Debug, Clone, PartialEq)]
pub enum OneText {
    One(String),
    Batch,
}

impl<'de> Deserialize<'de> for OneText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(OneText::One(s)),
            Value::Array(_) => Ok(OneText::Batch),
            _ => Err(D::Error::custom("expected a string")),
        }
    }
}

/// `/generate`'s `input_ids`: one list of ids; a list of lists (a batch) is read to be
/// refused by name.
#[derive(Debug, Clone, PartialEq)]
pub enum OneIds {
    One(Vec<u32>),
    Batch,
}

impl<'de> Deserialize<'de> for OneIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Array(items) if items.first().is_some_and(Value::is_array) => Ok(OneIds::Batch),
            // The field's error, not one of an index in it: `input_ids: invalid value: …`.
            v => Vec::<u32>::deserialize(v)
                .map(OneIds::One)
                .map_err(D::Error::custom),
        }
    }
}

/// A prompt as the client gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// Completions' `prompt` and embeddings' `input`: a string, a list of strings, a list of token
/// ids, or a list of such lists. Never empty, nor any list of ids in it (an empty text is a
/// prompt: BOS alone, as in SGLang and vLLM; `check_limits` refuses it if the tokenizer makes
/// no tokens of it).
#[derive(Debug, Clone, PartialEq)]
pub struct Prompts {
    pub items: Vec<Prompt>,
    /// Given as a list of prompts (not one string or one list of ids): answered as a list.
    pub batch: bool,
}

impl<'de> Deserialize<'de> for Prompts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let shape = || D::Error::custom("expected a string, a list of strings or token ids");
        let not_ids = || D::Error::custom("token ids must be non-negative integers");
        let ids = |items: &[Value]| items.iter().map(as_u32).collect::<Option<Vec<_>>>();
        let value = Value::deserialize(d)?;
        let batch =
            matches!(&value, Value::Array(items) if !items.first().is_some_and(Value::is_number));
        let prompts = match value {
            Value::String(s) => vec![Prompt::Text(s)],
            Value::Array(items) if items.is_empty() => return Err(D::Error::custom("is empty")),
            Value::Array(items) => match &items[0] {
                Value::String(_) => items
                    .into_iter()
                    .map(|i| match i {
                        Value::String(s) => Some(Prompt::Text(s)),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        D::Error::custom("a list must hold only strings or only token ids")
                    })?,
                Value::Number(_) => vec![Prompt::Ids(ids(&items).ok_or_else(not_ids)?)],
                Value::Array(_) => items
                    .iter()
                    .map(|i| i.as_array().and_then(|a| ids(a)).map(Prompt::Ids))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(not_ids)?,
                _ => return Err(shape()),
            },
            _ => return Err(shape()),
        };
        if prompts
            .iter()
            .any(|p| matches!(p, Prompt::Ids(i) if i.is_empty()))
        {
            return Err(D::Error::custom("must not be empty"));
        }
        Ok(Prompts {
            items: prompts,
            batch,
        })
    }
}

/// `/encode`'s `text`: a string, or a list of them (a batch).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodeText(pub Prompts);

impl<'de> Deserialize<'de> for EncodeText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let shape = || D::Error::custom("expected a string or a list of strings");
        let (items, batch) = match Value::deserialize(d)? {
            Value::String(s) => (vec![Prompt::Text(s)], false),
            Value::Array(items) => {
                let texts = items
                    .into_iter()
                    .map(|i| match i {
                        Value::String(s) => Ok(Prompt::Text(s)),
                        _ => Err(shape()),
                    })
                    .collect::<Result<_, _>>()?;
                (texts, true)
            }
            _ => return Err(shape()),
        };
        Ok(EncodeText(Prompts { items, batch }))
    }
}

/// `/encode`'s `input_ids`: token ids (one prompt) or a list of lists of them (a batch).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodeIds(pub Prompts);

impl<'de> Deserialize<'de> for EncodeIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let shape = || D::Error::custom("expected token ids or a list of lists of token ids");
        let value = Value::deserialize(d)?;
        let one = match &value {
            Value::Array(items) => !items.is_empty() && !items[0].is_array(),
            _ => return Err(shape()),
        };
        // [`Prompts`]' errors, as the field's own (`input_ids: is empty`).
        let prompts = Prompts::deserialize(value).map_err(D::Error::custom)?;
        match (one, prompts.items.as_slice()) {
            (true, [Prompt::Ids(_)]) | (false, _) => Ok(EncodeIds(prompts)),
            (true, _) => Err(shape()),
        }
    }
}

/// A chat message's `content`: a string, or a list of `{type: "text", text}` parts, joined.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Content(pub String);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let parts = match Value::deserialize(d)? {
            Value::String(s) => return Ok(Content(s)),
            Value::Array(parts) => parts,
            _ => return Err(D::Error::custom("expected a string or a list of parts")),
        };
        let mut text = String::new();
        for part in &parts {
            match (
                part.get("type").and_then(Value::as_str),
                part.get("text").and_then(Value::as_str),
            ) {
                (Some("text"), Some(t)) => text.push_str(t),
                (kind, _) => {
                    return Err(D::Error::custom(format!(
                        "only text parts are supported, got {}",
                        kind.unwrap_or("a part without type")
                    )))
                }
            }
        }
        Ok(Content(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_floats_are_integers_everywhere_in_the_body() {
        let v = integral(serde_json::json!({"a": 7.0, "b": [1.0, 1.5], "c": {"d": 2.0}}));
        assert_eq!(v, serde_json::json!({"a": 7, "b": [1, 1.5], "c": {"d": 2}}));
        assert_eq!(as_u32(&serde_json::json!(7.0)), Some(7));
        assert_eq!(as_u32(&serde_json::json!(-1)), None);
        assert_eq!(narrow(5e-324), f32::from_bits(1));
        assert_eq!(narrow(-5e-324), -f32::from_bits(1));
    }
}
