//! The bf16 compute mode of the GEMM (`--compute-dtype bf16`): activations rounded to bf16,
//! products of bf16 pairs accumulated in f32, as AVX512_BF16's `vdpbf16ps` computes them.
//! Opt-in; the default f32 contract of the parent module is untouched.
//!
//! Numeric contract (every path, bit for bit; a token's result still independent of its batch):
//!   1. each element of `x` is rounded to bf16, to nearest even ([`round_bf16`]); a result below
//!      bf16's smallest normal becomes a signed zero; NaN stays NaN;
//!   2. `W` holds bf16 values (a matrix stored as bf16: [`crate::WeightDtype::Bf16`]);
//!   3. `K` is zero-padded to whole windows of 32; lane `l` (of 16) of window `c` takes the pair of
//!      elements `32c + 2l` (even) and `32c + 2l + 1` (odd), and does, odd first,
//!      `acc[l] = ftz(fma(x_odd, w_odd, acc[l])); acc[l] = ftz(fma(x_even, w_even, acc[l]))`
//!      where a subnormal bf16 operand counts as a signed zero and `ftz` flushes a subnormal f32
//!      result to a signed zero: Intel's definition of `vdpbf16ps` (each step an FMA with DAZ,
//!      FTZ, round to nearest even; the product of two bf16 values is exact in f32). Checked on
//!      this project's AMD EPYC against the instruction on two million random vectors with
//!      subnormal, tiny and huge operands: equal bit for bit; the other orders are not;
//!   4. the fixed 16-lane tree of the f32 contract (`hsum16`, plain f32 adds), then `+ bias`.
//!
//! Paths: on a CPU with `avx512_bf16`, the AVX-512 path runs `vdpbf16ps` (two products per lane
//! per instruction: twice the f32 FMA rate); everywhere else (AVX-512 without it, AVX2, portable,
//! NEON) the same arithmetic is emulated with f32 FMAs and flushes ([`Bf16Dot`]), slower than
//! the f32 mode. AMX-BF16 tiles are not used (no CPU here has them to test on).
//!
//! Layout: `W` is the bf16 [`PackedMatrix`] as packed for the f32 mode (chunks of 16, so window
//! `c` of a row is its chunks `2c` and `2c + 1`; a last odd chunk has a zero partner); `x` is
//! rounded and packed per call in panels of `MR` rows by windows, `[panel][window][MR][32]`.

use std::cell::Cell;
use std::sync::OnceLock;

use super::{for_each_block, PackedMatrix, Panels, LANES, MR, NR, OUT_SLOTS, W_CHUNK};
use crate::path::{multiversion, KernelPath};
use crate::wdtype::Bf16;

/// Elements of one window: a lane's pair, 16 lanes.
const WINDOW: usize = 2 * LANES;
/// bf16 values of one window of an `x` panel.
const XW: usize = MR * WINDOW;

/// What the linear layers compute in (`--compute-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ComputeDtype {
    /// The exact f32 contract (weights widened exactly, products and sums in f32).
    #[default]
    F32,
    /// Activations rounded to bf16, bf16 weights, f32 accumulation (this module's contract).
    Bf16,
}

impl ComputeDtype {
    pub const ALL: [ComputeDtype; 2] = [ComputeDtype::F32, ComputeDtype::Bf16];

    /// `f32`, `bf16` (flags, logs, `/get_server_info`).
    pub fn name(self) -> &'static str {
        match self {
            ComputeDtype::F32 => "f32",
            ComputeDtype::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ComputeDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("{s:?} is not a compute dtype (f32, bf16)"))
    }
}

/// How the pair products are computed: the instruction, or its exact emulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Dot {
    /// `vdpbf16ps` (the AVX-512 path on a CPU with `avx512_bf16`).
    Instruction,
    /// f32 FMAs and flushes in the instruction's order (every path).
    Emulated,
}

impl Bf16Dot {
    /// Whether `path` can run this on this CPU.
    pub fn supported(self, path: KernelPath) -> bool {
        match self {
            Bf16Dot::Emulated => path.supported(),
            Bf16Dot::Instruction => path == KernelPath::Avx512 && cpu_has_dpbf16(),
        }
    }

