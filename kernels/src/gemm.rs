//! Batch-invariant f32 GEMM for linear layers: `y[M,N] = x[M,K] · W[N,K]^T (+ bias)`.
//!
//! Numeric contract: every output element is one dot product over the whole of `k`, reduced in
//! a fixed order that depends only on `K`:
//!   1. 16 lane accumulators; chunk `c` of 16 elements does `acc[l] = fma(x[16c+l], w[16c+l], acc[l])`;
//!      the last partial chunk is zero-padded (so no scalar tail with its own order);
//!   2. a fixed pairwise tree over the 16 lanes (`hsum16`), then `+ bias`.
//!
//! `K` is never split, so the value of `y[m][n]` does not depend on `M`, on the tile a thread
//! computes, on the register block shape or on the thread count. The AVX-512 path and the
//! portable path perform the identical sequence of fused multiply-adds and the identical lane
//! tree, and therefore agree bit for bit (`f32::mul_add` is a correctly rounded fma, like
//! `vfmadd`), which the tests check.
//!
//! Layout (the speed, not the numbers): `W` is packed once into [`PackedMatrix`] panels of `NR`
//! rows, chunk-interleaved (`[panel][chunk][NR][16]`, zero-padded in `K` and `N`, starting on
//! a cache line, see [`LineVec`]), so a micro-kernel reads one sequential stream of `W`; `x` is packed per call the same way in
//! panels of `MR` rows. The micro-kernel keeps `MR × NR` lane accumulators in registers, so each
//! loaded `W` chunk serves `MR` rows of `x` and each `x` chunk `NR` rows of `W`; the 16-lane
//! trees of 16 outputs are then done together with shuffles (same pairs, same order as
//! `hsum16`). Rows of `x` beyond `M` are never computed (the kernel is instantiated per row
//! count), so no work or result depends on what else is in the batch.
//!
//! 16-bit weights (bf16, f16: [`WeightDtype`]) are stored in the same panel layout at half the
//! bytes and widened to f32 as each chunk is loaded (bf16: a 16-bit shift; f16: `vcvtph2ps` or
//! the exact portable conversion), then go through the very same fma sequence and lane tree.
//! Widening is exact, so a bf16 matrix gives bit for bit the results of its values widened at
//! load; only the bytes streamed from memory change. AVX-512 BF16's `vdpbf16ps` is not used
//! here: it rounds the activations to bf16 too and sums its pairs in its own order, which would
//! break both this contract and f32 parity with transformers. It is the opt-in bf16 compute
//! mode's instruction instead, under that mode's own contract ([`bf16`]).
//!
//! Cost: O(M·N·K). Parallelism: one parallel region per call over (M block × N block) tasks (on
//! rayon's pool, or on a decode step's spinning team: [`crate::team`]); small
//! `M` (decode) gets a few large contiguous `N` ranges per thread, so the call streams `W` once
//! at memory bandwidth (its kernel also prefetches `W` 24 KiB ahead, except for one row of
//! 16-bit weights, which the hardware's prefetchers stream faster alone); large `M` (prefill) gets
//! cache-sized blocks (a `W` panel stays in L1 while the block's `x` panels stream from L2),
//! ordered so that consecutive tasks share their `W` block (read from memory once per call;
//! the packed `x` is the smaller operand).

use std::cell::Cell;

use rayon::prelude::*;

use crate::linevec::{LineBuf, LineVec};
use crate::path::{kernel_path, multiversion, KernelPath};
use crate::store::{SharedBytes, Store, ViewError};
use crate::wdtype::{Bf16, PackedElem, WeightDtype, F16};

pub mod bf16;
pub mod q8;
pub use bf16::{Bf16Dot, ComputeDtype};
pub use q8::IntDot;

/// Lanes of the fixed-order reduction. Part of the numeric contract: changing it changes results.
pub const LANES: usize = 16;

/// Rows of `x` per register block (and per packed `x` panel).
pub(crate) const MR: usize = 4;
/// Rows of `W` per register block (and per packed `W` panel).
pub(crate) const NR: usize = 6;
/// Floats of one chunk of a `W` panel.
pub(crate) const W_CHUNK: usize = NR * LANES;
/// Floats of one chunk of an `x` panel.
const X_CHUNK: usize = MR * LANES;
/// Accumulator slots a micro-kernel reduces, rounded up to whole 16-wide reductions.
pub(crate) const OUT_SLOTS: usize = (MR * NR).next_multiple_of(LANES);
/// `x` panels per task for large `M`: 64 rows, which stay in L2 while `W` panels pass.
const M_BLOCK_PANELS: usize = 16;
/// `W` panels per task for large `M` (96 rows).
const N_BLOCK_PANELS: usize = 16;
/// How far ahead of the current chunk the few-row SIMD kernels prefetch W (in elements: 24 KiB
/// of f32, 12 KiB of a 16-bit type):
/// across the page boundaries where the hardware streamer stops.
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_FLOATS: usize = 16 * W_CHUNK;
/// At or below this many `x` panels (32 rows) a call is "decode-like": it is bound by streaming
/// `W`, so `N` is cut into a few large ranges and all of `M` goes with each.
const SMALL_M_PANELS: usize = 8;
/// How many chunks ahead the many-row x86 kernels prefetch their x panel (streamed from L2
/// while a W panel sits in L1): 8 chunks = 2 KiB, about 100 cycles ahead.
#[cfg(target_arch = "x86_64")]
const X_PREFETCH: usize = 8;

/// The fixed pairwise lane tree shared by every path.
#[inline]
pub(crate) fn hsum16(a: &[f32; LANES]) -> f32 {
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

/// A `[n, k]` weight matrix packed for [`linear_packed`]: panels of `NR` rows, each stored
/// chunk by chunk (`[panel][k/16][NR][16]`), zero-padded to whole chunks and whole panels, in
/// f32 or in a 16-bit type ([`WeightDtype`]). Packing moves values, never changes them, so
/// results equal those of the row-major matrix (16-bit values widened to f32).
#[derive(Clone)]
pub struct PackedMatrix {
    n: usize,
    k: usize,
    /// Chunks of `LANES` per row (`ceil(k / 16)`).
    kc: usize,
    data: Panels,
    /// What [`linear_packed`] computes in with this matrix (bf16: [`bf16`]'s contract).
    compute: ComputeDtype,
}

/// The packed elements, in their storage type.
#[derive(Clone)]
enum Panels {
    F32(Store<f32>),
    Bf16(Store<Bf16>),
    F16(Store<F16>),
    Q8(q8::Q8Panels),
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("dtype", &self.dtype())
            .finish_non_exhaustive()
    }
}

