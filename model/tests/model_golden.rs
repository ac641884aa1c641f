//! Golden test of the CPU model against the real stories260k checkpoint (llama2.c TinyStories,
//! HF format) in `../shared/models/stories260k`: greedy ids must match `golden.json` exactly,
//! and logits must be bit-identical across prefill, chunked prefill, single steps and batching.

use std::path::{Path, PathBuf};

use model::{KvBuffers, LlamaModel, SeqInput};

fn model_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/stories260k");
    if dir.join("config.json").exists() {
        Some(dir)
    } else {
        eprintln!("skipping: ../shared/models/stories260k not found");
        None
    }
}

struct Golden {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
}

fn golden(dir: &Path) -> Golden {
    let text = std::fs::read_to_string(dir.join("golden.json")).expect("golden.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden.json parses");
    let ids = |k: &str| -> Vec<u32> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("golden.json: {k}"))
            .iter()
            .map(|x| x.as_u64().expect("token id") as u32)
            .collect()
    };
    Golden {
        prompt: ids("prompt_token_ids"),
        greedy: ids("greedy_token_ids"),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Scattered, non-monotonic slots so the test also covers slot indirection.
fn slots(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + 3) % 211).collect()
}

#[test]
fn stories260k_greedy_matches_golden() {
    let Some(dir) = model_dir() else { return };
    let g = golden(&dir);
    let model = LlamaModel::load_hf(&dir).expect("load stories260k");
    assert_eq!(model.config().vocab_size, 512);
    assert_eq!(model.config().eos_token_ids, vec![2]);
    let total = g.prompt.len() + g.greedy.len();
    let sl = slots(total);
    let mut kv = KvBuffers::new(model.config(), 211);
    let mut toks = g.prompt.clone();
    let mut logits = model
        .forward(
            &mut kv,
            &[SeqInput {
                new_tokens: &toks,
                start_pos: 0,
                slots: &sl[..toks.len()],
            }],
        )
        .expect("prefill");
    let mut out = Vec::new();
    while out.len() < g.greedy.len() {
        let next = kernels::argmax(&logits) as u32;
        out.push(next);
        toks.push(next);
        let p = toks.len() - 1;
        logits = model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &toks[p..],
                    start_pos: p,
                    slots: &sl[..=p],
                }],
            )
            .expect("decode");
    }
    assert_eq!(out, g.greedy);
}

#[test]
fn stories260k_logits_bit_identical_across_chunking_and_batching() {
    let Some(dir) = model_dir() else { return };
    let g = golden(&dir);
    let model = LlamaModel::load_hf(&dir).expect("load stories260k");
    // The prompt plus the first golden tokens: 13 tokens, so chunks of 2 end on a partial one.
    let seq: Vec<u32> = g.prompt.iter().chain(&g.greedy[..8]).copied().collect();
    let n = seq.len();
    let sl = slots(n);
    let vocab = model.config().vocab_size;

    let mut kv = KvBuffers::new(model.config(), 211);
    let whole = model
        .forward(
            &mut kv,
            &[SeqInput {
                new_tokens: &seq,
                start_pos: 0,
                slots: &sl,
            }],
        )
        .expect("whole");

    let mut kv = KvBuffers::new(model.config(), 211);
    let mut chunked = Vec::new();
    for a in (0..n).step_by(2) {
        let b = (a + 2).min(n);
        chunked = model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &seq[a..b],
                    start_pos: a,
                    slots: &sl[..b],
                }],
            )
            .expect("chunk");
    }
    assert_eq!(bits(&whole), bits(&chunked), "chunked prefill differs");

    let mut kv = KvBuffers::new(model.config(), 211);
    let mut stepped = Vec::new();
    for p in 0..n {
        stepped = model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &seq[p..=p],
                    start_pos: p,
                    slots: &sl[..=p],
                }],
            )
            .expect("step");
    }
    assert_eq!(bits(&whole), bits(&stepped), "step-by-step differs");

    // The same request (its last token as a decode step) inside a mixed batch: a fresh prefill of
    // another prompt before it and a decode of a third sequence after it.
    let other_a: Vec<u32> = vec![1, 300, 301, 302, 303, 304, 305];
    let other_b: Vec<u32> = vec![1, 50, 60];
    let sl_a: Vec<u32> = (100..107).collect();
    let sl_b: Vec<u32> = (200..203).collect();
    let mut kv = KvBuffers::new(model.config(), 211);
    model
        .forward(
            &mut kv,
            &[
                SeqInput {
                    new_tokens: &seq[..n - 1],
                    start_pos: 0,
                    slots: &sl[..n - 1],
                },
                SeqInput {
                    new_tokens: &other_b[..2],
                    start_pos: 0,
                    slots: &sl_b[..2],
                },
            ],
        )
        .expect("warm-up batch");
    let batch = model
        .forward(
            &mut kv,
            &[
                SeqInput {
                    new_tokens: &other_a,
                    start_pos: 0,
                    slots: &sl_a,
                },
                SeqInput {
                    new_tokens: &seq[n - 1..],
                    start_pos: n - 1,
                    slots: &sl,
                },
                SeqInput {
                    new_tokens: &other_b[2..],
                    start_pos: 2,
                    slots: &sl_b,
                },
            ],
        )
        .expect("mixed batch");
    assert_eq!(batch.len(), 3 * vocab);
    assert_eq!(
        bits(&whole),
        bits(&batch[vocab..2 * vocab]),
        "batched decode differs"
    );

    // forward_hidden runs the same pass.
    let mut kv = KvBuffers::new(model.config(), 211);
    let hidden = model
        .forward_hidden(
            &mut kv,
            &[SeqInput {
                new_tokens: &seq,
                start_pos: 0,
                slots: &sl,
            }],
        )
        .expect("hidden");
    assert_eq!(hidden.len(), model.config().hidden_size);
}
