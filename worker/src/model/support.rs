//! What the model code implements, read from `config.json`: the family (`architectures` /
//! `model_type`) and every option that changes the math (activation, biases, RoPE type, q/k
//! norm, sliding window, soft-capping, …). Anything else is refused at load with one line
//! naming the field and its value, so a checkpoint of another kind (Gemma, a mixture of
//! experts, a quantized one) never runs as if it were Llama. Not here: the shapes (`config.rs`),
//! Gemma's own options (`gemma.rs`) and the tensors (`loader.rs`, which refuses a tensor this
//! description does not use).

use std::fmt;

use serde_json::Value;

use super::config::Fields;
use super::error::{ModelError, Result};
use super::gemma::{self, GemmaOptions};
use super::moe::{self, MoeOptions};
use super::rope::{yarn_attention_factor, RopeScaling};

/// The decoder families the forward pass implements. All are pre-norm RMSNorm decoders with
/// gated MLPs and rotate-half RoPE; they differ in the options of [`Features`] (Gemma's in
/// [`GemmaOptions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFamily {
    /// Llama 1–3.3 (and TinyStories, SmolLM2): `attention_bias` puts biases on q, k, v and o,
    /// `mlp_bias` on gate, up and down.
    Llama,
    /// Mistral: no biases; `sliding_window` when set.
    Mistral,
    /// Qwen2 / Qwen2.5: q, k and v always carry biases, o never.
    Qwen2,
    /// Qwen3 (dense): a per-head RMSNorm on q and k before RoPE; `attention_bias` as Llama.
    Qwen3,
    /// Gemma 2: see [`GemmaOptions`] (norms of `1 + w`, GeGLU, scaled embeddings, norms after
    /// attention and MLP, local/global layers, soft-capping); `attention_bias` as Llama.
    Gemma2,
    /// Gemma 3 (text): Gemma 2's block with Qwen3-style q/k norms, no soft-capping by default,
    /// and its own RoPE base on the local layers.
    Gemma3,
    /// Mixtral: Mistral's attention, a mixture of SwiGLU experts in every layer
    /// ([`MoeOptions`]; top-k weights always renormalised).
    Mixtral,
    /// Qwen3-MoE: Qwen3's attention, experts in the layers `decoder_sparse_step` and
    /// `mlp_only_layers` leave them, `norm_topk_prob`.
    Qwen3Moe,
    /// Qwen2-MoE (Qwen1.5-MoE): Qwen2's attention (q/k/v biases by `qkv_bias`), Qwen3-MoE's
    /// routing, plus a shared expert gated by a sigmoid in every layer with experts.
    Qwen2Moe,
}

impl ModelFamily {
    pub const ALL: [ModelFamily; 9] = [
        ModelFamily::Llama,
        ModelFamily::Mistral,
        ModelFamily::Qwen2,
        ModelFamily::Qwen3,
        ModelFamily::Gemma2,
        ModelFamily::Gemma3,
        ModelFamily::Mixtral,
        ModelFamily::Qwen3Moe,
        ModelFamily::Qwen2Moe,
    ];

    /// The `architectures` entry of its checkpoints.
    pub fn architecture(self) -> &'static str {
        match self {
            ModelFamily::Llama => "LlamaForCausalLM",
            ModelFamily::Mistral => "MistralForCausalLM",
            ModelFamily::Qwen2 => "Qwen2ForCausalLM",
            ModelFamily::Qwen3 => "Qwen3ForCausalLM",
            ModelFamily::Gemma2 => "Gemma2ForCausalLM",
            ModelFamily::Gemma3 => "Gemma3ForCausalLM",
            ModelFamily::Mixtral => "MixtralForCausalLM",
            ModelFamily::Qwen3Moe => "Qwen3MoeForCausalLM",
            ModelFamily::Qwen2Moe => "Qwen2MoeForCausalLM",
        }
    }

    /// Its `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            ModelFamily::Llama => "llama",
            ModelFamily::Mistral => "mistral",
            ModelFamily::Qwen2 => "qwen2",
            ModelFamily::Qwen3 => "qwen3",
            ModelFamily::Gemma2 => "gemma2",
            ModelFamily::Gemma3 => "gemma3_text",
            ModelFamily::Mixtral => "mixtral",
            ModelFamily::Qwen3Moe => "qwen3_moe",
            ModelFamily::Qwen2Moe => "qwen2_moe",
        }
    }

    /// Mixtral or Qwen3-MoE.
    pub fn is_moe(self) -> bool {
        matches!(
            self,
            ModelFamily::Mixtral | ModelFamily::Qwen3Moe | ModelFamily::Qwen2Moe
        )
    }

    /// Gemma 2 or 3.
    pub fn is_gemma(self) -> bool {
        matches!(self, ModelFamily::Gemma2 | ModelFamily::Gemma3)
    }
}

