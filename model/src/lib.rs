//! The Llama-family model (Llama 1–3.3 with their RoPE scaling, Mistral with its sliding window,
//! Qwen2/2.5 with q/k/v biases, Qwen3 with its q/k norm, Gemma 2 and 3 (text) with their block,
//! `gemma.rs`; Mixtral and Qwen3-MoE with their experts, `moe.rs`; `support.rs` refuses anything
//! else):
//! configuration, Hugging Face loading, seeded dummy weights, the batch plan of a step and its
//! forward pass over a KV slot pool, on the CPU (`forward.rs`) and on an NVIDIA GPU (`cuda.rs`,
//! the `cuda` feature). Scheduling, slot allocation and sampling are the worker's (which
//! re-exports this crate as `worker::model`).

mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod elems;
mod error;
mod family;
mod fields;
mod forward;
mod gemma;
mod kv;
mod loader;
mod moe;
mod packed_file;
mod plan;
mod rope;
mod rope_config;
mod support;
mod weights;

/// Checkpoints of dummy weights in Hugging Face's layout, for tests (the `fixtures` feature
/// gives the worker's tests the bad checkpoints its start-up refuses).
#[cfg(any(test, feature = "fixtures"))]
#[doc(hidden)]
pub mod fixtures;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use config::{BuiltinSize, ModelConfig};
pub use elems::LoadDtype;
pub use error::{ModelError, Result};
pub use family::ModelFamily;
pub use gemma::GemmaOptions;
pub use kernels::cuda::CudaDtype;
pub use kv::KvBuffers;
pub use moe::MoeOptions;
pub use plan::BatchPlan;
pub use rope::RopeScaling;

use weights::Weights;

/// One sequence's part of a step. `slots[p]` is the KV slot of position `p`, for every position
/// `0..start_pos + new_tokens.len()`; `slots[..start_pos]` already hold K/V (prefix cache or
/// earlier chunks/steps) and the new tokens' K/V are written to the rest.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub new_tokens: &'a [u32],
    pub start_pos: usize,
    pub slots: &'a [u32],
}

