//! `--weight-dtype q8_0` against the same model in bf16 (the checkpoint's own weights, the exact
//! f32 compute): on each fixture of `tests/fixtures/hf`, every position of each reference
//! sequence (prompt + transformers' greedy continuation, teacher-forced), the mean and largest
//! |Δ logit| and how often the two models' argmax agree, within bounds measured here (the
//! numbers are in docs/MODELS.md). And the mode's contract: every kernel path this CPU supports
//! (each in its own process) gives the same bits, and a sequence's logits do not depend on the
//! batch it is in. `DPSERVE_TEST_Q8_MODEL=DIR` runs the same comparison on a real checkpoint.

mod common;
// The fixtures' f32 references are hf_parity's; this test reads their checkpoints and prompts.
#[allow(dead_code)]
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use hf_fixture::fixtures;
use kernels::WeightDtype;
use model::{KvBuffers, LlamaModel, LoadDtype, SeqInput};

const CHILD: &str = "DPSERVE_Q8_QUALITY_TEST_CHILD";

/// Bounds on a fixture (random weights of std ≈ 0.02–0.1, 2–4 layers).
const MAX_MEAN_DIFF: f64 = 0.06;
const MIN_ARGMAX_AGREEMENT: f64 = 0.8;

/// Every position's logits of `seq` (one prefill), `[len, vocab]` flattened.
fn all_logits(m: &LlamaModel, seq: &[u32]) -> Vec<f32> {
    let vocab = m.config().vocab_size;
    let mut out = Vec::with_capacity(seq.len() * vocab);
    let mut kv = KvBuffers::new(m.config(), seq.len());
    let slots: Vec<u32> = (0..seq.len() as u32).collect();
    for p in 0..seq.len() {
        let logits = m
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &seq[p..p + 1],
                    start_pos: p,
                    slots: &slots[..p + 1],
                }],
            )
            .expect("forward");
        out.extend(logits);
    }
    out
}

/// (mean |Δ|, max |Δ|, argmax agreement) of the two models over `seqs`.
fn compare(a: &LlamaModel, b: &LlamaModel, seqs: &[Vec<u32>]) -> (f64, f32, f64) {
    let vocab = a.config().vocab_size;
    let (mut sum, mut n, mut worst, mut agree, mut rows) = (0f64, 0usize, 0f32, 0usize, 0usize);
    for s in seqs {
        let (la, lb) = (all_logits(a, s), all_logits(b, s));
        for (ra, rb) in la.chunks(vocab).zip(lb.chunks(vocab)) {
            for (x, y) in ra.iter().zip(rb) {
                let d = (x - y).abs();
                sum += d as f64;
                worst = worst.max(d);
            }
            n += vocab;
            rows += 1;
            agree += usize::from(kernels::argmax(ra) == kernels::argmax(rb));
        }
    }
    (sum / n as f64, worst, agree as f64 / rows as f64)
}

/// Q8_0 panels in this host's packed weight file (`--weight-cache`), written by the first load
/// and mapped by the second: the logits of the matrices quantized in memory, bit for bit.
fn check_weight_cache(dir: &std::path::Path, name: &str, own: &LlamaModel, seq: &[u32]) {
    let cache = tempfile::tempdir().unwrap();
    let want: Vec<u32> = all_logits(own, seq).iter().map(|v| v.to_bits()).collect();
    for load in ["writes", "maps"] {
        let shared = LlamaModel::load_hf_shared(dir, LoadDtype::Q8_0, Some(cache.path()))
            .expect("load q8_0 with a weight cache");
        assert!(shared.weights_shared(), "{name}: the load that {load}");
        assert_eq!(shared.matrix_dtype(), WeightDtype::Q8_0);
        let got: Vec<u32> = all_logits(&shared, seq)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert!(
            got == want,
            "{name}: the load that {load} gives other logits"
        );
    }
}

