//! Model hyper-parameters: the built-in sizes and parsing of a Hugging Face `config.json`
//! (plus `generation_config.json` for EOS ids). Not the weights (see `loader`).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde_json::Value;

use super::error::{ModelError, Result};
use super::fields::Fields;
use super::gemma::GemmaOptions;
use super::moe::MoeOptions;
use super::rope::{Rope, RopeScaling};
use super::support::{self, ModelFamily};

/// Hyper-parameters of a Llama-family decoder (see [`ModelFamily`] for the families and how
/// they differ).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: ModelFamily,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2; Llama and Qwen3 with `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama and Qwen3 with `attention_bias`).
    pub o_bias: bool,
    /// Biases on the MLP's gate, up and down projections (Llama with `mlp_bias`).
    pub mlp_bias: bool,
    /// A per-head RMSNorm of q and k, before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Each token attends to at most this many of its sequence's latest positions, itself
    /// included (Mistral); `None`: to all of them.
    pub sliding_window: Option<usize>,
    /// Gemma 2/3's block and options (`None` for the Llama family).
    pub gemma: Option<GemmaOptions>,
    /// Mixtral / Qwen3-MoE's experts (`None`: a dense MLP in every layer).
    pub moe: Option<MoeOptions>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub model_id: String,
}

/// The built-in configurations used with seeded dummy weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuiltinSize {
    /// For tests: a few hundred thousand parameters, fast in the dev profile.
    Tiny,
    /// The default of `dpserve up`: about 29M parameters.
    Base,
}

impl FromStr for BuiltinSize {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tiny" => Ok(BuiltinSize::Tiny),
            "base" => Ok(BuiltinSize::Base),
            other => Err(ModelError::Config {
                field: "builtin size".into(),
                reason: format!("unknown size `{other}` (expected `tiny` or `base`)"),
            }),
        }
    }
}

impl fmt::Display for BuiltinSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BuiltinSize::Tiny => "tiny",
            BuiltinSize::Base => "base",
        })
    }
}

impl ModelConfig {
    /// A built-in configuration over the built-in tokenizer's vocabulary.
    pub fn builtin(size: BuiltinSize) -> Self {
        use protocol::builtin::{BOS_ID, CONTEXT_LEN, EOS_ID, MODEL_ID, VOCAB_SIZE};
        let (hidden, inter, layers, heads, kv_heads) = match size {
            BuiltinSize::Tiny => (64, 128, 2, 4, 2),
            BuiltinSize::Base => (512, 1536, 8, 8, 4),
        };
        ModelConfig {
            family: ModelFamily::Llama,
            vocab_size: VOCAB_SIZE,
            hidden_size: hidden,
            intermediate_size: inter,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim: hidden / heads,
            max_position_embeddings: CONTEXT_LEN,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: false,
            sliding_window: None,
            gemma: None,
            moe: None,
            bos_token_id: Some(BOS_ID),
            eos_token_ids: vec![EOS_ID],
            // The weights differ by size, so the id a worker announces in `Hello` does too: a
            // controller refuses a `tiny` worker in a `base` cluster. (Clients see the
            // tokenizer's served model name, the same for both.)
            model_id: match size {
                BuiltinSize::Base => MODEL_ID.to_string(),
                BuiltinSize::Tiny => format!("{MODEL_ID}-tiny"),
            },
        }
    }

    /// Width of the query projection output.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the key (and value) projection output.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The attention's heads, as the kernels take them.
    pub fn attn_shape(&self) -> kernels::AttnShape {
        kernels::AttnShape {
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
        }
    }

    /// How attention scores are scaled (and, Gemma 2, soft-capped).
    pub fn score_scale(&self) -> kernels::ScoreScale {
        match &self.gemma {
            Some(g) => kernels::ScoreScale {
                scale: g.attention_scale,
                softcap: g.attn_softcap,
            },
            None => kernels::ScoreScale::standard(self.head_dim),
        }
    }

    /// What a peer must match to exchange KV with a worker of this model (disaggregation).
    pub fn kv_layout(&self) -> protocol::KvLayout {
        protocol::KvLayout {
            model_id: self.model_id.clone(),
            num_layers: self.num_hidden_layers as u32,
            num_kv_heads: self.num_key_value_heads as u32,
            head_dim: self.head_dim as u32,
            dtype: "f32".into(),
        }
    }

    /// RoPE's inverse frequencies and cos/sin factor, scaling applied: what both devices build
    /// their tables from.
    pub(crate) fn rope(&self) -> Rope {
        self.rope_scaling.rope(self.head_dim, self.rope_theta)
    }

    /// Gemma 3's local layers' RoPE (their own base, unscaled), if the model has one.
    pub(crate) fn local_rope(&self) -> Option<Rope> {
        let theta = self.gemma.as_ref()?.local_rope_theta?;
        Some(RopeScaling::None.rope(self.head_dim, theta))
    }

    /// Why the CUDA pass cannot run this model, if it cannot: one line for the start-up refusal.
    pub fn cuda_refusal(&self) -> Option<String> {
        let missing = match self.family {
            f if f.is_moe() => "mixture-of-experts layers",
            _ => return None,
        };
        Some(format!(
            "{} runs on the CPU only: the CUDA pass does not implement {missing} (use --device cpu)",
            self.family.architecture()
        ))
    }

    /// The first position a token at position `p` attends to (0 without a sliding window).
    pub fn attend_from(&self, p: usize) -> usize {
        self.sliding_window.map_or(0, |w| (p + 1).saturating_sub(w))
    }

