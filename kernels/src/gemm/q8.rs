//! 8-bit weights (`--weight-dtype q8_0`): llama.cpp's Q8_0 — blocks of 32 weights, each an
//! int8 times one f16 scale per block — with the activations quantized the same way per call,
//! and the products summed as integers.
//!
//! Quantization (weights at load, activations per call, as ggml's `quantize_row_q8_0_ref`):
//! per block of 32, `d = max|v| / 127`, `q = round(v · (1/d))` (half away from zero; `q = 0`
//! where `d = 0`); a weight block keeps `d` as f16 (as Q8_0 stores it), an activation block as
//! f32. A weight is read back as `f16(d) · q`.
//!
//! Numeric contract (every path, bit for bit; a row's result independent of its batch):
//!   1. `K` zero-padded to windows of 64 (two blocks); lane `l` (of 16) of window `c` takes the
//!      four elements `4g .. 4g + 4` (`g = l / 2`) of block `b = 2c + l % 2`: the two blocks'
//!      groups of four alternate across the lanes (so one broadcast pair of scales serves a
//!      window);
//!   2. per window and lane, `p = Σ qx · qw` over those four (exact, in i32), then
//!      `acc[l] = fma(f32(p), dx[b] · dw[b], acc[l])` (`dx · dw` one f32 product);
//!   3. the f32 contract's 16-lane tree (`hsum16`), then `+ bias`.
//!
//! Paths ([`IntDot`]): AVX-512 with VNNI computes `p` with `vpdpbusd` (u8 × s8: the weights are
//! stored offset by 128 as u8, and the accumulator starts at `-128 · Σ qx` of the lane's four, so
//! the sum is exactly `Σ qx · qw`); AVX2 (and AVX-512 without VNNI) with `vpmaddubsw` on `|qx|`
//! and `qw · sign(qx)` then `vpmaddwd` by ones (as ggml's AVX2 Q8_0 dot: both factors are within
//! ±127, so no pair sum saturates 16 bits and the sum is exact); NEON with the `dotprod`
//! extension with `sdot` on `qx` and `qw`; every other path computes the same integers in plain
//! code. The float steps are the same FMAs in the same order everywhere.
//!
//! Layout: panels of `NR` rows as the other types, `[panel][window][NR][64]` offset quants in
//! lane order (group `g` of block half `h` at bytes `4(2g + h)`), and `[panel][window][NR][2]`
//! f16 scales beside them; `x` is quantized and packed per call the same way, `[panel][window]
//! [MR][64]` quants with, per lane, `-128 · Σ qx` and `dx`.

use std::cell::Cell;

use super::{for_each_block, hsum16, PackedMatrix, Panels, LANES, MR, NR, OUT_SLOTS};
use crate::linevec::LineBuf;
use crate::path::{multiversion, KernelPath};
use crate::store::{SharedBytes, Store, ViewError};
use crate::wdtype::f16_to_f32;

/// How far ahead the SIMD kernels prefetch the W panel where they do (several x rows), in
/// windows of NR × 64 bytes (8, 16 and 32 read alike on the machine measured).
#[cfg(target_arch = "x86_64")]
const PREFETCH_WINDOWS: usize = 8;

/// Weights per block (one scale each).
pub const BLOCK: usize = 32;
/// Elements of one window: two blocks, 4 per lane.
const WIN: usize = 64;

/// A Q8_0 matrix's panels, one run of bytes (owned, or viewed in a packed weight file): the
/// offset quants, `[panel][window][NR][64]` (`q + 128`), then the scales, `[panel][window][NR][2]`
/// f16 (little-endian).
#[derive(Clone)]
pub(crate) struct Q8Panels {
    data: Store<u8>,
    /// Bytes of the quants (where the scales start: a multiple of 64).
    qlen: usize,
}

impl Q8Panels {
    /// Bytes of an `[n, k]` matrix's panels.
    pub(crate) fn len(n: usize, k: usize) -> usize {
        Self::quant_len(n, k) + n.div_ceil(NR) * windows(k) * NR * 4
    }

    fn quant_len(n: usize, k: usize) -> usize {
        n.div_ceil(NR) * windows(k) * NR * WIN
    }

    /// An `[n, k]` matrix's panels viewed at `offset` of `bytes`.
    pub(crate) fn view(
        bytes: SharedBytes,
        offset: usize,
        n: usize,
        k: usize,
    ) -> Result<Self, ViewError> {
        Ok(Q8Panels {
            data: Store::view(bytes, offset, Self::len(n, k))?,
            qlen: Self::quant_len(n, k),
        })
    }

    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    pub(crate) fn is_shared(&self) -> bool {
        self.data.is_shared()
    }

