//! Facts about the built-in model (`--load-format dummy`) that the tokenizer and the worker
//! must agree on without reading any file: its id, vocabulary size and special tokens.

/// Model id reported by `/v1/models` and in `Hello` when no `--model-path` is given.
pub const MODEL_ID: &str = "dpserve-builtin";
/// Vocabulary size of the built-in word-level tokenizer and of the built-in model.
pub const VOCAB_SIZE: usize = 8192;
/// Unknown-word token.
pub const UNK_ID: u32 = 0;
/// Beginning-of-sequence token, prepended to every prompt.
pub const BOS_ID: u32 = 1;
/// End-of-sequence token.
pub const EOS_ID: u32 = 2;
/// Context length of the built-in model.
pub const CONTEXT_LEN: usize = 8192;
