//! The batched Llama-family forward pass on CPU: validation of a step's inputs, the decoder layers over
//! all new tokens of all sequences at once, and the final norm / lm_head on each sequence's last
//! token. Every kernel is row-wise batch-invariant, so a token's logits do not depend on what
//! else is in the step, on chunking, or on prefix-cache hits. Gemma's block (see `gemma.rs`) is
//! this one with its norms, activation, scores and windows where the options say; Mixtral and
//! Qwen3-MoE route their MLP through experts (`moe.rs`).

use std::cell::Cell;

use kernels::{AttnShape, LineVec, PackedMatrix, ScoreScale};

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::gemma;
use super::kv::KvBuffers;
use super::moe;
use super::plan::BatchPlan;
use super::weights::{LayerWeights, Weights};

/// Activations of one step, kept between steps (per thread) so a step allocates nothing but
/// its result once the buffers have grown to the largest step seen. Line-aligned where the
/// kernels read them with vector loads.
#[derive(Default)]
struct Buffers {
    x: LineVec,
    hn: LineVec,
    q: LineVec,
    k: LineVec,
    /// q or k after its per-head norm (Qwen3).
    qk_normed: LineVec,
    attn: LineVec,
    act: LineVec,
    qkv: LineVec,
    o: LineVec,
    gu: LineVec,
    down: LineVec,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Gemma 3's local layers' RoPE tables.
    local_cos: Vec<f32>,
    local_sin: Vec<f32>,
    last: Vec<f32>,
}

thread_local! {
    static BUFFERS: Cell<Option<Box<Buffers>>> = const { Cell::new(None) };
}

/// `v` with `len` elements (contents unspecified: every caller overwrites them all).
fn sized(v: &mut LineVec, len: usize) -> &mut [f32] {
    v.resize(len);
    &mut v[..]
}

/// `y = x · Wᵀ (+ b)` over `m` rows into `y` (resized, so one buffer serves every layer).
fn linear(x: &[f32], m: usize, w: &PackedMatrix, b: Option<&[f32]>, y: &mut LineVec) {
    y.resize(m * w.rows());
    kernels::linear_packed(x, m, w, b, y);
}

/// Runs the decoder over the step and returns the final-normed hidden state of each
/// sequence's last new token, `[plan.seqs(), hidden]`.
pub(crate) fn hidden_last(
    cfg: &ModelConfig,
    w: &Weights,
    kv: &mut KvBuffers,
    st: &BatchPlan<'_>,
) -> Result<Vec<f32>> {
    if !kv.fits(cfg) || st.num_slots > kv.num_slots() {
        return Err(ModelError::BadInput {
            reason: "the KV buffers do not fit this model or step".into(),
        });
    }
    let t = st.ids.len();
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let mut bufs = BUFFERS.take().unwrap_or_default();
    let Buffers {
        x,
        hn,
        q,
        k,
        qk_normed,
        attn,
        act,
        qkv,
        o,
        gu,
        down,
        cos,
        sin,
        local_cos,
        local_sin,
        last,
    } = &mut *bufs;
    let x = sized(x, t * h);
    embed(cfg, w, &st.ids, x);
    w.rope.tables_into(&st.positions, cos, sin);
    if let Some(r) = &w.local_rope {
        r.tables_into(&st.positions, local_cos, local_sin);
    }
    let step = Step::new(cfg, st);
    // Gemma's local layers read the last `sliding_window` of each token's slots.
    let mut window: Vec<&[u32]> = Vec::new();
    let hn = sized(hn, t * h);
    let q = sized(q, t * cfg.q_dim());
    let k = sized(k, t * cfg.kv_dim());
    let attn = sized(attn, t * cfg.q_dim());
    let act = sized(act, t * inter);
    for (l, lw) in w.layers.iter().enumerate() {
        let local = cfg.gemma.as_ref().is_some_and(|g| g.local_layers[l]);
        let rope = match (local, &w.local_rope) {
            (true, Some(_)) => (&local_cos[..], &local_sin[..]),
            _ => (&cos[..], &sin[..]),
        };
        let bufs = AttnBufs {
            x: &mut *x,
            hn: &mut *hn,
            q: &mut *q,
            k: &mut *k,
            qk_normed: &mut *qk_normed,
            attn: &mut *attn,
            qkv: &mut *qkv,
            o: &mut *o,
        };
        step.attention_block(l, lw, (&mut kv.k[l], &mut kv.v[l]), rope, bufs, &mut window);
        mlp_block(cfg, lw, x, t, [hn, act], [gu, down]);
    }
    last.clear();
    for &r in &st.logit_rows {
        last.extend_from_slice(&x[r * h..(r + 1) * h]);
    }
    let mut out = vec![0f32; last.len()];
    kernels::rmsnorm(last, &w.norm, cfg.rms_norm_eps, &mut out);
    BUFFERS.set(Some(bufs));
    Ok(out)
}

