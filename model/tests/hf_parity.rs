//! The model against Hugging Face transformers: each fixture of `tests/fixtures/hf` (a tiny
//! random checkpoint per family and option, made by `tests/python/make_model_fixtures.py`) is
//! loaded and run as the scheduler runs it — greedy decode after a whole prefill, a prefill in
//! chunks of 3, every position as its own step, all prompts batched, and a prompt whose first
//! tokens are another's cached prefix — and every logit is compared with the f32 logits
//! transformers recorded (within [`TOL`]), every greedy token with its greedy token (exactly).
//! Each kernel path this CPU supports runs the whole check in its own process, as a worker
//! would (the path is fixed once per process). The fixtures are bf16 checkpoints, so all of this
//! runs with the matrices kept in bf16 (`--weight-dtype auto`); widened to f32 at load they give
//! the same logits bit for bit, on every path. And the same mixture-of-experts weights in the
//! Hub's per-expert layout and in transformers 5's fused one load to the same model.

mod common;
#[path = "common/hf_fixture.rs"]
mod hf_fixture;

use std::collections::HashMap;

use hf_fixture::hf_weights::{write_safetensors, Bf16Tensor};
use hf_fixture::{fixtures, max_abs_diff, Fixture, RefSeq};
use kernels::WeightDtype;
use model::{KvBuffers, LlamaModel, LoadDtype, SeqInput};

/// Largest |dpserve − transformers| allowed on any logit.
const TOL: f32 = 1e-4;

/// Set in the children the parent test starts.
const CHILD: &str = "DPSERVE_HF_PARITY_TEST_CHILD";

/// The model of one fixture with a KV pool, tracking the largest difference seen.
struct Run<'a> {
    fx: &'a Fixture,
    model: LlamaModel,
    worst: f32,
}

/// Scattered slots, so slot indirection is exercised: sequence `s`'s position `p`.
fn slot(s: usize, p: usize) -> u32 {
    ((s * 64 + p) * 7 % 211) as u32
}

const POOL: usize = 211;

impl<'a> Run<'a> {
    fn new(fx: &'a Fixture) -> Self {
        let model =
            LlamaModel::load_hf(&fx.dir).unwrap_or_else(|e| panic!("{}: loading: {e}", fx.name));
        Run {
            fx,
            model,
            worst: 0.0,
        }
    }

