//! Element-wise ops of the Llama block (SwiGLU, Gemma's GeGLU, residual add) and argmax over
//! logits.

use crate::math::exp_fixed;
use crate::path::{kernel_path, multiversion};

/// SwiGLU: `out[t, i] = silu(gu[t, i]) * gu[t, inter + i]` for `gu` = `[tokens, 2·inter]` holding
/// the fused gate and up projections.
pub fn silu_mul(gu: &[f32], inter: usize, out: &mut [f32]) {
    silu_mul_with(kernel_path(), gu, inter, out)
}

multiversion! {
    /// [`silu_mul`] on a given path.
    pub fn silu_mul_with(gu: &[f32], inter: usize, out: &mut [f32]) => silu_mul_body;
}

#[inline(always)]
fn silu_mul_body(gu: &[f32], inter: usize, out: &mut [f32]) {
    assert!(inter > 0 && gu.len() == out.len() * 2, "silu_mul shape");
    for (g, o) in gu.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
        let (gate, up) = g.split_at(inter);
        for ((o, &x), &u) in o.iter_mut().zip(gate).zip(up) {
            *o = x / (1.0 + exp_fixed(-x)) * u;
        }
    }
}

/// GeGLU with the tanh approximation of GELU (Gemma's `gelu_pytorch_tanh`):
/// `out[t, i] = gelu_tanh(gu[t, i]) * gu[t, inter + i]`, `gu` holding the fused gate and up
/// projections as for [`silu_mul`]. One scalar `tanh` per element (the same bits on every path).
pub fn gelu_tanh_mul(gu: &[f32], inter: usize, out: &mut [f32]) {
    assert!(
        inter > 0 && gu.len() == out.len() * 2,
        "gelu_tanh_mul shape"
    );
    // sqrt(2/π), as PyTorch rounds it to f32.
    const K: f32 = 0.797_884_6;
    for (g, o) in gu.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
        let (gate, up) = g.split_at(inter);
        for ((o, &x), &u) in o.iter_mut().zip(gate).zip(up) {
            let inner = K * (x + 0.044715 * x * x * x);
            *o = 0.5 * x * (1.0 + inner.tanh()) * u;
        }
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    add_inplace_with(kernel_path(), x, y)
}

multiversion! {
    /// [`add_inplace`] on a given path.
    pub fn add_inplace_with(x: &mut [f32], y: &[f32]) => add_inplace_body;
}

