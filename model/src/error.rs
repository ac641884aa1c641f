//! Errors of the model: loading a Hugging Face directory and validating a forward batch.

use std::path::{Path, PathBuf};

/// Everything that can go wrong building or running the model. Load errors name the file and
/// the field or tensor, so a bad model directory is a clear startup message.
#[derive(thiserror::Error, Debug)]
pub enum ModelError {
    #[error("missing file {path}")]
    MissingFile { path: PathBuf },
    #[error("cannot read {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("malformed JSON in {path}: {reason}")]
    BadJson { path: PathBuf, reason: String },
    #[error("{file}: missing or invalid field `{field}`")]
    MissingField { file: PathBuf, field: String },
    #[error("{file}: malformed safetensors: {reason}")]
    BadSafetensors { file: PathBuf, reason: String },
    #[error("missing tensor `{name}`{}", file.as_ref().map(|f| format!(" in {}", f.display())).unwrap_or_default())]
    MissingTensor { name: String, file: Option<PathBuf> },
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("tensor `{name}` has unsupported dtype {dtype} (supported: F32, F16, BF16)")]
    UnsupportedDtype { name: String, dtype: String },
    /// A family or option the forward pass does not implement (see `support.rs`).
    #[error("{file}: `{field}` = {value} is not supported ({why})")]
    Unsupported {
        file: PathBuf,
        field: String,
        value: String,
        why: String,
    },
    /// A tensor the configured model does not use: the checkpoint has parts (norms, biases,
    /// experts) its config.json does not account for, so running without them would be wrong.
    #[error("tensor `{name}` is not used by a {family} model as its config.json describes it")]
    UnusedTensor { name: String, family: String },
    #[error("config field `{field}`: {reason}")]
    Config { field: String, reason: String },
    #[error("bad input: {reason}")]
    BadInput { reason: String },
    /// A file of `--weight-cache` that cannot be used as it is (it is written again).
    #[error("packed weight file {path}: {reason}")]
    PackedFile { path: PathBuf, reason: String },
    /// The GPU refused a step (a launch, a copy, cuBLAS): the CUDA backend's own words.
    #[error("GPU: {0}")]
    Gpu(String),
}

impl ModelError {
    /// [`ModelError::Io`] on `path`.
    pub fn io(path: &Path, e: impl std::fmt::Display) -> Self {
        ModelError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    }

    /// Whether the model is well formed but of a kind the code does not implement (a family,
    /// an option, a tensor): the worker refuses to start with it rather than run it wrong.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            ModelError::Unsupported { .. } | ModelError::UnusedTensor { .. }
        )
    }

    /// Whether this is a `--weight-cache` file that does not read back (the loader then
    /// writes it again).
    pub fn is_packed_file(&self) -> bool {
        matches!(self, ModelError::PackedFile { .. })
    }
}

/// Result alias of the model module.
pub type Result<T> = std::result::Result<T, ModelError>;
