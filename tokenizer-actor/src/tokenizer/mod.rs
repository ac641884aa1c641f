//! Text ↔ token ids: one trait with two implementations, the Hugging Face `tokenizer.json` of a
//! model directory and the built-in word-level tokenizer of the dummy model. Incremental
//! detokenization of a stream lives in `detokenize`, not here.

mod builtin;
pub mod config;
mod hf;

use std::path::PathBuf;

pub use builtin::BuiltinTokenizer;
pub use hf::HfTokenizer;

use crate::error::Result;

/// Encode and decode as the model expects. Implementations are shared by every HTTP worker
/// thread, hence `Send + Sync`.
pub trait TextTokenizer: Send + Sync {
    /// Token ids of `text`, with the special tokens the model wants (BOS) added.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Text of `ids`, skipping special tokens (what SGLang does by default).
    fn decode(&self, ids: &[u32]) -> Result<String>;
}

/// What the HTTP layer needs to know about the model besides its tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// `None` for the built-in model.
    pub model_path: Option<PathBuf>,
    /// Ids at or above this are rejected.
    pub vocab_size: usize,
    /// Prompt plus generated tokens must fit.
    pub context_len: usize,
    /// Ids that end generation unless `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// `tokenizer_config.json` `chat_template`, if the model has one.
    pub chat_template: Option<String>,
    /// Special tokens as text, for chat templates (`{{ bos_token }}`).
    pub bos_token: Option<String>,
    /// Id of `bos_token`, to drop the second BOS when a template writes one and encoding adds one.
    pub bos_token_id: Option<u32>,
    pub eos_token: Option<String>,
}

/// A tokenizer together with the facts of its model.
pub struct LoadedTokenizer {
    pub tokenizer: Box<dyn TextTokenizer>,
    pub facts: ModelFacts,
}

impl LoadedTokenizer {
    /// The tokenizer of `model_path`, or the built-in one when there is none.
    pub fn load(model_path: Option<&std::path::Path>) -> Result<Self> {
        match model_path {
            Some(dir) => hf::load(dir),
            None => Ok(LoadedTokenizer {
                tokenizer: Box::new(BuiltinTokenizer::new()),
                facts: BuiltinTokenizer::facts(),
            }),
        }
    }
}

/// The stories260k model directory, when this checkout has it; tests skip without it.
#[cfg(test)]
pub(crate) fn hf_test_dir() -> Option<PathBuf> {
    hf::tests::stories260k()
}