    fn kv(&self) -> KvBuffers {
        KvBuffers::new(self.model.config(), POOL)
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    /// Checks one logits row against sequence `s`'s reference at position `p`.
    fn check(&mut self, what: &str, s: usize, p: usize, got: &[f32]) {
        let d = max_abs_diff(got, &self.fx.seqs[s].logits[p]);
        assert!(
            d <= TOL,
            "{} {what}: seq {s} position {p}: max |dpserve - transformers| = {d:e} > {TOL:e}",
            self.fx.name
        );
        self.worst = self.worst.max(d);
    }

    /// Prefill of each prompt on its own, then greedy decode: the tokens must be transformers'.
    fn greedy(&mut self) {
        for s in 0..self.fx.seqs.len() {
            let mut kv = self.kv();
            let rs = &self.fx.seqs[s];
            let (prompt, want) = (rs.prompt.clone(), rs.greedy.clone());
            let slots: Vec<u32> = (0..prompt.len() + want.len()).map(|p| slot(s, p)).collect();
            let mut toks = prompt.clone();
            let mut start = 0;
            let mut got = Vec::new();
            while got.len() < want.len() {
                let logits = self
                    .model
                    .forward(
                        &mut kv,
                        &[SeqInput {
                            new_tokens: &toks[start..],
                            start_pos: start,
                            slots: &slots[..toks.len()],
                        }],
                    )
                    .expect("forward");
                self.check("greedy", s, toks.len() - 1, &logits);
                let next = kernels::argmax(&logits) as u32;
                got.push(next);
                start = toks.len();
                toks.push(next);
            }
            assert_eq!(got, want, "{}: greedy tokens of seq {s}", self.fx.name);
        }
    }

    /// Every sequence in chunks of `chunk` tokens (1: every position its own step); the last
    /// row of each chunk is checked.
    fn chunked(&mut self, chunk: usize) {
        for s in 0..self.fx.seqs.len() {
            let mut kv = self.kv();
            let toks = self.fx.seqs[s].tokens();
            let slots: Vec<u32> = (0..toks.len()).map(|p| slot(s, p)).collect();
            for a in (0..toks.len()).step_by(chunk) {
                let b = (a + chunk).min(toks.len());
                let logits = self
                    .model
                    .forward(
                        &mut kv,
                        &[SeqInput {
                            new_tokens: &toks[a..b],
                            start_pos: a,
                            slots: &slots[..b],
                        }],
                    )
                    .expect("forward");
                self.check(&format!("chunks of {chunk}"), s, b - 1, &logits);
            }
        }
    }

    /// All prompts prefilled in one step, then their continuations decoded together.
    fn batched(&mut self) {
        let mut kv = self.kv();
        let n = self.fx.seqs.len();
        let seqs: Vec<Vec<u32>> = self.fx.seqs.iter().map(RefSeq::tokens).collect();
        let slots: Vec<Vec<u32>> = seqs
            .iter()
            .enumerate()
            .map(|(s, t)| (0..t.len()).map(|p| slot(s, p)).collect())
            .collect();
        let plen: Vec<usize> = self.fx.seqs.iter().map(|r| r.prompt.len()).collect();
        let steps = seqs[0].len() - plen[0];
        for step in 0..=steps {
            let inputs: Vec<SeqInput<'_>> = (0..n)
                .map(|s| {
                    let (a, b) = match step {
                        0 => (0, plen[s]),
                        k => (plen[s] + k - 1, plen[s] + k),
                    };
                    SeqInput {
                        new_tokens: &seqs[s][a..b],
                        start_pos: a,
                        slots: &slots[s][..b],
                    }
                })
                .collect();
            let logits = self.model.forward(&mut kv, &inputs).expect("forward");
            let vocab = self.vocab();
            for s in 0..n {
                let row = logits[s * vocab..(s + 1) * vocab].to_vec();
                self.check("batched", s, plen[s] + step - 1, &row);
            }
        }
    }

    /// Prompt B after prompt A's first `shared` positions are cached: B's prefill computes
    /// only its own tokens, reading A's K/V for the prefix (as a radix-cache hit does).
    fn prefix_cached(&mut self) {
        let (a, b) = (&self.fx.seqs[0], &self.fx.seqs[1]);
        let shared = a
            .prompt
            .iter()
            .zip(&b.prompt)
            .take_while(|(x, y)| x == y)
            .count();
        assert!(
            shared > 1,
            "{}: prompts 0 and 1 share no prefix",
            self.fx.name
        );
        let (a_toks, b_toks) = (a.tokens(), b.tokens());
        let mut kv = self.kv();
        let a_slots: Vec<u32> = (0..a_toks.len()).map(|p| slot(0, p)).collect();
        self.model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &a_toks,
                    start_pos: 0,
                    slots: &a_slots,
                }],
            )
            .expect("forward");
        let mut b_slots = a_slots[..shared].to_vec();
        b_slots.extend((shared..b_toks.len()).map(|p| slot(1, p)));
        let logits = self
            .model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &b_toks[shared..],
                    start_pos: shared,
                    slots: &b_slots,
                }],
            )
            .expect("forward");
        self.check("prefix-cached", 1, b_toks.len() - 1, &logits);
    }
}

/// Every sequence of `fx` prefilled in one batch: the logits, as bits.
fn batch_logit_bits(fx: &Fixture, m: &LlamaModel) -> Vec<u32> {
    let mut kv = KvBuffers::new(m.config(), POOL);
    let seqs: Vec<Vec<u32>> = fx.seqs.iter().map(RefSeq::tokens).collect();
    let slots: Vec<Vec<u32>> = seqs
        .iter()
        .enumerate()
        .map(|(s, t)| (0..t.len()).map(|p| slot(s, p)).collect())
        .collect();
    let inputs: Vec<SeqInput<'_>> = (0..seqs.len())
        .map(|s| SeqInput {
            new_tokens: &seqs[s],
            start_pos: 0,
            slots: &slots[s],
        })
        .collect();
    let logits = m.forward(&mut kv, &inputs).expect("forward");
    logits.into_iter().map(f32::to_bits).collect()
}

/// A bf16 checkpoint kept in bf16 and widened to f32 at load: the same logits, bit for bit.
fn check_weight_dtypes(fx: &Fixture, kept: &LlamaModel) {
    assert_eq!(kept.matrix_dtype(), WeightDtype::Bf16, "{}", fx.name);
    let wide = LlamaModel::load_hf_as(&fx.dir, LoadDtype::F32).expect("load as f32");
    assert_eq!(wide.matrix_dtype(), WeightDtype::F32);
    let (k, w) = (kept.weight_bytes(), wide.weight_bytes());
    assert!(k * 10 < w * 7, "{}: {k} bytes in bf16, {w} in f32", fx.name);
    assert!(
        batch_logit_bits(fx, kept) == batch_logit_bits(fx, &wide),
        "{}: bf16 and f32 weights give different logits",
        fx.name
    );
}