impl fmt::Display for ModelFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

/// What a supported `config.json` asks of the forward pass beyond the shapes.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Features {
    pub family: ModelFamily,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub qk_norm: bool,
    pub sliding_window: Option<usize>,
    pub gemma: Option<GemmaOptions>,
    pub moe: Option<MoeOptions>,
}

/// Options no supported family has; present and not null (or, for a flag, true), they are
/// refused: each changes the math in a way the forward pass does not implement.
const NOT_IMPLEMENTED: &[(&str, &str)] = &[
    (
        "attn_logit_softcapping",
        "attention soft-capping is not implemented",
    ),
    (
        "final_logit_softcapping",
        "logit soft-capping is not implemented",
    ),
    (
        "query_pre_attn_scalar",
        "only 1/sqrt(head_dim) attention scaling is implemented",
    ),
    (
        "quantization_config",
        "quantized checkpoints are not implemented",
    ),
    (
        "embedding_multiplier",
        "embedding scaling is not implemented",
    ),
    ("residual_multiplier", "residual scaling is not implemented"),
    (
        "attention_multiplier",
        "attention scaling other than 1/sqrt(head_dim) is not implemented",
    ),
    ("logits_scaling", "logit scaling is not implemented"),
    ("no_rope_layers", "layers without RoPE are not implemented"),
    (
        "dual_chunk_attention_config",
        "dual-chunk attention is not implemented",
    ),
    (
        "num_experts",
        "mixture-of-experts layers are not implemented",
    ),
    (
        "num_local_experts",
        "mixture-of-experts layers are not implemented",
    ),
    (
        "n_routed_experts",
        "mixture-of-experts layers are not implemented",
    ),
    ("qk_layernorm", "q/k norm is implemented for Qwen3 only"),
    ("use_qk_norm", "q/k norm is implemented for Qwen3 only"),
];

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

/// The family and options of a `config.json`, or the first thing in it that is not implemented.
pub(super) fn read(f: &Fields<'_>) -> Result<Features> {
    let family = family(f)?;
    if family.is_gemma() {
        return read_gemma(f, family);
    }
    for field in ["hidden_act", "hidden_activation"] {
        if let Some(v) = f.get(field) {
            if v.as_str() != Some("silu") {
                return Err(unsupported(
                    f,
                    field,
                    v,
                    "only silu (SwiGLU) is implemented",
                ));
            }
        }
    }
    refuse_not_implemented(
        f,
        if family.is_moe() {
            moe::OWN_FIELDS
        } else {
            &[]
        },
    )?;
    if let Some(Value::Array(types)) = f.get("layer_types") {
        if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
            return Err(unsupported(
                f,
                "layer_types",
                t,
                "only full_attention layers are implemented",
            ));
        }
    }
    let sliding_window = sliding_window(f, family)?;
    let (rope_theta, rope_scaling) = rope(f)?;
    let attention_bias = f.bool_opt("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_bias) = match family {
        ModelFamily::Llama | ModelFamily::Qwen3 | ModelFamily::Qwen3Moe => {
            (attention_bias, attention_bias)
        }
        // Transformers ignores `attention_bias` for these two: their biases are fixed.
        ModelFamily::Qwen2 => (true, false),
        // Qwen2-MoE reads its own flag for q, k and v (o never has one).
        ModelFamily::Qwen2Moe => (f.bool_opt("qkv_bias")?.unwrap_or(true), false),
        ModelFamily::Mistral | ModelFamily::Mixtral | ModelFamily::Gemma2 | ModelFamily::Gemma3 => {
            (false, false)
        }
    };
    // Only Llama's MLP reads `mlp_bias`; elsewhere transformers ignores it, and so does this.
    let mlp_bias = family == ModelFamily::Llama && f.bool_opt("mlp_bias")?.unwrap_or(false);
    Ok(Features {
        family,
        rope_theta,
        rope_scaling,
        qkv_bias,
        o_bias,
        mlp_bias,
        qk_norm: matches!(family, ModelFamily::Qwen3 | ModelFamily::Qwen3Moe),
        sliding_window,
        gemma: None,
        moe: match family.is_moe() {
            true => Some(moe::read(f, family)?),
            false => None,
        },
    })
}