    fn quants(&self) -> &[u8] {
        &self.data[..self.qlen]
    }

    /// The scale bytes (two per block, little-endian f16).
    fn scales(&self) -> &[u8] {
        &self.data[self.qlen..]
    }
}

/// Scale `i` of the scale bytes `ws`, widened.
#[inline(always)]
fn scale(ws: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([ws[2 * i], ws[2 * i + 1]]))
}

/// Where element `e` of block half `h` sits in its window: group `e / 4` of the half at lane
/// `2 · (e / 4) + h`.
#[inline(always)]
fn lane_byte(h: usize, e: usize) -> usize {
    4 * (2 * (e / 4) + h) + e % 4
}

/// Windows of a row of `k` elements.
fn windows(k: usize) -> usize {
    k.div_ceil(WIN)
}

/// f32 → f16 bits, to nearest even (what `ggml_fp32_to_fp16` gives for a scale).
fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// ggml's quantization of one block (`v.len() <= 32`; missing elements are zeros): `(d, q)`.
pub fn quantize_block(v: &[f32], q: &mut [i8; BLOCK]) -> f32 {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    q.fill(0);
    for (o, &x) in q.iter_mut().zip(v) {
        *o = (x * id).round() as i8;
    }
    d
}

/// [`quantize_block`] of a whole block, in code the compiler vectorizes (the same bits: `max` is
/// order-free on magnitudes, and round-half-away-from-zero is `trunc` plus one where the dropped
/// fraction, exact in f32, is at least one half).
#[inline(always)]
fn quantize32(v: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> f32 {
    let mut m = [0f32; BLOCK / 2];
    for i in 0..BLOCK / 2 {
        m[i] = v[i].abs().max(v[i + BLOCK / 2].abs());
    }
    let mut w = BLOCK / 4;
    while w > 0 {
        for i in 0..w {
            m[i] = m[i].max(m[i + w]);
        }
        w /= 2;
    }
    // `max` ignores a NaN unless both are: as the fold from 0, a block of NaNs has amax 0.
    let amax = m[0].max(0.0);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &x) in q.iter_mut().zip(v) {
        let a = (x * id).abs();
        let t = a.trunc();
        let r = if a - t >= 0.5 { t + 1.0 } else { t };
        *o = r.copysign(x * id) as i8;
    }
    d
}

/// One dot product in the contract, from f32 `x` and f32 `w` (both quantized here, `w`'s
/// scales rounded to f16): the reference every path is tested against.
pub fn dot_q8_0(x: &[f32], w: &[f32]) -> f32 {
    assert_eq!(x.len(), w.len());
    let quantized = |v: &[f32], f16_scale: bool| -> Vec<(f32, [i8; BLOCK])> {
        v.chunks(BLOCK)
            .map(|b| {
                let mut q = [0i8; BLOCK];
                let d = quantize_block(b, &mut q);
                (
                    if f16_scale {
                        f16_to_f32(f16_bits(d))
                    } else {
                        d
                    },
                    q,
                )
            })
            .collect()
    };
    let (xb, wb) = (quantized(x, false), quantized(w, true));
    let mut acc = [0f32; LANES];
    for (b, ((dx, qx), (dw, qw))) in xb.iter().zip(&wb).enumerate() {
        for g in 0..BLOCK / 4 {
            let p: i32 = (0..4)
                .map(|t| qx[4 * g + t] as i32 * qw[4 * g + t] as i32)
                .sum();
            let l = 2 * g + b % 2;
            acc[l] = (p as f32).mul_add(dx * dw, acc[l]);
        }
    }
    hsum16(&acc)
}

/// Packs a row-major `[n, k]` f32 matrix as Q8_0 panels.
pub(crate) fn pack(w: &[f32], n: usize, k: usize) -> Q8Panels {
    assert_eq!(w.len(), n * k, "w shape");
    let qlen = Q8Panels::quant_len(n, k);
    let mut data = LineBuf::<u8>::zeroed(Q8Panels::len(n, k));
    let (quants, scales) = data.split_at_mut(qlen);
    quants.fill(128);
    if k > 0 {
        // The same bytes on every path (`quantize32` is exact); the best one vectorizes it.
        pack_rows(KernelPath::best(), w, k, quants, scales);
    }
    Q8Panels {
        data: Store::Owned(data),
        qlen,
    }
}

multiversion! {
    /// Quantizes the rows of `w` (`k` weights each) into their panels' `quants` and `scales`.
    fn pack_rows(w: &[f32], k: usize, quants: &mut [u8], scales: &mut [u8]) => pack_rows_body;
}

