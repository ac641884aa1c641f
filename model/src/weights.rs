//! The model's weights in the layout the forward pass wants (matrices in f32 or a 16-bit type,
//! vectors in f32, projections fused so one GEMM serves q/k/v and one serves gate/up, every
//! matrix packed once for the GEMM kernel), and the seeded dummy initialisation.

use kernels::cuda::CudaDtype;
use kernels::{PackedMatrix, WeightDtype};
use rand::{Rng, SeedableRng};

use super::config::ModelConfig;
use super::elems::narrow;
use super::moe::{MoeWeights, SharedExpert};
use super::rope::Rope;

/// Dummy-init constants, tuned by looking at greedy outputs of the builtin sizes: with tied
/// embeddings a large embedding makes every token predict itself (h·e_cur dominates), and soft
/// attention averages context into a fixed point; small embeddings, sharper q/k and stronger
/// residual branches give varied greedy text. Logit std ≈ EMBED_STD·sqrt(hidden) ≈ 1 for Base.
const EMBED_STD: f32 = 0.05;
/// Gain on the q/k projections (sharper attention scores).
const QK_GAIN: f32 = 3.0;
/// Gain on the residual-writing projections (o, down), before the 1/sqrt(2·layers) scaling.
const RESID_GAIN: f32 = 2.0;

/// One decoder layer. Fusing concatenates rows of `[out, in]` matrices, so each output element
/// is still the same dot product as with separate projections; packing only moves values.
pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// `[q_dim + 2·kv_dim, hidden]`: q rows, then k rows, then v rows.
    pub wqkv: PackedMatrix,
    pub bqkv: Option<Vec<f32>>,
    /// Qwen3's per-head RMSNorm weights of q and of k, `[head_dim]` each.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// `[hidden, q_dim]`.
    pub wo: PackedMatrix,
    pub bo: Option<Vec<f32>>,
    pub mlp_norm: Vec<f32>,
    /// `[2·intermediate, hidden]`: gate rows, then up rows. Of intermediate size 0 in a layer
    /// with experts, as is `wdown`.
    pub wgu: PackedMatrix,
    /// The gate and up biases, fused the same way (Llama with `mlp_bias`).
    pub bgu: Option<Vec<f32>>,
    /// `[hidden, intermediate]`.
    pub wdown: PackedMatrix,
    pub bdown: Option<Vec<f32>>,
    /// Gemma's norms of the attention output and of the MLP output, before each residual add.
    pub post_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// The router and experts of a mixture-of-experts layer (instead of `wgu` / `wdown`).
    pub moe: Option<MoeWeights>,
}

pub(crate) struct Weights {
    /// `[vocab, hidden]`; rows are read back for the embedding lookup, so a tied model keeps
    /// one copy.
    pub embed: PackedMatrix,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    /// `[vocab, hidden]`; `None` means tied to `embed`.
    pub lm_head: Option<PackedMatrix>,
    /// What RoPE's tables are built from, scaling applied ([`ModelConfig::rope`]), so a step
    /// builds its tables without recomputing the frequencies.
    pub rope: Rope,
    /// Gemma 3's local layers' RoPE (their own base); `None`: every layer uses `rope`.
    pub local_rope: Option<Rope>,
    /// The checkpoint's storage type (of its embedding table; f32 for dummy weights). Every
    /// value above is that value (widened to f32 exactly, or in its own 16-bit type) unless
    /// `--weight-dtype` asked for a narrower type.
    pub dtype: CudaDtype,
}

/// `v` rounded to `dtype` (to nearest even) and widened back: what a checkpoint stored in
/// `dtype` loads as.
fn round_to(v: &mut [f32], dtype: CudaDtype) {
    match dtype {
        CudaDtype::F32 => {}
        CudaDtype::Bf16 => v
            .iter_mut()
            .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
        CudaDtype::F16 => v
            .iter_mut()
            .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
    }
}

