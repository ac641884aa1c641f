//! What the model code implements, read from `config.json`: the family (`architectures` /
//! `model_type`) and every option that changes the math (activation, biases, RoPE type, q/k
//! norm, sliding window, soft-capping, …). Anything else is refused at load with one line
//! naming the field and its value, so a checkpoint of another kind (Gemma, a mixture of
//! experts, a quantized one) never runs as if it were Llama. Not here: the shapes (`config.rs`),
//! Gemma's own options (`gemma.rs`) and the tensors (`loader.rs`, which refuses a tensor this
//! description does not use).

use serde_json::Value;

use super::error::Result;
pub(super) use super::family::ModelFamily;
use super::family::{Bias, Window};
use super::fields::{is_off, unsupported, Fields};
use super::gemma::{self, GemmaOptions};
use super::moe::{self, MoeOptions};
use super::rope::RopeScaling;
use super::rope_config::rope_from;

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

/// The family and options of a `config.json`, or the first thing in it that is not implemented.
pub(super) fn read(f: &Fields<'_>) -> Result<Features> {
    let family = family(f)?;
    if family.is_gemma() {
        return read_gemma(f, family);
    }
    let spec = family.spec();
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
    let sliding_window = sliding_window(f, spec.window)?;
    let (rope_theta, rope_scaling) = rope(f)?;
    let attention_bias = f.bool_opt("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_bias) = (
        bias(f, spec.qkv_bias, attention_bias)?,
        bias(f, spec.o_bias, attention_bias)?,
    );
    // Only the families that read `mlp_bias` (Llama's MLP); elsewhere transformers ignores
    // it, and so does this.
    let mlp_bias = spec.mlp_bias && f.bool_opt("mlp_bias")?.unwrap_or(false);
    Ok(Features {
        family,
        rope_theta,
        rope_scaling,
        qkv_bias,
        o_bias,
        mlp_bias,
        qk_norm: spec.qk_norm,
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
    let spec = family.spec();
    let attention_bias = f.bool_opt("attention_bias")?.unwrap_or(false);
    Ok(Features {
        family,
        rope_theta,
        rope_scaling,
        qkv_bias: bias(f, spec.qkv_bias, attention_bias)?,
        o_bias: bias(f, spec.o_bias, attention_bias)?,
        mlp_bias: false,
        qk_norm: spec.qk_norm,
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

/// Whether a family's q, k and v (or o) projections carry biases, per its row.
fn bias(f: &Fields<'_>, from: Bias, attention_bias: bool) -> Result<bool> {
    Ok(match from {
        Bias::Attention => attention_bias,
        Bias::Always => true,
        Bias::Never => false,
        Bias::Flag(field) => f.bool_opt(field)?.unwrap_or(true),
    })
}

/// The window every layer has, when the family has one and the config sets it (Mistral's,
/// Mixtral's); windows on some layers only (Qwen's `use_sliding_window`) are refused; a family
/// without windows ignores the field, as transformers does (Llama); Gemma's are its own.
fn sliding_window(f: &Fields<'_>, window: Window) -> Result<Option<usize>> {
    match window {
        Window::Every => match f.usize_opt("sliding_window")? {
            Some(0) => Err(unsupported(
                f,
                "sliding_window",
                &Value::from(0),
                "a window must hold at least the token itself",
            )),
            w => Ok(w),
        },
        Window::SomeLayersRefused => match f.get("use_sliding_window") {
            Some(v) if !is_off(v) => Err(unsupported(
                f,
                "use_sliding_window",
                v,
                "Qwen sliding-window layers are not implemented",
            )),
            _ => Ok(None),
        },
        Window::Never | Window::OwnLayers => Ok(None),
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