#[inline(always)]
fn pack_rows_body(w: &[f32], k: usize, quants: &mut [u8], scales: &mut [u8]) {
    let nw = windows(k);
    let mut q = [0i8; BLOCK];
    let mut whole = [0f32; BLOCK];
    for (r, row) in w.chunks_exact(k).enumerate() {
        let (p, j) = (r / NR, r % NR);
        for (b, block) in row.chunks(BLOCK).enumerate() {
            whole[..block.len()].copy_from_slice(block);
            whole[block.len()..].fill(0.0);
            let d = quantize32(&whole, &mut q);
            let (c, half) = (b / 2, b % 2);
            let o = ((p * nw + c) * NR + j) * WIN;
            for (e, &v) in q.iter().enumerate() {
                quants[o + lane_byte(half, e)] = (v as i16 + 128) as u8;
            }
            let at = (((p * nw + c) * NR + j) * 2 + half) * 2;
            scales[at..at + 2].copy_from_slice(&f16_bits(d).to_le_bytes());
        }
    }
}

impl PackedMatrix {
    /// Row `r` of a Q8_0 matrix, dequantized (`f16(d) · q`).
    pub(crate) fn q8_row(p: &Q8Panels, n: usize, k: usize, r: usize, out: &mut [f32]) {
        debug_assert!(r < n && out.len() == k);
        let nw = windows(k);
        let (pi, j) = (r / NR, r % NR);
        for (e, o) in out.iter_mut().enumerate() {
            let (c, within) = (e / WIN, e % WIN);
            let base = (pi * nw + c) * NR + j;
            let half = within / BLOCK;
            let q = p.quants()[base * WIN + lane_byte(half, within % BLOCK)] as i32 - 128;
            let d = scale(p.scales(), base * 2 + half);
            *o = d * q as f32;
        }
    }
}

thread_local! {
    static X_PACK: Cell<XPack> = const { Cell::new(XPack::new()) };
}

/// The quantized `x` of one call.
#[derive(Default)]
struct XPack {
    /// `[panel][window][MR][64]` quants.
    q: Vec<i8>,
    /// `[panel][window][MR][16]`: per lane, `-128 · Σ` of its four quants.
    neg: Vec<i32>,
    /// `[panel][window][MR][16]`: per lane, its block's `dx`.
    d: Vec<f32>,
}

impl XPack {
    const fn new() -> Self {
        XPack {
            q: Vec::new(),
            neg: Vec::new(),
            d: Vec::new(),
        }
    }
}

multiversion! {
    /// Quantizes and lays out `x` (`m` rows of `k`) into `xs` for one call.
    fn pack_x(xs: &mut XPack, x: &[f32], m: usize, k: usize) => pack_x_body;
}

/// [`pack_x`]: every slot of rows `0..m` written (a block past `k` as zeros); the pad rows of
/// the last panel keep whatever they held, as no kernel reads a row past `m`.
#[inline(always)]
fn pack_x_body(xs: &mut XPack, x: &[f32], m: usize, k: usize) {
    let (mp, nw) = (m.div_ceil(MR), windows(k));
    let slots = mp * nw * MR;
    xs.q.resize(slots * WIN, 0);
    xs.neg.resize(slots * LANES, 0);
    xs.d.resize(slots * LANES, 0.0);
    let mut block = [0f32; BLOCK];
    let mut q = [[0i8; BLOCK]; 2];
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        for c in 0..nw {
            let mut d = [0f32; 2];
            for h in 0..2 {
                let start = ((2 * c + h) * BLOCK).min(k);
                let part = &row[start..(start + BLOCK).min(k)];
                block[..part.len()].copy_from_slice(part);
                block[part.len()..].fill(0.0);
                d[h] = quantize32(&block, &mut q[h]);
            }
            let slot = ((r / MR) * nw + c) * MR + r % MR;
            let qs = &mut xs.q[slot * WIN..][..WIN];
            let neg = &mut xs.neg[slot * LANES..][..LANES];
            let dl = &mut xs.d[slot * LANES..][..LANES];
            for (h, (qh, dh)) in q.iter().zip(d).enumerate() {
                for (g, four) in qh.chunks_exact(4).enumerate() {
                    let at = lane_byte(h, 4 * g);
                    qs[at..at + 4].copy_from_slice(four);
                    neg[at / 4] = -128 * four.iter().map(|&v| v as i32).sum::<i32>();
                    dl[at / 4] = dh;
                }
            }
        }
    }
}

