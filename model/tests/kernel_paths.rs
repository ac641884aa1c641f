//! Every kernel path this CPU supports computes the same model, bit for bit: the built-in tiny
//! model's logits over a prefill and decode steps, and the stories260k golden (when
//! `../shared/models/stories260k` is there). Each path runs as a worker runs it: in its own
//! process with `DPSERVE_KERNEL_PATH` set, since the path is fixed once per process.

mod common;

use std::path::{Path, PathBuf};

use common::this_binary;
use kernels::{KernelPath, KERNEL_PATH_ENV};
use model::{BuiltinSize, KvBuffers, LlamaModel, ModelConfig, SeqInput};
use protocol::hash::{fnv1a64_extend, FNV1A64_OFFSET};

/// Set in the children this test starts (the child test does nothing without it).
const CHILD: &str = "DPSERVE_KERNEL_PATH_TEST_CHILD";

fn child(path: &str) -> std::process::Output {
    this_binary()
        .args([
            "--exact",
            "child_fingerprint",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env(KERNEL_PATH_ENV, path)
        .output()
        .expect("start child")
}

#[test]
fn every_kernel_path_gives_the_same_logits() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let mut seen = Vec::new();
    for p in KernelPath::all_supported() {
        let out = child(p.name());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{p}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            // libtest may print "test child_fingerprint ... " on the same line first.
            .find_map(|l| l.split_once("fingerprint: ").map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("{p}: no fingerprint in {stdout}"));
        let (path, print) = line.split_once(' ').expect("path and print");
        assert_eq!(path, p.name(), "the child ran another path");
        seen.push((p, print.to_string()));
    }
    eprintln!("fingerprints: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].1 == w[1].1),
        "paths disagree: {seen:?}"
    );
}

#[test]
fn an_unknown_or_unsupported_path_is_refused_by_name() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let out = child("sse9");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"sse9\" is not a kernel path"), "{err}");
    #[cfg(target_arch = "x86_64")]
    {
        let out = child("neon");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not supported by this CPU"), "{err}");
    }
}

/// FNV-1a over the bits of every logit.
fn fold(h: &mut u64, v: &[f32]) {
    for x in v {
        *h = fnv1a64_extend(*h, &x.to_bits().to_le_bytes());
    }
}

/// A prefill of `prompt`, then `steps` greedy decode steps; every logit goes into `h`.
fn run(model: &LlamaModel, prompt: &[u32], steps: usize, h: &mut u64) -> Vec<u32> {
    let total = prompt.len() + steps;
    let slots: Vec<u32> = (0..total as u32).map(|i| (i * 7 + 3) % 257).collect();
    let mut kv = KvBuffers::new(model.config(), 257);
    let mut toks = prompt.to_vec();
    let mut start = 0;
    let mut out = Vec::new();
    loop {
        let logits = model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &toks[start..],
                    start_pos: start,
                    slots: &slots[..toks.len()],
                }],
            )
            .expect("forward");
        fold(h, &logits);
        if out.len() == steps {
            return out;
        }
        let next = kernels::argmax(&logits) as u32;
        out.push(next);
        start = toks.len();
        toks.push(next);
    }
}

fn stories_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/stories260k");
    dir.join("golden.json").exists().then_some(dir)
}

#[test]
fn child_fingerprint() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let path = kernels::kernel_path();
    let mut h = FNV1A64_OFFSET;
    let tiny = LlamaModel::dummy(ModelConfig::builtin(BuiltinSize::Tiny), 7);
    let prompt: Vec<u32> = (0..45).map(|i| (i * 37 + 11) % 500).collect();
    run(&tiny, &prompt, 6, &mut h);
    if let Some(dir) = stories_dir() {
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap())
                .unwrap();
        let ids = |k: &str| -> Vec<u32> {
            golden[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let (prompt, want) = (ids("prompt_token_ids"), ids("greedy_token_ids"));
        let model = LlamaModel::load_hf(&dir).expect("load stories260k");
        let got = run(&model, &prompt, want.len(), &mut h);
        assert_eq!(got, want, "stories260k golden on {path}");
    } else {
        eprintln!("skipping the stories260k part: ../shared/models/stories260k not found");
    }
    println!("fingerprint: {path} {h:016x}");
}