    /// Parameter count (tied embeddings counted once; biases and norms included when
    /// configured).
    pub fn num_params(&self) -> usize {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let (q, kv) = (self.q_dim(), self.kv_dim());
        let bias = if self.qkv_bias { q + 2 * kv } else { 0 }
            + if self.o_bias { h } else { 0 }
            + if self.mlp_bias { 2 * i + h } else { 0 };
        let qk_norm = if self.qk_norm { 2 * self.head_dim } else { 0 };
        // Gemma's norms after attention and after the MLP.
        let post_norms = if self.gemma.is_some() { 2 * h } else { 0 };
        let attn = h * (q + 2 * kv) + bias + qk_norm + post_norms + q * h + 2 * h;
        let mlp = |l: usize| match &self.moe {
            Some(m) if m.moe_layers[l] => {
                let shared = m
                    .shared_expert_intermediate_size
                    .map_or(0, |si| 3 * h * si + h);
                m.num_experts * (h + 3 * h * m.expert_intermediate_size) + shared
            }
            _ => 3 * h * i,
        };
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let layers: usize = (0..self.num_hidden_layers).map(|l| attn + mlp(l)).sum();
        embed + head + layers + h
    }

    /// Reads `dir/config.json` and, if present, `dir/generation_config.json` (whose EOS ids win).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let v = read_json(&path)?;
        let f = Fields { file: &path, v: &v };
        // The family and options first: a checkpoint of another kind is named as such, not
        // reported as a Llama with odd shapes.
        let features = support::read(&f)?;
        // Gemma's configs default `head_dim` to 256, whatever the hidden size.
        let default_head_dim = features.family.is_gemma().then_some(256);
        let shape = AttentionShape::read(&f, default_head_dim)?;
        let (bos, eos) = special_tokens(dir, &f)?;
        let model_id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        let cfg = ModelConfig {
            family: features.family,
            vocab_size: f.usize_req("vocab_size")?,
            hidden_size: shape.hidden,
            intermediate_size: f.usize_req("intermediate_size")?,
            num_hidden_layers: f.usize_req("num_hidden_layers")?,
            num_attention_heads: shape.heads,
            num_key_value_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            max_position_embeddings: f.usize_opt("max_position_embeddings")?.unwrap_or(2048),
            rms_norm_eps: f.f32_opt("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: features.rope_theta,
            rope_scaling: features.rope_scaling,
            // Absent means tied: the loader still prefers an `lm_head.weight` when one exists.
            tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(true),
            qkv_bias: features.qkv_bias,
            o_bias: features.o_bias,
            mlp_bias: features.mlp_bias,
            qk_norm: features.qk_norm,
            sliding_window: features.sliding_window,
            gemma: features.gemma,
            moe: features.moe,
            bos_token_id: bos,
            eos_token_ids: eos,
            model_id,
        };
        for (field, val) in [
            ("vocab_size", cfg.vocab_size),
            ("hidden_size", cfg.hidden_size),
            ("intermediate_size", cfg.intermediate_size),
            ("max_position_embeddings", cfg.max_position_embeddings),
        ] {
            if val == 0 {
                return Err(f.missing(field));
            }
        }
        Ok(cfg)
    }
}

/// The attention geometry of `config.json`, checked: heads divide the hidden size (unless
/// `head_dim` says otherwise), KV heads divide heads (GQA), and RoPE gets an even head size.
struct AttentionShape {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl AttentionShape {
    fn read(f: &Fields<'_>, default_head_dim: Option<usize>) -> Result<Self> {
        let hidden = f.usize_req("hidden_size")?;
        let heads = f.usize_req("num_attention_heads")?;
        let given_head_dim = f.get("head_dim").is_some() || default_head_dim.is_some();
        if heads == 0 || hidden % heads != 0 && !given_head_dim {
            return Err(f.missing("num_attention_heads"));
        }
        let kv_heads = f.usize_opt("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(ModelError::Config {
                field: "num_key_value_heads".into(),
                reason: format!("{kv_heads} does not divide num_attention_heads {heads}"),
            });
        }
        let head_dim = f
            .usize_opt("head_dim")?
            .or(default_head_dim)
            .unwrap_or(hidden / heads);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(ModelError::Config {
                field: "head_dim".into(),
                reason: format!("{head_dim} must be even and positive for RoPE"),
            });
        }
        Ok(AttentionShape {
            hidden,
            heads,
            kv_heads,
            head_dim,
        })
    }
}

/// BOS and EOS ids from `config.json`, overridden by `generation_config.json` when the
/// directory has one (as transformers does).
fn special_tokens(dir: &Path, f: &Fields<'_>) -> Result<(Option<u32>, Vec<u32>)> {
    let mut eos = f.ids_opt("eos_token_id")?.unwrap_or_default();
    let mut bos = f.ids_opt("bos_token_id")?.and_then(|b| b.first().copied());
    let gen_path = dir.join("generation_config.json");
    if gen_path.exists() {
        let g = read_json(&gen_path)?;
        let gf = Fields {
            file: &gen_path,
            v: &g,
        };
        if let Some(e) = gf.ids_opt("eos_token_id")? {
            eos = e;
        }
        if let Some(b) = gf.ids_opt("bos_token_id")? {
            bos = b.first().copied().or(bos);
        }
    }
    Ok((bos, eos))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ModelError::MissingFile { path: path.into() },
        _ => ModelError::Io {
            path: path.into(),
            reason: e.to_string(),
        },
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::BadJson {
        path: path.into(),
        reason: e.to_string(),
    })
}
