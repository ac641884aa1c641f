//! What a scheduler step runs: the real Llama model on the CPU or on an NVIDIA GPU
//! (`--device cuda:N`), or a simulated GPU's cost model (`--device sim`). The scheduler sees only
//! this seam (the model's configuration, a KV pool of the right kind, logits or hidden states
//! per sequence) and never asks which one it has. A real model's step is one [`BatchPlan`],
//! checked once here and executed by whichever device holds the model.

#[cfg(feature = "cuda")]
use crate::model::cuda::CudaLlama;
use crate::model::{BatchPlan, KvBuffers, LlamaModel, ModelConfig, Result, SeqInput};
use crate::sim::{SimModel, SimProfile};

#[derive(Debug)]
pub enum ModelRunner {
    Llama(LlamaModel),
    /// Weights and KV pool on the GPU; the scheduler's `KvBuffers` only count its slots.
    #[cfg(feature = "cuda")]
    Cuda(Box<CudaLlama>),
    Sim(SimModel),
}

#[cfg(feature = "cuda")]
impl From<CudaLlama> for ModelRunner {
    fn from(model: CudaLlama) -> Self {
        ModelRunner::Cuda(Box::new(model))
    }
}

impl From<LlamaModel> for ModelRunner {
    fn from(model: LlamaModel) -> Self {
        ModelRunner::Llama(model)
    }
}

impl From<SimModel> for ModelRunner {
    fn from(model: SimModel) -> Self {
        ModelRunner::Sim(model)
    }
}

impl ModelRunner {
    /// Vocabulary, hidden size, special tokens, context length, model id.
    pub fn config(&self) -> &ModelConfig {
        match self {
            ModelRunner::Llama(m) => m.config(),
            #[cfg(feature = "cuda")]
            ModelRunner::Cuda(m) => m.config(),
            ModelRunner::Sim(m) => m.config(),
        }
    }

    /// The KV storage for a pool of `num_slots` token slots: real buffers for the model on the
    /// CPU; none for a GPU (its pool is on the GPU, allocated at start) or a simulated rank
    /// (its slots are bookkeeping only).
    pub fn kv_buffers(&self, num_slots: usize) -> KvBuffers {
        match self {
            ModelRunner::Llama(m) => KvBuffers::new(m.config(), num_slots),
            #[cfg(feature = "cuda")]
            ModelRunner::Cuda(_) => KvBuffers::empty(num_slots),
            ModelRunner::Sim(_) => KvBuffers::empty(num_slots),
        }
    }

    /// One batched step: the logits of each sequence's last new token, `[seqs.len(), vocab]`.
    pub fn forward(&self, kv: &mut KvBuffers, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        match self {
            ModelRunner::Llama(m) => m.forward_plan(kv, &plan(m.config(), kv, seqs)?),
            #[cfg(feature = "cuda")]
            ModelRunner::Cuda(m) => m.forward(&plan(m.config(), kv, seqs)?),
            ModelRunner::Sim(m) => Ok(m.forward(seqs)),
        }
    }

    /// The same step, returning each sequence's final hidden state, `[seqs.len(), hidden]`.
    pub fn forward_hidden(&self, kv: &mut KvBuffers, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        match self {
            ModelRunner::Llama(m) => m.forward_hidden_plan(kv, &plan(m.config(), kv, seqs)?),
            #[cfg(feature = "cuda")]
            ModelRunner::Cuda(m) => m.forward_hidden(&plan(m.config(), kv, seqs)?),
            ModelRunner::Sim(m) => Ok(m.forward_hidden(seqs)),
        }
    }

    /// The GPU this rank's model runs on; `None` on the CPU or a simulated rank.
    pub fn gpu(&self) -> Option<&kernels::cuda::DeviceInfo> {
        match self {
            #[cfg(feature = "cuda")]
            ModelRunner::Cuda(m) => Some(m.gpu()),
            _ => None,
        }
    }

    /// The simulated GPU's profile; `None` for the real model.
    pub fn simulated(&self) -> Option<&SimProfile> {
        match self {
            ModelRunner::Sim(m) => Some(m.profile()),
            _ => None,
        }
    }
}

/// The checked plan of `seqs` over the pool `kv` counts.
fn plan<'a>(cfg: &ModelConfig, kv: &KvBuffers, seqs: &[SeqInput<'a>]) -> Result<BatchPlan<'a>> {
    BatchPlan::new(cfg, kv.num_slots(), seqs)
}