    /// The instruction where `path` can run it, else the emulation.
    pub fn best(path: KernelPath) -> Bf16Dot {
        if Bf16Dot::Instruction.supported(path) {
            Bf16Dot::Instruction
        } else {
            Bf16Dot::Emulated
        }
    }
}

/// Whether the CPU has `vdpbf16ps` (AVX512_BF16).
pub fn cpu_has_dpbf16() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `v` rounded to bf16 (nearest, ties to even), as its bits; a result below bf16's smallest
/// normal is a signed zero (the instruction reads such an operand as zero anyway); NaN stays a
/// (quiet) NaN.
#[inline(always)]
pub fn round_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    let h = (rounded >> 16) as u16;
    if h & 0x7f80 == 0 {
        h & 0x8000
    } else {
        h
    }
}

/// `v`, or a signed zero where `v` is subnormal.
#[inline(always)]
fn ftz(v: f32) -> f32 {
    if v.abs() < f32::MIN_POSITIVE {
        f32::from_bits(v.to_bits() & 0x8000_0000)
    } else {
        v
    }
}

/// The two bf16 values of a pair `(even | odd << 16)` as f32, each flushed if subnormal.
#[inline(always)]
fn pair(bits: u32) -> (f32, f32) {
    (
        ftz(f32::from_bits(bits << 16)),
        ftz(f32::from_bits(bits & 0xffff_0000)),
    )
}

/// One lane's step over a pair of `x` and a pair of `w` (the contract's step 3).
#[inline(always)]
fn step(acc: f32, x: u32, w: u32) -> f32 {
    let (xe, xo) = pair(x);
    let (we, wo) = pair(w);
    let acc = ftz(xo.mul_add(wo, acc));
    ftz(xe.mul_add(we, acc))
}

/// One dot product in the contract (`x` in f32, rounded here; `w` as bf16 bits). The reference
/// every path is tested against.
pub fn dot_bf16(x: &[f32], w: &[u16]) -> f32 {
    assert_eq!(x.len(), w.len());
    let mut acc = [0f32; LANES];
    for (xw, ww) in x.chunks(WINDOW).zip(w.chunks(WINDOW)) {
        let at = |s: &[u16], i: usize| s.get(i).map_or(0u32, |&v| v as u32);
        let xr: Vec<u16> = xw.iter().map(|&v| round_bf16(v)).collect();
        for (l, a) in acc.iter_mut().enumerate() {
            let xp = at(&xr, 2 * l) | at(&xr, 2 * l + 1) << 16;
            let wp = at(ww, 2 * l) | at(ww, 2 * l + 1) << 16;
            *a = step(*a, xp, wp);
        }
    }
    super::hsum16(&acc)
}

thread_local! {
    /// The rounded, packed `x` of the current call, kept between calls.
    static X_PACK: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
}

/// Packs `x` (`[m, k]`) rounded to bf16 into `[m/MR][windows][MR][32]`, zero-padded.
fn pack_x(x: &[f32], m: usize, k: usize, windows: usize, buf: &mut Vec<u16>) {
    let panel = windows * XW;
    buf.clear();
    buf.resize(m.div_ceil(MR) * panel, 0);
    let fill = |(q, dst): (usize, &mut [u16])| {
        let rows = MR.min(m - q * MR);
        for (c, win) in dst.chunks_exact_mut(XW).enumerate() {
            let (k0, k1) = (c * WINDOW, ((c + 1) * WINDOW).min(k));
            for (i, lanes) in win.chunks_exact_mut(WINDOW).take(rows).enumerate() {
                let src = &x[(q * MR + i) * k + k0..(q * MR + i) * k + k1];
                for (d, &v) in lanes.iter_mut().zip(src) {
                    *d = round_bf16(v);
                }
            }
        }
    };
    use rayon::prelude::*;
    if m >= 64 {
        buf.par_chunks_mut(panel).enumerate().for_each(fill);
    } else {
        buf.chunks_mut(panel).enumerate().for_each(fill);
    }
}

