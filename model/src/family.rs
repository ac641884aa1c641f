//! The decoder families the model code implements, as `config.json` names them, each as data:
//! one `FamilySpec` row says how its config is read differently from another family's.

use std::fmt;

/// The decoder families the forward pass implements. All are pre-norm RMSNorm decoders with
/// gated MLPs and rotate-half RoPE; they differ in their `FamilySpec` row, which `support.rs`
/// turns into the options of its `Features` (Gemma's own in `GemmaOptions`, experts' in
/// `MoeOptions`).
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

/// Where a family's biases on the q, k and v (or o) projections come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bias {
    /// `attention_bias`, the field every family but these reads (absent: none).
    Attention,
    /// Always there, whatever the config says (transformers ignores `attention_bias`).
    Always,
    /// Never there (transformers ignores `attention_bias`).
    Never,
    /// The family's own flag, on when absent (Qwen2-MoE's `qkv_bias`).
    Flag(&'static str),
}

/// Where a family's sliding window comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// None (transformers ignores `sliding_window` for the family).
    Never,
    /// `sliding_window` on every layer, when set (Mistral's).
    Every,
    /// Windows on some layers only (Qwen's `use_sliding_window`): refused when on.
    SomeLayersRefused,
    /// Its own local layers (Gemma's: `gemma.rs`).
    OwnLayers,
}

/// What a family's blocks are beyond attention: which module reads the rest of its config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// A dense SwiGLU MLP in every layer.
    Dense,
    /// Experts (`moe.rs` reads their options).
    Moe,
    /// Gemma's block (`gemma.rs` reads its options).
    Gemma,
}

/// A family as data: how its checkpoints name it and every way its config is read differently
/// from another family's. A new family is a variant of [`ModelFamily`] and its row in
/// [`FAMILIES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FamilySpec {
    /// The `architectures` entry of its checkpoints.
    pub architecture: &'static str,
    pub model_type: &'static str,
    pub qkv_bias: Bias,
    pub o_bias: Bias,
    /// Whether it reads `mlp_bias` (biases on gate, up and down); the others ignore it, as
    /// transformers does.
    pub mlp_bias: bool,
    /// A per-head RMSNorm of q and k before RoPE.
    pub qk_norm: bool,
    pub window: Window,
    pub block: Block,
}

/// Every family's row, in the order of [`ModelFamily`]'s variants (a unit test checks it): the
/// one place a family's differences are written.
const FAMILIES: [(ModelFamily, FamilySpec); 9] = {
    use Bias::{Always, Attention, Flag, Never};
    [
        (
            ModelFamily::Llama,
            FamilySpec {
                architecture: "LlamaForCausalLM",
                model_type: "llama",
                qkv_bias: Attention,
                o_bias: Attention,
                mlp_bias: true,
                qk_norm: false,
                window: Window::Never,
                block: Block::Dense,
            },
        ),
        (
            ModelFamily::Mistral,
            FamilySpec {
                architecture: "MistralForCausalLM",
                model_type: "mistral",
                qkv_bias: Never,
                o_bias: Never,
                mlp_bias: false,
                qk_norm: false,
                window: Window::Every,
                block: Block::Dense,
            },
        ),
        (
            ModelFamily::Qwen2,
            FamilySpec {
                architecture: "Qwen2ForCausalLM",
                model_type: "qwen2",
                qkv_bias: Always,
                o_bias: Never,
                mlp_bias: false,
                qk_norm: false,
                window: Window::SomeLayersRefused,
                block: Block::Dense,
            },
        ),
        (
            ModelFamily::Qwen3,
            FamilySpec {
                architecture: "Qwen3ForCausalLM",
                model_type: "qwen3",
                qkv_bias: Attention,
                o_bias: Attention,
                mlp_bias: false,
                qk_norm: true,
                window: Window::SomeLayersRefused,
                block: Block::Dense,
            },
        ),
        (
            ModelFamily::Gemma2,
            FamilySpec {
                architecture: "Gemma2ForCausalLM",
                model_type: "gemma2",
                qkv_bias: Attention,
                o_bias: Attention,
                mlp_bias: false,
                qk_norm: false,
                window: Window::OwnLayers,
                block: Block::Gemma,
            },
        ),
        (
            ModelFamily::Gemma3,
            FamilySpec {
                architecture: "Gemma3ForCausalLM",
                model_type: "gemma3_text",
                qkv_bias: Attention,
                o_bias: Attention,
                mlp_bias: false,
                qk_norm: true,
                window: Window::OwnLayers,
                block: Block::Gemma,
            },
        ),
        (
            ModelFamily::Mixtral,
            FamilySpec {
                architecture: "MixtralForCausalLM",
                model_type: "mixtral",
                qkv_bias: Never,
                o_bias: Never,
                mlp_bias: false,
                qk_norm: false,
                window: Window::Every,
                block: Block::Moe,
            },
        ),
        (
            ModelFamily::Qwen3Moe,
            FamilySpec {
                architecture: "Qwen3MoeForCausalLM",
                model_type: "qwen3_moe",
                qkv_bias: Attention,
                o_bias: Attention,
                mlp_bias: false,
                qk_norm: true,
                window: Window::SomeLayersRefused,
                block: Block::Moe,
            },
        ),
        (
            ModelFamily::Qwen2Moe,
            FamilySpec {
                architecture: "Qwen2MoeForCausalLM",
                model_type: "qwen2_moe",
                qkv_bias: Flag("qkv_bias"),
                o_bias: Never,
                mlp_bias: false,
                qk_norm: false,
                window: Window::SomeLayersRefused,
                block: Block::Moe,
            },
        ),
    ]
};

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

    /// The family's row of [`FAMILIES`].
    pub const fn spec(self) -> FamilySpec {
        FAMILIES[self as usize].1
    }

    /// The `architectures` entry of its checkpoints.
    pub fn architecture(self) -> &'static str {
        self.spec().architecture
    }

    /// Its `model_type`.
    pub fn model_type(self) -> &'static str {
        self.spec().model_type
    }

    /// Mixtral, Qwen3-MoE or Qwen2-MoE.
    pub fn is_moe(self) -> bool {
        self.spec().block == Block::Moe
    }

    /// Gemma 2 or 3.
    pub fn is_gemma(self) -> bool {
        self.spec().block == Block::Gemma
    }
}

impl fmt::Display for ModelFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_its_own_row_in_variant_order() {
        for (i, family) in ModelFamily::ALL.into_iter().enumerate() {
            assert_eq!(FAMILIES[i].0, family, "row {i}");
            assert_eq!(family as usize, i, "{family:?}");
        }
    }
}
