//! Gemma 2 and Gemma 3 (text): what their `config.json` asks beyond the Llama family's options,
//! read with transformers' defaults. The block itself is the Llama one with these changes
//! (`forward.rs`): norms multiply by `1 + w` (folded into the weights at load), the embedding is
//! scaled by `sqrt(hidden)`, the attention output and the MLP output are normed before their
//! residual add, the MLP is GeGLU (`gelu_pytorch_tanh`), scores are scaled by
//! `query_pre_attn_scalar^-1/2` and may be soft-capped, local layers see a sliding window (and,
//! in Gemma 3, rotate by their own RoPE base), and the final logits may be soft-capped. Not
//! here: Gemma 1, PaliGemma / Gemma 3's vision tower (`Gemma3ForConditionalGeneration`),
//! bidirectional attention. The GPU pass (`cuda.rs`) does the same math, kernel for kernel.

use serde_json::Value;

use super::error::Result;
use super::family::ModelFamily;
use super::fields::{is_off, unsupported, Fields};
use super::rope::RopeScaling;
use super::rope_config::rope_from;

/// Fields refused for the other families that Gemma reads itself.
pub(super) const OWN_FIELDS: &[&str] = &[
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
];

/// Gemma's options, as its config gives them (or transformers' defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaOptions {
    /// What q·k is multiplied by: `query_pre_attn_scalar^-1/2`.
    pub attention_scale: f32,
    /// `attn_logit_softcapping`: scores become `c · tanh(score / c)` (Gemma 2's default 50).
    pub attn_softcap: Option<f32>,
    /// `final_logit_softcapping`: logits become `c · tanh(logit / c)` (Gemma 2's default 30).
    pub final_softcap: Option<f32>,
    /// The window of the local layers: a token sees its latest `sliding_window` positions.
    pub sliding_window: usize,
    /// For each layer, whether it is local (`sliding_attention`) rather than global.
    pub local_layers: Vec<bool>,
    /// Gemma 3: the RoPE base of the local layers (`rope_local_base_freq`, unscaled); the global
    /// layers use `rope_theta` with `rope_scaling`. `None` (Gemma 2): one RoPE for all.
    pub local_rope_theta: Option<f32>,
}

impl GemmaOptions {
    /// The layers of a model of `layers` layers local every `pattern`-th one excepted
    /// (transformers' default `layer_types`: Gemma 2 alternates, pattern 2; Gemma 3, 6).
    fn default_layers(layers: usize, pattern: usize) -> Vec<bool> {
        (0..layers).map(|i| (i + 1) % pattern != 0).collect()
    }

    /// The slice of `attend` (a token's slots, oldest first) that layer `layer` reads.
    pub fn window<'a>(&self, layer: usize, attend: &'a [u32]) -> &'a [u32] {
        match self.local_layers[layer] {
            true => self.local_window(attend),
            false => attend,
        }
    }

    /// The slice of `attend` a local layer reads: its last `sliding_window` slots.
    pub fn local_window<'a>(&self, attend: &'a [u32]) -> &'a [u32] {
        &attend[attend.len().saturating_sub(self.sliding_window)..]
    }
}

/// `c · tanh(x / c)` in place, as transformers soft-caps (divide, tanh, multiply).
pub(crate) fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
}

/// A soft-cap field: absent means `default`, null or 0 none.
fn cap(f: &Fields<'_>, field: &str, default: Option<f32>) -> Result<Option<f32>> {
    match f.raw(field) {
        None => Ok(default),
        Some(v) if is_off(v) => Ok(None),
        Some(v) => match v.as_f64().filter(|c| c.is_finite() && *c > 0.0) {
            Some(c) => Ok(Some(c as f32)),
            None => Err(unsupported(
                f,
                field,
                v,
                "a soft cap must be a positive number",
            )),
        },
    }
}