fn check_all() {
    let path = kernels::kernel_path();
    for fx in fixtures() {
        let bf16 = LlamaModel::load_hf(&fx.dir).expect("load");
        let q8 = LlamaModel::load_hf_as(&fx.dir, LoadDtype::Q8_0).expect("load as q8_0");
        assert_eq!(q8.matrix_dtype(), WeightDtype::Q8_0);
        let seqs: Vec<Vec<u32>> = fx.seqs.iter().map(|s| s.tokens()).collect();
        common::assert_batch_invariant(&fx.name, &q8, &seqs);
        check_weight_cache(&fx.dir, &fx.name, &q8, &seqs[0]);
        let (mean, worst, agree) = compare(&bf16, &q8, &seqs);
        let digest = common::logits_digest(&all_logits(&q8, &seqs[0]));
        println!(
            "q8_0 quality: {path} {} mean |q8_0 - bf16| = {mean:.5}, max {worst:.4}, argmax \
             agreement {:.1} %, logits digest {digest:016x}",
            fx.name,
            agree * 100.0
        );
        assert!(
            mean <= MAX_MEAN_DIFF,
            "{}: mean |Δ logit| {mean} > {MAX_MEAN_DIFF}",
            fx.name
        );
        assert!(
            agree >= MIN_ARGMAX_AGREEMENT,
            "{}: argmax agreement {agree}",
            fx.name
        );
    }
}

#[test]
fn q8_0_is_close_to_bf16_and_the_same_bits_on_every_path() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let per_path = common::per_path_lines(CHILD, "q8_0 quality: ");
    common::assert_same_last_words(&per_path, "q8_0 logits");
}

#[test]
fn child_check() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    check_all();
}

/// A real checkpoint (`DPSERVE_TEST_Q8_MODEL=DIR`): q8_0 against its bf16 matrices on a few
/// token sequences of its vocabulary, numbers printed for docs/MODELS.md.
#[test]
fn a_real_checkpoint_in_q8_0_against_bf16() {
    let Some(dir) = std::env::var_os("DPSERVE_TEST_Q8_MODEL") else {
        eprintln!("skipped: set DPSERVE_TEST_Q8_MODEL to a checkpoint directory");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let bf16 = LlamaModel::load_hf_as(&dir, LoadDtype::Bf16).expect("load as bf16");
    let q8 = LlamaModel::load_hf_as(&dir, LoadDtype::Q8_0).expect("load as q8_0");
    let vocab = bf16.config().vocab_size as u64;
    // Greedy continuations of the bf16 model from a few fixed token prompts, then both models
    // over them (teacher-forced).
    let seqs: Vec<Vec<u32>> = (0..4u64)
        .map(|s| {
            let mut toks: Vec<u32> = (0..8)
                .map(|i| ((s * 7919 + i * 104729) % vocab) as u32)
                .collect();
            for _ in 0..24 {
                let l = all_logits(&bf16, &toks);
                toks.push(kernels::argmax(&l[l.len() - vocab as usize..]) as u32);
            }
            toks
        })
        .collect();
    let (mean, worst, agree) = compare(&bf16, &q8, &seqs);
    eprintln!(
        "q8_0 quality: {} {}: mean |q8_0 - bf16| = {mean:.4}, max {worst:.3}, argmax agreement \
         {:.1} % ({} positions), weights {:.1} MiB against {:.1}",
        kernels::kernel_path(),
        dir.display(),
        agree * 100.0,
        seqs.iter().map(Vec::len).sum::<usize>(),
        q8.weight_bytes() as f64 / (1 << 20) as f64,
        bf16.weight_bytes() as f64 / (1 << 20) as f64
    );
    assert!(agree >= 0.8, "argmax agreement {agree}");
    // 34 bytes per 32 weights against 64 (the padding of windows of 64 is small here).
    assert!(q8.weight_bytes() * 10 < bf16.weight_bytes() * 6);
}
