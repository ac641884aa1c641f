//! Batch-invariant f32 GEMM for linear layers: `y[M,N] = x[M,K] · W[N,K]^T (+ bias)`.
//!
//! Design: every output element is one dot product over the whole of `k`, reduced in a fixed
//! order that depends only on `K`:
//!   1. 16 lane accumulators; chunk `c` of 16 elements does `acc[l] = fma(x[16c+l], w[16c+l], acc[l])`;
//!      the last partial chunk is zero-padded (so no scalar tail with its own order);
//!   2. a fixed pairwise tree over the 16 lanes (`hsum16`), then `+ bias`.
//!
//! `K` is never split, so the value of `y[m][n]` does not depend on `M`, on the tile a thread
//! computes, on the register block shape or on the thread count. The AVX-512 path and the
//! portable path perform the identical sequence of fused multiply-adds and therefore agree bit
//! for bit (`f32::mul_add` is a correctly rounded fma, like `vfmadd`), which the tests check.
//!
//! Cost: O(M·N·K); parallel over (M tile × N tile) tasks with rayon, register-blocked 4×4.

use rayon::prelude::*;

/// Lanes of the fixed-order reduction. Part of the numeric contract: changing it changes results.
pub const LANES: usize = 16;

/// Rows of `x` per register block.
const MR: usize = 4;
/// Rows of `W` per register block.
const NR: usize = 4;
/// Rows of `x` per parallel task (the x tile stays in L2 while W rows stream through L1).
const M_TILE: usize = 64;

/// Which implementation runs. Chosen once per process, so every call (every batch size) uses the
/// same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmImpl {
    Portable,
    Avx512,
}

/// The implementation this machine uses.
pub fn gemm_impl() -> GemmImpl {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<GemmImpl> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return GemmImpl::Avx512;
            }
        }
        GemmImpl::Portable
    })
}

/// The fixed pairwise lane tree shared by every path.
#[inline]
fn hsum16(a: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = a[i] + a[i + 8];
    }
    let mut s4 = [0f32; 4];
    for i in 0..4 {
        s4[i] = s8[i] + s8[i + 4];
    }
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// One dot product in the contract order, portable. Also the reference for the SIMD paths.
pub fn dot_fixed(x: &[f32], w: &[f32]) -> f32 {
    assert_eq!(x.len(), w.len());
    let mut acc = [0f32; LANES];
    let mut xc = x.chunks_exact(LANES);
    let mut wc = w.chunks_exact(LANES);
    for (xs, ws) in (&mut xc).zip(&mut wc) {
        for l in 0..LANES {
            acc[l] = xs[l].mul_add(ws[l], acc[l]);
        }
    }
    let (xr, wr) = (xc.remainder(), wc.remainder());
    if !xr.is_empty() {
        for l in 0..LANES {
            let (a, b) = if l < xr.len() {
                (xr[l], wr[l])
            } else {
                (0.0, 0.0)
            };
            acc[l] = a.mul_add(b, acc[l]);
        }
    }
    hsum16(&acc)
}

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (row, column) ranges of the output, see `linear`.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no element is written by two tasks or read while written.
unsafe impl Sync for OutPtr {}

