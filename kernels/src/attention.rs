//! Causal GQA attention of new query tokens over K/V held in a slot pool.
//!
//! K and V of one layer are `[num_slots, num_kv_heads, head_dim]`. Query token `t` attends to
//! the slots `token_slots[t]` (the slots of its sequence's positions `0..=p`, in position order).
//! The reduction for one (token, head) is fixed: scores in position order (8-lane dot), max, exp,
//! sum in position order, V accumulated in position order, one final scale. Nothing depends on
//! how many other tokens share the call, so prefill, chunked prefill and batched decode agree
//! bit for bit. Cost O(Σ_t (p_t+1) · heads · head_dim); parallel over (token, head).

use rayon::prelude::*;

use crate::dot8;

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// `out[t, h, :] = softmax(q[t,h]·K[slots]ᵀ / sqrt(d)) · V[slots]` for every query token `t`.
///
/// # Panics
/// On inconsistent shapes or a slot outside the cache (callers validate slots first).
pub fn attention(
    q: &[f32],
    token_slots: &[&[u32]],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: AttnShape,
    out: &mut [f32],
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    assert!(
        num_kv_heads > 0 && num_heads % num_kv_heads == 0,
        "gqa shape"
    );
    let q_width = num_heads * head_dim;
    assert_eq!(q.len(), token_slots.len() * q_width, "q shape");
    assert_eq!(out.len(), q.len(), "out shape");
    assert_eq!(k_cache.len(), v_cache.len(), "kv shape");
    let group = num_heads / num_kv_heads;
    let kv_row = num_kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();

    let one = |(idx, o): (usize, &mut [f32])| {
        let (t, h) = (idx / num_heads, idx % num_heads);
        let qv = &q[t * q_width + h * head_dim..t * q_width + (h + 1) * head_dim];
        let kvh = h / group;
        let slots = token_slots[t];
        let mut scores = Vec::with_capacity(slots.len());
        let mut max = f32::NEG_INFINITY;
        for &s in slots {
            let base = s as usize * kv_row + kvh * head_dim;
            let sc = dot8(qv, &k_cache[base..base + head_dim]) * scale;
            max = max.max(sc);
            scores.push(sc);
        }
        let mut sum = 0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        o.fill(0.0);
        for (&s, &p) in slots.iter().zip(&scores) {
            let base = s as usize * kv_row + kvh * head_dim;
            for (acc, &v) in o.iter_mut().zip(&v_cache[base..base + head_dim]) {
                *acc += p * v;
            }
        }
        let inv = 1.0 / sum;
        for acc in o.iter_mut() {
            *acc *= inv;
        }
    };
    let work: usize = token_slots.iter().map(|s| s.len()).sum::<usize>() * num_heads;
    if work * head_dim >= 1 << 16 {
        out.par_chunks_mut(head_dim).enumerate().for_each(one);
    } else {
        out.chunks_mut(head_dim).enumerate().for_each(one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn matches_naive_gqa_and_is_batch_invariant() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let shape = AttnShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
        };
        let slots_n = 10;
        let kv_row = 2 * 8;
        let k: Vec<f32> = (0..slots_n * kv_row)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let v: Vec<f32> = (0..slots_n * kv_row)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let seq: Vec<u32> = vec![7, 2, 9, 0, 4];
        // Token at position p attends to seq[..=p].
        let toks: Vec<&[u32]> = (0..seq.len()).map(|p| &seq[..=p]).collect();
        let q: Vec<f32> = (0..toks.len() * 32)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut out = vec![0f32; q.len()];
        attention(&q, &toks, &k, &v, shape, &mut out);
        for (t, slots) in toks.iter().enumerate() {
            for h in 0..4 {
                let qv = &q[t * 32 + h * 8..t * 32 + h * 8 + 8];
                let kvh = h / 2;
                let sc: Vec<f64> = slots
                    .iter()
                    .map(|&s| {
                        let kb = s as usize * kv_row + kvh * 8;
                        (0..8).map(|d| qv[d] as f64 * k[kb + d] as f64).sum::<f64>() / 8f64.sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..8 {
                    let r: f64 = slots
                        .iter()
                        .zip(&e)
                        .map(|(&s, p)| p * v[s as usize * kv_row + kvh * 8 + d] as f64)
                        .sum::<f64>()
                        / z;
                    assert!((out[t * 32 + h * 8 + d] as f64 - r).abs() < 1e-5);
                }
            }
        }
        // The last token alone gives the same bits as inside the batch.
        let mut single = vec![0f32; 32];
        attention(&q[4 * 32..], &toks[4..], &k, &v, shape, &mut single);
        assert_eq!(
            single.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            out[4 * 32..]
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        );
    }
}
