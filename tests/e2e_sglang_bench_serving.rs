//! Runs `tests/python/e2e_sglang_bench_serving.py` (SGLang's own benchmark client,
//! `python -m sglang.bench_serving` from the `sglang` package, against a real `dpserve up`) from
//! `cargo test`, so the README's one test command covers it. Skips with a message when the
//! pinned package is not installed
//! (`pip install --no-deps -r tests/python/requirements-sglang-bench.txt`).
//!
//! bench_serving makes its prompts from, and retokenizes the output with, a Hugging Face
//! tokenizer; the built-in model has no tokenizer files, so this test writes its word-level
//! tokenizer as one (see [`write_builtin_tokenizer`]).

use std::path::Path;
use std::process::Command;

use serde_json::{json, Map, Value};
use tokenizer_actor::tokenizer::BuiltinTokenizer;

/// The built-in tokenizer as `tokenizer.json` and `tokenizer_config.json` in `dir`: the same
/// vocabulary, split on whitespace, a `<s>` in front (dpserve counts it in `prompt_tokens`),
/// and decoded by joining with spaces, as dpserve decodes. It reads the text dpserve writes
/// (words and punctuation apart) exactly as dpserve does, so a retokenized output has as many
/// tokens as were generated.
fn write_builtin_tokenizer(dir: &Path) {
    let words = BuiltinTokenizer::new().vocab().to_vec();
    let vocab: Map<String, Value> = words
        .iter()
        .enumerate()
        .map(|(id, w)| (w.clone(), json!(id)))
        .collect();
    let special = |id: u32| {
        json!({"id": id, "content": words[id as usize], "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let (unk, bos, eos) = (
        protocol::builtin::UNK_ID,
        protocol::builtin::BOS_ID,
        protocol::builtin::EOS_ID,
    );
    let bos_text = &words[bos as usize];
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(unk), special(bos), special(eos)],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos_text, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos_text, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos_text: {"id": bos_text, "ids": [bos], "tokens": [bos_text]}},
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": words[unk as usize]},
    });
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_text,
        "eos_token": words[eos as usize],
        "unk_token": words[unk as usize],
        // " ." stays " .": dpserve writes punctuation apart from words.
        "clean_up_tokenization_spaces": false,
        "model_max_length": protocol::builtin::CONTEXT_LEN,
    });
    for (name, value) in [
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", config),
    ] {
        std::fs::write(dir.join(name), value.to_string()).expect("write the tokenizer");
    }
}

#[test]
fn sglang_bench_serving_against_a_real_cluster() {
    let probe = Command::new("python3")
        .args([
            "-c",
            "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)",
        ])
        .status();
    if !matches!(probe, Ok(s) if s.success()) {
        eprintln!(
            "skipping: the sglang Python package is not installed \
             (pip install --no-deps -r tests/python/requirements-sglang-bench.txt)"
        );
        return;
    }
    let tokenizer = tempfile::tempdir().expect("temp dir");
    write_builtin_tokenizer(tokenizer.path());
    let out = Command::new("python3")
        .args(["tests/python/e2e_sglang_bench_serving.py", "-v"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("DPSERVE_BIN", env!("CARGO_BIN_EXE_dpserve"))
        .env("BUILTIN_TOKENIZER_DIR", tokenizer.path())
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sglang bench_serving tests failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{stderr}");
}