/// The integer dot product a kernel path runs for Q8_0 (every one gives the same integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntDot {
    /// `vpdpbusd` on 512-bit registers (AVX-512 with VNNI).
    Vnni512,
    /// `vpmaddubsw` + `vpmaddwd` on 256-bit registers (AVX2; AVX-512 without VNNI).
    Avx2Madd,
    /// `sdot` (aarch64 NEON with the dotprod extension).
    NeonSdot,
    /// Plain integer code (the portable path; NEON without dotprod).
    Plain,
}

impl IntDot {
    /// The one `path` runs on this CPU.
    pub fn of(path: KernelPath) -> IntDot {
        match path {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 if cpu_has_vnni() => IntDot::Vnni512,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 | KernelPath::Avx2 => IntDot::Avx2Madd,
            #[cfg(target_arch = "aarch64")]
            KernelPath::Neon if std::arch::is_aarch64_feature_detected!("dotprod") => {
                IntDot::NeonSdot
            }
            _ => IntDot::Plain,
        }
    }

    /// Its name in the worker's start line and the tests' logs.
    pub fn name(self) -> &'static str {
        match self {
            IntDot::Vnni512 => "vpdpbusd",
            IntDot::Avx2Madd => "vpmaddubsw",
            IntDot::NeonSdot => "sdot",
            IntDot::Plain => "plain integers",
        }
    }
}

/// `y = x · Wᵀ + bias` for a Q8_0 `W`, on `path`: with the path's [`IntDot`] where `simd`, the
/// plain integer code otherwise (the same numbers either way).
pub(crate) fn linear_q8(
    path: KernelPath,
    simd: bool,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let Panels::Q8(p) = &w.data else {
        unreachable!("linear_q8 of a {} matrix", w.dtype())
    };
    let (n, k) = (w.n, w.k);
    let nw = windows(k);
    let mut xs = X_PACK.take();
    pack_x(path, &mut xs, x, m, k);
    let dot = if simd {
        IntDot::of(path)
    } else {
        IntDot::Plain
    };
    for_each_block(m, n, bias, y, |q, pi, rows, res| {
        let xq = &xs.q[q * nw * MR * WIN..(q + 1) * nw * MR * WIN];
        let neg = &xs.neg[q * nw * MR * LANES..(q + 1) * nw * MR * LANES];
        let xd = &xs.d[q * nw * MR * LANES..(q + 1) * nw * MR * LANES];
        let wq = &p.quants()[pi * nw * NR * WIN..(pi + 1) * nw * NR * WIN];
        let ws = &p.scales()[pi * nw * NR * 4..(pi + 1) * nw * NR * 4];
        let panel = XPanel { q: xq, neg, d: xd };
        match dot {
            // SAFETY (each SIMD arm): `IntDot::of` names a kernel only where the CPU reports
            // its features (avx512f + avx512vnni; the Avx2 or Avx512 path's avx2, fma and f16c;
            // neon + dotprod); the slices hold `nw` whole windows of their panels.
            #[cfg(target_arch = "x86_64")]
            IntDot::Vnni512 => unsafe { vnni::micro(&panel, wq, ws, nw, rows, res) },
            #[cfg(target_arch = "x86_64")]
            IntDot::Avx2Madd => unsafe { avx2::micro(&panel, wq, ws, nw, rows, res) },
            #[cfg(target_arch = "aarch64")]
            IntDot::NeonSdot => unsafe { neon::micro(&panel, wq, ws, nw, rows, res) },
            _ => generic(path, &panel, wq, ws, nw, rows, res),
        }
    });
    X_PACK.set(xs);
}

/// Whether the CPU has AVX512-VNNI (`vpdpbusd` on 512-bit registers).
pub fn cpu_has_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// One x panel of the call.
struct XPanel<'a> {
    q: &'a [i8],
    neg: &'a [i32],
    d: &'a [f32],
}

multiversion! {
    fn generic(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    ) => generic_body;
}