/// `y = x · Wᵀ + bias` in the bf16 contract on `path`, pair products by `dot`.
///
/// # Panics
/// If `W` is not stored as bf16, the shapes do not match, or `path`/`dot` cannot run here.
pub fn linear_bf16_with(
    path: KernelPath,
    dot: Bf16Dot,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert!(
        dot.supported(path),
        "{dot:?} on {path} is not supported by this CPU"
    );
    let Panels::Bf16(wd) = &w.data else {
        panic!(
            "the bf16 compute mode needs bf16 weights, not {}",
            w.dtype()
        );
    };
    super::check_shapes(x, m, w, bias, y);
    let (n, k, kc) = (w.n, w.k, w.kc);
    if m == 0 || n == 0 {
        return;
    }
    let windows = kc.div_ceil(2);
    let mut xs = X_PACK.take();
    pack_x(x, m, k, windows, &mut xs);
    let wd: &[Bf16] = wd;
    for_each_block(m, n, bias, y, |q, p, rows, res| {
        let wp = &wd[p * kc * W_CHUNK..(p + 1) * kc * W_CHUNK];
        let xp = &xs[q * windows * XW..(q + 1) * windows * XW];
        micro(path, dot, xp, wp, kc, rows, res);
    });
    X_PACK.set(xs);
}

