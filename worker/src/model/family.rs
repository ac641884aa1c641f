//! The decoder families the model code implements, as `config.json` names them.

use std::fmt;

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
