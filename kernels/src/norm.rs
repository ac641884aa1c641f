//! Row-wise RMSNorm (Llama): `y = w ⊙ x / sqrt(mean(x²) + eps)`, each row reduced on its own.

use rayon::prelude::*;

use crate::path::{kernel_path, multiversion, KernelPath};

/// Normalises each row of `x` (`[rows, dim]`) into `y`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, y: &mut [f32]) {
    rmsnorm_with(kernel_path(), x, weight, eps, y)
}

multiversion! {
    /// One row of [`rmsnorm`].
    fn rmsnorm_row(xr: &[f32], weight: &[f32], eps: f32, yr: &mut [f32]) => rmsnorm_row_body;
}

#[inline(always)]
fn rmsnorm_row_body(xr: &[f32], weight: &[f32], eps: f32, yr: &mut [f32]) {
    let ms = dot8(xr, xr) / weight.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &w) in yr.iter_mut().zip(xr).zip(weight) {
        *o = w * (v * inv);
    }
}

/// [`rmsnorm`] on a given path.
pub fn rmsnorm_with(path: KernelPath, x: &[f32], weight: &[f32], eps: f32, y: &mut [f32]) {
    let dim = weight.len();
    assert!(
        dim > 0 && x.len().is_multiple_of(dim) && y.len() == x.len(),
        "rmsnorm shape"
    );
    let row = |(xr, yr): (&[f32], &mut [f32])| rmsnorm_row(path, xr, weight, eps, yr);
    // Threads only pay off for many rows; per-row math is the same either way.
    if x.len() / dim >= 64 {
        x.par_chunks(dim).zip(y.par_chunks_mut(dim)).for_each(row);
    } else {
        x.chunks(dim).zip(y.chunks_mut(dim)).for_each(row);
    }
}

/// Sum of products over 8 lanes with plain multiply and add, then a fixed tree: fast on the
/// portable build without FMA, and deterministic.
#[inline]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ac = a.chunks_exact(8);
    let mut bc = b.chunks_exact(8);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ac.remainder().iter().zip(bc.remainder()).enumerate() {
        acc[l] += x * y;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive() {
        let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..12).map(|i| 1.0 + i as f32 * 0.1).collect();
        let mut y = vec![0f32; 24];
        rmsnorm(&x, &w, 1e-5, &mut y);
        for r in 0..2 {
            let row = &x[r * 12..(r + 1) * 12];
            let ms: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 12.0;
            for i in 0..12 {
                let e = w[i] as f64 * row[i] as f64 / (ms + 1e-5).sqrt();
                assert!((y[r * 12 + i] as f64 - e).abs() < 1e-5);
            }
        }
        for p in KernelPath::all_supported() {
            let mut yp = vec![0f32; 24];
            rmsnorm_with(p, &x, &w, 1e-5, &mut yp);
            assert_eq!(
                yp.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{p}"
            );
        }
    }
}