/// The checkpoint's matrices viewed in a packed weight file (`--weight-cache`), written by the
/// first load and mapped by the second: the same logits as packed in memory, bit for bit.
fn check_weight_cache(fx: &Fixture, own: &LlamaModel) {
    let cache = tempfile::tempdir().unwrap();
    for load in ["writes", "maps"] {
        let shared = LlamaModel::load_hf_shared(&fx.dir, LoadDtype::Auto, Some(cache.path()))
            .expect("load with a weight cache");
        assert!(shared.weights_shared(), "{}: the load that {load}", fx.name);
        assert!(
            batch_logit_bits(fx, &shared) == batch_logit_bits(fx, own),
            "{}: the load that {load} the packed weight file gives other logits",
            fx.name
        );
    }
}

/// The whole check of every fixture on this process's kernel path; one line per fixture.
fn check_all() {
    let path = kernels::kernel_path();
    for fx in fixtures() {
        let mut run = Run::new(&fx);
        check_weight_dtypes(&fx, &run.model);
        check_weight_cache(&fx, &run.model);
        run.greedy();
        run.chunked(3);
        run.chunked(1);
        run.batched();
        run.prefix_cached();
        println!(
            "parity: {path} {} max |dpserve - transformers| = {:e}",
            fx.name, run.worst
        );
    }
}

#[test]
fn every_fixture_matches_transformers_on_every_kernel_path() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    common::per_path_lines(CHILD, "parity: ");
}

#[test]
fn child_check() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    check_all();
}

/// The logits of a few tokens' prefill.
fn prefill_logits(m: &LlamaModel) -> Vec<f32> {
    let mut kv = KvBuffers::new(m.config(), 16);
    let toks = [1u32, 7, 30, 12, 44];
    m.forward(
        &mut kv,
        &[SeqInput {
            new_tokens: &toks,
            start_pos: 0,
            slots: &[0, 1, 2, 3, 4],
        }],
    )
    .unwrap()
}

/// The `mixtral` fixture rewritten in transformers 5's fused expert layout
/// (`mlp.experts.gate_up_proj` `[E, 2·inter, hidden]`, `mlp.experts.down_proj`, the router at
/// `mlp.gate`) loads to the same model as the Hub's per-expert layout.
#[test]
fn moe_experts_load_from_the_fused_layout_too() {
    let fixture = fixtures()
        .into_iter()
        .find(|f| f.name == "mixtral")
        .expect("the mixtral fixture");
    let bytes = std::fs::read(fixture.dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let raw = |name: &str| {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::BF16, "{name}");
        Bf16Tensor {
            shape: t.shape().to_vec(),
            data: t.data().to_vec(),
        }
    };
    let hub = LlamaModel::load_hf(&fixture.dir).unwrap();
    let c = hub.config().clone();
    let (e, i, h) = (
        c.moe.as_ref().unwrap().num_experts,
        c.intermediate_size,
        c.hidden_size,
    );
    let mut t = HashMap::new();
    for name in st.names() {
        if !name.contains(".block_sparse_moe.") {
            t.insert(name.to_string(), raw(name));
        }
    }
    for l in 0..c.num_hidden_layers {
        let (p, m) = (
            format!("model.layers.{l}.block_sparse_moe"),
            format!("model.layers.{l}.mlp"),
        );
        t.insert(format!("{m}.gate.weight"), raw(&format!("{p}.gate.weight")));
        let (mut gu, mut down) = (Vec::new(), Vec::new());
        for x in 0..e {
            for w in ["w1", "w3"] {
                gu.extend(raw(&format!("{p}.experts.{x}.{w}.weight")).data);
            }
            down.extend(raw(&format!("{p}.experts.{x}.w2.weight")).data);
        }
        let fused = |shape: Vec<usize>, data: Vec<u8>| Bf16Tensor { shape, data };
        t.insert(
            format!("{m}.experts.gate_up_proj"),
            fused(vec![e, 2 * i, h], gu),
        );
        t.insert(format!("{m}.experts.down_proj"), fused(vec![e, h, i], down));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture.dir.join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &t);
    let fused = LlamaModel::load_hf(dir.path()).unwrap();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(prefill_logits(&fused)), bits(prefill_logits(&hub)));
    // The fused tensors cut into experts in a packed weight file too.
    let cache = tempfile::tempdir().unwrap();
    let mapped =
        LlamaModel::load_hf_shared(dir.path(), LoadDtype::Auto, Some(cache.path())).unwrap();
    assert!(mapped.weights_shared());
    assert_eq!(bits(prefill_logits(&mapped)), bits(prefill_logits(&hub)));
}
