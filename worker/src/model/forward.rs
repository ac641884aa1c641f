//! The batched Llama forward pass on CPU: validation of a step's inputs, the decoder layers over
//! all new tokens of all sequences at once, and the final norm / lm_head on each sequence's last
//! token. Every kernel is row-wise batch-invariant, so a token's logits do not depend on what
//! else is in the step, on chunking, or on prefix-cache hits.

use std::cell::Cell;

use kernels::{AttnShape, LineVec, PackedMatrix};

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::kv::KvBuffers;
use super::weights::Weights;
use super::SeqInput;

/// Activations of one step, kept between steps (per thread) so a step allocates nothing but
/// its result once the buffers have grown to the largest step seen. Line-aligned where the
/// kernels read them with vector loads.
#[derive(Default)]
struct Buffers {
    x: LineVec,
    hn: LineVec,
    q: LineVec,
    k: LineVec,
    attn: LineVec,
    act: LineVec,
    qkv: LineVec,
    o: LineVec,
    gu: LineVec,
    down: LineVec,
    cos: Vec<f32>,
    sin: Vec<f32>,
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

/// All new tokens of one step, flattened in sequence order.
struct StepTokens<'a> {
    ids: Vec<u32>,
    positions: Vec<usize>,
    /// The slot each new token's K/V is written to.
    write_slots: Vec<u32>,
    /// For each new token, the slots of its sequence's positions `0..=p`.
    attend: Vec<&'a [u32]>,
    /// Row (in the flat token list) of each sequence's last new token.
    last_rows: Vec<usize>,
}

fn bad(reason: String) -> ModelError {
    ModelError::BadInput { reason }
}

/// Checks every sequence against the model and the KV pool, then flattens them.
fn flatten<'a>(cfg: &ModelConfig, kv: &KvBuffers, seqs: &[SeqInput<'a>]) -> Result<StepTokens<'a>> {
    if !kv.fits(cfg) {
        return Err(bad(
            "KV buffers were built for a different model shape".into()
        ));
    }
    let total: usize = seqs.iter().map(|s| s.new_tokens.len()).sum();
    let mut st = StepTokens {
        ids: Vec::with_capacity(total),
        positions: Vec::with_capacity(total),
        write_slots: Vec::with_capacity(total),
        attend: Vec::with_capacity(total),
        last_rows: Vec::with_capacity(seqs.len()),
    };
    for (i, s) in seqs.iter().enumerate() {
        let end = s.start_pos + s.new_tokens.len();
        if s.new_tokens.is_empty() {
            return Err(bad(format!("seq {i}: no new tokens")));
        }
        if s.slots.len() != end {
            return Err(bad(format!(
                "seq {i}: {} slots for start_pos {} + {} new tokens",
                s.slots.len(),
                s.start_pos,
                s.new_tokens.len()
            )));
        }
        if end > cfg.max_position_embeddings {
            return Err(bad(format!(
                "seq {i}: position {} >= max_position_embeddings {}",
                end - 1,
                cfg.max_position_embeddings
            )));
        }
        if let Some(&slot) = s.slots.iter().find(|&&x| x as usize >= kv.num_slots()) {
            return Err(bad(format!(
                "seq {i}: slot {slot} >= num_slots {}",
                kv.num_slots()
            )));
        }
        if let Some(&t) = s.new_tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(bad(format!(
                "seq {i}: token id {t} >= vocab_size {}",
                cfg.vocab_size
            )));
        }
        for (j, &t) in s.new_tokens.iter().enumerate() {
            let p = s.start_pos + j;
            st.ids.push(t);
            st.positions.push(p);
            st.write_slots.push(s.slots[p]);
            st.attend.push(&s.slots[..=p]);
        }
        st.last_rows.push(st.ids.len() - 1);
    }
    Ok(st)
}

/// `y = x · Wᵀ (+ b)` over `m` rows into `y` (resized, so one buffer serves every layer).
fn linear(x: &[f32], m: usize, w: &PackedMatrix, b: Option<&[f32]>, y: &mut LineVec) {
    y.resize(m * w.rows());
    kernels::linear_packed(x, m, w, b, y);
}

/// Runs the decoder over the step and returns the final-normed hidden state of each
/// sequence's last new token, `[seqs.len(), hidden]`.
pub(crate) fn hidden_last(
    cfg: &ModelConfig,
    w: &Weights,
    kv: &mut KvBuffers,
    seqs: &[SeqInput<'_>],
) -> Result<Vec<f32>> {
    let st = flatten(cfg, kv, seqs)?;
    let t = st.ids.len();
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    let shape = AttnShape {
        num_heads: cfg.num_attention_heads,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: hd,
    };
    let mut bufs = BUFFERS.take().unwrap_or_default();
    let Buffers {
        x,
        hn,
        q,
        k,
        attn,
        act,
        qkv,
        o,
        gu,
        down,
        cos,
        sin,
        last,
    } = &mut *bufs;
    let x = sized(x, t * h);
    for (row, &id) in x.chunks_exact_mut(h).zip(&st.ids) {
        w.embed.copy_row(id as usize, row);
    }
    kernels::rope_tables_into(&st.positions, hd, cfg.rope_theta, cos, sin);
    let hn = sized(hn, t * h);
    let q = sized(q, t * qd);
    let k = sized(k, t * kvd);
    let attn = sized(attn, t * qd);
    let act = sized(act, t * inter);
    for (l, lw) in w.layers.iter().enumerate() {
        kernels::rmsnorm(x, &lw.attn_norm, cfg.rms_norm_eps, hn);
        linear(hn, t, &lw.wqkv, lw.bqkv.as_deref(), qkv);
        let (kc, vc) = (&mut kv.k[l], &mut kv.v[l]);
        for (r, row) in qkv.chunks_exact(qd + 2 * kvd).enumerate() {
            q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
            k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
            let s = st.write_slots[r] as usize * kvd;
            vc[s..s + kvd].copy_from_slice(&row[qd + kvd..]);
        }
        kernels::apply_rope(q, cfg.num_attention_heads, hd, cos, sin);
        kernels::apply_rope(k, cfg.num_key_value_heads, hd, cos, sin);
        for (r, &slot) in st.write_slots.iter().enumerate() {
            let s = slot as usize * kvd;
            kc[s..s + kvd].copy_from_slice(&k[r * kvd..(r + 1) * kvd]);
        }
        kernels::attention(q, &st.attend, kc, vc, shape, attn);
        linear(attn, t, &lw.wo, None, o);
        kernels::add_inplace(x, o);

        kernels::rmsnorm(x, &lw.mlp_norm, cfg.rms_norm_eps, hn);
        linear(hn, t, &lw.wgu, None, gu);
        kernels::silu_mul(gu, inter, act);
        linear(act, t, &lw.wdown, None, down);
        kernels::add_inplace(x, down);
    }
    last.clear();
    for &r in &st.last_rows {
        last.extend_from_slice(&x[r * h..(r + 1) * h]);
    }
    let mut out = vec![0f32; last.len()];
    kernels::rmsnorm(last, &w.norm, cfg.rms_norm_eps, &mut out);
    BUFFERS.set(Some(bufs));
    Ok(out)
}

/// Logits `[rows, vocab]` of final-normed hidden states.
pub(crate) fn logits(cfg: &ModelConfig, w: &Weights, hidden: &[f32]) -> Vec<f32> {
    let rows = hidden.len() / cfg.hidden_size;
    let mut y = vec![0f32; rows * w.lm_head().rows()];
    kernels::linear_packed(hidden, rows, w.lm_head(), None, &mut y);
    y
}
