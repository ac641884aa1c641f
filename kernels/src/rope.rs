//! Rotary position embedding in the Hugging Face rotate-half layout: for head dim `d` the pairs
//! are `(i, i + d/2)` with `inv_freq[i] = theta^(-2i/d)`.

/// The default (unscaled) inverse frequencies `[head_dim/2]`: `inv_freq[i] = theta^(-2i/d)`,
/// each formed in f32 as Hugging Face forms them. A model with RoPE scaling adjusts these and
/// hands them to [`rope_tables_from_freqs_into`].
pub fn rope_inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}

/// cos/sin tables `[positions.len(), head_dim/2]`. Angles are formed in f32 as Hugging Face
/// does (`pos * inv_freq`), then cos/sin are taken in f64 and rounded, so a table entry depends
/// only on (position, i).
pub fn rope_tables(positions: &[usize], head_dim: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    rope_tables_into(positions, head_dim, theta, &mut cos, &mut sin);
    (cos, sin)
}

/// [`rope_tables`] into reused buffers (cleared first), so a step allocates nothing.
pub fn rope_tables_into(
    positions: &[usize],
    head_dim: usize,
    theta: f32,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    rope_tables_from_freqs_into(positions, &rope_inv_freq(head_dim, theta), cos, sin)
}

/// The tables of [`rope_tables`] from given inverse frequencies (one per rotated pair, so
/// `inv_freq.len()` is `head_dim/2`): what a scaled RoPE (Llama 3, linear, …) needs.
pub fn rope_tables_from_freqs_into(
    positions: &[usize],
    inv_freq: &[f32],
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    let half = inv_freq.len();
    cos.clear();
    cos.resize(positions.len() * half, 0.0);
    sin.clear();
    sin.resize(positions.len() * half, 0.0);
    for (i, &f) in inv_freq.iter().enumerate() {
        for (t, &p) in positions.iter().enumerate() {
            let angle = (p as f32 * f) as f64;
            cos[t * half + i] = angle.cos() as f32;
            sin[t * half + i] = angle.sin() as f32;
        }
    }
}

use crate::path::{kernel_path, multiversion};

/// Rotates `x` (`[tokens, heads, head_dim]`) in place; token `t` uses row `t` of the tables.
pub fn apply_rope(x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
    apply_rope_with(kernel_path(), x, heads, head_dim, cos, sin)
}

multiversion! {
    /// [`apply_rope`] on a given path.
    pub fn apply_rope_with(
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
    ) => apply_rope_body;
}

#[inline(always)]
fn apply_rope_body(x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    let tokens = cos.len() / half.max(1);
    assert_eq!(x.len(), tokens * heads * head_dim, "rope shape");
    assert_eq!(sin.len(), cos.len(), "rope tables");
    for (t, xt) in x.chunks_mut(heads * head_dim).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in xt.chunks_exact_mut(head_dim) {
            let (lo, hi) = head.split_at_mut(half);
            for (((l, h), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(c).zip(s) {
                let (a, b) = (*l, *h);
                *l = a * c - b * s;
                *h = b * c + a * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_rotation_preserves_norm() {
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let orig = x.clone();
        let (c, s) = rope_tables(&[0, 5], 8, 10000.0);
        apply_rope(&mut x, 1, 8, &c, &s);
        assert_eq!(&x[..8], &orig[..8]);
        let n0: f32 = orig[8..].iter().map(|v| v * v).sum();
        let n1: f32 = x[8..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // Pair (0, 4) at position 5 with inv_freq 1 rotates by 5 radians.
        let (a, b) = (orig[8], orig[12]);
        assert!((x[8] - (a * 5f32.cos() - b * 5f32.sin())).abs() < 1e-5);
    }

    #[test]
    fn every_path_gives_the_same_bits() {
        let (heads, d) = (3, 24);
        let x0: Vec<f32> = (0..4 * heads * d).map(|i| (i as f32 * 0.7).cos()).collect();
        let (c, s) = rope_tables(&[0, 3, 900, 4095], d, 10000.0);
        let mut want = x0.clone();
        apply_rope_with(crate::KernelPath::Portable, &mut want, heads, d, &c, &s);
        for p in crate::KernelPath::all_supported() {
            let mut x = x0.clone();
            apply_rope_with(p, &mut x, heads, d, &c, &s);
            assert_eq!(x, want, "{p}");
        }
    }
}