/// Packs row-major `w` (`[n, k]`) into panels, converting each element with `elem`.
fn pack_panels<S: Copy, T: Copy + Default>(
    w: &[S],
    n: usize,
    k: usize,
    elem: impl Fn(S) -> T,
) -> LineBuf<T> {
    assert_eq!(w.len(), n * k, "w shape");
    let kc = k.div_ceil(LANES);
    let mut buf = LineBuf::zeroed(n.div_ceil(NR) * kc * W_CHUNK);
    let data = &mut buf[..];
    if k > 0 {
        for (r, row) in w.chunks_exact(k).enumerate() {
            let base = (r / NR) * kc * W_CHUNK + (r % NR) * LANES;
            for (c, part) in row.chunks(LANES).enumerate() {
                let o = base + c * W_CHUNK;
                for (d, &v) in data[o..o + part.len()].iter_mut().zip(part) {
                    *d = elem(v);
                }
            }
        }
    }
    buf
}

/// Row `r` of packed panels, widened into `out` (`k` elements).
fn copy_row_of<T: PackedElem>(data: &[T], kc: usize, r: usize, out: &mut [f32]) {
    let base = (r / NR) * kc * W_CHUNK + (r % NR) * LANES;
    for (c, part) in out.chunks_mut(LANES).enumerate() {
        let o = base + c * W_CHUNK;
        let src = &data[o..o + part.len()];
        for (d, v) in part.iter_mut().zip(src) {
            *d = v.widen();
        }
    }
}

impl PackedMatrix {
    /// Packs a row-major `[n, k]` f32 matrix (Hugging Face `[out, in]`).
    ///
    /// # Panics
    /// If `w.len() != n * k`.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        Self::with(n, k, Panels::F32(Store::Owned(pack_panels(w, n, k, |v| v))))
    }

    /// Packs a row-major `[n, k]` matrix of 16-bit values (`bits`, as a checkpoint stores them)
    /// kept in `dtype` (bf16 or f16).
    ///
    /// # Panics
    /// If `bits.len() != n * k`, or `dtype` is f32 (use [`Self::pack`]).
    pub fn pack_16bit(bits: &[u16], n: usize, k: usize, dtype: WeightDtype) -> Self {
        let data = match dtype {
            WeightDtype::Bf16 => Panels::Bf16(Store::Owned(pack_panels(bits, n, k, Bf16))),
            WeightDtype::F16 => Panels::F16(Store::Owned(pack_panels(bits, n, k, F16))),
            WeightDtype::F32 | WeightDtype::Q8_0 => {
                panic!("pack_16bit of {dtype}: use PackedMatrix::pack or pack_q8_0")
            }
        };
        Self::with(n, k, data)
    }

    /// Quantizes a row-major `[n, k]` f32 matrix to Q8_0 (see [`q8`]; lossy).
    ///
    /// # Panics
    /// If `w.len() != n * k`.
    pub fn pack_q8_0(w: &[f32], n: usize, k: usize) -> Self {
        Self::with(n, k, Panels::Q8(q8::pack(w, n, k)))
    }

    /// What the packed layout is, as one string: a file of packed panels is valid for a build
    /// whose layout string is the same (the kernel paths share it).
    pub const LAYOUT: &'static str = "panels of 6 rows, chunks of 16 lanes, \
        [panel][chunk][row][lane]; q8_0: windows of 64 in pairs of blocks by lane, \
        f16 scales after the quants";

    /// Bytes the packed panels of an `[n, k]` matrix of `dtype` take ([`Self::panel_bytes`]'s
    /// length).
    pub fn panel_len(n: usize, k: usize, dtype: WeightDtype) -> usize {
        match dtype {
            WeightDtype::Q8_0 => q8::Q8Panels::len(n, k),
            _ => n.div_ceil(NR) * k.div_ceil(LANES) * W_CHUNK * dtype.bytes(),
        }
    }

    /// An `[n, k]` matrix of `dtype` whose packed panels are the [`Self::panel_len`] bytes of
    /// `bytes` from `offset` (as [`Self::panel_bytes`] wrote them), viewed, not copied: every
    /// matrix and process mapping the same file reads the same pages. `offset` must start a
    /// 64-byte cache line.
    pub fn view(
        bytes: SharedBytes,
        offset: usize,
        n: usize,
        k: usize,
        dtype: WeightDtype,
    ) -> Result<Self, ViewError> {
        let len = Self::panel_len(n, k, dtype) / dtype.bytes();
        let data = match dtype {
            WeightDtype::F32 => Panels::F32(Store::view(bytes, offset, len)?),
            WeightDtype::Bf16 => Panels::Bf16(Store::view(bytes, offset, len)?),
            WeightDtype::F16 => Panels::F16(Store::view(bytes, offset, len)?),
            WeightDtype::Q8_0 => Panels::Q8(q8::Q8Panels::view(bytes, offset, n, k)?),
        };
        Ok(Self::with(n, k, data))
    }

    /// The packed panels as bytes (little-endian elements, padding included): what
    /// [`Self::view`] reads back.
    pub fn panel_bytes(&self) -> &[u8] {
        match &self.data {
            Panels::F32(d) => d.as_bytes(),
            Panels::Bf16(d) => d.as_bytes(),
            Panels::F16(d) => d.as_bytes(),
            Panels::Q8(p) => p.as_bytes(),
        }
    }

    /// Whether the panels are viewed in shared bytes ([`Self::view`]) rather than owned.
    pub fn is_shared(&self) -> bool {
        match &self.data {
            Panels::F32(d) => d.is_shared(),
            Panels::Bf16(d) => d.is_shared(),
            Panels::F16(d) => d.is_shared(),
            Panels::Q8(p) => p.is_shared(),
        }
    }

    fn with(n: usize, k: usize, data: Panels) -> Self {
        PackedMatrix {
            n,
            k,
            kc: k.div_ceil(LANES),
            data,
            compute: ComputeDtype::F32,
        }
    }

    /// Makes [`linear_packed`] compute in `compute` with this matrix. Only how it is used
    /// changes, never the panels (a shared view serves both modes).
    ///
    /// # Panics
    /// For [`ComputeDtype::Bf16`] on a non-empty matrix not stored as bf16 (the loader rounds
    /// every matrix to bf16 in that mode first).
    pub fn set_compute(&mut self, compute: ComputeDtype) {
        if self.n * self.k == 0 && self.dtype() != WeightDtype::Bf16 {
            // No element, no product: an empty matrix (a layer with experts has empty dense
            // projections) stays as it is.
            return;
        }
        assert!(
            compute == ComputeDtype::F32 || self.dtype() == WeightDtype::Bf16,
            "the bf16 compute mode needs bf16 weights, not {}",
            self.dtype()
        );
        self.compute = compute;
    }

    /// What [`linear_packed`] computes in with this matrix.
    pub fn compute(&self) -> ComputeDtype {
        self.compute
    }

    /// Rows (`n`, output features).
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Columns (`k`, input features).
    pub fn cols(&self) -> usize {
        self.k
    }

    /// How the elements are stored.
    pub fn dtype(&self) -> WeightDtype {
        match self.data {
            Panels::F32(_) => WeightDtype::F32,
            Panels::Bf16(_) => WeightDtype::Bf16,
            Panels::F16(_) => WeightDtype::F16,
            Panels::Q8(_) => WeightDtype::Q8_0,
        }
    }

    /// Bytes of the packed panels (padding included), owned or viewed.
    pub fn bytes(&self) -> usize {
        match &self.data {
            Panels::Q8(p) => p.bytes(),
            _ => Self::panel_len(self.n, self.k, self.dtype()),
        }
    }

    /// Copies row `r` out, widened to f32 (e.g. an embedding lookup on a tied matrix).
    ///
    /// # Panics
    /// If `r >= rows()` or `out.len() != cols()`.
    pub fn copy_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n && out.len() == self.k, "row out of range");
        match &self.data {
            Panels::F32(d) => copy_row_of(d, self.kc, r, out),
            Panels::Bf16(d) => copy_row_of(d, self.kc, r, out),
            Panels::F16(d) => copy_row_of(d, self.kc, r, out),
            Panels::Q8(p) => Self::q8_row(p, self.n, self.k, r, out),
        }
    }

    /// The row-major `[n, k]` matrix, widened to f32.
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.n * self.k];
        if self.k > 0 {
            for (r, row) in w.chunks_exact_mut(self.k).enumerate() {
                self.copy_row(r, row);
            }
        }
        w
    }
}

