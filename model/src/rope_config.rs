//! RoPE's base and scaling as `config.json` gives them (`rope_parameters`, `rope_scaling`),
//! checked: a type or key the RoPE code does not implement is refused.

use serde_json::Value;

use super::error::{ModelError, Result};
use super::fields::{unsupported, Fields};
use super::rope::{yarn_attention_factor, RopeScaling};

/// The RoPE base and scaling of one `rope_parameters` / `rope_scaling` object (`field` names
/// it in errors); `default_theta` where it gives no `rope_theta`.
pub(super) fn rope_from(
    f: &Fields<'_>,
    field: &str,
    params: Option<&Value>,
    default_theta: f32,
) -> Result<(f32, RopeScaling)> {
    let theta_field = params
        .and_then(|p| p.get("rope_theta"))
        .filter(|v| !v.is_null());
    let theta = match theta_field {
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| unsupported(f, field, v, "rope_theta must be a number"))?,
        None => default_theta,
    };
    let Some(p) = params else {
        return Ok((theta, RopeScaling::None));
    };
    let Some(obj) = p.as_object() else {
        return Err(unsupported(f, field, p, "expected an object"));
    };
    let rope = RopeParams { f, field, p, obj };
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    rope.only_known_keys(kind)?;
    let scaling = match kind {
        "linear" => RopeScaling::Linear {
            factor: rope.num("factor")?,
        },
        "llama3" => rope.llama3()?,
        "yarn" => rope.yarn()?,
        _ => RopeScaling::None,
    };
    Ok((theta, scaling))
}

/// A config's `rope_scaling` (or `rope_parameters`), read with errors naming the field.
struct RopeParams<'a> {
    f: &'a Fields<'a>,
    field: &'a str,
    p: &'a Value,
    obj: &'a serde_json::Map<String, Value>,
}

impl RopeParams<'_> {
    /// Refuses a RoPE type not implemented, and any key its implementation would ignore.
    fn only_known_keys(&self, kind: &str) -> Result<()> {
        let known: &[&str] = match kind {
            "default" => &[],
            "linear" => &["factor"],
            "llama3" => &[
                "factor",
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            ],
            "yarn" => &[
                "factor",
                "original_max_position_embeddings",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
                "attention_factor",
                "truncate",
            ],
            _ => {
                return Err(self.unsupported(format!(
                    "RoPE type `{kind}` is not implemented (implemented: default, linear, llama3, yarn)"
                )))
            }
        };
        for (key, v) in self.obj {
            let neutral = match key.as_str() {
                "rope_type" | "type" | "rope_theta" => true,
                "partial_rotary_factor" => v.as_f64() == Some(1.0),
                _ => known.contains(&key.as_str()),
            };
            if !neutral {
                return Err(
                    self.unsupported(format!("`{key}` is not implemented for RoPE type `{kind}`"))
                );
            }
        }
        Ok(())
    }

    fn unsupported(&self, why: impl Into<String>) -> ModelError {
        unsupported(self.f, self.field, self.p, why)
    }

    /// `key`, required, a positive number.
    fn num(&self, key: &str) -> Result<f32> {
        self.obj
            .get(key)
            .and_then(Value::as_f64)
            .map(|x| x as f32)
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| self.unsupported(format!("`{key}` must be a positive number")))
    }

    /// `key`, optional (absent or null), a finite number.
    fn opt(&self, key: &str) -> Result<Option<f64>> {
        match self.obj.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.unsupported(format!("`{key}` must be a number"))),
        }
    }

    fn llama3(&self) -> Result<RopeScaling> {
        let (low, high) = (self.num("low_freq_factor")?, self.num("high_freq_factor")?);
        if high <= low {
            return Err(self.unsupported("high_freq_factor must exceed low_freq_factor"));
        }
        let original = original_context(self.f, self.field, self.p)?;
        Ok(RopeScaling::Llama3 {
            factor: self.num("factor")?,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: original,
        })
    }

    fn yarn(&self) -> Result<RopeScaling> {
        let original = original_context(self.f, self.field, self.p)?;
        let factor = match self.obj.get("factor").filter(|v| !v.is_null()) {
            Some(_) => self.num("factor")?,
            // Transformers' fallback: the context extension the config states.
            None => {
                self.f
                    .usize_opt("max_position_embeddings")?
                    .unwrap_or(original) as f32
                    / original as f32
            }
        };
        let attention_factor = match self.opt("attention_factor")? {
            Some(a) => a,
            None => yarn_attention_factor(
                factor as f64,
                self.opt("mscale")?,
                self.opt("mscale_all_dim")?,
            ),
        };
        Ok(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            // Transformers reads 0 as unset here too (`or 32`).
            beta_fast: self.opt("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
            beta_slow: self.opt("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
            truncate: self
                .obj
                .get("truncate")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            attention_factor: attention_factor as f32,
        })
    }
}

/// The pretraining context of a `llama3` or `yarn` scaling: the config's top-level
/// `original_max_position_embeddings` (Phi-3 style) wins over the scaling's own, which
/// falls back to `max_position_embeddings`, as in transformers.
fn original_context(f: &Fields<'_>, field: &str, p: &Value) -> Result<usize> {
    let given = f
        .get("original_max_position_embeddings")
        .or_else(|| p.get("original_max_position_embeddings"));
    match given {
        Some(v) => v.as_u64().and_then(|n| usize::try_from(n).ok()),
        None => f.usize_opt("max_position_embeddings")?,
    }
    .filter(|&n| n > 0)
    .ok_or_else(|| {
        unsupported(
            f,
            field,
            p,
            "`original_max_position_embeddings` must be a positive integer",
        )
    })
}