/// The options of [`NOT_IMPLEMENTED`] (but those in `own`, which the family reads itself), and
/// partial RoPE: the first one set is refused.
fn refuse_not_implemented(f: &Fields<'_>, own: &[&str]) -> Result<()> {
    for &(field, why) in NOT_IMPLEMENTED {
        if own.contains(&field) {
            continue;
        }
        if let Some(v) = f.get(field).filter(|v| !is_off(v)) {
            return Err(unsupported(f, field, v, why));
        }
    }
    if let Some(v) = f.get("partial_rotary_factor") {
        if v.as_f64() != Some(1.0) {
            return Err(unsupported(
                f,
                "partial_rotary_factor",
                v,
                "only full RoPE is implemented",
            ));
        }
    }
    Ok(())
}

/// A Gemma 2/3 `config.json`: its own options ([`gemma::read`]), `attention_bias` as Llama,
/// everything else refused as for the other families.
fn read_gemma(f: &Fields<'_>, family: ModelFamily) -> Result<Features> {
    refuse_not_implemented(f, gemma::OWN_FIELDS)?;
    let (g, rope_theta, rope_scaling) = gemma::read(f, family)?;
    let attention_bias = f.bool_opt("attention_bias")?.unwrap_or(false);
    Ok(Features {
        family,
        rope_theta,
        rope_scaling,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias: false,
        qk_norm: family == ModelFamily::Gemma3,
        sliding_window: None,
        gemma: Some(g),
        moe: None,
    })
}

/// The family `architectures` and `model_type` name; both, when given, must name the same one.
fn family(f: &Fields<'_>) -> Result<ModelFamily> {
    let implemented = || {
        let names: Vec<&str> = ModelFamily::ALL.iter().map(|m| m.architecture()).collect();
        format!("implemented: {}", names.join(", "))
    };
    let by_arch = match f.get("architectures") {
        None => None,
        Some(v) => {
            let one = match v {
                Value::Array(a) if a.len() == 1 => a[0].as_str(),
                Value::String(s) => Some(s.as_str()),
                _ => None,
            };
            let fam = ModelFamily::ALL
                .into_iter()
                .find(|m| one == Some(m.architecture()));
            Some(fam.ok_or_else(|| unsupported(f, "architectures", v, implemented()))?)
        }
    };
    let by_type = match f.get("model_type") {
        None => None,
        Some(v) => {
            let fam = ModelFamily::ALL
                .into_iter()
                .find(|m| v.as_str() == Some(m.model_type()));
            let types: Vec<&str> = ModelFamily::ALL.iter().map(|m| m.model_type()).collect();
            let why = format!("implemented: {}", types.join(", "));
            Some(fam.ok_or_else(|| unsupported(f, "model_type", v, why))?)
        }
    };
    match (by_arch, by_type) {
        (Some(a), Some(t)) if a != t => Err(unsupported(
            f,
            "model_type",
            &Value::from(t.model_type()),
            format!(
                "{} checkpoints have model_type `{}`",
                a.architecture(),
                a.model_type()
            ),
        )),
        (Some(a), _) => Ok(a),
        (None, Some(t)) => Ok(t),
        (None, None) => Err(unsupported(
            f,
            "architectures",
            &Value::Null,
            format!("neither it nor model_type is given; {}", implemented()),
        )),
    }
}

/// Mistral's window, when set. Qwen2/Qwen3 place windows on some layers only
/// (`use_sliding_window`, `max_window_layers`): refused. Llama has none (transformers ignores
/// the field there, and so does this).
fn sliding_window(f: &Fields<'_>, family: ModelFamily) -> Result<Option<usize>> {
    match family {
        ModelFamily::Mistral | ModelFamily::Mixtral => match f.usize_opt("sliding_window")? {
            Some(0) => Err(unsupported(
                f,
                "sliding_window",
                &Value::from(0),
                "a window must hold at least the token itself",
            )),
            w => Ok(w),
        },
        ModelFamily::Qwen2 | ModelFamily::Qwen3 | ModelFamily::Qwen3Moe | ModelFamily::Qwen2Moe => {
            match f.get("use_sliding_window") {
                Some(v) if !is_off(v) => Err(unsupported(
                    f,
                    "use_sliding_window",
                    v,
                    "Qwen sliding-window layers are not implemented",
                )),
                _ => Ok(None),
            }
        }
        ModelFamily::Llama => Ok(None),
        // Windows on some layers only: `gemma.rs`.
        ModelFamily::Gemma2 | ModelFamily::Gemma3 => Ok(None),
    }
}

/// The RoPE base and scaling, from `rope_parameters` (transformers 5) or `rope_theta` and
/// `rope_scaling` (the checkpoints on the Hub).
fn rope(f: &Fields<'_>) -> Result<(f32, RopeScaling)> {
    let (field, params) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, s) => ("rope_scaling", s),
    };
    let theta = f.f32_opt("rope_theta")?.unwrap_or(10000.0);
    rope_from(f, field, params, theta)
}

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