/// The contract in plain integer and float code (every path without VNNI).
#[inline(always)]
fn generic_body(
    x: &XPanel<'_>,
    wq: &[u8],
    ws: &[u8],
    nw: usize,
    rows: usize,
    res: &mut [f32; OUT_SLOTS],
) {
    for i in 0..rows {
        for j in 0..NR {
            let mut acc = [0f32; LANES];
            for c in 0..nw {
                let xq = &x.q[(c * MR + i) * WIN..][..WIN];
                let xd = &x.d[(c * MR + i) * LANES..][..LANES];
                let w = &wq[(c * NR + j) * WIN..][..WIN];
                let d0 = scale(ws, (c * NR + j) * 2);
                let d1 = scale(ws, (c * NR + j) * 2 + 1);
                let neg = &x.neg[(c * MR + i) * LANES..][..LANES];
                for l in 0..LANES {
                    // As vpdpbusd sums it: the offset weights, from `-128 · Σ qx` (exact).
                    let mut p = neg[l];
                    for t in 0..4 {
                        p += xq[4 * l + t] as i32 * w[4 * l + t] as i32;
                    }
                    let dw = if l % 2 == 0 { d0 } else { d1 };
                    acc[l] = (p as f32).mul_add(xd[l] * dw, acc[l]);
                }
            }
            res[i * NR + j] = hsum16(&acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    //! The AVX512-VNNI micro-kernel: per window, one `vpdpbusd` per (x row, W row) started from
    //! the x lane's `-128 · Σ qx`, then the contract's conversion and FMA.
    #![allow(clippy::needless_range_loop)]
    use super::{XPanel, LANES, MR, NR, OUT_SLOTS, PREFETCH_WINDOWS, WIN};
    use crate::gemm::avx512::reduce16;
    use std::arch::x86_64::*;

    /// # Safety
    /// avx512f and avx512vnni; the slices hold `nw` windows of their panels.
    #[target_feature(enable = "avx512f,avx512vnni,f16c")]
    pub(super) unsafe fn micro(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        let mut flat = [_mm512_setzero_ps(); OUT_SLOTS];
        let mut i0 = 0;
        while i0 < rows {
            // Two x rows at a time (12 accumulators and their operands fit the 32 registers).
            let acc: &[[__m512; NR]] = if rows - i0 >= 2 {
                // SAFETY: function contract.
                &unsafe { chains::<2>(x, wq, ws, nw, i0) }
            } else {
                // SAFETY: function contract.
                &unsafe { chains::<1>(x, wq, ws, nw, i0) }
            };
            for (i, row) in acc.iter().enumerate() {
                flat[(i0 + i) * NR..(i0 + i + 1) * NR].copy_from_slice(row);
            }
            i0 += acc.len();
        }
        for g in 0..(rows * NR).div_ceil(LANES) {
            let mut v = [_mm512_setzero_ps(); LANES];
            v.copy_from_slice(&flat[g * LANES..(g + 1) * LANES]);
            // SAFETY: avx512f; `res` holds OUT_SLOTS >= (g + 1) * 16 floats.
            unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(g * LANES), reduce16(&v)) };
        }
    }

    /// Rows `i0..i0 + A` of the x panel against the `NR` W rows.
    ///
    /// # Safety
    /// As [`micro`]; `i0 + A <= MR`.
    #[target_feature(enable = "avx512f,avx512vnni,f16c")]
    #[inline(never)]
    unsafe fn chains<const A: usize>(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        i0: usize,
    ) -> [[__m512; NR]; A] {
        const {
            assert!(
                NR * 4 == 24,
                "a window's scales are one 16-byte and one 8-byte load"
            )
        };
        let mut acc = [[_mm512_setzero_ps(); NR]; A];
        for c in 0..nw {
            // W streams from memory. With one x row the hardware's prefetchers alone stream
            // it fastest; with more (more arithmetic per byte) a software prefetch ahead of
            // them is faster (docs/BENCHMARKS.md). A hint: never faults.
            if A > 1 {
                let ahead = wq.as_ptr().wrapping_add((c + PREFETCH_WINDOWS) * NR * WIN);
                for j in 0..NR {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j * WIN) as *const i8);
                }
            }
            // The window's 2·NR scales, [d0 of row 0, d1 of row 0, d0 of row 1, …], widened
            // once (lanes 2·NR.. zero).
            // SAFETY: the window's 4·NR scale bytes lie inside the panel (function contract).
            let dws = unsafe {
                let at = ws.as_ptr().add(c * NR * 4);
                let lo = _mm_loadu_si128(at as *const __m128i);
                let hi = _mm_loadl_epi64(at.add(16) as *const __m128i);
                _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
            };
            let mut xv = [_mm512_setzero_si512(); A];
            let mut neg = [_mm512_setzero_si512(); A];
            // Per x row, every W row's `dx · dw` in one product (x's lanes alternate its two
            // blocks' dx as the pairs alternate d0, d1): the contract's product, lane for lane.
            let mut scales = [_mm512_setzero_ps(); A];
            for i in 0..A {
                let s = c * MR + i0 + i;
                // SAFETY: slot s of window c is inside the panel (function contract).
                unsafe {
                    xv[i] = _mm512_loadu_si512(x.q.as_ptr().add(s * WIN) as *const _);
                    neg[i] = _mm512_loadu_si512(x.neg.as_ptr().add(s * LANES) as *const _);
                    scales[i] = _mm512_mul_ps(_mm512_loadu_ps(x.d.as_ptr().add(s * LANES)), dws);
                }
            }
            for j in 0..NR {
                // SAFETY: as above, for the W panel.
                let wv =
                    unsafe { _mm512_loadu_si512(wq.as_ptr().add((c * NR + j) * WIN) as *const _) };
                // W row j's pair (64 bits) in every 64-bit lane.
                let pick = _mm512_set1_epi64(j as i64);
                for i in 0..A {
                    let p = _mm512_dpbusd_epi32(neg[i], wv, xv[i]);
                    let pair = _mm512_permutexvar_pd(pick, _mm512_castps_pd(scales[i]));
                    let scale = _mm512_castpd_ps(pair);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[i][j]);
                }
            }
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 micro-kernel: a window's 16 lanes are two 256-bit halves (lanes 0–7, 8–15);
    //! per half, `p = vpmaddwd(vpmaddubsw(|qx|, qw · sign(qx)), 1)` (exact: every factor is within
    //! ±127), then the contract's conversion and FMA, and the tree's first step adds the halves.
    #![allow(clippy::needless_range_loop)]
    use super::{XPanel, LANES, MR, NR, OUT_SLOTS, PREFETCH_WINDOWS, WIN};
    use crate::gemm::avx2::hsum16_pair;
    use std::arch::x86_64::*;

    /// # Safety
    /// avx2, fma and f16c; the slices hold `nw` windows of their panels.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn micro(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        for i in 0..rows {
            // SAFETY: function contract; i < rows <= MR.
            let prefetch = rows > 1;
            let (lo, hi) = unsafe {
                (
                    half(x, wq, ws, nw, i, 0, prefetch),
                    half(x, wq, ws, nw, i, 1, false),
                )
            };
            for j in 0..NR {
                res[i * NR + j] = hsum16_pair(lo[j], hi[j]);
            }
        }
    }

    /// Lanes `8h .. 8h + 8` of x row `i`'s accumulators against the `NR` W rows.
    ///
    /// # Safety
    /// As [`micro`]; `i < MR`, `h` 0 or 1.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn half(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        i: usize,
        h: usize,
        prefetch: bool,
    ) -> [__m256; NR] {
        let flip = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NR];
        for c in 0..nw {
            if prefetch {
                // W streams from memory: as the VNNI kernel, prefetched only for several rows.
                let ahead = wq.as_ptr().wrapping_add((c + PREFETCH_WINDOWS) * NR * WIN);
                for j in 0..NR {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j * WIN) as *const i8);
                }
            }
            let s = c * MR + i;
            // SAFETY: slot s of window c is inside the x panel (function contract).
            let (xv, xd) = unsafe {
                (
                    _mm256_loadu_si256(x.q.as_ptr().add(s * WIN + 32 * h) as *const __m256i),
                    _mm256_loadu_ps(x.d.as_ptr().add(s * LANES + 8 * h)),
                )
            };
            let ax = _mm256_sign_epi8(xv, xv);
            for j in 0..NR {
                let t = c * NR + j;
                // SAFETY: as above, for the W panel.
                let (wv, dw) = unsafe {
                    let wv =
                        _mm256_loadu_si256(wq.as_ptr().add(t * WIN + 32 * h) as *const __m256i);
                    // The pair (d0, d1) in every 32-bit lane: [d0, d1, d0, d1, …] as f32.
                    let pair = std::ptr::read_unaligned(ws.as_ptr().add(t * 4) as *const i32);
                    (wv, _mm256_cvtph_ps(_mm_set1_epi32(pair)))
                };
                // The stored `qw + 128` back to `qw`, then its sign moved onto it from `qx`.
                let sw = _mm256_sign_epi8(_mm256_xor_si256(wv, flip), xv);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sw), ones);
                let scale = _mm256_mul_ps(xd, dw);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
            }
        }
        acc
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    //! The NEON micro-kernel with `sdot` (the dotprod extension): a window's 16 lanes are four
    //! 128-bit quarters; per quarter `p = sdot(0, qx, qw)` (four i8 products per i32 lane, exact),
    //! then the contract's conversion and FMA, and the contract's tree.
    #![allow(clippy::needless_range_loop)]
    use super::{XPanel, LANES, MR, NR, OUT_SLOTS, WIN};
    use crate::gemm::hsum16;
    use std::arch::aarch64::*;

    /// # Safety
    /// neon and dotprod; the slices hold `nw` windows of their panels.
    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn micro(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        for i in 0..rows {
            for j in 0..NR {
                // SAFETY: function contract; i < rows <= MR, j < NR.
                let acc = unsafe { row_dot(x, wq, ws, nw, i, j) };
                let mut lanes = [0f32; LANES];
                for q in 0..4 {
                    // SAFETY: 4 floats at 4q of the 16.
                    unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * q), acc[q]) };
                }
                res[i * NR + j] = hsum16(&lanes);
            }
        }
    }

    /// Per 32-bit lane, the sum of its four i8 products (`sdot`; exact). Written in assembly:
    /// Rust's `vdotq_s32` is not stable yet.
    #[target_feature(enable = "neon,dotprod")]
    #[inline]
    fn sdot(x: int8x16_t, w: int8x16_t) -> int32x4_t {
        let mut acc = vdupq_n_s32(0);
        // SAFETY: `sdot` reads and writes only these registers; dotprod is enabled here.
        unsafe {
            std::arch::asm!(
                "sdot {acc:v}.4s, {x:v}.16b, {w:v}.16b",
                acc = inout(vreg) acc,
                x = in(vreg) x,
                w = in(vreg) w,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }

    /// The 16 lane accumulators of x row `i` against W row `j`, as four quarters.
    ///
    /// # Safety
    /// As [`micro`]; `i < MR`, `j < NR`.
    #[target_feature(enable = "neon,dotprod")]
    #[inline]
    unsafe fn row_dot(
        x: &XPanel<'_>,
        wq: &[u8],
        ws: &[u8],
        nw: usize,
        i: usize,
        j: usize,
    ) -> [float32x4_t; 4] {
        let flip = vdupq_n_u8(0x80);
        let mut acc = [vdupq_n_f32(0.0); 4];
        for c in 0..nw {
            let (s, t) = (c * MR + i, c * NR + j);
            // SAFETY: slot s of the x panel's window c and row t of the W panel's (function
            // contract); the scale pair's 4 bytes at 4t.
            unsafe {
                let pair = std::ptr::read_unaligned(ws.as_ptr().add(t * 4) as *const [u16; 2]);
                let (d0, d1) = (
                    crate::wdtype::f16_to_f32(pair[0]),
                    crate::wdtype::f16_to_f32(pair[1]),
                );
                // [d0, d1, d0, d1]: even lanes take block 2c's scale, odd lanes block 2c + 1's.
                let dw = vld1q_f32([d0, d1, d0, d1].as_ptr());
                for q in 0..4 {
                    let xv = vld1q_s8(x.q.as_ptr().add(s * WIN + 16 * q));
                    let wv = vreinterpretq_s8_u8(veorq_u8(
                        vld1q_u8(wq.as_ptr().add(t * WIN + 16 * q)),
                        flip,
                    ));
                    let p = sdot(xv, wv);
                    let scale = vmulq_f32(vld1q_f32(x.d.as_ptr().add(s * LANES + 4 * q)), dw);
                    acc[q] = vfmaq_f32(acc[q], vcvtq_f32_s32(p), scale);
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn value(&mut self) -> f32 {
            let r = self.next();
            let scale = f32::powi(2.0, (r >> 20) as i32 % 13 - 6);
            let v = ((r % 20001) as f32 - 10000.0) / 5000.0 * scale;
            if r.is_multiple_of(17) {
                0.0
            } else {
                v
            }
        }
        fn values(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.value()).collect()
        }
    }

    #[test]
    fn blocks_quantize_as_ggml_does() {
        let mut q = [0i8; BLOCK];
        let v: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        let d = quantize_block(&v, &mut q);
        assert_eq!(d, 15.5 / 127.0);
        assert_eq!((q[0], q[31]), (-127, 127));
        // ±0.5 / d = ±4.097: -4 and 4; 2.5 / d = 20.48: 20.
        assert_eq!((q[15], q[16], q[18]), (-4, 4, 20));
        assert_eq!(quantize_block(&[0.0; 5], &mut q), 0.0);
        assert!(q.iter().all(|&v| v == 0));
    }

    #[test]
    fn the_vectorized_quantizer_is_the_reference_bit_for_bit() {
        let mut rng = Lcg(5);
        let mut blocks: Vec<[f32; BLOCK]> = (0..2000)
            .map(|_| std::array::from_fn(|_| rng.value()))
            .collect();
        // Exact halves after scaling (amax 127: id = 1): 2.5, -2.5, 0.5, 126.5.
        let mut halves = [0f32; BLOCK];
        halves[..5].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -126.5]);
        blocks.push(halves);
        // Just below and above a half, zeros of both signs, a NaN, infinities, denormals.
        let odd = [
            0.49999997,
            0.50000006,
            -0.0,
            0.0,
            f32::NAN,
            1e-40,
            -3e-39,
            7.0,
        ];
        let mut edge = [0f32; BLOCK];
        edge[..odd.len()].copy_from_slice(&odd);
        blocks.push(edge);
        blocks.push([f32::NAN; BLOCK]);
        blocks.push([0.0; BLOCK]);
        let mut inf = [1.0f32; BLOCK];
        inf[3] = f32::NEG_INFINITY;
        blocks.push(inf);
        for (i, b) in blocks.iter().enumerate() {
            let (mut want, mut got) = ([0i8; BLOCK], [0i8; BLOCK]);
            let dw = quantize_block(b, &mut want);
            for path in KernelPath::all_supported() {
                let dg = quantize_each(path, b, &mut got);
                assert_eq!(
                    (dg.to_bits(), got),
                    (dw.to_bits(), want),
                    "block {i} {path}"
                );
            }
        }
    }

    multiversion! {
        fn quantize_each(v: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> f32 => quantize32;
    }

    #[test]
    fn rows_read_back_as_scale_times_quant() {
        let mut rng = Lcg(9);
        let (n, k) = (7, 100);
        let w = rng.values(n * k);
        let m = PackedMatrix::pack_q8_0(&w, n, k);
        assert_eq!(m.dtype(), crate::WeightDtype::Q8_0);
        let mut row = vec![0f32; k];
        for r in [0, 3, 6] {
            m.copy_row(r, &mut row);
            for (b, block) in w[r * k..(r + 1) * k].chunks(BLOCK).enumerate() {
                let mut q = [0i8; BLOCK];
                let d = f16_to_f32(f16_bits(quantize_block(block, &mut q)));
                for (i, _) in block.iter().enumerate() {
                    assert_eq!(
                        row[b * BLOCK + i],
                        d * q[i] as f32,
                        "row {r} elem {}",
                        b * BLOCK + i
                    );
                }
            }
        }
    }

    #[test]
    fn every_path_equals_the_reference_bit_for_bit() {
        let mut rng = Lcg(21);
        for (m, n, k) in [
            (1, 7, 5),
            (3, 13, 70),
            (4, 6, 64),
            (9, 19, 200),
            (70, 13, 33),
            (2, 5, 1000),
        ] {
            let x = rng.values(m * k);
            let w = rng.values(n * k);
            let bias = rng.values(n);
            let packed = PackedMatrix::pack_q8_0(&w, n, k);
            let mut want = vec![0f32; m * n];
            for r in 0..m {
                for c in 0..n {
                    want[r * n + c] =
                        dot_q8_0(&x[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]) + bias[c];
                }
            }
            for path in KernelPath::all_supported() {
                for simd in [false, true] {
                    let dot = if simd {
                        IntDot::of(path)
                    } else {
                        IntDot::Plain
                    };
                    let mut y = vec![0f32; m * n];
                    linear_q8(path, simd, &x, m, &packed, Some(&bias), &mut y);
                    let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{path} {} m={m} n={n} k={k}", dot.name());
                }
            }
        }
    }

    #[test]
    fn which_integer_dot_ran_here() {
        // Not a check of numbers: says in the test log whether VNNI was tested on this CPU.
        eprintln!("avx512_vnni on this CPU: {}", cpu_has_vnni());
        for path in KernelPath::all_supported() {
            eprintln!("{path}: {}", IntDot::of(path).name());
        }
    }

    #[test]
    fn a_row_does_not_depend_on_its_batch_and_is_close_to_f32() {
        let mut rng = Lcg(4);
        let (m, n, k) = (37, 11, 256);
        let x = rng.values(m * k);
        let w = rng.values(n * k);
        let q = PackedMatrix::pack_q8_0(&w, n, k);
        let mut all = vec![0f32; m * n];
        crate::gemm::linear_packed(&x, m, &q, None, &mut all);
        for r in [0, 5, 36] {
            let mut one = vec![0f32; n];
            crate::gemm::linear_packed(&x[r * k..(r + 1) * k], 1, &q, None, &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
        let mut exact = vec![0f32; m * n];
        crate::gemm::linear(&x, m, k, &w, n, None, &mut exact);
        let scale = exact.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let err = all
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err > 0.0 && err < 0.05 * scale, "err {err} scale {scale}");
    }
}