/// The step's tokens' embeddings into `x` (`[t, hidden]`), scaled as Gemma scales them.
fn embed(cfg: &ModelConfig, w: &Weights, ids: &[u32], x: &mut [f32]) {
    let h = cfg.hidden_size;
    for (row, &id) in x.chunks_exact_mut(h).zip(ids) {
        w.embed.copy_row(id as usize, row);
    }
    if cfg.gemma.is_some() {
        // sqrt(hidden) rounded to f32 first, as transformers' `embed_scale` buffer holds it.
        let scale = (h as f64).sqrt() as f32;
        x.iter_mut().for_each(|v| *v *= scale);
    }
}

/// What every layer of one step reads: the model's shape and the step's plan.
struct Step<'a> {
    cfg: &'a ModelConfig,
    st: &'a BatchPlan<'a>,
    shape: AttnShape,
    score: ScoreScale,
}

/// The attention half's buffers: the residual stream `x` and its scratch, `[t, …]` each.
struct AttnBufs<'b> {
    x: &'b mut [f32],
    hn: &'b mut [f32],
    q: &'b mut [f32],
    k: &'b mut [f32],
    qk_normed: &'b mut LineVec,
    attn: &'b mut [f32],
    qkv: &'b mut LineVec,
    o: &'b mut LineVec,
}

impl<'a> Step<'a> {
    fn new(cfg: &'a ModelConfig, st: &'a BatchPlan<'a>) -> Self {
        Step {
            cfg,
            st,
            shape: cfg.attn_shape(),
            score: cfg.score_scale(),
        }
    }