/// Gemma's options and its global layers' RoPE base and scaling, or the first field that is
/// not implemented.
pub(super) fn read(
    f: &Fields<'_>,
    family: ModelFamily,
) -> Result<(GemmaOptions, f32, RopeScaling)> {
    let gemma3 = family == ModelFamily::Gemma3;
    refuse_unimplemented(f)?;
    let scalar = f.f32_opt("query_pre_attn_scalar")?.unwrap_or(256.0);
    if !(scalar > 0.0 && scalar.is_finite()) {
        return Err(unsupported(
            f,
            "query_pre_attn_scalar",
            &Value::from(scalar),
            "must be a positive number",
        ));
    }
    let sliding_window = match f.usize_opt("sliding_window")?.unwrap_or(4096) {
        0 => {
            return Err(unsupported(
                f,
                "sliding_window",
                &Value::from(0),
                "a window must hold at least the token itself",
            ))
        }
        w => w,
    };
    let local_layers = local_layers(f, gemma3)?;
    let (theta, scaling, local_rope_theta) = match gemma3 {
        true => gemma3_rope(f)?,
        false => {
            let (field, params) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
                (Some(p), _) => ("rope_parameters", Some(p)),
                (None, s) => ("rope_scaling", s),
            };
            let theta = f.f32_opt("rope_theta")?.unwrap_or(10000.0);
            let (theta, scaling) = rope_from(f, field, params, theta)?;
            (theta, scaling, None)
        }
    };
    let (attn_default, final_default) = match gemma3 {
        true => (None, None),
        false => (Some(50.0), Some(30.0)),
    };
    let options = GemmaOptions {
        attention_scale: (scalar as f64).powf(-0.5) as f32,
        attn_softcap: cap(f, "attn_logit_softcapping", attn_default)?,
        final_softcap: cap(f, "final_logit_softcapping", final_default)?,
        sliding_window,
        local_layers,
        local_rope_theta,
    };
    Ok((options, theta, scaling))
}

/// The activation and attention kinds Gemma configs can ask for that are not implemented.
fn refuse_unimplemented(f: &Fields<'_>) -> Result<()> {
    // transformers' Gemma configs read `hidden_activation` (the Hub's files also carry a
    // `hidden_act`, which they ignore).
    if let Some(v) = f.get("hidden_activation") {
        if v.as_str() != Some("gelu_pytorch_tanh") {
            return Err(unsupported(
                f,
                "hidden_activation",
                v,
                "Gemma is implemented with gelu_pytorch_tanh only",
            ));
        }
    }
    if let Some(v) = f.get("use_bidirectional_attention").filter(|v| !is_off(v)) {
        return Err(unsupported(
            f,
            "use_bidirectional_attention",
            v,
            "only causal attention is implemented",
        ));
    }
    Ok(())
}

/// Which layers are local (sliding-window): `layer_types` where given, else Gemma 3's
/// `sliding_window_pattern` (every sixth layer global by default) or Gemma 2's alternation.
fn local_layers(f: &Fields<'_>, gemma3: bool) -> Result<Vec<bool>> {
    let layers = f.usize_opt("num_hidden_layers")?.unwrap_or(0);
    match f.get("layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != layers {
                return Err(unsupported(
                    f,
                    "layer_types",
                    &Value::from(types.len()),
                    format!("{} entries for num_hidden_layers {layers}", types.len()),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(unsupported(
                        f,
                        "layer_types",
                        t,
                        "Gemma layers are sliding_attention or full_attention",
                    )),
                })
                .collect()
        }
        Some(v) => Err(unsupported(f, "layer_types", v, "expected a list")),
        None if gemma3 => {
            let pattern = f.usize_opt("sliding_window_pattern")?.unwrap_or(6);
            if pattern == 0 {
                return Err(unsupported(
                    f,
                    "sliding_window_pattern",
                    &Value::from(0),
                    "must be positive",
                ));
            }
            Ok(GemmaOptions::default_layers(layers, pattern))
        }
        None => Ok(GemmaOptions::default_layers(layers, 2)),
    }
}

/// Gemma 3's two RoPEs: the global layers' (`rope_theta`, default 1e6, with `rope_scaling`)
/// and the local layers' (`rope_local_base_freq`, default 1e4, unscaled); or transformers 5's
/// `rope_parameters` with one entry per layer type.
fn gemma3_rope(f: &Fields<'_>) -> Result<(f32, RopeScaling, Option<f32>)> {
    let (global, local) = match f.get("rope_parameters") {
        Some(p) => {
            let entry = |key: &str| {
                p.get(key).filter(|v| !v.is_null()).ok_or_else(|| {
                    unsupported(
                        f,
                        "rope_parameters",
                        p,
                        format!("Gemma 3 gives one entry per layer type; `{key}` is missing"),
                    )
                })
            };
            (
                rope_from(f, "rope_parameters", Some(entry("full_attention")?), 1e6)?,
                rope_from(f, "rope_parameters", Some(entry("sliding_attention")?), 1e4)?,
            )
        }
        None => {
            let theta = f.f32_opt("rope_theta")?.unwrap_or(1e6);
            let local = f.f32_opt("rope_local_base_freq")?.unwrap_or(1e4);
            (
                rope_from(f, "rope_scaling", f.get("rope_scaling"), theta)?,
                (local, RopeScaling::None),
            )
        }
    };
    if local.1 != RopeScaling::None {
        return Err(unsupported(
            f,
            "rope_parameters",
            &Value::from("sliding_attention"),
            "RoPE scaling on Gemma 3's local layers is not implemented",
        ));
    }
    Ok((global.0, global.1, Some(local.0)))
}