impl Weights {
    /// Every weight rounded to `dtype`, recorded as the stored type: the model a checkpoint of
    /// these weights saved in `dtype` would load as.
    pub fn round_to(&mut self, dtype: CudaDtype) {
        // A matrix is then held in `dtype` itself (the same values; the CPU widens them exactly).
        let matrix = |m: &mut PackedMatrix| {
            let (n, k) = (m.rows(), m.cols());
            let w = m.unpack();
            *m = match dtype {
                CudaDtype::F32 => PackedMatrix::pack(&w, n, k),
                CudaDtype::Bf16 => PackedMatrix::pack_16bit(
                    &narrow(&w, WeightDtype::Bf16),
                    n,
                    k,
                    WeightDtype::Bf16,
                ),
                CudaDtype::F16 => {
                    PackedMatrix::pack_16bit(&narrow(&w, WeightDtype::F16), n, k, WeightDtype::F16)
                }
            };
        };
        self.for_each_matrix(matrix);
        self.for_each_vector(|v| round_to(v, dtype));
        self.dtype = dtype;
    }

    /// Calls `f` on every weight matrix (the embedding table, each layer's projections and
    /// experts, an untied LM head).
    pub fn for_each_matrix(&mut self, mut f: impl FnMut(&mut PackedMatrix)) {
        f(&mut self.embed);
        for l in &mut self.layers {
            for m in [&mut l.wqkv, &mut l.wo, &mut l.wgu, &mut l.wdown] {
                f(m);
            }
            if let Some(m) = &mut l.moe {
                f(&mut m.router);
                for (gu, down) in &mut m.experts {
                    f(gu);
                    f(down);
                }
                if let Some(s) = &mut m.shared {
                    for m in [&mut s.wgu, &mut s.wdown, &mut s.gate] {
                        f(m);
                    }
                }
            }
        }
        if let Some(m) = &mut self.lm_head {
            f(m);
        }
    }

    /// Calls `f` on every weight vector (norms and biases).
    pub fn for_each_vector(&mut self, mut f: impl FnMut(&mut [f32])) {
        for l in &mut self.layers {
            f(&mut l.attn_norm);
            f(&mut l.mlp_norm);
            let pairs = [&mut l.qk_norm, &mut l.post_norms];
            for (a, b) in pairs.into_iter().flatten() {
                f(a);
                f(b);
            }
            let biases = [&mut l.bqkv, &mut l.bo, &mut l.bgu, &mut l.bdown];
            for b in biases.into_iter().flatten() {
                f(b);
            }
        }
        f(&mut self.norm);
    }