/// `y[M,N] = x[M,K] · W[N,K]^T + bias`. `x` is row-major `[m, k]`, `w` row-major `[n, k]`
/// (Hugging Face `[out, in]`), `y` row-major `[m, n]`.
///
/// # Panics
/// If the slice lengths do not match the shapes (a caller bug, never external input).
pub fn linear(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert_eq!(x.len(), m * k, "x shape");
    assert_eq!(w.len(), n * k, "w shape");
    assert_eq!(y.len(), m * n, "y shape");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias shape");
    }
    if m == 0 || n == 0 {
        return;
    }
    let imp = gemm_impl();
    let threads = rayon::current_num_threads().max(1);
    let m_tiles = m.div_ceil(M_TILE);
    // Enough N tiles to keep every thread busy (×4 for balance), in multiples of NR, and small
    // enough that a 4-row block of W for all of K stays hot in L1/L2.
    let want_tasks = threads * 4;
    let n_tiles_wanted = want_tasks.div_ceil(m_tiles).max(1);
    let mut n_tile = n.div_ceil(n_tiles_wanted).next_multiple_of(NR).max(NR);
    n_tile = n_tile.min(256);
    let n_tiles = n.div_ceil(n_tile);
    let out = OutPtr(y.as_mut_ptr());
    let run = |task: usize| {
        let (mt, nt) = (task / n_tiles, task % n_tiles);
        let m0 = mt * M_TILE;
        let m1 = (m0 + M_TILE).min(m);
        let n0 = nt * n_tile;
        let n1 = (n0 + n_tile).min(n);
        // SAFETY: this task is the only writer of rows m0..m1 × columns n0..n1 of `y`, and `y`
        // outlives the parallel loop (it is borrowed mutably for the whole call).
        unsafe { tile(imp, x, k, w, bias, out, n, m0, m1, n0, n1) };
    };
    let tasks = m_tiles * n_tiles;
    if tasks == 1 {
        run(0);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// Computes one output tile.
///
/// # Safety
/// `out` must point to an `[?, ldy]` row-major buffer covering rows `m0..m1`, columns `n0..n1`,
/// which no other thread accesses during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    imp: GemmImpl,
    x: &[f32],
    k: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    out: OutPtr,
    ldy: usize,
    m0: usize,
    m1: usize,
    n0: usize,
    n1: usize,
) {
    let mut nb = n0;
    while nb < n1 {
        let nr = NR.min(n1 - nb);
        let mut mb = m0;
        while mb < m1 {
            let mr = MR.min(m1 - mb);
            let mut res = [[0f32; NR]; MR];
            match imp {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Avx512` is only chosen when the CPU reports avx512f; rows are in bounds
                // because mb+mr <= m and nb+nr <= n.
                GemmImpl::Avx512 => unsafe { avx512::block(x, w, k, mb, mr, nb, nr, &mut res) },
                _ => portable_block(x, w, k, mb, mr, nb, nr, &mut res),
            }
            for (i, row) in res.iter().enumerate().take(mr) {
                for (j, &v) in row.iter().enumerate().take(nr) {
                    let v = match bias {
                        Some(b) => v + b[nb + j],
                        None => v,
                    };
                    // SAFETY: (mb+i, nb+j) lies in this task's tile, see the function contract.
                    unsafe { *out.0.add((mb + i) * ldy + nb + j) = v };
                }
            }
            mb += mr;
        }
        nb += nr;
    }
}

#[allow(clippy::too_many_arguments)]
fn portable_block(
    x: &[f32],
    w: &[f32],
    k: usize,
    mb: usize,
    mr: usize,
    nb: usize,
    nr: usize,
    res: &mut [[f32; NR]; MR],
) {
    for i in 0..mr {
        let xr = &x[(mb + i) * k..(mb + i + 1) * k];
        for j in 0..nr {
            res[i][j] = dot_fixed(xr, &w[(nb + j) * k..(nb + j + 1) * k]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 register-blocked kernel; same FMA sequence as `dot_fixed`.
    // Index loops over the (i, j) register block read like the math and unroll fully.
    #![allow(clippy::needless_range_loop)]
    use super::{hsum16, LANES, MR, NR};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support avx512f; `mb+mr` rows of `x` and `nb+nr` rows of `w` must exist.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block(
        x: &[f32],
        w: &[f32],
        k: usize,
        mb: usize,
        mr: usize,
        nb: usize,
        nr: usize,
        res: &mut [[f32; NR]; MR],
    ) {
        // Full 4×4 blocks get the unrolled kernel; edges use the generic one. Both perform the
        // same per-element FMA sequence, so the result never depends on which one ran.
        // Full-width blocks keep NR independent FMA chains per x row even when M is 1 (decode),
        // which hides FMA latency; only the ragged N edge falls back to single dots.
        if nr == NR {
            // SAFETY: forwarded contract (mr rows from mb, NR rows from nb exist).
            unsafe {
                match mr {
                    1 => block_n::<1, NR>(x, w, k, mb, nb, res),
                    2 => block_n::<2, NR>(x, w, k, mb, nb, res),
                    3 => block_n::<3, NR>(x, w, k, mb, nb, res),
                    _ => block_n::<MR, NR>(x, w, k, mb, nb, res),
                }
            }
        } else {
            for i in 0..mr {
                for j in 0..nr {
                    let mut one = [[0f32; NR]; MR];
                    // SAFETY: row mb+i of x and row nb+j of w exist.
                    unsafe { block_n::<1, 1>(x, w, k, mb + i, nb + j, &mut one) };
                    res[i][j] = one[0][0];
                }
            }
        }
    }

    /// # Safety
    /// As `block`, with `A` rows from `mb` and `B` rows from `nb`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block_n<const A: usize, const B: usize>(
        x: &[f32],
        w: &[f32],
        k: usize,
        mb: usize,
        nb: usize,
        res: &mut [[f32; NR]; MR],
    ) {
        debug_assert!((mb + A) * k <= x.len() && (nb + B) * k <= w.len());
        let xp = x.as_ptr();
        let wp = w.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); B]; A];
        let full = k / LANES;
        for c in 0..full {
            let off = c * LANES;
            let mut xv = [_mm512_setzero_ps(); A];
            for (i, v) in xv.iter_mut().enumerate() {
                // SAFETY: off+16 <= k, row mb+i exists (function contract).
                *v = unsafe { _mm512_loadu_ps(xp.add((mb + i) * k + off)) };
            }
            for j in 0..B {
                // SAFETY: as above for row nb+j of w.
                let wv = unsafe { _mm512_loadu_ps(wp.add((nb + j) * k + off)) };
                for i in 0..A {
                    acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                }
            }
        }
        let rem = k - full * LANES;
        if rem > 0 {
            let off = full * LANES;
            let mask: __mmask16 = ((1u32 << rem) - 1) as __mmask16;
            let mut xv = [_mm512_setzero_ps(); A];
            for (i, v) in xv.iter_mut().enumerate() {
                // SAFETY: masked load reads only the `rem` in-bounds elements of the row.
                *v = unsafe { _mm512_maskz_loadu_ps(mask, xp.add((mb + i) * k + off)) };
            }
            for j in 0..B {
                // SAFETY: as above.
                let wv = unsafe { _mm512_maskz_loadu_ps(mask, wp.add((nb + j) * k + off)) };
                for i in 0..A {
                    acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                }
            }
        }
        for i in 0..A {
            for j in 0..B {
                let mut lanes = [0f32; LANES];
                // SAFETY: `lanes` holds 16 f32.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[i][j]) };
                res[i][j] = hsum16(&lanes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_vec(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    fn naive(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, b: Option<&[f32]>) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[j * k + t] as f64;
                }
                y[i * n + j] = s + b.map_or(0.0, |b| b[j] as f64);
            }
        }
        y
    }

    #[test]
    fn linear_matches_naive_for_odd_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 17, 5),
            (7, 64, 33),
            (65, 100, 130),
            (2, 15, 9),
        ] {
            let x = rand_vec(&mut rng, m * k);
            let w = rand_vec(&mut rng, n * k);
            let b = rand_vec(&mut rng, n);
            let mut y = vec![0f32; m * n];
            linear(&x, m, k, &w, n, Some(&b), &mut y);
            let r = naive(&x, m, k, &w, n, Some(&b));
            for (a, e) in y.iter().zip(&r) {
                assert!(
                    (*a as f64 - e).abs() < 1e-4 * (k as f64).sqrt(),
                    "{m}x{k}x{n}: {a} vs {e}"
                );
            }
        }
    }

    #[test]
    fn rows_bit_identical_across_batch_sizes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let (k, n) = (200, 77);
        let x = rand_vec(&mut rng, 64 * k);
        let w = rand_vec(&mut rng, n * k);
        let mut y64 = vec![0f32; 64 * n];
        linear(&x, 64, k, &w, n, None, &mut y64);
        for m in [1usize, 37, 5] {
            let mut y = vec![0f32; m * n];
            linear(&x[..m * k], m, k, &w, n, None, &mut y);
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        y[i * n + j].to_bits(),
                        y64[i * n + j].to_bits(),
                        "m={m} ({i},{j})"
                    );
                }
            }
        }
        // Every SIMD result equals the portable contract order bit for bit.
        for i in 0..64 {
            for j in 0..n {
                let d = dot_fixed(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                assert_eq!(d.to_bits(), y64[i * n + j].to_bits());
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    /// `cargo test --release -p kernels gemm_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn gemm_speed() {
        for &(m, k, n) in &[
            (512, 512, 1536),
            (1, 512, 3072),
            (1, 1536, 512),
            (32, 512, 3072),
            (1, 512, 8192),
        ] {
            let x = vec![0.5f32; m * k];
            let w = vec![0.25f32; n * k];
            let mut y = vec![0f32; m * n];
            linear(&x, m, k, &w, n, None, &mut y);
            let reps = 20;
            let t = Instant::now();
            for _ in 0..reps {
                linear(&x, m, k, &w, n, None, &mut y);
            }
            let dt = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{m}x{k}x{n}: {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s of W",
                dt * 1e3,
                2.0 * (m * n * k) as f64 / dt / 1e9,
                (n * k * 4) as f64 / dt / 1e9
            );
        }
    }
}