/// A loaded (or dummy) model: configuration plus weights (matrices in f32, bf16 or f16).
pub struct LlamaModel {
    config: ModelConfig,
    weights: Weights,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Weights are millions of floats; the configuration identifies the model.
        f.debug_struct("LlamaModel")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LlamaModel {
    /// Loads `dir/config.json` (+ `generation_config.json`) and every weight from its
    /// safetensors files (single or sharded; F32, F16 or BF16), each matrix kept in its
    /// stored type ([`LoadDtype::Auto`]).
    pub fn load_hf(dir: &Path) -> Result<Self> {
        Self::load_hf_as(dir, LoadDtype::Auto)
    }

    /// [`Self::load_hf`] with the weight matrices in the type `dtype` resolves.
    pub fn load_hf_as(dir: &Path, dtype: LoadDtype) -> Result<Self> {
        Self::load_hf_shared(dir, dtype, None)
    }

    /// [`Self::load_hf_as`], the weight matrices viewed in this host's packed weight file of
    /// the checkpoint in `cache` (`--weight-cache`; written first when there is none), so the
    /// ranks of a host share one copy; `None`: packed in this process.
    pub fn load_hf_shared(dir: &Path, dtype: LoadDtype, cache: Option<&Path>) -> Result<Self> {
        let config = ModelConfig::from_hf_dir(dir)?;
        let weights = loader::load_weights(dir, &config, dtype, cache)?;
        Ok(LlamaModel { config, weights })
    }

    /// Whether the weight matrices are viewed in a mapped packed weight file.
    pub fn weights_shared(&self) -> bool {
        self.weights.embed.is_shared()
    }

    /// Seeded random weights for `config` (deterministic for a seed).
    pub fn dummy(config: ModelConfig, seed: u64) -> Self {
        let weights = Weights::dummy(&config, seed);
        LlamaModel { config, weights }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// This model as if loaded from a checkpoint stored in `dtype`: every weight rounded to it
    /// (to nearest even). For checking the 16-bit GPU paths against the CPU on the same values.
    pub fn rounded_to(mut self, dtype: CudaDtype) -> Self {
        self.weights.round_to(dtype);
        self
    }

    /// How the checkpoint stored its weights (f32 for dummy weights). The CPU computes in f32
    /// whatever it is; the GPU keeps weights and KV in this type.
    pub fn stored_dtype(&self) -> CudaDtype {
        self.weights.dtype
    }

    /// The type the CPU holds the weight matrices in (that of the embedding table; see
    /// [`LoadDtype`]).
    pub fn matrix_dtype(&self) -> kernels::WeightDtype {
        self.weights.embed.dtype()
    }

    /// [`Self::matrix_dtype`] as the start line names it: with Q8_0, the integer dot product
    /// `path` runs (`q8_0 (vpdpbusd)`, `q8_0 (vpmaddubsw)`, `q8_0 (sdot)`, …).
    pub fn matrix_dtype_name(&self, path: kernels::KernelPath) -> String {
        match self.matrix_dtype() {
            kernels::WeightDtype::Q8_0 => format!("q8_0 ({})", kernels::IntDot::of(path).name()),
            other => other.to_string(),
        }
    }

    /// Makes the linear layers compute in `compute` (`--compute-dtype`). For bf16 every
    /// parameter is rounded to bf16 (to nearest even), as transformers loads a model with
    /// `torch_dtype=bfloat16`: norms and biases here, the matrices by the loader.
    ///
    /// # Panics
    /// For bf16, if a matrix is not held in bf16 (load with [`LoadDtype::Bf16`]).
    pub fn set_compute_dtype(&mut self, compute: kernels::ComputeDtype) {
        if compute == kernels::ComputeDtype::Bf16 {
            self.weights.for_each_vector(|v| {
                v.iter_mut()
                    .for_each(|x| *x = half::bf16::from_f32(*x).to_f32())
            });
        }
        self.weights.for_each_matrix(|m| m.set_compute(compute));
    }

    /// What the linear layers compute in.
    pub fn compute_dtype(&self) -> kernels::ComputeDtype {
        self.weights.embed.compute()
    }

    /// [`Self::compute_dtype`] as the start line names it: `f32`, or `bf16` with how the pair
    /// products run on `path` (`vdpbf16ps`, or `emulated`).
    pub fn compute_dtype_name(&self, path: kernels::KernelPath) -> String {
        match self.compute_dtype() {
            kernels::ComputeDtype::F32 => "f32".into(),
            kernels::ComputeDtype::Bf16 => match kernels::Bf16Dot::best(path) {
                kernels::Bf16Dot::Instruction => "bf16 (vdpbf16ps)".into(),
                kernels::Bf16Dot::Emulated => "bf16 (emulated: slower than f32)".into(),
            },
        }
    }

    /// Bytes the weights take in memory (packed matrices with their padding, and the f32
    /// vectors).
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// One batched step: writes the new tokens' K/V to their slots and returns the logits of
    /// each sequence's last new token, row-major `[seqs.len(), vocab_size]`.
    pub fn forward(&self, kv: &mut KvBuffers, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        self.forward_plan(kv, &BatchPlan::new(&self.config, kv.num_slots(), seqs)?)
    }

    /// The same pass, returning the final-normed hidden state of each sequence's last new token,
    /// `[seqs.len(), hidden_size]`.
    pub fn forward_hidden(&self, kv: &mut KvBuffers, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        self.forward_hidden_plan(kv, &BatchPlan::new(&self.config, kv.num_slots(), seqs)?)
    }

    /// [`Self::forward`] of a checked plan.
    pub fn forward_plan(&self, kv: &mut KvBuffers, plan: &BatchPlan<'_>) -> Result<Vec<f32>> {
        let mut run = move || {
            let hidden = forward::hidden_last(&self.config, &self.weights, kv, plan)?;
            Ok(forward::logits(&self.config, &self.weights, &hidden))
        };
        // A decode step is ~120 small GEMMs: the pool's threads spin between them instead of
        // being woken for each (kernels::team); a prefill's few large ones keep rayon's pool.
        if plan.tokens() == plan.seqs() {
            kernels::team::with_team(run)
        } else {
            run()
        }
    }

    /// [`Self::forward_hidden`] of a checked plan.
    pub fn forward_hidden_plan(
        &self,
        kv: &mut KvBuffers,
        plan: &BatchPlan<'_>,
    ) -> Result<Vec<f32>> {
        forward::hidden_last(&self.config, &self.weights, kv, plan)
    }
}