thread_local! {
    /// The packed `x` of the current call, kept between calls so a decode step allocates nothing.
    static X_PACK: Cell<LineVec> = const { Cell::new(LineVec::new()) };
}

/// Packs `x` (`[m, k]`) into `[m/MR][kc][MR][16]`, zero-padded, reusing `buf`. Every element
/// is written once (whole chunks as fixed 16-float copies), so the buffer needs no clearing.
fn pack_x(x: &[f32], m: usize, k: usize, kc: usize, buf: &mut LineVec) {
    let panel = kc * X_CHUNK;
    buf.resize(m.div_ceil(MR) * panel);
    let fill = |(q, dst): (usize, &mut [f32])| {
        let rows = MR.min(m - q * MR);
        for (c, chunk) in dst.chunks_exact_mut(X_CHUNK).enumerate() {
            let (k0, k1) = (c * LANES, ((c + 1) * LANES).min(k));
            for (i, lanes) in chunk.chunks_exact_mut(LANES).enumerate() {
                if i >= rows {
                    lanes.fill(0.0);
                } else if k1 - k0 == LANES {
                    let src = &x[(q * MR + i) * k + k0..][..LANES];
                    lanes.copy_from_slice(src);
                } else {
                    let src = &x[(q * MR + i) * k + k0..(q * MR + i) * k + k1];
                    lanes[..src.len()].copy_from_slice(src);
                    lanes[src.len()..].fill(0.0);
                }
            }
        }
    };
    if m >= 64 {
        buf.par_chunks_mut(panel).enumerate().for_each(fill);
    } else {
        buf.chunks_mut(panel).enumerate().for_each(fill);
    }
}

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (row, column) ranges of the output, see `linear_packed`.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no element is written by two tasks or read while written.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Element `i` (taking `self` whole keeps closures capturing the `Sync` wrapper, not the
    /// raw pointer field).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// `y[M,N] = x[M,K] · W[N,K]^T + bias` with a row-major `w` (`[n, k]`). Packs `w` on every
/// call; hot paths pack once and call [`linear_packed`].
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
    linear_packed(x, m, &PackedMatrix::pack(w, n, k), bias, y);
}

/// `y[M,N] = x[M,K] · W[N,K]^T + bias`: `x` row-major `[m, k]`, `y` row-major `[m, n]`.
///
/// # Panics
/// If the slice lengths do not match the shapes (a caller bug, never external input).
pub fn linear_packed(x: &[f32], m: usize, w: &PackedMatrix, bias: Option<&[f32]>, y: &mut [f32]) {
    linear_with(kernel_path(), x, m, w, bias, y);
}

/// [`linear_packed`] on a given path (tests and benchmarks compare paths in one process).
///
/// # Panics
/// As [`linear_packed`]; and if `path` is not supported by this CPU.
pub fn linear_with(
    path: KernelPath,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert!(
        path.supported(),
        "kernel path {path} is not supported by this CPU"
    );
    if w.compute == ComputeDtype::Bf16 {
        return bf16::linear_bf16_with(path, Bf16Dot::best(path), x, m, w, bias, y);
    }
    check_shapes(x, m, w, bias, y);
    if m == 0 || w.n == 0 {
        return;
    }
    if let Panels::Q8(_) = w.data {
        return q8::linear_q8(path, true, x, m, w, bias, y);
    }
    let (n, k, kc) = (w.n, w.k, w.kc);
    let mut xs = X_PACK.take();
    pack_x(x, m, k, kc, &mut xs);
    let shape = Shape { m, n, kc };
    match &w.data {
        Panels::F32(d) => run_blocks(path, &xs, d, shape, bias, y),
        Panels::Bf16(d) => run_blocks(path, &xs, d, shape, bias, y),
        Panels::F16(d) => run_blocks(path, &xs, d, shape, bias, y),
        Panels::Q8(_) => unreachable!("q8_0 is computed above"),
    }
    X_PACK.set(xs);
}