    /// The attention half of layer `l`: `x += o(attention(rope(qkv(rmsnorm(x)))))` (with
    /// Gemma's post-norm), the step's K/V written into the layer's cache `(k, v)` at its slots
    /// first. `rope`: the layer's `(cos, sin)` tables; `window`: scratch for a local layer's
    /// sliding window.
    fn attention_block(
        &self,
        l: usize,
        lw: &LayerWeights,
        (kc, vc): (&mut LineVec, &mut LineVec),
        (cos, sin): (&[f32], &[f32]),
        b: AttnBufs<'_>,
        window: &mut Vec<&'a [u32]>,
    ) {
        let (cfg, st) = (self.cfg, self.st);
        let (t, qd, kvd, hd) = (st.ids.len(), cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        kernels::rmsnorm(b.x, &lw.attn_norm, cfg.rms_norm_eps, b.hn);
        linear(b.hn, t, &lw.wqkv, lw.bqkv.as_deref(), b.qkv);
        for (r, row) in b.qkv.chunks_exact(qd + 2 * kvd).enumerate() {
            b.q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
            b.k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
            let s = st.write_slots[r] as usize * kvd;
            vc[s..s + kvd].copy_from_slice(&row[qd + kvd..]);
        }
        if let Some((qn, kn)) = &lw.qk_norm {
            // Each head is a row of `head_dim` for the norm.
            for (x, wn) in [(&mut *b.q, qn), (&mut *b.k, kn)] {
                let y = sized(b.qk_normed, x.len());
                kernels::rmsnorm(x, wn, cfg.rms_norm_eps, y);
                x.copy_from_slice(y);
            }
        }
        kernels::apply_rope(b.q, cfg.num_attention_heads, hd, cos, sin);
        kernels::apply_rope(b.k, cfg.num_key_value_heads, hd, cos, sin);
        for (r, &slot) in st.write_slots.iter().enumerate() {
            let s = slot as usize * kvd;
            kc[s..s + kvd].copy_from_slice(&b.k[r * kvd..(r + 1) * kvd]);
        }
        let gemma = cfg.gemma.as_ref();
        let attend = match gemma.filter(|g| g.local_layers[l]) {
            Some(g) => {
                window.clear();
                window.extend(st.attend.iter().map(|s| g.window(l, s)));
                &window[..]
            }
            None => &st.attend[..],
        };
        match gemma {
            Some(_) => {
                kernels::attention_scored(b.q, attend, kc, vc, self.shape, self.score, b.attn)
            }
            None => kernels::attention(b.q, attend, kc, vc, self.shape, b.attn),
        }
        linear(b.attn, t, &lw.wo, lw.bo.as_deref(), b.o);
        add_residual(b.x, b.o, lw.post_norms.as_ref().map(|n| &n.0), cfg, b.hn);
    }
}

/// The MLP half of a layer: `x += mlp(rmsnorm(x))`, the MLP dense (SwiGLU, or Gemma's GeGLU
/// with its post-norm) or of experts; `hn` (`[t, hidden]`) and `act` (`[t, intermediate]`)
/// sized, `gu` and `down` resized as needed.
fn mlp_block(
    cfg: &ModelConfig,
    lw: &LayerWeights,
    x: &mut [f32],
    t: usize,
    [hn, act]: [&mut [f32]; 2],
    [gu, down]: [&mut LineVec; 2],
) {
    kernels::rmsnorm(x, &lw.mlp_norm, cfg.rms_norm_eps, hn);
    if let (Some(mw), Some(opts)) = (&lw.moe, &cfg.moe) {
        let down = sized(down, t * cfg.hidden_size);
        moe::moe_mlp(opts, mw, hn, t, down);
        kernels::add_inplace(x, down);
        return;
    }
    let inter = cfg.intermediate_size;
    linear(hn, t, &lw.wgu, lw.bgu.as_deref(), gu);
    match cfg.gemma {
        Some(_) => kernels::gelu_tanh_mul(gu, inter, act),
        None => kernels::silu_mul(gu, inter, act),
    }
    linear(act, t, &lw.wdown, lw.bdown.as_deref(), down);
    add_residual(x, down, lw.post_norms.as_ref().map(|n| &n.1), cfg, hn);
}

/// `x += y`, or (Gemma) `x += rmsnorm(y)` with `post_norm`, through `scratch`.
fn add_residual(
    x: &mut [f32],
    y: &[f32],
    post_norm: Option<&Vec<f32>>,
    cfg: &ModelConfig,
    scratch: &mut [f32],
) {
    match post_norm {
        Some(n) => {
            kernels::rmsnorm(y, n, cfg.rms_norm_eps, scratch);
            kernels::add_inplace(x, scratch);
        }
        None => kernels::add_inplace(x, y),
    }
}

/// Logits `[rows, vocab]` of final-normed hidden states (soft-capped where Gemma says).
pub(crate) fn logits(cfg: &ModelConfig, w: &Weights, hidden: &[f32]) -> Vec<f32> {
    let rows = hidden.len() / cfg.hidden_size;
    let mut y = vec![0f32; rows * w.lm_head().rows()];
    kernels::linear_packed(hidden, rows, w.lm_head(), None, &mut y);
    if let Some(cap) = cfg.gemma.as_ref().and_then(|g| g.final_softcap) {
        gemma::softcap(&mut y, cap);
    }
    y
}
