//! Loading a Hugging Face model directory: `tokenizer.json` through the `tokenizers` crate, and
//! the few `config.json` / `tokenizer_config.json` facts the HTTP layer validates against.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use super::{LoadedTokenizer, ModelFacts, TextTokenizer};
use crate::error::{Result, TokenizerError};

/// Used only when neither config names a context length; small enough to be safe for the
/// Llama-family models this serves.
const FALLBACK_CONTEXT_LEN: usize = 2048;
/// `tokenizer_config.json` says this when it has no real limit.
const HF_UNLIMITED_MAX_LENGTH: f64 = 1e29;

/// A `tokenizer.json` tokenizer.
pub struct HfTokenizer {
    inner: Tokenizer,
}

impl TextTokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| TokenizerError::Encode {
                reason: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| TokenizerError::Decode {
                reason: e.to_string(),
            })
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let bad = |reason: String| TokenizerError::ConfigFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("malformed JSON: {e}")))
}

/// `eos_token_id` may be one id or a list of them.
fn eos_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|id| id as u32).into_iter().collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|id| id as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Load `dir/tokenizer.json`, `dir/config.json` and, if present, `dir/tokenizer_config.json`
/// and `dir/generation_config.json` (which often lists extra EOS ids, e.g. Llama 3 instruct).
pub fn load(dir: &Path) -> Result<LoadedTokenizer> {
    let tok_path = dir.join("tokenizer.json");
    let inner = Tokenizer::from_file(&tok_path).map_err(|e| TokenizerError::TokenizerFile {
        path: tok_path.clone(),
        reason: e.to_string(),
    })?;

    let config = read_json(&dir.join("config.json"))?;
    let optional = |name: &str| -> Result<Option<Value>> {
        let path: PathBuf = dir.join(name);
        if path.exists() {
            read_json(&path).map(Some)
        } else {
            Ok(None)
        }
    };
    let tok_config = optional("tokenizer_config.json")?;
    let gen_config = optional("generation_config.json")?;

    let vocab_size = config
        .get("vocab_size")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .unwrap_or_else(|| inner.get_vocab_size(true));

    let context_len = config
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .or_else(|| {
            tok_config
                .as_ref()
                .and_then(|c| c.get("model_max_length"))
                .and_then(Value::as_f64)
                .filter(|&v| v > 0.0 && v < HF_UNLIMITED_MAX_LENGTH)
                .map(|v| v as usize)
        })
        .unwrap_or(FALLBACK_CONTEXT_LEN);

    let mut eos_token_ids = eos_ids(config.get("eos_token_id"));
    if let Some(gen) = &gen_config {
        eos_token_ids.extend(eos_ids(gen.get("eos_token_id")));
    }
    if let Some(name) = tok_config
        .as_ref()
        .and_then(|c| c.get("eos_token"))
        .and_then(Value::as_str)
    {
        eos_token_ids.extend(inner.token_to_id(name));
    }
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();
    let special = |name: &str| {
        tok_config
            .as_ref()
            .and_then(|c| super::config::special_token(c, name))
    };

    let bos_token_id = special("bos_token").and_then(|t| inner.token_to_id(&t));
    Ok(LoadedTokenizer {
        tokenizer: Box::new(HfTokenizer { inner }),
        facts: ModelFacts {
            model_path: Some(dir.to_path_buf()),
            vocab_size,
            context_len,
            eos_token_ids,
            chat_template: tok_config.as_ref().and_then(super::config::template_of),
            bos_token: special("bos_token"),
            bos_token_id,
            eos_token: special("eos_token"),
        },
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The stories260k model shipped in the shared directory, if this checkout has it.
    pub(crate) fn stories260k() -> Option<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/stories260k");
        if dir.join("tokenizer.json").exists() {
            Some(dir)
        } else {
            eprintln!("skipping: {} not found", dir.display());
            None
        }
    }

    const GOLDEN_OUTPUT: [u32; 32] = [
        432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
        419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394,
    ];
    const GOLDEN_TEXT: &str = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw";

    #[test]
    fn stories260k_matches_golden() {
        let Some(dir) = stories260k() else { return };
        let loaded = load(&dir).unwrap();
        let ids = loaded.tokenizer.encode("Once upon a time").unwrap();
        assert_eq!(ids, vec![1, 403, 407, 261, 378]);
        assert_eq!(
            loaded.tokenizer.decode(&GOLDEN_OUTPUT).unwrap(),
            GOLDEN_TEXT
        );
        assert_eq!(loaded.facts.vocab_size, 512);
        assert_eq!(loaded.facts.context_len, 512);
        assert_eq!(loaded.facts.eos_token_ids, vec![2]);
    }

    #[test]
    fn golden_file_agrees() {
        let Some(dir) = stories260k() else { return };
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap())
                .unwrap();
        assert_eq!(golden["greedy_text"], GOLDEN_TEXT);
    }

    #[test]
    fn missing_or_malformed_files_name_the_file() {
        let dir = std::env::temp_dir().join(format!("dpserve-tok-hf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = load(&dir).err().unwrap().to_string();
        assert!(err.contains("tokenizer.json"), "{err}");

        if let Some(src) = stories260k() {
            std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
            let err = load(&dir).err().unwrap().to_string();
            assert!(err.contains("config.json"), "{err}");
            std::fs::write(dir.join("config.json"), "{not json").unwrap();
            let err = load(&dir).err().unwrap().to_string();
            assert!(
                err.contains("config.json") && err.contains("malformed"),
                "{err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
