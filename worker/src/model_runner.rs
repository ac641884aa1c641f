//! What a scheduler step runs: the real Llama model on the CPU, or a simulated GPU's cost model
//! (`--device sim`). The scheduler sees only this seam (the model's configuration, a KV pool
//! of the right kind, logits or hidden states per sequence) and never asks which one it has.

use crate::model::{KvBuffers, LlamaModel, ModelConfig, Result, SeqInput};
use crate::sim::{SimModel, SimProfile};

#[derive(Debug)]
pub enum ModelRunner {
    Llama(LlamaModel),
    Sim(SimModel),
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
            ModelRunner::Sim(m) => m.config(),
        }
    }

    /// The KV storage for a pool of `num_slots` token slots: real buffers for the model, none
    /// for a simulated rank (its slots are bookkeeping only).
    pub fn kv_buffers(&self, num_slots: usize) -> KvBuffers {
        match self {
            ModelRunner::Llama(m) => KvBuffers::new(m.config(), num_slots),
            ModelRunner::Sim(_) => KvBuffers::empty(num_slots),
        }
    }

    /// One batched step: the logits of each sequence's last new token, `[seqs.len(), vocab]`.
    pub fn forward(&self, kv: &mut KvBuffers, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        match self {
            ModelRunner::Llama(m) => m.forward(kv, seqs),
            ModelRunner::Sim(m) => Ok(m.forward(seqs)),
        }
    }

    /// The same step, returning each sequence's final hidden state, `[seqs.len(), hidden]`.
    pub fn forward_hidden(&self, kv: &mut KvBuffers, seqs: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        match self {
            ModelRunner::Llama(m) => m.forward_hidden(kv, seqs),
            ModelRunner::Sim(m) => Ok(m.forward_hidden(seqs)),
        }
    }

    /// The simulated GPU's profile; `None` for the real model.
    pub fn simulated(&self) -> Option<&SimProfile> {
        match self {
            ModelRunner::Llama(_) => None,
            ModelRunner::Sim(m) => Some(m.profile()),
        }
    }
}