    /// Bytes held: every packed matrix and every f32 vector.
    pub fn bytes(&self) -> usize {
        let vec = |v: &Vec<f32>| v.len() * 4;
        let pair =
            |p: &Option<(Vec<f32>, Vec<f32>)>| p.as_ref().map_or(0, |(a, b)| vec(a) + vec(b));
        let opt = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, vec);
        let mut n = self.embed.bytes() + vec(&self.norm);
        n += self.lm_head.as_ref().map_or(0, PackedMatrix::bytes);
        for l in &self.layers {
            n += l.wqkv.bytes() + l.wo.bytes() + l.wgu.bytes() + l.wdown.bytes();
            n += vec(&l.attn_norm) + vec(&l.mlp_norm) + pair(&l.qk_norm) + pair(&l.post_norms);
            n += opt(&l.bqkv) + opt(&l.bo) + opt(&l.bgu) + opt(&l.bdown);
            if let Some(m) = &l.moe {
                n += m.router.bytes();
                n += m
                    .experts
                    .iter()
                    .map(|(a, b)| a.bytes() + b.bytes())
                    .sum::<usize>();
                if let Some(s) = &m.shared {
                    n += s.wgu.bytes() + s.wdown.bytes() + s.gate.bytes();
                }
            }
        }
        n
    }

    /// The matrix of the output projection.
    pub fn lm_head(&self) -> &PackedMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Seeded uniform random weights: projections with std 1/sqrt(fan_in) times the gains above,
    /// residual-writing projections (o, down) scaled by 1/sqrt(2·layers) so the residual stream
    /// stays O(1), norms 1 (q/k norms about 1). Deterministic for a seed.
    pub fn dummy(cfg: &ModelConfig, seed: u64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut uni = |n: usize, std: f32| -> Vec<f32> {
            let a = std * 3f32.sqrt();
            (0..n).map(|_| rng.gen_range(-a..a)).collect()
        };
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
        let resid = RESID_GAIN / (2.0 * cfg.num_hidden_layers.max(1) as f32).sqrt();
        let embed = PackedMatrix::pack(&uni(cfg.vocab_size * h, EMBED_STD), cfg.vocab_size, h);
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let moe = cfg.moe.as_ref().filter(|m| m.moe_layers[l]);
                // A layer with experts has no dense MLP.
                let i = if moe.is_some() { 0 } else { i };
                LayerWeights {
                    attn_norm: vec![1.0; h],
                    wqkv: {
                        let mut w = uni((q + kv) * h, QK_GAIN / (h as f32).sqrt());
                        w.extend(uni(kv * h, 1.0 / (h as f32).sqrt()));
                        PackedMatrix::pack(&w, q + 2 * kv, h)
                    },
                    bqkv: cfg.qkv_bias.then(|| uni(q + 2 * kv, 0.02)),
                    qk_norm: cfg.qk_norm.then(|| {
                        let d = cfg.head_dim;
                        let around_one = |v: Vec<f32>| v.into_iter().map(|x| 1.0 + x).collect();
                        (around_one(uni(d, 0.1)), around_one(uni(d, 0.1)))
                    }),
                    wo: PackedMatrix::pack(&uni(h * q, resid / (q as f32).sqrt()), h, q),
                    bo: cfg.o_bias.then(|| uni(h, 0.02)),
                    mlp_norm: vec![1.0; h],
                    wgu: PackedMatrix::pack(&uni(2 * i * h, 1.0 / (h as f32).sqrt()), 2 * i, h),
                    wdown: PackedMatrix::pack(&uni(h * i, resid / (i as f32).sqrt()), h, i),
                    bgu: cfg.mlp_bias.then(|| uni(2 * i, 0.02)),
                    bdown: cfg.mlp_bias.then(|| uni(h, 0.02)),
                    post_norms: cfg.gemma.is_some().then(|| (vec![1.0; h], vec![1.0; h])),
                    moe: moe.map(|m| dummy_moe(m, h, resid, &mut uni)),
                }
            })
            .collect();
        let lm_head = (!cfg.tie_word_embeddings).then(|| {
            let w = uni(cfg.vocab_size * h, 1.0 / (h as f32).sqrt());
            PackedMatrix::pack(&w, cfg.vocab_size, h)
        });
        Weights {
            embed,
            layers,
            norm: vec![1.0; h],
            lm_head,
            rope: cfg.rope(),
            local_rope: cfg.local_rope(),
            dtype: CudaDtype::F32,
        }
    }
}

/// [`Weights::dummy`]'s experts of one layer, drawn from `uni` in the order: router, each
/// expert's gate/up then down, the shared expert.
fn dummy_moe(
    m: &super::moe::MoeOptions,
    h: usize,
    resid: f32,
    uni: &mut impl FnMut(usize, f32) -> Vec<f32>,
) -> MoeWeights {
    let ei = m.expert_intermediate_size;
    let e = m.num_experts;
    let fan_in = |n: usize| 1.0 / (n as f32).sqrt();
    MoeWeights {
        router: PackedMatrix::pack(&uni(e * h, fan_in(h)), e, h),
        experts: (0..e)
            .map(|_| {
                let gu = uni(2 * ei * h, fan_in(h));
                let down = uni(h * ei, resid / (ei as f32).sqrt());
                (
                    PackedMatrix::pack(&gu, 2 * ei, h),
                    PackedMatrix::pack(&down, h, ei),
                )
            })
            .collect(),
        shared: m.shared_expert_intermediate_size.map(|si| SharedExpert {
            wgu: PackedMatrix::pack(&uni(2 * si * h, fan_in(h)), 2 * si, h),
            wdown: PackedMatrix::pack(&uni(h * si, resid / (si as f32).sqrt()), h, si),
            gate: PackedMatrix::pack(&uni(h, fan_in(h)), 1, h),
        }),
    }
}