/// Asserts the shapes of one call: caller bugs, never external input.
fn check_shapes(x: &[f32], m: usize, w: &PackedMatrix, bias: Option<&[f32]>, y: &[f32]) {
    assert_eq!(x.len(), m * w.k, "x shape");
    assert_eq!(y.len(), m * w.n, "y shape");
    if let Some(b) = bias {
        assert_eq!(b.len(), w.n, "bias shape");
    }
}

/// The problem of one call: rows of `x`, rows of `W`, chunks per row.
#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    n: usize,
    kc: usize,
}

/// Every (M block × N block) task of one call over packed `x` panels `xs` and `W` panels `wd`.
fn run_blocks<T: GemmElem>(
    path: KernelPath,
    xs: &[f32],
    wd: &[T],
    shape: Shape,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let kc = shape.kc;
    for_each_block(shape.m, shape.n, bias, y, |q, p, rows, res| {
        let wp = &wd[p * kc * W_CHUNK..(p + 1) * kc * W_CHUNK];
        let xp = &xs[q * kc * X_CHUNK..(q + 1) * kc * X_CHUNK];
        micro(path, xp, wp, kc, rows, res);
    });
}

/// Runs `micro(q, p, rows, res)` for every `x` panel `q` (`rows` of its `MR` are real) and `W`
/// panel `p` of an `[m, n]` output, in (M block × N block) tasks over the rayon pool, then adds
/// `bias` and stores each block into `y`. `micro` fills `res[i * NR + j]` with the dot product of
/// panel row `i` and W panel row `j`. The blocking is the speed, never the numbers: every
/// element is one `micro` result plus its bias.
pub(crate) fn for_each_block<F>(m: usize, n: usize, bias: Option<&[f32]>, y: &mut [f32], micro: F)
where
    F: Fn(usize, usize, usize, &mut [f32; OUT_SLOTS]) + Sync,
{
    let (mp, np) = (m.div_ceil(MR), n.div_ceil(NR));
    let threads = rayon::current_num_threads().max(1);
    let (m_block, n_block) = if mp <= SMALL_M_PANELS {
        // Bandwidth-bound: a few big contiguous ranges of W per thread (several per thread so a
        // busy core does not hold the whole call back).
        let min_panels = 8;
        (mp, np.div_ceil(threads * 4).max(min_panels))
    } else {
        (M_BLOCK_PANELS, N_BLOCK_PANELS)
    };
    let (m_blocks, n_blocks) = (mp.div_ceil(m_block), np.div_ceil(n_block));
    let out = OutPtr(y.as_mut_ptr());
    let run = |task: usize| {
        let (mt, nt) = (task % m_blocks, task / m_blocks);
        let (q0, q1) = (mt * m_block, ((mt + 1) * m_block).min(mp));
        let (p0, p1) = (nt * n_block, ((nt + 1) * n_block).min(np));
        let mut res = [0f32; OUT_SLOTS];
        for p in p0..p1 {
            let n0 = p * NR;
            let cols = NR.min(n - n0);
            for q in q0..q1 {
                let rows = MR.min(m - q * MR);
                micro(q, p, rows, &mut res);
                let bias = bias.map(|b| &b[n0..n0 + cols]);
                for i in 0..rows {
                    let src = &mut res[i * NR..i * NR + cols];
                    if let Some(b) = bias {
                        for (v, &b) in src.iter_mut().zip(b) {
                            *v += b;
                        }
                    }
                    // Element stores, not a copy call: `cols` is at most NR.
                    for (j, &v) in src.iter().enumerate() {
                        // SAFETY: this task is the only writer of rows of x panels q0..q1 and
                        // columns of W panels p0..p1; row q*MR+i < m and column n0+j < n lie
                        // inside `y`, which is borrowed mutably for the whole call.
                        unsafe { *out.at((q * MR + i) * n + n0 + j) = v };
                    }
                }
            }
        }
    };
    let tasks = m_blocks * n_blocks;
    if tasks == 1 {
        run(0);
    } else {
        crate::team::for_each(tasks, run);
    }
}