#[inline(always)]
fn add_inplace_body(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add shape");
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Softmax weights of one row of logits: `out[i] = exp_fixed((x[i] - max) · inv_temp)`; returns
/// their sum, in f64 over 8 lanes (element `i` into lane `i % 8`, in index order) closed by a
/// fixed tree, so every path gives the same bits. `max` is the row's maximum (the largest
/// weight is then exactly 1).
///
/// # Panics
/// If `out.len() != x.len()`.
pub fn softmax_weights(x: &[f32], max: f32, inv_temp: f32, out: &mut [f32]) -> f64 {
    softmax_weights_with(kernel_path(), x, max, inv_temp, out)
}

multiversion! {
    /// [`softmax_weights`] on a given path.
    pub fn softmax_weights_with(x: &[f32], max: f32, inv_temp: f32, out: &mut [f32]) -> f64
        => softmax_weights_body;
}

#[inline(always)]
fn softmax_weights_body(x: &[f32], max: f32, inv_temp: f32, out: &mut [f32]) -> f64 {
    assert_eq!(x.len(), out.len(), "softmax_weights shape");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_fixed((v - max) * inv_temp);
    }
    let mut acc = [0f64; 8];
    let mut chunks = out.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l] as f64;
        }
    }
    for (l, &v) in chunks.remainder().iter().enumerate() {
        acc[l] += v as f64;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Index of the largest value, ties to the lowest index; NaNs are never chosen unless all are.
pub fn argmax(x: &[f32]) -> usize {
    argmax_with(kernel_path(), x)
}

multiversion! {
    /// [`argmax`] on a given path (the same index on every path: only comparisons).
    pub fn argmax_with(x: &[f32]) -> usize => argmax_body;
}

/// Lanes of the first pass: as many as two AVX-512 registers, so the compares vectorize.
const ARGMAX_LANES: usize = 32;

/// Two passes, each a plain compare the compiler vectorizes (the one pass it replaces was a
/// compare and a branch per element, scalar): the largest value that is not NaN, then its
/// first index. A row with no number at all (every entry NaN) gives 0.
#[inline(always)]
fn argmax_body(x: &[f32]) -> usize {
    let mut lanes = [f32::NEG_INFINITY; ARGMAX_LANES];
    let chunks = x.chunks_exact(ARGMAX_LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // `v > m` is false for NaN: a NaN never becomes the maximum.
            *m = if v > *m { v } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    // Ties (and -0.0 against 0.0, which compare equal) go to the lowest index, as one pass of
    // `v > best` would have them.
    x.iter().position(|&v| v == max).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_tanh_is_the_tanh_gelu_times_up() {
        // Known values of 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))) (f64), times up = 2.
        let cases = [
            (0.0f32, 0.0f64),
            (1.0, 0.841_191_990_608),
            (-1.0, -0.158_808_009_392),
            (3.0, 2.996_362_607_918),
            (-4.0, -7.024_594_8e-5),
        ];
        let gate: Vec<f32> = cases.iter().map(|c| c.0).collect();
        let mut gu = gate.clone();
        gu.extend(std::iter::repeat_n(2.0, gate.len()));
        let mut out = vec![0f32; gate.len()];
        gelu_tanh_mul(&gu, gate.len(), &mut out);
        for ((_, want), got) in cases.iter().zip(&out) {
            assert!(
                (*got as f64 - 2.0 * want).abs() < 1e-5,
                "{got} vs {}",
                2.0 * want
            );
        }
    }

    #[test]
    fn argmax_ties_low_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    /// The one-pass rule the two passes replace: the first index of a value larger than every
    /// earlier one, NaN skipped.
    fn argmax_one_pass(x: &[f32]) -> usize {
        let (mut best, mut best_v, mut found) = (0, f32::NEG_INFINITY, false);
        for (i, &v) in x.iter().enumerate() {
            if v > best_v || (!found && !v.is_nan()) {
                (best, best_v, found) = (i, v, true);
            }
        }
        best
    }

    #[test]
    fn argmax_is_the_one_pass_rule_on_every_path() {
        let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0, 0.0, 7.0];
        for len in [0, 1, 31, 32, 33, 100, 8192] {
            for seed in 0..40usize {
                // Few distinct values, so ties are common, with NaN, ±inf and ±0 sprinkled in.
                let x: Vec<f32> = (0..len)
                    .map(|i| {
                        let h = (i * 2654435761 + seed * 40503) % 1009;
                        match h % 11 {
                            0 => specials[(h / 11) % specials.len()],
                            _ if seed % 5 == 0 => f32::NAN,
                            _ => (h % 7) as f32 - 3.0,
                        }
                    })
                    .collect();
                let want = argmax_one_pass(&x);
                for path in crate::KernelPath::all_supported() {
                    assert_eq!(argmax_with(path, &x), want, "{path} len {len} seed {seed}");
                }
            }
        }
    }

    #[test]
    fn softmax_weights_match_exp_and_agree_on_every_path() {
        let x: Vec<f32> = (0..1003)
            .map(|i| ((i * 37) % 101) as f32 * 0.13 - 6.0)
            .collect();
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut want = vec![0f32; x.len()];
        let sum = softmax_weights_with(crate::KernelPath::Portable, &x, max, 0.7, &mut want);
        let exact: f64 = x.iter().map(|&v| ((v - max) as f64 * 0.7).exp()).sum();
        assert!((sum - exact).abs() < 1e-5 * exact, "{sum} vs {exact}");
        assert!(want.contains(&1.0));
        for path in crate::KernelPath::all_supported() {
            let mut got = vec![0f32; x.len()];
            let s = softmax_weights_with(path, &x, max, 0.7, &mut got);
            assert_eq!(s.to_bits(), sum.to_bits(), "{path}");
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{path}"
            );
        }
    }

    #[test]
    fn silu_mul_matches_formula() {
        let gu = [1.0f32, -2.0, 3.0, 4.0];
        let mut o = [0f32; 2];
        silu_mul(&gu, 2, &mut o);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert!((o[0] - silu(1.0) * 3.0).abs() < 1e-6);
        assert!((o[1] - silu(-2.0) * 4.0).abs() < 1e-6);
    }

    #[test]
    fn every_path_gives_the_same_bits() {
        let inter = 37;
        let gu: Vec<f32> = (0..3 * 2 * inter)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 40.0)
            .collect();
        let y: Vec<f32> = (0..3 * inter).map(|i| (i as f32).sin()).collect();
        use crate::KernelPath;
        let run = |p: KernelPath| {
            let mut o = vec![0f32; 3 * inter];
            silu_mul_with(p, &gu, inter, &mut o);
            add_inplace_with(p, &mut o, &y);
            o.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let want = run(KernelPath::Portable);
        for p in KernelPath::all_supported() {
            assert_eq!(run(p), want, "{p}");
        }
    }
}