/// One `rows × NR` block of the bf16 contract.
fn micro(
    path: KernelPath,
    dot: Bf16Dot,
    xp: &[u16],
    wp: &[Bf16],
    kc: usize,
    rows: usize,
    res: &mut [f32; OUT_SLOTS],
) {
    debug_assert!(xp.len() == kc.div_ceil(2) * XW && wp.len() == kc * W_CHUNK);
    match dot {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Instruction` runs only where `Bf16Dot::supported` (asserted by the caller):
        // the CPU has avx512f and avx512bf16; the panels hold whole windows and chunks.
        Bf16Dot::Instruction => unsafe {
            match rows {
                1 => dp::micro::<1>(xp.as_ptr(), wp.as_ptr() as *const u16, kc, res),
                2 => dp::micro::<2>(xp.as_ptr(), wp.as_ptr() as *const u16, kc, res),
                3 => dp::micro::<3>(xp.as_ptr(), wp.as_ptr() as *const u16, kc, res),
                _ => dp::micro::<MR>(xp.as_ptr(), wp.as_ptr() as *const u16, kc, res),
            }
        },
        _ => emulated(path, xp, wp, kc, rows, res),
    }
}

multiversion! {
    fn emulated(
        xp: &[u16],
        wp: &[Bf16],
        kc: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    ) => emulated_body;
}

/// The emulation, in register blocks of 2 × 3 (or 1 × 6) dot products as the f32 mode's
/// generic kernel does them.
#[inline(always)]
fn emulated_body(xp: &[u16], wp: &[Bf16], kc: usize, rows: usize, res: &mut [f32; OUT_SLOTS]) {
    let mut i0 = 0;
    while i0 < rows {
        if rows - i0 >= 2 {
            emulated_block::<2, 3>(xp, wp, kc, i0, 0, res);
            emulated_block::<2, 3>(xp, wp, kc, i0, 3, res);
            i0 += 2;
        } else {
            emulated_block::<1, NR>(xp, wp, kc, i0, 0, res);
            i0 += 1;
        }
    }
}

/// The 16 pairs of a window whose elements are `lo` then `hi` (zeros if `None`), as
/// `even | odd << 16` words.
#[inline(always)]
fn words(lo: &[u16], hi: Option<&[u16]>) -> [u32; LANES] {
    let mut w = [0u32; LANES];
    for l in 0..LANES / 2 {
        w[l] = lo[2 * l] as u32 | (lo[2 * l + 1] as u32) << 16;
    }
    if let Some(hi) = hi {
        for l in 0..LANES / 2 {
            w[LANES / 2 + l] = hi[2 * l] as u32 | (hi[2 * l + 1] as u32) << 16;
        }
    }
    w
}

/// `v`, or a signed zero where `v` is subnormal, without a branch (vectorises).
#[inline(always)]
fn ftz_bits(v: f32) -> f32 {
    let b = v.to_bits();
    let keep = (((b & 0x7f80_0000) != 0) as u32).wrapping_neg() | 0x8000_0000;
    f32::from_bits(b & keep)
}

/// Rows `i0..i0 + A` of the x panel against W rows `j0..j0 + B`, in the contract's order.
#[inline(always)]
fn emulated_block<const A: usize, const B: usize>(
    xp: &[u16],
    wp: &[Bf16],
    kc: usize,
    i0: usize,
    j0: usize,
    res: &mut [f32; OUT_SLOTS],
) {
    let wbits = |from: usize| -> &[u16] {
        let s = &wp[from..from + LANES];
        // SAFETY: `Bf16` is `#[repr(transparent)]` over `u16`: same size, alignment and bits.
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u16, LANES) }
    };
    let mut acc = [[[0f32; LANES]; B]; A];
    for c in 0..kc.div_ceil(2) {
        let mut we = [[0f32; LANES]; B];
        let mut wo = [[0f32; LANES]; B];
        for j in 0..B {
            let lo = wbits(2 * c * W_CHUNK + (j0 + j) * LANES);
            let hi = (2 * c + 1 < kc).then(|| wbits((2 * c + 1) * W_CHUNK + (j0 + j) * LANES));
            let w = words(lo, hi);
            for l in 0..LANES {
                we[j][l] = ftz_bits(f32::from_bits(w[l] << 16));
                wo[j][l] = ftz_bits(f32::from_bits(w[l] & 0xffff_0000));
            }
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let xs = &xp[c * XW + (i0 + i) * WINDOW..][..WINDOW];
            let x = words(&xs[..LANES], Some(&xs[LANES..]));
            // `x` was rounded by `round_bf16`, which leaves no subnormal to flush.
            let xe: [f32; LANES] = std::array::from_fn(|l| f32::from_bits(x[l] << 16));
            let xo: [f32; LANES] = std::array::from_fn(|l| f32::from_bits(x[l] & 0xffff_0000));
            for (j, acc_ij) in acc_i.iter_mut().enumerate() {
                for l in 0..LANES {
                    let a = ftz_bits(xo[l].mul_add(wo[j][l], acc_ij[l]));
                    acc_ij[l] = ftz_bits(xe[l].mul_add(we[j][l], a));
                }
            }
        }
    }
    for (i, acc_i) in acc.iter().enumerate() {
        for (j, acc_ij) in acc_i.iter().enumerate() {
            res[(i0 + i) * NR + j0 + j] = super::hsum16(acc_ij);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod dp {
    //! The `vdpbf16ps` micro-kernel: `A × NR` accumulators of 16 lanes, one instruction per
    //! window per (row, W row), then the f32 contract's lane tree.
    #![allow(clippy::needless_range_loop)]
    use super::{LANES, NR, OUT_SLOTS, W_CHUNK, XW};
    use crate::gemm::avx512::reduce16;
    use crate::gemm::PREFETCH_FLOATS;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support avx512f and avx512bf16; `xp` must hold `ceil(kc / 2) * XW` values
    /// and `wp` `kc * W_CHUNK`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn micro<const A: usize>(
        xp: *const u16,
        wp: *const u16,
        kc: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        // SAFETY: function contract.
        let acc = unsafe { chains::<A>(xp, wp, kc) };
        let mut flat = [_mm512_setzero_ps(); OUT_SLOTS];
        for i in 0..A {
            for j in 0..NR {
                flat[i * NR + j] = acc[i][j];
            }
        }
        for g in 0..(A * NR).div_ceil(LANES) {
            let mut v = [_mm512_setzero_ps(); LANES];
            v.copy_from_slice(&flat[g * LANES..(g + 1) * LANES]);
            // SAFETY: avx512f is present; `res` holds OUT_SLOTS >= (g + 1) * 16 floats.
            unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(g * LANES), reduce16(&v)) };
        }
    }

    /// Row `j` of W window `c`: its chunks `2c` and `2c + 1` (zero past the last chunk).
    ///
    /// # Safety
    /// avx512f; chunk `2c` in bounds.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn w_window(wp: *const u16, kc: usize, c: usize, j: usize) -> __m512i {
        // SAFETY: chunk 2c exists; chunk 2c + 1 is read only when it exists.
        unsafe {
            let lo = _mm256_loadu_si256(wp.add(2 * c * W_CHUNK + j * LANES) as *const __m256i);
            let hi = if 2 * c + 1 < kc {
                _mm256_loadu_si256(wp.add((2 * c + 1) * W_CHUNK + j * LANES) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        }
    }

    /// # Safety
    /// As [`micro`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline(never)]
    unsafe fn chains<const A: usize>(
        xp: *const u16,
        wp: *const u16,
        kc: usize,
    ) -> [[__m512; NR]; A] {
        let mut acc = [[_mm512_setzero_ps(); NR]; A];
        for c in 0..kc.div_ceil(2) {
            if A == 2 {
                // Two rows: W streams from memory; prefetch it well ahead (a hint: never
                // faults). With one, the hardware's prefetchers alone stream it faster
                // (docs/BENCHMARKS.md, "16-bit weights at batch 1").
                for j in (0..NR).step_by(2) {
                    let ahead = wp.wrapping_add(2 * c * W_CHUNK + 2 * PREFETCH_FLOATS + j * LANES);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                    let ahead = ahead.wrapping_add(W_CHUNK);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                }
            }
            let mut xv = [_mm512_setzero_si512(); A];
            for i in 0..A {
                // SAFETY: row i < A <= MR of window c.
                xv[i] = unsafe { _mm512_loadu_si512(xp.add(c * XW + i * 2 * LANES) as *const _) };
            }
            for j in 0..NR {
                // SAFETY: chunk 2c < kc.
                let wv: __m512bh = unsafe { std::mem::transmute(w_window(wp, kc, c, j)) };
                for i in 0..A {
                    let xb: __m512bh = unsafe { std::mem::transmute(xv[i]) };
                    acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, wv);
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::KernelPath;
    use crate::wdtype::WeightDtype;

    pub(super) struct Lcg(pub(super) u64);
    impl Lcg {
        pub(super) fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        /// Mostly ordinary values, some tiny, subnormal, zero and large.
        pub(super) fn value(&mut self) -> f32 {
            let r = self.next();
            // Magnitudes over 2^-12..2^12, so that sums round (same-sized bf16 products add
            // exactly for a while, and then any order of the additions would pass).
            let scale = f32::powi(2.0, (r >> 20) as i32 % 25 - 12);
            let v = ((r % 20001) as f32 - 10000.0) / 5000.0 * scale;
            match r % 23 {
                0 => 0.0,
                1 => v * 1e-38,
                2 => v * 1e-41,
                // No huge values: a sum they dominate absorbs every other term in any order
                // (and an overflow makes it NaN, which every order computes alike).
                3 => v * 64.0,
                _ => v,
            }
        }
    }

    fn random(rng: &mut Lcg, len: usize) -> Vec<f32> {
        (0..len).map(|_| rng.value()).collect()
    }

    #[test]
    fn rounding_is_to_nearest_even_and_flushes_below_the_smallest_normal() {
        assert_eq!(round_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even (1.0).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(round_bf16(-2.0), 0xc000);
        assert_eq!(round_bf16(1e-40), 0);
        assert_eq!(round_bf16(-1e-40), 0x8000);
        assert_eq!(round_bf16(f32::MAX), 0x7f80, "rounds up to infinity");
        assert!(f32::from_bits((round_bf16(f32::NAN) as u32) << 16).is_nan());
        for v in [0.1f32, -3.7, 65504.0, 1e-20] {
            let want = half::bf16::from_f32(v).to_bits();
            assert_eq!(round_bf16(v), want, "{v}");
        }
    }

    fn bf16_matrix(rng: &mut Lcg, n: usize, k: usize) -> (Vec<u16>, PackedMatrix) {
        // Some subnormal weights too: the contract reads them as zeros.
        let bits: Vec<u16> = random(rng, n * k)
            .into_iter()
            .map(|v| match rng.next() % 31 {
                0 => 0x0001 + (rng.next() % 0x7f) as u16,
                1 => 0x8040,
                _ => round_bf16(v),
            })
            .collect();
        let packed = PackedMatrix::pack_16bit(&bits, n, k, WeightDtype::Bf16);
        (bits, packed)
    }

    #[test]
    fn every_path_and_dot_equals_the_reference_bit_for_bit() {
        let mut rng = Lcg(11);
        let shapes = [
            (1, 7, 5),
            (3, 13, 47),
            (4, 6, 64),
            (9, 19, 100),
            (70, 13, 33),
            (2, 5, 1000),
            (5, 7, 4099),
        ];
        for (m, n, k) in shapes {
            let x = random(&mut rng, m * k);
            let (bits, w) = bf16_matrix(&mut rng, n, k);
            let bias = random(&mut rng, n);
            let mut want = vec![0f32; m * n];
            for r in 0..m {
                for c in 0..n {
                    want[r * n + c] =
                        dot_bf16(&x[r * k..(r + 1) * k], &bits[c * k..(c + 1) * k]) + bias[c];
                }
            }
            for path in KernelPath::all_supported() {
                for dot in [Bf16Dot::Emulated, Bf16Dot::Instruction] {
                    if !dot.supported(path) {
                        continue;
                    }
                    let mut y = vec![0f32; m * n];
                    linear_bf16_with(path, dot, &x, m, &w, Some(&bias), &mut y);
                    assert!(want.iter().all(|v| v.is_finite()), "finite sums");
                    let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{path} {dot:?} m={m} n={n} k={k}");
                }
            }
        }
    }

    #[test]
    fn products_below_the_smallest_normal_are_flushed_on_every_path() {
        // 1e-20 squared is subnormal in f32: each step's result flushes to zero, so the rows of
        // tiny values give exactly zero, and a row mixing them with one normal product gives
        // that product alone.
        let (n, k) = (6, 64);
        let tiny: Vec<f32> = (0..k).map(|i| 1e-20 * (1.0 + i as f32 / 64.0)).collect();
        let bits: Vec<u16> = tiny.iter().map(|&v| round_bf16(v)).collect();
        let w = PackedMatrix::pack_16bit(&bits.repeat(n), n, k, WeightDtype::Bf16);
        let mut x = tiny.clone();
        x.extend(&tiny);
        x[k + 5] = 3.0;
        let mut want = [0f32; 2];
        for (r, want) in want.iter_mut().enumerate() {
            *want = dot_bf16(&x[r * k..(r + 1) * k], &bits);
        }
        assert_eq!(want[0], 0.0);
        assert_eq!(want[1], 3.0 * f32::from_bits((bits[5] as u32) << 16));
        for path in KernelPath::all_supported() {
            for dot in [Bf16Dot::Emulated, Bf16Dot::Instruction] {
                if dot.supported(path) {
                    let mut y = vec![0f32; 2 * n];
                    linear_bf16_with(path, dot, &x, 2, &w, None, &mut y);
                    assert!(y[..n].iter().all(|&v| v == 0.0), "{path} {dot:?}");
                    assert!(y[n..].iter().all(|&v| v == want[1]), "{path} {dot:?}");
                }
            }
        }
    }

    #[test]
    fn the_instruction_is_tested_where_the_cpu_has_it() {
        // Not a check of numbers: says in the test log which dot ran here.
        eprintln!("avx512_bf16 on this CPU: {}", cpu_has_dpbf16());
    }

    #[test]
    fn a_row_does_not_depend_on_its_batch() {
        let mut rng = Lcg(5);
        let (m, n, k) = (37, 11, 96);
        let x = random(&mut rng, m * k);
        let (_, w) = bf16_matrix(&mut rng, n, k);
        let path = crate::path::kernel_path();
        let dot = Bf16Dot::best(path);
        let mut all = vec![0f32; m * n];
        linear_bf16_with(path, dot, &x, m, &w, None, &mut all);
        for r in [0, 5, 36] {
            let mut one = vec![0f32; n];
            linear_bf16_with(path, dot, &x[r * k..(r + 1) * k], 1, &w, None, &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
    }

    #[test]
    fn it_is_close_to_f32_and_not_equal() {
        let mut rng = Lcg(3);
        let (m, n, k) = (2, 8, 256);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 37.0)
            .collect();
        let (_, w) = bf16_matrix(&mut rng, n, k);
        let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
        linear_bf16_with(
            KernelPath::Portable,
            Bf16Dot::Emulated,
            &x,
            m,
            &w,
            None,
            &mut a,
        );
        super::super::linear_with(KernelPath::Portable, &x, m, &w, None, &mut b);
        let scale = b.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let err = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(err > 0.0 && err < 0.02 * scale, "err {err} scale {scale}");
    }
}