/// One `rows × NR` block: `res[i * NR + j]` = dot of x panel row `i` and W panel row `j`.
fn micro<T: GemmElem>(
    path: KernelPath,
    xp: &[f32],
    wp: &[T],
    kc: usize,
    rows: usize,
    res: &mut [f32; OUT_SLOTS],
) {
    debug_assert!(xp.len() == kc * X_CHUNK && wp.len() == kc * W_CHUNK);
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512` is only chosen (and `linear_with` only runs it) when the CPU reports
        // avx512f (and f16c); the panels hold `kc` whole chunks (asserted in debug, guaranteed by packing).
        KernelPath::Avx512 => unsafe {
            match rows {
                1 => avx512::micro::<T, 1>(xp.as_ptr(), wp.as_ptr(), kc, res),
                2 => avx512::micro::<T, 2>(xp.as_ptr(), wp.as_ptr(), kc, res),
                3 => avx512::micro::<T, 3>(xp.as_ptr(), wp.as_ptr(), kc, res),
                _ => avx512::micro::<T, MR>(xp.as_ptr(), wp.as_ptr(), kc, res),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is only chosen when the CPU reports avx2, fma and f16c; panels as above.
        KernelPath::Avx2 => unsafe { avx2::micro(xp.as_ptr(), wp.as_ptr(), kc, rows, res) },
        _ => T::lanes_micro(path, xp, wp, kc, rows, res),
    }
}

/// A packed element type with its generic micro-kernel instantiated for every path.
trait GemmElem: PackedElem {
    fn lanes_micro(
        path: KernelPath,
        xp: &[f32],
        wp: &[Self],
        kc: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    );
}

/// The generic micro-kernel (portable and NEON paths) of element type `$t`, compiled per path.
macro_rules! lanes_micro_for {
    ($t:ty, $name:ident, $body:ident) => {
        #[inline(always)]
        fn $body(xp: &[f32], wp: &[$t], kc: usize, rows: usize, res: &mut [f32; OUT_SLOTS]) {
            lanes_micro_body::<$t>(xp, wp, kc, rows, res)
        }

        multiversion! {
            fn $name(
                xp: &[f32],
                wp: &[$t],
                kc: usize,
                rows: usize,
                res: &mut [f32; OUT_SLOTS],
            ) => $body;
        }

        impl GemmElem for $t {
            fn lanes_micro(
                path: KernelPath,
                xp: &[f32],
                wp: &[$t],
                kc: usize,
                rows: usize,
                res: &mut [f32; OUT_SLOTS],
            ) {
                $name(path, xp, wp, kc, rows, res)
            }
        }
    };
}

lanes_micro_for!(f32, lanes_micro_f32, lanes_micro_body_f32);
lanes_micro_for!(Bf16, lanes_micro_bf16, lanes_micro_body_bf16);
lanes_micro_for!(F16, lanes_micro_f16, lanes_micro_body_f16);

/// In register blocks of 2 × 3 (or 1 × 6) dot products whose 16-lane accumulators the compiler
/// keeps in vector registers.
#[inline(always)]
fn lanes_micro_body<T: PackedElem>(
    xp: &[f32],
    wp: &[T],
    kc: usize,
    rows: usize,
    res: &mut [f32; OUT_SLOTS],
) {
    let mut i0 = 0;
    while i0 < rows {
        if rows - i0 >= 2 {
            lanes_block::<T, 2, 3>(xp, wp, kc, i0, 0, res);
            lanes_block::<T, 2, 3>(xp, wp, kc, i0, 3, res);
            i0 += 2;
        } else {
            lanes_block::<T, 1, NR>(xp, wp, kc, i0, 0, res);
            i0 += 1;
        }
    }
}

/// Rows `i0..i0 + A` of the x panel against rows `j0..j0 + B` of the W panel, in the contract
/// order (per lane: one fma per chunk, chunks in order; then `hsum16`).
#[inline(always)]
fn lanes_block<T: PackedElem, const A: usize, const B: usize>(
    xp: &[f32],
    wp: &[T],
    kc: usize,
    i0: usize,
    j0: usize,
    res: &mut [f32; OUT_SLOTS],
) {
    let mut acc = [[[0f32; LANES]; B]; A];
    for c in 0..kc {
        let xc = &xp[c * X_CHUNK + i0 * LANES..][..A * LANES];
        let wc = &wp[c * W_CHUNK + j0 * LANES..][..B * LANES];
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let xs = &xc[i * LANES..(i + 1) * LANES];
            for (j, acc_ij) in acc_i.iter_mut().enumerate() {
                let ws = &wc[j * LANES..(j + 1) * LANES];
                for l in 0..LANES {
                    acc_ij[l] = xs[l].mul_add(ws[l].widen(), acc_ij[l]);
                }
            }
        }
    }
    for (i, acc_i) in acc.iter().enumerate() {
        for (j, acc_ij) in acc_i.iter().enumerate() {
            res[(i0 + i) * NR + j0 + j] = hsum16(acc_ij);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 + FMA micro-kernel: each 16-lane accumulator is a pair of 256-bit registers
    //! (lanes 0–7, lanes 8–15), so the fma sequence per lane is `dot_fixed`'s; the tree's first
    //! step (`a[l] + a[l + 8]`) is then one vector add of the pair.
    // Index loops over the (i, j) register block read like the math and unroll fully.
    #![allow(clippy::needless_range_loop)]
    use super::{LANES, NR, OUT_SLOTS, PREFETCH_FLOATS, W_CHUNK, X_CHUNK, X_PREFETCH};
    use crate::wdtype::{PackedElem, WeightDtype};
    use std::arch::x86_64::*;

    /// 8 weights at `p`, widened to f32 (exactly).
    ///
    /// # Safety
    /// The CPU must support avx2 and f16c; `p` must hold 8 elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8<T: PackedElem>(p: *const T) -> __m256 {
        // SAFETY (each arm): 8 elements at `p` (function contract): 32 bytes of f32, 16 of a
        // 16-bit type.
        unsafe {
            match T::DTYPE {
                WeightDtype::F32 => _mm256_loadu_ps(p as *const f32),
                WeightDtype::Bf16 => {
                    let h = _mm_loadu_si128(p as *const __m128i);
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
                }
                WeightDtype::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                WeightDtype::Q8_0 => unreachable!("no PackedElem is q8_0"),
            }
        }
    }

    /// `res[i * NR + j]` for `i < rows`, `j < NR`.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c; `xp` must hold `kc * X_CHUNK` floats and `wp`
    /// `kc * W_CHUNK` elements; `rows <= MR`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn micro<T: PackedElem>(
        xp: *const f32,
        wp: *const T,
        kc: usize,
        rows: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        // 12 accumulator registers of 16: two rows × six W rows, one half of the lanes at a
        // time (lane l's chain never meets lane l + 8's before the tree), or one row × six W
        // rows with both halves (a single row streams W from memory: read it once).
        // SAFETY (all calls): function contract; i0 + 2 <= rows <= MR, or i0 < rows.
        unsafe {
            let mut i0 = 0;
            while i0 < rows {
                if rows - i0 >= 2 {
                    let lo = half::<T, 2>(xp, wp, kc, i0, 0);
                    let hi = half::<T, 2>(xp, wp, kc, i0, 8);
                    for i in 0..2 {
                        for j in 0..NR {
                            res[(i0 + i) * NR + j] = hsum16_pair(lo[i][j], hi[i][j]);
                        }
                    }
                    i0 += 2;
                } else {
                    one_row(xp, wp, kc, i0, res);
                    i0 += 1;
                }
            }
        }
    }

    /// Lanes `off..off + 8` of the accumulators of rows `i0..i0 + A` against all `NR` W rows.
    ///
    /// # Safety
    /// As [`micro`], with `i0 + A <= MR` and `off` 0 or 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn half<T: PackedElem, const A: usize>(
        xp: *const f32,
        wp: *const T,
        kc: usize,
        i0: usize,
        off: usize,
    ) -> [[__m256; NR]; A] {
        let mut acc = [[_mm256_setzero_ps(); NR]; A];
        for c in 0..kc {
            // SAFETY: chunk c < kc of both panels, rows i0 + i < MR and j < NR inside it, 8
            // floats at `off` (function contract).
            unsafe {
                let (xc, wc) = (
                    xp.add(c * X_CHUNK + i0 * LANES + off),
                    wp.add(c * W_CHUNK + off),
                );
                if off == 0 {
                    for i in 0..A {
                        let ahead = xc.wrapping_add(X_PREFETCH * X_CHUNK + i * LANES);
                        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                    }
                }
                let mut xv = [_mm256_setzero_ps(); A];
                for i in 0..A {
                    xv[i] = _mm256_loadu_ps(xc.add(i * LANES));
                }
                for j in 0..NR {
                    let wv = load8(wc.add(j * LANES));
                    for i in 0..A {
                        acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
            }
        }
        acc
    }

    /// Row `i0` of the x panel against all `NR` W rows, both halves of the lanes at once.
    ///
    /// # Safety
    /// As [`micro`], with `i0 < MR`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn one_row<T: PackedElem>(
        xp: *const f32,
        wp: *const T,
        kc: usize,
        i0: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        let mut acc = [[_mm256_setzero_ps(); NR]; 2];
        for c in 0..kc {
            // SAFETY: chunk c < kc of both panels, row i0 < MR inside it (function contract).
            let (xc, wc) = unsafe { (xp.add(c * X_CHUNK + i0 * LANES), wp.add(c * W_CHUNK)) };
            // One row streams W from memory: prefetch the whole chunk well ahead (a hint; past
            // the end of the panel it never faults).
            // One hint per cache line: a 16-bit chunk row is half a line.
            for j in (0..NR).step_by(4 / std::mem::size_of::<T>()) {
                let ahead = wc.wrapping_add(PREFETCH_FLOATS + j * LANES);
                _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            }
            for (half, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 8 floats at offset 8 * half of row i0 < MR of chunk c.
                let xv = unsafe { _mm256_loadu_ps(xc.add(8 * half)) };
                for j in 0..NR {
                    // SAFETY: row j < NR of chunk c.
                    let wv = unsafe { load8(wc.add(j * LANES + 8 * half)) };
                    acc[j] = _mm256_fmadd_ps(xv, wv, acc[j]);
                }
            }
        }
        for j in 0..NR {
            res[i0 * NR + j] = hsum16_pair(acc[0][j], acc[1][j]);
        }
    }

    /// `hsum16` of the 16 lanes `lo ++ hi`, pair for pair in its order.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn hsum16_pair(lo: __m256, hi: __m256) -> f32 {
        let s8 = _mm256_add_ps(lo, hi); // s8[i] = a[i] + a[i + 8]
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); // [s4[0] + s4[2], s4[1] + s4[3], ..]
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    //! The AVX-512 micro-kernel; same FMA sequence and lane tree as `dot_fixed`.
    // Index loops over the (i, j) register block read like the math and unroll fully.
    #![allow(clippy::needless_range_loop)]
    use super::{LANES, NR, OUT_SLOTS, PREFETCH_FLOATS, W_CHUNK, X_CHUNK, X_PREFETCH};
    use crate::wdtype::{PackedElem, WeightDtype};
    use std::arch::x86_64::*;

    /// 16 weights at `p`, widened to f32 (exactly).
    ///
    /// # Safety
    /// The CPU must support avx512f; `p` must hold 16 elements.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load16<T: PackedElem>(p: *const T) -> __m512 {
        // SAFETY (each arm): 16 elements at `p` (function contract): 64 bytes of f32, 32 of a
        // 16-bit type.
        unsafe {
            match T::DTYPE {
                WeightDtype::F32 => _mm512_loadu_ps(p as *const f32),
                WeightDtype::Bf16 => {
                    let h = _mm256_loadu_si256(p as *const __m256i);
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
                }
                WeightDtype::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
                WeightDtype::Q8_0 => unreachable!("no PackedElem is q8_0"),
            }
        }
    }

    /// `res[i * NR + j]` for `i < A`: the dot products of packed x panel rows and W panel rows.
    ///
    /// # Safety
    /// The CPU must support avx512f; `xp` must hold `kc * X_CHUNK` floats and `wp` `kc * W_CHUNK`
    /// elements.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn micro<T: PackedElem, const A: usize>(
        xp: *const f32,
        wp: *const T,
        kc: usize,
        res: &mut [f32; OUT_SLOTS],
    ) {
        // SAFETY: function contract.
        let acc = unsafe { chains::<T, A>(xp, wp, kc) };
        let mut flat = [_mm512_setzero_ps(); OUT_SLOTS];
        for i in 0..A {
            for j in 0..NR {
                flat[i * NR + j] = acc[i][j];
            }
        }
        let used = (A * NR).div_ceil(LANES);
        for g in 0..used {
            let mut v = [_mm512_setzero_ps(); LANES];
            v.copy_from_slice(&flat[g * LANES..(g + 1) * LANES]);
            // SAFETY: avx512f is present (function contract); `res` holds OUT_SLOTS >= (g + 1) * 16
            // floats.
            unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(g * LANES), reduce16(&v)) };
        }
    }

    /// The per-lane fma chains of rows `0..A` of the x panel against the `NR` W rows, kept in
    /// its own function so the register allocator sees only the loop (inlined into the
    /// reduction it spilled an accumulator every chunk).
    ///
    /// # Safety
    /// As [`micro`].
    #[target_feature(enable = "avx512f")]
    #[inline(never)]
    unsafe fn chains<T: PackedElem, const A: usize>(
        xp: *const f32,
        wp: *const T,
        kc: usize,
    ) -> [[__m512; NR]; A] {
        let mut acc = [[_mm512_setzero_ps(); NR]; A];
        for c in 0..kc {
            // SAFETY: chunk c < kc of both panels is in bounds (function contract).
            let (xc, wc) = unsafe { (xp.add(c * X_CHUNK), wp.add(c * W_CHUNK)) };
            if A == 2 || (A == 1 && std::mem::size_of::<T>() == 4) {
                // Few rows: the kernel streams W from memory; prefetching well ahead (across
                // the page boundaries where the hardware streamer stops) keeps more lines in
                // flight. Not for one row of 16-bit weights: there the hardware's prefetchers
                // alone stream them faster (docs/BENCHMARKS.md, "16-bit weights at batch 1").
                // A prefetch is a hint: past the end of the panel it never faults.
                // One hint per cache line: a 16-bit chunk row is half a line.
                for j in (0..NR).step_by(4 / std::mem::size_of::<T>()) {
                    let ahead = wc.wrapping_add(PREFETCH_FLOATS + j * LANES);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                }
            } else {
                // Many rows: the x panel streams from L2 (a hint again; past its end it runs
                // into the next panel, which comes next).
                for i in 0..A {
                    let ahead = xc.wrapping_add(X_PREFETCH * X_CHUNK + i * LANES);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                }
            }
            let mut xv = [_mm512_setzero_ps(); A];
            for i in 0..A {
                // SAFETY: row i < A <= MR of chunk c.
                xv[i] = unsafe { _mm512_loadu_ps(xc.add(i * LANES)) };
            }
            for j in 0..NR {
                // SAFETY: row j < NR of chunk c.
                let wv = unsafe { load16(wc.add(j * LANES)) };
                for i in 0..A {
                    acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                }
            }
        }
        acc
    }

    /// Lane `o` of the result is `hsum16(v[o])`, with the very same pairs added in the same
    /// tree (each step adds `a[i] + a[i + h]` for the tree's half width `h`), done 16 at a time.
    ///
    /// # Safety
    /// The CPU must support avx512f.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn reduce16(v: &[__m512; LANES]) -> __m512 {
        // s8: lanes 0..8 of the pair's first vector + lanes 8..16, likewise for the second.
        let mut r8 = [_mm512_setzero_ps(); 8];
        for p in 0..8 {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            let lo = _mm512_shuffle_f32x4::<0x44>(a, b);
            let hi = _mm512_shuffle_f32x4::<0xEE>(a, b);
            r8[p] = _mm512_add_ps(lo, hi);
        }
        // s4: in each 8-lane half, quarter 0 + quarter 1 → [s4(4q) | s4(4q+1) | ...].
        let mut r4 = [_mm512_setzero_ps(); 4];
        for q in 0..4 {
            let (c, d) = (r8[2 * q], r8[2 * q + 1]);
            let lo = _mm512_shuffle_f32x4::<0x88>(c, d);
            let hi = _mm512_shuffle_f32x4::<0xDD>(c, d);
            r4[q] = _mm512_add_ps(lo, hi);
        }
        // s2: in each quarter, elements (0, 1) + (2, 3).
        let mut r2 = [_mm512_setzero_ps(); 2];
        for r in 0..2 {
            let (e, f) = (r4[2 * r], r4[2 * r + 1]);
            let lo = _mm512_shuffle_ps::<0x44>(e, f);
            let hi = _mm512_shuffle_ps::<0xEE>(e, f);
            r2[r] = _mm512_add_ps(lo, hi);
        }
        // s1: element 0 + element 1 of each pair; lane 4k + j now holds output 4j + k.
        let lo = _mm512_shuffle_ps::<0x88>(r2[0], r2[1]);
        let hi = _mm512_shuffle_ps::<0xDD>(r2[0], r2[1]);
        let s = _mm512_add_ps(lo, hi);
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, s)
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

    #[test]
    fn every_path_equals_dot_fixed_for_every_shape_and_batch() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        // K tails, N edges of every panel remainder, M edges of every panel remainder, and both
        // the decode-like and the blocked task layouts (M above 32 rows).
        for &(m, k, n) in &[
            (1, 16, 6),
            (2, 33, 7),
            (3, 64, 13),
            (5, 1, 11),
            (9, 47, 200),
            (33, 100, 37),
            (70, 129, 101),
            (130, 48, 250),
        ] {
            let x = rand_vec(&mut rng, m * k);
            let w = rand_vec(&mut rng, n * k);
            let b = rand_vec(&mut rng, n);
            let pw = PackedMatrix::pack(&w, n, k);
            assert_eq!(pw.unpack(), w);
            for imp in KernelPath::all_supported() {
                let mut y = vec![0f32; m * n];
                linear_with(imp, &x, m, &pw, Some(&b), &mut y);
                for i in 0..m {
                    for j in 0..n {
                        let d = dot_fixed(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]) + b[j];
                        assert_eq!(d.to_bits(), y[i * n + j].to_bits(), "{imp:?} {m}x{k}x{n}");
                    }
                }
                // Any prefix of the batch gives the same rows.
                for mm in [1, m / 2, m - 1] {
                    let mut y2 = vec![0f32; mm * n];
                    linear_with(imp, &x[..mm * k], mm, &pw, Some(&b), &mut y2);
                    assert_eq!(y2, y[..mm * n], "{imp:?} prefix {mm}");
                }
            }
        }
    }

    /// `w` rounded to `dtype` (to nearest even), as the 16-bit bits a checkpoint stores.
    fn to_bits16(w: &[f32], dtype: WeightDtype) -> Vec<u16> {
        w.iter()
            .map(|&v| match dtype {
                WeightDtype::Bf16 => half::bf16::from_f32(v).to_bits(),
                _ => half::f16::from_f32(v).to_bits(),
            })
            .collect()
    }

    #[test]
    fn sixteen_bit_weights_equal_their_f32_widening_on_every_path() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for &(m, k, n) in &[
            (1, 16, 6),
            (2, 33, 7),
            (5, 1, 11),
            (9, 47, 200),
            (70, 129, 101),
        ] {
            let x = rand_vec(&mut rng, m * k);
            // Wide magnitudes: f16 subnormals and bf16's short mantissa both show up.
            let w: Vec<f32> = (0..n * k)
                .map(|_| rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-7..2)))
                .collect();
            let b = rand_vec(&mut rng, n);
            for dtype in [WeightDtype::Bf16, WeightDtype::F16] {
                let p16 = PackedMatrix::pack_16bit(&to_bits16(&w, dtype), n, k, dtype);
                assert_eq!(p16.dtype(), dtype);
                let wide = p16.unpack();
                let p32 = PackedMatrix::pack(&wide, n, k);
                assert!(p16.bytes() < p32.bytes());
                for imp in KernelPath::all_supported() {
                    let (mut y16, mut y32) = (vec![0f32; m * n], vec![0f32; m * n]);
                    linear_with(imp, &x, m, &p16, Some(&b), &mut y16);
                    linear_with(imp, &x, m, &p32, Some(&b), &mut y32);
                    for i in 0..m {
                        for j in 0..n {
                            let d = dot_fixed(&x[i * k..(i + 1) * k], &wide[j * k..(j + 1) * k]);
                            let (got, want) = (y16[i * n + j], d + b[j]);
                            assert_eq!(got.to_bits(), want.to_bits(), "{imp} {dtype} {m}x{k}x{n}");
                        }
                    }
                    assert_eq!(y16, y32, "{imp} {dtype}");
                }
            }
        }
    }

    /// Line-aligned bytes to view, as a memory-mapped file's are.
    struct FileBytes(LineBuf<u8>);

    impl AsRef<[u8]> for FileBytes {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    #[test]
    fn a_viewed_matrix_computes_what_the_owned_one_does() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let (m, k, n) = (5, 70, 13);
        let x = rand_vec(&mut rng, m * k);
        let w = rand_vec(&mut rng, n * k);
        for dtype in WeightDtype::ALL {
            let owned = match dtype {
                WeightDtype::F32 => PackedMatrix::pack(&w, n, k),
                WeightDtype::Q8_0 => PackedMatrix::pack_q8_0(&w, n, k),
                d => PackedMatrix::pack_16bit(&to_bits16(&w, d), n, k, d),
            };
            // Two matrices in one file, the second at the next line after the first.
            let first = owned.panel_bytes().len();
            assert_eq!(first, PackedMatrix::panel_len(n, k, dtype));
            let second = first.next_multiple_of(64);
            let mut file = LineBuf::zeroed(second + first);
            file[..first].copy_from_slice(owned.panel_bytes());
            file[second..].copy_from_slice(owned.panel_bytes());
            let bytes: SharedBytes = std::sync::Arc::new(FileBytes(file));
            for offset in [0, second] {
                let viewed = PackedMatrix::view(bytes.clone(), offset, n, k, dtype).unwrap();
                assert!(viewed.is_shared() && !owned.is_shared());
                assert_eq!(
                    (viewed.rows(), viewed.cols(), viewed.dtype()),
                    (n, k, dtype)
                );
                assert_eq!(viewed.bytes(), owned.bytes());
                assert_eq!(viewed.unpack(), owned.unpack());
                for imp in KernelPath::all_supported() {
                    let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
                    linear_with(imp, &x, m, &owned, None, &mut a);
                    linear_with(imp, &x, m, &viewed, None, &mut b);
                    assert_eq!(a, b, "{imp} {dtype}");
                }
            }
            assert!(PackedMatrix::view(bytes.clone(), second + 64, n, k, dtype).is_err());
            // The layout string names the constants it depends on, so changing them changes it
            // (and files packed before are written again).
            let layout = PackedMatrix::LAYOUT;
            assert!(
                layout.contains(&format!("{NR} rows"))
                    && layout.contains(&format!("{LANES} lanes"))
            );
            assert!(PackedMatrix::view(bytes, 2, n, k, dtype).is_err());
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn reduce16_is_sixteen_hsum16() {
        if !KernelPath::Avx512.supported() {
            eprintln!("skipping: no avx512f on this CPU");
            return;
        }
        use std::arch::x86_64::*;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..100 {
            // Wide magnitudes so a different pairing would show up in the low bits.
            let a: Vec<[f32; LANES]> = (0..LANES)
                .map(|_| {
                    std::array::from_fn(|_| {
                        rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-6..6))
                    })
                })
                .collect();
            let mut out = [0f32; LANES];
            // SAFETY: avx512f is present (checked above); each row holds 16 floats.
            unsafe {
                let v: [__m512; LANES] = std::array::from_fn(|o| _mm512_loadu_ps(a[o].as_ptr()));
                _mm512_storeu_ps(out.as_mut_ptr(), avx512::reduce16(&v));
            }
            for o in 0..LANES {
                assert_eq!(out[o].to_bits(), hsum16(&a[o]).to_bits(), "lane {o}");
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    /// Decode as a model does it: one row of `x` through a stack of matrices far larger than
    /// the caches (SmolLM2-135M's 30 layers of q/k/v, o, gate/up, down), so `W` streams from
    /// memory. `cargo test --release -p kernels decode_stream_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn decode_stream_speed() {
        let shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)];
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::Q8_0] {
            let layers: Vec<PackedMatrix> = (0..30)
                .flat_map(|_| shapes)
                .map(|(n, k)| match dtype {
                    WeightDtype::F32 => PackedMatrix::pack(&vec![0.25f32; n * k], n, k),
                    WeightDtype::Q8_0 => PackedMatrix::pack_q8_0(&vec![0.25f32; n * k], n, k),
                    d => PackedMatrix::pack_16bit(&vec![0x3e80; n * k], n, k, d),
                })
                .collect();
            let bytes: usize = layers.iter().map(PackedMatrix::bytes).sum();
            let x = vec![0.5f32; 3072];
            let mut y = vec![0f32; 3072];
            for path in KernelPath::all_supported() {
                let mut times = Vec::new();
                for _ in 0..7 {
                    let t = Instant::now();
                    for w in &layers {
                        linear_with(path, &x[..w.cols()], 1, w, None, &mut y[..w.rows()]);
                    }
                    times.push(t.elapsed().as_secs_f64());
                }
                times.sort_by(f64::total_cmp);
                let dt = times[3];
                println!(
                    "{path:>8} {dtype:>4}: {} calls, {:.1} MB: {:.2} ms, {:.1} GB/s of W (median of 7)",
                    layers.len(),
                    bytes as f64 / 1e6,
                    dt * 1e3,
                    bytes as f64 / dt / 1e9
                );
            }
        }
    }

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
            let w32 = PackedMatrix::pack(&vec![0.25f32; n * k], n, k);
            let w16 = PackedMatrix::pack_16bit(&vec![0x3e80; n * k], n, k, WeightDtype::Bf16);
            let mut wbf = w16.clone();
            wbf.set_compute(ComputeDtype::Bf16);
            let w8 = PackedMatrix::pack_q8_0(&vec![0.25f32; n * k], n, k);
            let mut y = vec![0f32; m * n];
            for (path, w) in KernelPath::all_supported()
                .into_iter()
                .flat_map(|p| [(p, &w32), (p, &w16), (p, &wbf), (p, &w8)])
            {
                linear_with(path, &x, m, w, None, &mut y);
                let reps = 20;
                let t = Instant::now();
                for _ in 0..reps {
                    linear_with(path, &x, m, w, None, &mut y);
                }
                let dt = t.elapsed().as_secs_f64() / reps as f64;
                let mode = match w.compute() {
                    ComputeDtype::Bf16 => format!("bf16 ({:?})", Bf16Dot::best(path)),
                    ComputeDtype::F32 => "f32".to_string(),
                };
                println!(
                    "{path:>8} {:>4} compute {mode} {m}x{k}x{n}: {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s of W",
                    w.dtype(),
                    dt * 1e3,
                    2.0 * (m * n * k) as f64 / dt / 1e9,
                    (n * k * w.dtype().bytes()) as f64 / dt / 1e9
                );
            }
        }
        for path in KernelPath::all_supported() {
            let peak = crate::peak::fma_gflops(path, std::time::Duration::from_millis(300));
            println!("{path:>8} fma peak {peak:.1} GFLOP/s");
        }
        println!("copy {:.1} GB/s", crate::peak::copy_gbps(256 << 20, 5));
    }
}
