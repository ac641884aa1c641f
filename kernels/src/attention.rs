//! Causal GQA attention of new query tokens over K/V held in a slot pool.
//!
//! K and V of one layer are `[num_slots, num_kv_heads, head_dim]`. Query token `t` attends to
//! the slots `token_slots[t]` (the slots of its sequence's positions `0..=p`, in position order).
//! The reduction for one (token, head) is fixed: scores in position order (8-lane dot), max, exp,
//! sum in position order, V accumulated in position order, one final scale. Nothing depends on
//! how many other tokens share the call, so prefill, chunked prefill and batched decode agree
//! bit for bit. Cost O(Σ_t (p_t+1) · heads · head_dim); parallel over (token, KV head), the query
//! heads of one KV head together so each K/V row is read once per group.

use std::cell::Cell;

use rayon::prelude::*;

use crate::dot8;
use crate::math::exp_sub_sum;
use crate::path::{kernel_path, multiversion, KernelPath};

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

thread_local! {
    /// Scores of the current (token, KV head) group, reused so no call allocates per head.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
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
    attention_with(kernel_path(), q, token_slots, k_cache, v_cache, shape, out);
}

/// [`attention`] on a given path (tests and benchmarks compare paths in one process).
///
/// # Panics
/// As [`attention`]; and if `path` is not supported by this CPU.
pub fn attention_with(
    path: KernelPath,
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
    assert!(
        path.supported(),
        "kernel path {path} is not supported by this CPU"
    );
    if q.is_empty() {
        return;
    }
    let kv_row = num_kv_heads * head_dim;
    for slots in token_slots {
        // One check here keeps the inner loops free of per-key bounds logic.
        if let Some(&s) = slots.iter().max() {
            assert!(
                (s as usize + 1) * kv_row <= k_cache.len(),
                "slot {s} out of cache"
            );
        }
    }
    let g = Group {
        k_cache,
        v_cache,
        kv_row,
        head_dim,
        heads: num_heads / num_kv_heads,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    // The query heads of one KV head are adjacent, so (token, KV head) owns one output chunk.
    let width = g.heads * head_dim;
    let one = |(idx, o): (usize, &mut [f32])| {
        let (t, kvh) = (idx / num_kv_heads, idx % num_kv_heads);
        let qg = &q[t * q_width + kvh * width..t * q_width + (kvh + 1) * width];
        let mut scores = SCORES.take();
        match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` is only chosen (and run, see the assert above) when the CPU
            // reports avx512f, avx2 and fma.
            KernelPath::Avx512 => unsafe {
                g.attend_avx512(qg, token_slots[t], kvh, &mut scores, o)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for avx2 and fma.
            KernelPath::Avx2 => unsafe { g.attend_avx2(qg, token_slots[t], kvh, &mut scores, o) },
            _ => attend_generic(path, &g, qg, token_slots[t], kvh, &mut scores, o),
        }
        SCORES.set(scores);
    };
    let work: usize = token_slots.iter().map(|s| s.len()).sum::<usize>() * num_heads;
    if work * head_dim >= 1 << 16 {
        out.par_chunks_mut(width).enumerate().for_each(one);
    } else {
        out.chunks_mut(width).enumerate().for_each(one);
    }
}

/// What every (token, KV head) group shares.
struct Group<'a> {
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    kv_row: usize,
    head_dim: usize,
    /// Query heads per KV head.
    heads: usize,
    scale: f32,
}

multiversion! {
    /// `attend` with the portable dot (portable and NEON paths).
    fn attend_generic(
        g: &Group<'_>,
        qg: &[f32],
        slots: &[u32],
        kvh: usize,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) => attend_portable;
}

#[inline(always)]
fn attend_portable(
    g: &Group<'_>,
    qg: &[f32],
    slots: &[u32],
    kvh: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    g.attend::<false>(qg, slots, kvh, scores, out)
}

impl Group<'_> {
    /// `attend` compiled for AVX-512. Same source, no fast-math, so the same IEEE operations in
    /// the same order: only the vector width differs, never a result.
    ///
    /// # Safety
    /// The CPU must support avx512f, avx2 and fma.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn attend_avx512(
        &self,
        qg: &[f32],
        slots: &[u32],
        kvh: usize,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        self.attend::<true>(qg, slots, kvh, scores, out)
    }

    /// `attend` compiled for AVX2 + FMA.
    ///
    /// # Safety
    /// The CPU must support avx2 and fma.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn attend_avx2(
        &self,
        qg: &[f32],
        slots: &[u32],
        kvh: usize,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        self.attend::<true>(qg, slots, kvh, scores, out)
    }

    /// All query heads of KV head `kvh` for one token: each K/V row is loaded once for the
    /// group, and four keys are scored at a time (independent chains), while each head's
    /// reduction keeps the contract order (8-lane dot, position order everywhere).
    /// `SIMD` selects the explicit AVX dot (only when the caller runs under avx512f).
    #[inline(always)]
    fn attend<const SIMD: bool>(
        &self,
        qg: &[f32],
        slots: &[u32],
        kvh: usize,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let (d, n, heads) = (self.head_dim, slots.len(), self.heads);
        let base = kvh * d;
        let krow = |s: u32| &self.k_cache[s as usize * self.kv_row + base..][..d];
        let vrow = |s: u32| &self.v_cache[s as usize * self.kv_row + base..][..d];
        scores.clear();
        scores.resize(heads * n, 0.0);
        let mut i = 0;
        if d.is_multiple_of(8) {
            while i + 4 <= n {
                let ks = [
                    krow(slots[i]),
                    krow(slots[i + 1]),
                    krow(slots[i + 2]),
                    krow(slots[i + 3]),
                ];
                for j in 0..heads {
                    let qj = &qg[j * d..(j + 1) * d];
                    let dots = if SIMD {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `SIMD` is only set by `attend_avx512` and `attend_avx2`, which
                        // require avx2 (hence avx); `d` is a multiple of 8 and every row holds
                        // `d` floats.
                        unsafe {
                            avx::dot8x4(qj, ks)
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        dot8x4(qj, ks)
                    } else {
                        dot8x4(qj, ks)
                    };
                    for (u, v) in dots.into_iter().enumerate() {
                        scores[j * n + i + u] = v * self.scale;
                    }
                }
                i += 4;
            }
        }
        for (i, &s) in slots.iter().enumerate().skip(i) {
            let k = krow(s);
            for j in 0..heads {
                scores[j * n + i] = dot8(&qg[j * d..(j + 1) * d], k) * self.scale;
            }
        }
        let mut inv = [0f32; MAX_GROUP];
        let inv = if heads <= MAX_GROUP {
            &mut inv[..heads]
        } else {
            // Unusual GQA ratios: correctness over speed.
            return self.attend_heads_one_by_one(scores, slots, out, base);
        };
        for (j, inv) in inv.iter_mut().enumerate() {
            let sc = &mut scores[j * n..(j + 1) * n];
            let max = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            *inv = 1.0 / exp_sub_sum(sc, max);
        }
        out.fill(0.0);
        for (i, &s) in slots.iter().enumerate() {
            let v = vrow(s);
            for (j, o) in out.chunks_exact_mut(d).enumerate() {
                let p = scores[j * n + i];
                for (acc, &x) in o.iter_mut().zip(v) {
                    *acc += p * x;
                }
            }
        }
        for (o, &inv) in out.chunks_exact_mut(d).zip(inv.iter()) {
            for acc in o.iter_mut() {
                *acc *= inv;
            }
        }
    }

    /// Softmax and V of each head on its own (for groups wider than `MAX_GROUP`).
    fn attend_heads_one_by_one(
        &self,
        scores: &mut [f32],
        slots: &[u32],
        out: &mut [f32],
        base: usize,
    ) {
        let (d, n) = (self.head_dim, slots.len());
        for (j, o) in out.chunks_exact_mut(d).enumerate() {
            let sc = &mut scores[j * n..(j + 1) * n];
            let max = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum = exp_sub_sum(sc, max);
            o.fill(0.0);
            for (&s, &p) in slots.iter().zip(sc.iter()) {
                let v = &self.v_cache[s as usize * self.kv_row + base..][..d];
                for (acc, &x) in o.iter_mut().zip(v) {
                    *acc += p * x;
                }
            }
            let inv = 1.0 / sum;
            for acc in o.iter_mut() {
                *acc *= inv;
            }
        }
    }
}

/// Query heads per KV head handled together; wider groups take the one-by-one path.
const MAX_GROUP: usize = 16;

/// `dot8(q, k[u])` for four keys at once (four independent accumulator chains), each in exactly
/// the order of `dot8`. `q.len()` must be a multiple of 8 and equal every `k[u].len()`.
#[inline(always)]
fn dot8x4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
    let mut acc = [[0f32; 8]; 4];
    for (c, qc) in q.chunks_exact(8).enumerate() {
        for u in 0..4 {
            let kc = &k[u][c * 8..c * 8 + 8];
            for l in 0..8 {
                acc[u][l] += qc[l] * kc[l];
            }
        }
    }
    acc.map(|a| ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])))
}

#[cfg(target_arch = "x86_64")]
mod avx {
    //! `dot8x4` with 8-lane AVX vectors: lane `l` of a key's accumulator is its `acc[l]`, and
    //! separate multiply and add (no fma) keep every rounding of the scalar form.
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support avx; `q.len()` must be a multiple of 8 and every `k[u]` as long.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn dot8x4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        debug_assert!(q.len().is_multiple_of(8) && k.iter().all(|r| r.len() == q.len()));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut c = 0;
        while c < q.len() {
            // SAFETY: c + 8 <= len of q and of every key row (function contract).
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                for u in 0..4 {
                    let kv = _mm256_loadu_ps(k[u].as_ptr().add(c));
                    acc[u] = _mm256_add_ps(acc[u], _mm256_mul_ps(qv, kv));
                }
            }
            c += 8;
        }
        // ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as `dot8`.
        let mut out = [0f32; 4];
        for (o, a) in out.iter_mut().zip(acc) {
            let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let p = _mm_add_ps(h, _mm_movehl_ps(h, h));
            *o = _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps::<1>(p, p)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The straightforward one-head-at-a-time form of the contract order.
    fn reference(
        q: &[f32],
        token_slots: &[&[u32]],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: AttnShape,
    ) -> Vec<f32> {
        let (nh, d) = (shape.num_heads, shape.head_dim);
        let group = nh / shape.num_kv_heads;
        let kv_row = shape.num_kv_heads * d;
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; q.len()];
        for (idx, o) in out.chunks_mut(d).enumerate() {
            let (t, h) = (idx / nh, idx % nh);
            let qv = &q[(t * nh + h) * d..(t * nh + h + 1) * d];
            let kvh = h / group;
            let mut scores = Vec::new();
            let mut max = f32::NEG_INFINITY;
            for &s in token_slots[t] {
                let b = s as usize * kv_row + kvh * d;
                let sc = dot8(qv, &k_cache[b..b + d]) * scale;
                max = max.max(sc);
                scores.push(sc);
            }
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = crate::math::exp_fixed(*sc - max);
                sum += *sc;
            }
            for (&s, &p) in token_slots[t].iter().zip(&scores) {
                let b = s as usize * kv_row + kvh * d;
                for (acc, &v) in o.iter_mut().zip(&v_cache[b..b + d]) {
                    *acc += p * v;
                }
            }
            let inv = 1.0 / sum;
            for acc in o.iter_mut() {
                *acc *= inv;
            }
        }
        out
    }

    #[test]
    fn grouped_kernel_equals_reference_bits() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for &(nh, nkv, d, n) in &[
            (4, 2, 8, 10),
            (8, 4, 64, 37),
            (6, 6, 12, 9),
            (8, 1, 16, 5),
            (32, 1, 8, 7),
        ] {
            let shape = AttnShape {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
            };
            let kv_row = nkv * d;
            let k: Vec<f32> = (0..n * kv_row).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let v: Vec<f32> = (0..n * kv_row).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let seq: Vec<u32> = (0..n as u32).map(|i| (i * 5 + 2) % n as u32).collect();
            let toks: Vec<&[u32]> = (0..n).map(|p| &seq[..=p]).collect();
            let q: Vec<f32> = (0..n * nh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let want = reference(&q, &toks, &k, &v, shape);
            for imp in KernelPath::all_supported() {
                let mut out = vec![0f32; q.len()];
                attention_with(imp, &q, &toks, &k, &v, shape, &mut out);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "{imp:?} {nh}/{nkv}x{d}, {n} keys");
            }
        }
    }

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
        // The portable build gives the same bits.
        let mut portable = vec![0f32; q.len()];
        attention_with(
            KernelPath::Portable,
            &q,
            &toks,
            &k,
            &v,
            shape,
            &mut portable,
        );
        assert_eq!(
            portable.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
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
