//! Causal GQA attention of new query tokens over K/V held in a slot pool.
//!
//! K and V of one layer are `[num_slots, num_kv_heads, head_dim]`. Query token `t` attends to
//! the slots `token_slots[t]` (the slots of its sequence's positions `0..=p`, in position order).
//! The reduction for one (token, head) is fixed: scores (8-lane fma dot, `dot8_fma`), max,
//! `exp_fixed`, their sum over 8 lanes (position `i` in lane `i % 8`, the same tree), V
//! accumulated by fma in position order, one final scale by the sum's inverse. Nothing depends on
//! how many other tokens share the call, so prefill, chunked prefill and batched decode agree
//! bit for bit. Cost O(Σ_t (p_t+1) · heads · head_dim); parallel over (block of up to 16 tokens
//! of one sequence, KV head), the query heads of one KV head together so each K/V row is read
//! once per block.
//!
//! Only the layout differs between paths, never an operation or its order. On the AVX paths a
//! sequence with at least 8 tokens in the call has its K and V copied once per call into
//! contiguous per-KV-head rows (K transposed on AVX-512, so lane `j` of a vector is key `j` and
//! the 8 lane sums of `dot8_fma` are 8 vectors whose tree is vertical adds); the scores then take
//! 3 rows per K load (AVX-512: 24 accumulators of 16 keys; AVX2: 3 rows × 4 keys of 8-lane
//! sums), the weighted values 4 (AVX-512) or 2 (AVX2) rows per V load, and the softmax sums
//! 4 rows at a time.

use std::cell::Cell;

use crate::linevec::LineVec;
use crate::math::exp_fixed;
use crate::path::{kernel_path, multiversion, KernelPath};

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

thread_local! {
    /// The query blocks of the current call, as `(first token, count, sequence)` (kept so a
    /// call allocates nothing).
    static BLOCKS: Cell<Vec<(usize, usize, usize)>> = const { Cell::new(Vec::new()) };
    /// The sequences of the current call's blocks.
    static SEQS: Cell<Vec<Seq>> = const { Cell::new(Vec::new()) };
    /// K and V of the current call's prefill sequences, per KV head contiguous in position
    /// order, so a key tile's rows are neither scattered over the slot pool nor `kv_row` apart
    /// (1 KiB rows of 64-float heads map a tile's lines onto a quarter of L1's sets). Per
    /// sequence: K of every KV head (`n` rounded up to 16 keys: transposed blocks, see
    /// [`transpose_k`], on AVX-512; rows on AVX2), then V of every KV head (rows).
    static PACKED: Cell<LineVec> = const { Cell::new(LineVec::new()) };
    /// `0, 1, 2, …`: the slots of packed K/V.
    static IDENT: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    /// Scores and sums of the current work item, reused so no call allocates per head.
    static SCRATCH: Cell<Scratch> = const { Cell::new(Scratch { scores: LineVec::new(), acc: Vec::new(), inv: Vec::new() }) };
}

#[derive(Default)]
struct Scratch {
    /// `[rows][stride]` scores, then softmax numerators (`stride`: the job's key count rounded
    /// up to an odd multiple of 16; entries past a row's keys are unused).
    scores: LineVec,
    /// `[rows][head_dim]` weighted-value sums.
    acc: Vec<f32>,
    /// `[rows]` inverse softmax sums.
    inv: Vec<f32>,
}

/// Query tokens of one sequence computed together, so each K/V row they share is loaded from
/// memory once for all of them (prefill); a decode token is a block of one.
const QB: usize = 16;
/// Keys per tile: a tile's K (then V) rows of one KV head stay in L1 while every query row of
/// the block uses them.
const KT: usize = 64;
/// Query tokens of one sequence in a call from which the AVX paths pack its K and V (cost: one
/// pass over the sequence's K and V; shared by all its blocks).
const PACK_MIN_TOKENS: usize = 8;
/// Most floats one call packs (64 MiB, kept by the calling thread between calls): sequences
/// beyond it are read from the cache in place (same bits, slower), so a long context of a
/// large model cannot make the pack buffer grow with it.
const PACK_MAX_FLOATS: usize = 16 << 20;
/// Query rows per transposed-K load in the AVX-512 score kernel (`8 RS` accumulators).
#[cfg(target_arch = "x86_64")]
const RS: usize = 3;
/// Query rows per V load in the weighted values (AVX-512: `4 HV` accumulators of 16 floats for
/// a 64-float head; AVX2: `4 HV` of 8 floats, 32 columns at a time).
#[cfg(target_arch = "x86_64")]
const HV_512: usize = 4;
#[cfg(target_arch = "x86_64")]
const HV_256: usize = 2;

/// The `P` of [`Group::attend`]: which kernels it runs.
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

/// One sequence of a call: the blocks whose last token's slots start at `ptr`.
#[derive(Clone, Copy)]
struct Seq {
    ptr: usize,
    /// A token of the sequence with the most keys, and their count.
    longest: usize,
    n: usize,
    tokens: usize,
    /// Offset of its packed K and V in `PACKED`, or `usize::MAX` for none.
    off: usize,
}

/// How a score is made from `q·k`: multiplied by `scale`, then, with a `softcap`, squashed to
/// `softcap · tanh(score / softcap)` (Gemma 2) before the softmax. Either way the score is one
/// element-wise function of the dot, so batch invariance and the reduction order are kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreScale {
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl ScoreScale {
    /// `1/sqrt(head_dim)`, uncapped: the Llama family's scores.
    pub fn standard(head_dim: usize) -> Self {
        ScoreScale {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
        }
    }
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

/// [`attention`] with scores made as `score` says (another scale, a soft cap).
///
/// # Panics
/// As [`attention`].
pub fn attention_scored(
    q: &[f32],
    token_slots: &[&[u32]],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: AttnShape,
    score: ScoreScale,
    out: &mut [f32],
) {
    let path = kernel_path();
    attention_scored_with(path, q, token_slots, k_cache, v_cache, shape, score, out);
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
    let score = ScoreScale::standard(shape.head_dim);
    attention_scored_with(path, q, token_slots, k_cache, v_cache, shape, score, out);
}

/// [`attention_scored`] on a given path.
///
/// # Panics
/// As [`attention_with`].
#[allow(clippy::too_many_arguments)]
pub fn attention_scored_with(
    path: KernelPath,
    q: &[f32],
    token_slots: &[&[u32]],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: AttnShape,
    score: ScoreScale,
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
        scale: score.scale,
        softcap: score.softcap,
    };
    let mut blocks = BLOCKS.take();
    let mut seqs = SEQS.take();
    let mut packed = PACKED.take();
    let mut ident = IDENT.take();
    query_blocks(token_slots, &mut blocks);
    let work: usize = token_slots.iter().map(|s| s.len()).sum::<usize>() * num_heads;
    let parallel = work * head_dim >= 1 << 16;
    let pack = matches!(path, KernelPath::Avx512 | KernelPath::Avx2) && head_dim % 8 == 0;
    sequences(
        token_slots,
        &mut blocks,
        &mut seqs,
        pack,
        shape,
        &mut packed,
    );
    let transposed = path == KernelPath::Avx512;
    let part = |s: &Seq| num_kv_heads * s.n.next_multiple_of(16) * head_dim;
    for s in seqs.iter().filter(|s| s.off != usize::MAX) {
        let nblk = s.n.div_ceil(16);
        let dst = &mut packed[s.off..s.off + 2 * part(s)];
        let slots = token_slots[s.longest];
        let fill = |(i, dst): (usize, &mut [f32])| {
            let (kvh, b) = ((i / nblk) % num_kv_heads, i % nblk);
            let (slots, col) = (&slots[b * 16..], kvh * head_dim);
            match i < num_kv_heads * nblk {
                true if transposed => transpose_k(dst, slots, k_cache, kv_row, col),
                true => copy_rows(dst, slots, k_cache, kv_row, col),
                false => copy_rows(dst, slots, v_cache, kv_row, col),
            }
        };
        if parallel {
            crate::team::for_each_chunk_mut(dst, 16 * head_dim, |i, c| fill((i, c)));
        } else {
            dst.chunks_mut(16 * head_dim).enumerate().for_each(fill);
        }
    }
    if let Some(n) = seqs
        .iter()
        .filter(|s| s.off != usize::MAX)
        .map(|s| s.n)
        .max()
    {
        if ident.len() < n {
            ident.clear();
            ident.extend(0..n as u32);
        }
    }
    let out = OutPtr(out.as_mut_ptr());
    let one = |idx: usize| {
        let ((t0, nq, seq), kvh) = (blocks[idx / num_kv_heads], idx % num_kv_heads);
        let packed = seqs.get(seq).filter(|s| s.off != usize::MAX).map(|s| {
            let size = s.n.next_multiple_of(16) * head_dim;
            let k = &packed[s.off + kvh * size..][..size];
            let v = &packed[s.off + part(s) + kvh * size..][..size];
            (k, v, &ident[..s.n])
        });
        let job = Job {
            q,
            q_width,
            t0,
            nq,
            n0: token_slots[t0].len(),
            slots: token_slots[t0 + nq - 1],
            kvh,
            packed,
            out,
        };
        let mut scratch = SCRATCH.take();
        match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` is only chosen (and run, see the assert above) when the CPU
            // reports avx512f, avx2 and fma.
            KernelPath::Avx512 => unsafe { g.attend_avx512(&job, &mut scratch) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for avx2 and fma.
            KernelPath::Avx2 => unsafe { g.attend_avx2(&job, &mut scratch) },
            _ => attend_generic(path, &g, &job, &mut scratch),
        }
        SCRATCH.set(scratch);
    };
    let items = blocks.len() * num_kv_heads;
    if parallel {
        crate::team::for_each(items, one);
    } else {
        (0..items).for_each(one);
    }
    BLOCKS.set(blocks);
    SEQS.set(seqs);
    PACKED.set(packed);
    IDENT.set(ident);
}

/// The sequences of `blocks` (consecutive blocks whose last tokens' slots start at the same
/// address; every token's slots are a prefix of the longest), each block's third field set to
/// its sequence's index. With `pack`, a sequence of at least `PACK_MIN_TOKENS` tokens gets
/// room for its packed K and V in `packed` (see [`PACKED`]).
fn sequences(
    token_slots: &[&[u32]],
    blocks: &mut [(usize, usize, usize)],
    seqs: &mut Vec<Seq>,
    pack: bool,
    shape: AttnShape,
    packed: &mut LineVec,
) {
    seqs.clear();
    if !pack {
        blocks.iter_mut().for_each(|b| b.2 = usize::MAX);
        return;
    }
    for (t0, nq, seq) in blocks.iter_mut() {
        let t = *t0 + *nq - 1;
        let (ptr, n) = (token_slots[t].as_ptr() as usize, token_slots[t].len());
        match seqs.last_mut() {
            Some(s) if s.ptr == ptr => {
                if n > s.n {
                    (s.longest, s.n) = (t, n);
                }
                s.tokens += *nq;
            }
            _ => seqs.push(Seq {
                ptr,
                longest: t,
                n,
                tokens: *nq,
                off: usize::MAX,
            }),
        }
        *seq = seqs.len() - 1;
    }
    let mut total = 0;
    for s in seqs.iter_mut().filter(|s| s.tokens >= PACK_MIN_TOKENS) {
        let need = 2 * shape.num_kv_heads * s.n.next_multiple_of(16) * shape.head_dim;
        if total + need <= PACK_MAX_FLOATS {
            s.off = total;
            total += need;
        }
    }
    packed.resize(total);
}

/// One block of 16 keys of one KV head, transposed: `dst[16 c + j] = K[slots[j]][col + c]`
/// for the first `min(16, slots.len())` keys, zeros for the rest (`dst` holds `16 d` floats).
fn transpose_k(dst: &mut [f32], slots: &[u32], k_cache: &[f32], kv_row: usize, col: usize) {
    let d = dst.len() / 16;
    for j in 0..16 {
        match slots.get(j) {
            Some(&s) => {
                let src = &k_cache[s as usize * kv_row + col..][..d];
                for (c, &x) in src.iter().enumerate() {
                    dst[16 * c + j] = x;
                }
            }
            None => (0..d).for_each(|c| dst[16 * c + j] = 0.0),
        }
    }
}

/// 16 rows of one KV head, contiguous: `dst[d j + c] = cache[slots[j]][col + c]` for the first
/// `min(16, slots.len())` keys, zeros for the rest (`dst` holds `16 d` floats).
fn copy_rows(dst: &mut [f32], slots: &[u32], cache: &[f32], kv_row: usize, col: usize) {
    let d = dst.len() / 16;
    for (j, row) in dst.chunks_exact_mut(d).enumerate() {
        match slots.get(j) {
            Some(&s) => row.copy_from_slice(&cache[s as usize * kv_row + col..][..d]),
            None => row.fill(0.0),
        }
    }
}

/// Runs of at most `QB` consecutive tokens of one sequence, as `(first token, count)`: token
/// `t + 1` continues `t`'s run when it attends to `t`'s slots plus one more.
fn query_blocks(token_slots: &[&[u32]], blocks: &mut Vec<(usize, usize, usize)>) {
    blocks.clear();
    for (t, slots) in token_slots.iter().enumerate() {
        if let Some((t0, nq, _)) = blocks.last_mut() {
            let prev = token_slots[*t0 + *nq - 1];
            if *nq < QB && slots.len() == prev.len() + 1 && slots.as_ptr() == prev.as_ptr() {
                *nq += 1;
                continue;
            }
        }
        blocks.push((t, 1, usize::MAX));
    }
}

/// Raw output pointer shared by work items that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each work item writes only its own (token, KV head) ranges, see `Group::attend`.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no element is written by two items or read while written.
unsafe impl Sync for OutPtr {}

/// One work item: tokens `t0..t0 + nq` (one sequence, consecutive positions) × one KV head.
struct Job<'a> {
    q: &'a [f32],
    q_width: usize,
    t0: usize,
    nq: usize,
    /// Keys of the first token; token `t0 + u` attends to `slots[..n0 + u]`.
    n0: usize,
    /// The last token's slots (every token's are a prefix of them).
    slots: &'a [u32],
    kvh: usize,
    /// The KV head's packed K and V (see [`PACKED`]) and their slots, when the sequence has
    /// them.
    packed: Option<(&'a [f32], &'a [f32], &'a [u32])>,
    out: OutPtr,
}

/// What every (token, KV head) group shares.
#[derive(Clone, Copy)]
struct Group<'a> {
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    kv_row: usize,
    head_dim: usize,
    /// Query heads per KV head.
    heads: usize,
    scale: f32,
    softcap: Option<f32>,
}

multiversion! {
    /// `attend` with the portable dot (portable and NEON paths).
    fn attend_generic(g: &Group<'_>, job: &Job<'_>, scratch: &mut Scratch) => attend_portable;
}

#[inline(always)]
fn attend_portable(g: &Group<'_>, job: &Job<'_>, scratch: &mut Scratch) {
    g.attend::<PORTABLE>(job, scratch)
}

impl Group<'_> {
    /// `attend` compiled for AVX-512. Same source, no fast-math, so the same IEEE operations in
    /// the same order: only the vector width differs, never a result.
    ///
    /// # Safety
    /// The CPU must support avx512f, avx2 and fma.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn attend_avx512(&self, job: &Job<'_>, scratch: &mut Scratch) {
        self.attend::<AVX512>(job, scratch)
    }

    /// `attend` compiled for AVX2 + FMA.
    ///
    /// # Safety
    /// The CPU must support avx2 and fma.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn attend_avx2(&self, job: &Job<'_>, scratch: &mut Scratch) {
        self.attend::<AVX2>(job, scratch)
    }

    /// Every query head of KV head `job.kvh` for the job's tokens. Rows `r = u · heads + j`
    /// (token `t0 + u`, head `j` of the group). Three passes over key tiles (scores, softmax,
    /// weighted values), so a tile's K and V rows are loaded once for all rows; each row keeps
    /// the contract order (8-lane dot per score, position order for the values).
    /// `P` is the path: [`PORTABLE`] (the generic code), [`AVX2`] or [`AVX512`] (explicit
    /// kernels; only under `attend_avx2`/`attend_avx512`).
    #[inline(always)]
    fn attend<const P: u8>(&self, job: &Job<'_>, scratch: &mut Scratch) {
        match job.packed {
            Some((k, v, ident)) if P != PORTABLE => {
                // The packed K and V as a cache of one KV head, `d` floats per slot.
                let view = Group {
                    k_cache: k,
                    v_cache: v,
                    kv_row: self.head_dim,
                    ..*self
                };
                let kt = if P == AVX512 { Some(k) } else { None };
                view.attend_in::<P>(job, &ident[..job.slots.len()], 0, kt, scratch)
            }
            _ => self.attend_in::<P>(job, job.slots, job.kvh * self.head_dim, None, scratch),
        }
    }

    /// [`Self::attend`] over the K/V rows `slots` of this group's cache (the job's own, or the
    /// packed copy's), the KV head's columns from `base`; `kt`: its transposed K, if any.
    #[inline(always)]
    fn attend_in<const P: u8>(
        &self,
        job: &Job<'_>,
        slots: &[u32],
        base: usize,
        kt: Option<&[f32]>,
        scratch: &mut Scratch,
    ) {
        let (d, heads) = (self.head_dim, self.heads);
        let n_last = slots.len();
        let rows = job.nq * heads;
        let width = heads * d;
        // An odd number of 64-byte lines: rows a multiple of 4 KiB apart would share L1 sets.
        let stride = n_last.next_multiple_of(16) | 16;
        let krow = |s: u32| &self.k_cache[s as usize * self.kv_row + base..][..d];
        let qrow = |u: usize, j: usize| {
            &job.q[(job.t0 + u) * job.q_width + job.kvh * width + j * d..][..d]
        };
        let Scratch { scores, acc, inv } = scratch;
        scores.resize(rows * stride);
        acc.clear();
        acc.resize(rows * d, 0.0);
        inv.clear();
        let qrow = |r: usize| qrow(r / heads, r % heads);
        let end = |tile: usize, r: usize| (tile + KT).min(job.n0 + r / heads);
        match kt {
            #[cfg(target_arch = "x86_64")]
            Some(kt) if P != PORTABLE => {
                // SAFETY: `P` is only set under its target features; the shapes are asserted.
                unsafe { self.scores_t::<P>(job, kt, scores, stride) }
            }
            _ => {
                for tile in (0..n_last).step_by(KT) {
                    // Rows in groups (pairs; threes on AVX2, whose kernel has registers for
                    // 12 chains) that share every K load; a group's keys are those all its
                    // rows see (rows of one token see the same keys; across tokens a later one
                    // sees more, which its single-row pass below adds).
                    let g = if P == AVX2 { 3 } else { 2 };
                    let mut r = 0;
                    while r < rows {
                        let n = (rows - r).min(g);
                        let mut i = tile;
                        // Ends grow with the row: the first row's is the group's.
                        let all = end(tile, r);
                        if n > 1 && all > tile {
                            let slots = &slots[tile..all];
                            let mut ch = scores[r * stride..].chunks_mut(stride);
                            let mut out = || &mut ch.next().expect("a row")[tile..];
                            i += if n == 3 {
                                let out = [out(), out(), out()];
                                let q = [qrow(r), qrow(r + 1), qrow(r + 2)];
                                self.scores::<P, 3>(q, base, slots, out)
                            } else {
                                let out = [out(), out()];
                                self.scores::<P, 2>([qrow(r), qrow(r + 1)], base, slots, out)
                            };
                        }
                        for r in r..r + n {
                            let row = &mut scores[r * stride..][..n_last];
                            let qj = qrow(r);
                            let end = end(tile, r);
                            let mut i = i;
                            if end > i {
                                let out = [&mut row[i..]];
                                i += self.scores::<P, 1>([qj], base, &slots[i..end], out);
                            }
                            while i < end {
                                row[i] = dot8_fma(qj, krow(slots[i])) * self.scale;
                                i += 1;
                            }
                        }
                        r += n;
                    }
                }
            }
        }
        for r in 0..rows {
            let n = job.n0 + r / heads;
            let row = &mut scores[r * stride..r * stride + n];
            if let Some(cap) = self.softcap {
                // After the scale, as transformers caps; one scalar `tanh` per score, so
                // every path gives the same bits.
                row.iter_mut().for_each(|s| *s = (*s / cap).tanh() * cap);
            }
            exp_shifted(row);
        }
        // The sums four rows at a time: four independent chains of adds.
        let mut r = 0;
        while r < rows {
            let row = |i: usize| {
                let i = (r + i).min(rows - 1);
                &scores[i * stride..i * stride + job.n0 + i / heads]
            };
            let rows4 = [row(0), row(1), row(2), row(3)];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `P` is only set under its target features (both include avx2).
            let sums = match P {
                PORTABLE => lane_sums(rows4),
                _ => unsafe { wide::lane_sums_256(rows4) },
            };
            #[cfg(not(target_arch = "x86_64"))]
            let sums = lane_sums(rows4);
            inv.extend(sums[..(rows - r).min(4)].iter().map(|s| 1.0 / s));
            r += 4;
        }
        #[cfg(target_arch = "x86_64")]
        if P != PORTABLE && d.is_multiple_of(8) {
            // SAFETY: as above; `acc` holds `rows * d` floats, and `attention_with` checked
            // every slot against the cache.
            unsafe { self.values_t::<P>(job, slots, base, scores, stride, acc) };
            return self.finish(job, acc, inv);
        }
        for tile in (0..n_last).step_by(KT) {
            for u in 0..job.nq {
                let end = (tile + KT).min(job.n0 + u);
                if end <= tile {
                    continue;
                }
                let mut j0 = 0;
                while j0 < heads {
                    let pair = (heads - j0).min(2);
                    let r0 = u * heads + j0;
                    let keys = tile..end;
                    if pair == 2 {
                        self.values::<2>(scores, stride, r0, keys, slots, base, acc);
                    } else {
                        self.values::<1>(scores, stride, r0, keys, slots, base, acc);
                    }
                    j0 += pair;
                }
            }
        }
        self.finish(job, acc, inv)
    }

    /// Writes the job's outputs: `acc` rows scaled by `inv`.
    #[inline(always)]
    fn finish(&self, job: &Job<'_>, acc: &[f32], inv: &[f32]) {
        let (d, heads) = (self.head_dim, self.heads);
        let width = heads * d;
        for u in 0..job.nq {
            let start = (job.t0 + u) * job.q_width + job.kvh * width;
            // SAFETY: this job is the only writer of token `t0 + u`'s columns of KV head
            // `kvh` (`query_blocks` gives each token to one block, and items differ in block or
            // head); the range lies inside `out`, borrowed mutably for the whole call.
            let o = unsafe { std::slice::from_raw_parts_mut(job.out.0.add(start), width) };
            for j in 0..heads {
                let r = u * heads + j;
                for (o, &a) in o[j * d..(j + 1) * d]
                    .iter_mut()
                    .zip(&acc[r * d..(r + 1) * d])
                {
                    *o = a * inv[r];
                }
            }
        }
    }

    /// Scores of every row of the job from the transposed K `kt`, `RS` rows per K load (rows
    /// may span tokens: a row block computes the keys of its last row, and a row's scores past
    /// its own keys are never read).
    ///
    /// # Safety
    /// `P` is [`AVX2`] or [`AVX512`] and the CPU has its features (the rest is asserted).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scores_t<const P: u8>(
        &self,
        job: &Job<'_>,
        kt: &[f32],
        scores: &mut [f32],
        stride: usize,
    ) {
        let (d, heads) = (self.head_dim, self.heads);
        let rows = job.nq * heads;
        let n_last = job.slots.len();
        let n16 = n_last.next_multiple_of(16);
        assert!(kt.len() >= n16 * d && stride >= n16 && d.is_multiple_of(8));
        assert!(scores.len() >= rows * stride);
        let width = heads * d;
        let q0 = job.t0 * job.q_width + job.kvh * width;
        let qp = |r: usize| {
            let (u, j) = (r / heads, r % heads);
            assert!(q0 + u * job.q_width + (j + 1) * d <= job.q.len());
            // SAFETY: in bounds (asserted).
            unsafe { job.q.as_ptr().add(q0 + u * job.q_width + j * d) }
        };
        let sp = scores.as_mut_ptr();
        for tile in (0..n_last).step_by(KT) {
            let kp = kt[tile * d..].as_ptr();
            let mut r = 0;
            while r < rows {
                let h = (rows - r).min(RS);
                let e = (tile + KT).min(job.n0 + (r + h - 1) / heads);
                if e > tile {
                    let nblk = (e - tile).div_ceil(16);
                    let o = |i: usize| sp.add((r + i) * stride + tile);
                    let (sc, kp) = (self.scale, kp);
                    match (P, h) {
                        (AVX512, RS) => wide::scores_512::<RS>(
                            [qp(r), qp(r + 1), qp(r + 2)],
                            kp,
                            nblk,
                            d,
                            sc,
                            [o(0), o(1), o(2)],
                        ),
                        (AVX512, 2) => {
                            wide::scores_512::<2>([qp(r), qp(r + 1)], kp, nblk, d, sc, [o(0), o(1)])
                        }
                        (AVX512, _) => wide::scores_512::<1>([qp(r)], kp, nblk, d, sc, [o(0)]),
                        _ => unreachable!("K is only transposed for AVX-512"),
                    }
                }
                r += h;
            }
        }
    }

    /// Weighted values of every row of the job into `acc`, `HV` rows per V load over the keys
    /// they all see, then each row alone over its remaining keys (so each row adds its keys in
    /// position order).
    ///
    /// # Safety
    /// `P` is [`AVX2`] or [`AVX512`] and the CPU has its features; `d % 8 == 0`; the job's
    /// slots are inside the cache; `scores` holds `rows * stride` floats, `acc` `rows * d`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn values_t<const P: u8>(
        &self,
        job: &Job<'_>,
        slots: &[u32],
        base: usize,
        scores: &[f32],
        stride: usize,
        acc: &mut [f32],
    ) {
        let (d, heads) = (self.head_dim, self.heads);
        let rows = job.nq * heads;
        let n_last = slots.len();
        assert!(scores.len() >= rows * stride && acc.len() >= rows * d && d.is_multiple_of(8));
        assert!(base + d <= self.kv_row);
        let end = |tile: usize, r: usize| (tile + KT).min(job.n0 + r / heads);
        let (sp, ap) = (scores.as_ptr(), acc.as_mut_ptr());
        let vp = self.v_cache.as_ptr().add(base);
        let kv_row = self.kv_row;
        // `H` rows from `r` over `keys`, all columns.
        let run = |h: usize, r: usize, keys: std::ops::Range<usize>| {
            let p = |i: usize| sp.add((r + i) * stride);
            let a = |i: usize, b: usize| ap.add((r + i) * d + b);
            let mut b = 0;
            macro_rules! cols {
                ($f:ident, $w:literal, $nv:literal) => {
                    while b + $w <= d {
                        let (v, k) = (vp.add(b), keys.clone());
                        match h {
                            4 => wide::$f::<4, $nv>(
                                [p(0), p(1), p(2), p(3)],
                                slots,
                                k,
                                v,
                                kv_row,
                                [a(0, b), a(1, b), a(2, b), a(3, b)],
                            ),
                            3 => wide::$f::<3, $nv>(
                                [p(0), p(1), p(2)],
                                slots,
                                k,
                                v,
                                kv_row,
                                [a(0, b), a(1, b), a(2, b)],
                            ),
                            2 => wide::$f::<2, $nv>(
                                [p(0), p(1)],
                                slots,
                                k,
                                v,
                                kv_row,
                                [a(0, b), a(1, b)],
                            ),
                            _ => wide::$f::<1, $nv>([p(0)], slots, k, v, kv_row, [a(0, b)]),
                        }
                        b += $w;
                    }
                };
            }
            if P == AVX512 {
                cols!(values_512, 64, 4);
                cols!(values_512, 16, 1);
            } else {
                cols!(values_256, 32, 4);
            }
            cols!(values_256, 8, 1);
        };
        let hv = if P == AVX512 { HV_512 } else { HV_256 };
        for tile in (0..n_last).step_by(KT) {
            let mut r = 0;
            while r < rows {
                let h = (rows - r).min(hv);
                let common = end(tile, r).max(tile);
                if common > tile {
                    run(h, r, tile..common);
                }
                for i in r..r + h {
                    let e = end(tile, i);
                    if e > common {
                        run(1, i, common..e);
                    }
                }
                r += h;
            }
        }
    }

    /// Scaled scores of the `R` query rows `q` against the keys `slots` (K rows at
    /// `base` of each slot's row), into `out[h][..]`, in blocks of four keys: returns how many
    /// keys it did (a multiple of four; the caller finishes the rest one by one). Each K load
    /// serves all `R` rows.
    #[inline(always)]
    fn scores<const P: u8, const R: usize>(
        &self,
        q: [&[f32]; R],
        base: usize,
        slots: &[u32],
        out: [&mut [f32]; R],
    ) -> usize {
        let d = self.head_dim;
        if !d.is_multiple_of(8) {
            return 0;
        }
        assert!(base + d <= self.kv_row && q.iter().all(|q| q.len() == d));
        assert!(out.iter().all(|o| o.len() >= slots.len()));
        if P != PORTABLE {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `P` is only set under avx2 and fma; `attention_with` checked every
            // slot against the cache, and the shapes are asserted above.
            return unsafe {
                avx::scores(q, self.k_cache, self.kv_row, base, slots, self.scale, out)
            };
        }
        let n = slots.len() / 4 * 4;
        let mut out = out;
        for i in (0..n).step_by(4) {
            let ks: [&[f32]; 4] = std::array::from_fn(|u| {
                &self.k_cache[slots[i + u] as usize * self.kv_row + base..][..d]
            });
            for (q, o) in q.iter().zip(out.iter_mut()) {
                for (o, v) in o[i..i + 4].iter_mut().zip(dot8x4(q, ks)) {
                    *o = v * self.scale;
                }
            }
        }
        n
    }

    /// `acc[r0 + h] += Σ_{i in keys} scores[r0 + h][i] · V[slots[i]]` for `H` rows, in
    /// position order, in blocks of the head dim whose sums stay in registers over the keys.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn values<const H: usize>(
        &self,
        scores: &[f32],
        n_last: usize,
        r0: usize,
        keys: std::ops::Range<usize>,
        slots: &[u32],
        base: usize,
        acc: &mut [f32],
    ) {
        let d = self.head_dim;
        let mut b = 0;
        while b + 32 <= d {
            self.values_block::<H, 32>(scores, n_last, r0, keys.clone(), slots, base, acc, b);
            b += 32;
        }
        while b + 8 <= d {
            self.values_block::<H, 8>(scores, n_last, r0, keys.clone(), slots, base, acc, b);
            b += 8;
        }
        while b < d {
            self.values_block::<H, 1>(scores, n_last, r0, keys.clone(), slots, base, acc, b);
            b += 1;
        }
    }

    /// Elements `b..b + W` of [`Self::values`].
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn values_block<const H: usize, const W: usize>(
        &self,
        scores: &[f32],
        n_last: usize,
        r0: usize,
        keys: std::ops::Range<usize>,
        slots: &[u32],
        base: usize,
        acc: &mut [f32],
        b: usize,
    ) {
        let d = self.head_dim;
        let mut sums = [[0f32; W]; H];
        for (h, s) in sums.iter_mut().enumerate() {
            s.copy_from_slice(&acc[(r0 + h) * d + b..][..W]);
        }
        for i in keys {
            let v: &[f32; W] = self.v_cache[slots[i] as usize * self.kv_row + base + b..][..W]
                .try_into()
                .expect("W floats");
            for (h, s) in sums.iter_mut().enumerate() {
                let p = scores[(r0 + h) * n_last + i];
                for (a, &x) in s.iter_mut().zip(v) {
                    *a = p.mul_add(x, *a);
                }
            }
        }
        for (h, s) in sums.iter().enumerate() {
            acc[(r0 + h) * d + b..][..W].copy_from_slice(s);
        }
    }
}

/// Softmax numerators of one head's scores in place: `exp_fixed(s - max)`. The max is exact in
/// any order (a NaN score is passed over, as by `f32::max`; the row's sum is NaN then anyway).
#[inline(always)]
fn exp_shifted(sc: &mut [f32]) {
    let mut m = [f32::NEG_INFINITY; 16];
    let mut chunks = sc.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            // One `max` instruction; `f32::max`'s NaN handling is a compare-and-blend chain.
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    for (l, &v) in chunks.remainder().iter().enumerate() {
        m[l] = if v > m[l] { v } else { m[l] };
    }
    let max = m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for v in sc.iter_mut() {
        *v = exp_fixed(*v - max);
    }
}

/// The softmax sums of four rows of numerators: each over 8 lanes (position `i` in lane
/// `i % 8`, in position order) closed by `tree8`. The rows together so the adds form four
/// independent chains.
#[inline(always)]
fn lane_sums(rows: [&[f32]; 4]) -> [f32; 4] {
    let n = rows.iter().map(|r| r.len()).min().unwrap_or(0) / 8 * 8;
    let mut acc = [[0f32; 8]; 4];
    let chunks = |r: usize| rows[r][..n].chunks_exact(8);
    for (((x0, x1), x2), x3) in chunks(0).zip(chunks(1)).zip(chunks(2)).zip(chunks(3)) {
        for l in 0..8 {
            acc[0][l] += x0[l];
            acc[1][l] += x1[l];
            acc[2][l] += x2[l];
            acc[3][l] += x3[l];
        }
    }
    for (a, row) in acc.iter_mut().zip(&rows) {
        for (i, &x) in row.iter().enumerate().skip(n) {
            a[i % 8] += x;
        }
    }
    acc.map(|a| tree8(&a))
}

/// One score: 8 lane accumulators, `acc[i % 8] = fma(q[i], k[i], acc[i % 8])` in index
/// order, closed by the tree `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline(always)]
fn dot8_fma(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut qc = q.chunks_exact(8);
    let mut kc = k.chunks_exact(8);
    for (x, y) in (&mut qc).zip(&mut kc) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    for (l, (x, y)) in qc.remainder().iter().zip(kc.remainder()).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    tree8(&acc)
}

#[inline(always)]
fn tree8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// `dot8_fma(q, k[u])` for four keys at once (four independent accumulator chains).
/// `q.len()` must be a multiple of 8 and equal every `k[u].len()`.
#[inline(always)]
fn dot8x4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
    let mut acc = [[0f32; 8]; 4];
    for (c, qc) in q.chunks_exact(8).enumerate() {
        for u in 0..4 {
            let kc = &k[u][c * 8..c * 8 + 8];
            for l in 0..8 {
                acc[u][l] = qc[l].mul_add(kc[l], acc[u][l]);
            }
        }
    }
    acc.map(|a| tree8(&a))
}

#[cfg(target_arch = "x86_64")]
// Register blocks read best indexed by (row, lane, vector).
#[allow(clippy::needless_range_loop)]
mod wide {
    //! Kernels of the AVX2 and AVX-512 paths, one generic body per vector type.
    //!
    //! AVX-512 scores read K transposed (see [`super::transpose_k`]: 16 keys of one KV head as
    //! `[d][16]`, lane `j` of a vector is key `j`), so the 8 lane accumulators of `dot8_fma`
    //! are 8 vectors (lane accumulator `l` of 16 keys at once, fed `q[c] · K[c]` for
    //! `c % 8 == l` in index order) and `tree8` is 7 vertical adds: the same operations as the
    //! contract, no shuffles. Weighted values: `H` rows share every V load, each row's sum in
    //! position order.
    use std::arch::x86_64::*;

    /// A vector of `L` floats.
    pub(super) trait Lanes: Copy {
        const L: usize;
        /// # Safety
        /// (Every method.) The CPU supports the vector type; pointers are valid for `L` floats.
        unsafe fn zero() -> Self;
        unsafe fn load(p: *const f32) -> Self;
        unsafe fn store(self, p: *mut f32);
        unsafe fn splat(x: f32) -> Self;
        /// `a · b + c`, one rounding.
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
        unsafe fn add(a: Self, b: Self) -> Self;
        unsafe fn mul(a: Self, b: Self) -> Self;
    }

    impl Lanes for __m256 {
        const L: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm256_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            _mm256_mul_ps(a, b)
        }
    }

    impl Lanes for __m512 {
        const L: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            unsafe { _mm512_mul_ps(a, b) }
        }
    }

    /// Scaled scores of `R` query rows against `nblk` blocks of 16 keys (`kt`: the blocks'
    /// transposed K, `[nblk][d][16]`), into `out[r][..16 nblk]`.
    ///
    /// # Safety
    /// The CPU supports `V`; `d` is a multiple of 8; `q[r]` holds `d` floats, `kt`
    /// `16 d nblk`, `out[r]` `16 nblk`.
    #[inline(always)]
    unsafe fn scores_t<V: Lanes, const R: usize>(
        q: [*const f32; R],
        kt: *const f32,
        nblk: usize,
        d: usize,
        scale: f32,
        out: [*mut f32; R],
    ) {
        unsafe {
            let scale = V::splat(scale);
            for blk in 0..nblk {
                let kb = kt.add(blk * 16 * d);
                for half in (0..16).step_by(V::L) {
                    let mut acc = [[V::zero(); 8]; R];
                    for m in (0..d).step_by(8) {
                        for l in 0..8 {
                            let kv = V::load(kb.add((m + l) * 16 + half));
                            for r in 0..R {
                                acc[r][l] = V::fma(V::splat(*q[r].add(m + l)), kv, acc[r][l]);
                            }
                        }
                    }
                    for r in 0..R {
                        let a = &acc[r];
                        // tree8, lane by lane.
                        let t = V::add(
                            V::add(V::add(a[0], a[4]), V::add(a[2], a[6])),
                            V::add(V::add(a[1], a[5]), V::add(a[3], a[7])),
                        );
                        V::mul(t, scale).store(out[r].add(blk * 16 + half));
                    }
                }
            }
        }
    }

    /// `acc[h][b..b + NV L] += Σ_{i in keys} p[h][i] · V[slots[i]][b..]` for `H` rows, in
    /// position order (`v`: V of the KV head at column `b`, rows `kv_row` apart).
    ///
    /// # Safety
    /// The CPU supports `V`; `p[h]` holds `keys.end` floats; every `slots[i]` row of `v` holds
    /// `NV L` floats; `acc[h]` holds `NV L` floats.
    #[inline(always)]
    unsafe fn values_t<V: Lanes, const H: usize, const NV: usize>(
        p: [*const f32; H],
        slots: &[u32],
        keys: std::ops::Range<usize>,
        v: *const f32,
        kv_row: usize,
        acc: [*mut f32; H],
    ) {
        unsafe {
            let mut s = [[V::zero(); NV]; H];
            for h in 0..H {
                for n in 0..NV {
                    s[h][n] = V::load(acc[h].add(n * V::L));
                }
            }
            for i in keys {
                let vp = v.add(*slots.get_unchecked(i) as usize * kv_row);
                let mut x = [V::zero(); NV];
                for n in 0..NV {
                    x[n] = V::load(vp.add(n * V::L));
                }
                for h in 0..H {
                    let pb = V::splat(*p[h].add(i));
                    for n in 0..NV {
                        s[h][n] = V::fma(pb, x[n], s[h][n]);
                    }
                }
            }
            for h in 0..H {
                for n in 0..NV {
                    s[h][n].store(acc[h].add(n * V::L));
                }
            }
        }
    }

    /// [`scores_t`] on AVX-512 (on AVX2, with 16 registers, one row per K load of 8 keys
    /// measured slower than 3 rows × 4 keys of K rows, `super::avx::scores`).
    ///
    /// # Safety
    /// As [`scores_t`].
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn scores_512<const R: usize>(
        q: [*const f32; R],
        kt: *const f32,
        nblk: usize,
        d: usize,
        scale: f32,
        out: [*mut f32; R],
    ) {
        unsafe { scores_t::<__m512, R>(q, kt, nblk, d, scale, out) }
    }

    macro_rules! instances {
        ($features:literal, $v:ty, $values:ident) => {
            /// [`values_t`] for this path.
            ///
            /// # Safety
            /// As [`values_t`].
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $values<const H: usize, const NV: usize>(
                p: [*const f32; H],
                slots: &[u32],
                keys: std::ops::Range<usize>,
                v: *const f32,
                kv_row: usize,
                acc: [*mut f32; H],
            ) {
                unsafe { values_t::<$v, H, NV>(p, slots, keys, v, kv_row, acc) }
            }
        };
    }
    /// [`super::lane_sums`] with one 8-lane vector per row (the compiler leaves the generic
    /// form scalar).
    ///
    /// # Safety
    /// The CPU supports avx2.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn lane_sums_256(rows: [&[f32]; 4]) -> [f32; 4] {
        let n = rows.iter().map(|r| r.len()).min().unwrap_or(0) / 8 * 8;
        let mut acc = [_mm256_setzero_ps(); 4];
        for c in (0..n).step_by(8) {
            for r in 0..4 {
                // SAFETY: `c + 8 <= n <= rows[r].len()`.
                let x = unsafe { _mm256_loadu_ps(rows[r].as_ptr().add(c)) };
                acc[r] = _mm256_add_ps(acc[r], x);
            }
        }
        let mut lanes = [[0f32; 8]; 4];
        for r in 0..4 {
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(lanes[r].as_mut_ptr(), acc[r]) };
            for (i, &x) in rows[r].iter().enumerate().skip(n) {
                lanes[r][i % 8] += x;
            }
        }
        lanes.map(|a| super::tree8(&a))
    }

    instances!("avx512f,avx2,fma", __m512, values_512);
    instances!("avx2,fma", __m256, values_256);
}

#[cfg(target_arch = "x86_64")]
mod avx {
    //! `Group::scores` with 8-lane AVX vectors: lane `l` of a key's accumulator is
    //! its `acc[l]`; the four trees are done together with shuffles, each adding the same pairs
    //! as `tree8`, and the scale is one vector multiply (the same per-element product).
    use std::arch::x86_64::*;

    /// Scaled scores of `R` query rows against the keys `slots`, four keys at a time (each
    /// key chunk loaded once for all rows, `4 R` independent chains); returns the keys done.
    ///
    /// # Safety
    /// The CPU must support avx2 and fma; `d = q[h].len()` is a multiple of 8 with
    /// `base + d <= kv_row`; every slot `s` has `(s + 1) * kv_row <= k.len()`; every `out[h]`
    /// holds `slots.len()` floats.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores<const R: usize>(
        q: [&[f32]; R],
        k: &[f32],
        kv_row: usize,
        base: usize,
        slots: &[u32],
        scale: f32,
        out: [&mut [f32]; R],
    ) -> usize {
        let d = q[0].len();
        debug_assert!(d.is_multiple_of(8) && base + d <= kv_row);
        debug_assert!(slots.iter().all(|&s| (s as usize + 1) * kv_row <= k.len()));
        let n = slots.len() / 4 * 4;
        let scale = _mm_set1_ps(scale);
        for i in (0..n).step_by(4) {
            // SAFETY (the loads): slot rows, `base + c + 8 <= kv_row`, and q rows of `d`
            // floats are in bounds by the function contract.
            let kp: [*const f32; 4] = std::array::from_fn(|u| unsafe {
                k.as_ptr().add(slots[i + u] as usize * kv_row + base)
            });
            let mut acc = [[_mm256_setzero_ps(); 4]; R];
            for c in (0..d).step_by(8) {
                let mut x = [_mm256_setzero_ps(); R];
                for h in 0..R {
                    x[h] = unsafe { _mm256_loadu_ps(q[h].as_ptr().add(c)) };
                }
                for u in 0..4 {
                    let kv = unsafe { _mm256_loadu_ps(kp[u].add(c)) };
                    for h in 0..R {
                        acc[h][u] = _mm256_fmadd_ps(x[h], kv, acc[h][u]);
                    }
                }
            }
            for h in 0..R {
                // SAFETY: avx2 is present; `out[h]` holds `slots.len() >= i + 4` floats.
                unsafe {
                    let v = _mm_mul_ps(trees4(acc[h]), scale);
                    _mm_storeu_ps(out[h].as_mut_ptr().add(i), v);
                }
            }
        }
        n
    }

    /// `tree8` of four 8-lane accumulators at once, each adding the same pairs as `tree8`; the
    /// four sums in key order.
    ///
    /// # Safety
    /// The CPU must support avx2.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn trees4(acc: [__m256; 4]) -> __m128 {
        // s4[i] = a[i] + a[i + 4]: key u's four in half (u % 2) of r[u / 2].
        let r01 = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(acc[0], acc[1]),
            _mm256_permute2f128_ps::<0x31>(acc[0], acc[1]),
        );
        let r23 = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(acc[2], acc[3]),
            _mm256_permute2f128_ps::<0x31>(acc[2], acc[3]),
        );
        // s2 = [s4[0] + s4[2], s4[1] + s4[3]] per key: [k0 | k2] in the low half, [k1 | k3] high.
        let s2 = _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(r01, r23),
            _mm256_shuffle_ps::<0xEE>(r01, r23),
        );
        // s2[0] + s2[1] per key: lanes [k0, k2, k0, k2 | k1, k3, k1, k3].
        let s1 = _mm256_hadd_ps(s2, s2);
        // [k0, k1, k2, k3].
        _mm_unpacklo_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps::<1>(s1))
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
        let score = ScoreScale::standard(shape.head_dim);
        reference_scored(q, token_slots, k_cache, v_cache, shape, score)
    }

    /// [`reference`] with scores made as `score` says.
    fn reference_scored(
        q: &[f32],
        token_slots: &[&[u32]],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: AttnShape,
        score: ScoreScale,
    ) -> Vec<f32> {
        let (nh, d) = (shape.num_heads, shape.head_dim);
        let group = nh / shape.num_kv_heads;
        let kv_row = shape.num_kv_heads * d;
        let scale = score.scale;
        let mut out = vec![0f32; q.len()];
        for (idx, o) in out.chunks_mut(d).enumerate() {
            let (t, h) = (idx / nh, idx % nh);
            let qv = &q[(t * nh + h) * d..(t * nh + h + 1) * d];
            let kvh = h / group;
            let mut scores = Vec::new();
            let mut max = f32::NEG_INFINITY;
            for &s in token_slots[t] {
                let b = s as usize * kv_row + kvh * d;
                let mut sc = dot8_fma(qv, &k_cache[b..b + d]) * scale;
                if let Some(cap) = score.softcap {
                    sc = (sc / cap).tanh() * cap;
                }
                max = max.max(sc);
                scores.push(sc);
            }
            let mut lanes = [0f32; 8];
            for (i, sc) in scores.iter_mut().enumerate() {
                *sc = crate::math::exp_fixed(*sc - max);
                lanes[i % 8] += *sc;
            }
            let a = lanes;
            let sum = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
            for (&s, &p) in token_slots[t].iter().zip(&scores) {
                let b = s as usize * kv_row + kvh * d;
                for (acc, &v) in o.iter_mut().zip(&v_cache[b..b + d]) {
                    *acc = p.mul_add(v, *acc);
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
            // One head per group and three: score row pairs that span two tokens (whose key
            // ranges differ by one), over several 4-key blocks and more than one key tile.
            (4, 4, 16, 71),
            (6, 2, 8, 19),
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

    /// Gemma's scores (another scale, and a cap of 2 that bites: scaled scores here reach
    /// several times it) on every path, prefill-sized and decode-sized: the reference's bits,
    /// and different from uncapped attention.
    #[test]
    fn scaled_and_capped_scores_equal_reference_bits() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let score = ScoreScale {
            scale: 0.2,
            softcap: Some(2.0),
        };
        for &(nh, nkv, d, n) in &[(4, 2, 16, 40), (8, 4, 64, 9), (2, 1, 8, 1)] {
            let shape = AttnShape {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
            };
            let kv_row = nkv * d;
            let k: Vec<f32> = (0..n * kv_row).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let v: Vec<f32> = (0..n * kv_row).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let seq: Vec<u32> = (0..n as u32).collect();
            let toks: Vec<&[u32]> = (0..n).map(|p| &seq[..=p]).collect();
            let q: Vec<f32> = (0..n * nh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let want = reference_scored(&q, &toks, &k, &v, shape, score);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for imp in KernelPath::all_supported() {
                let mut out = vec![0f32; q.len()];
                attention_scored_with(imp, &q, &toks, &k, &v, shape, score, &mut out);
                assert_eq!(bits(&out), bits(&want), "{imp:?} {nh}/{nkv}x{d}, {n} keys");
            }
            if n > 1 {
                let plain = ScoreScale {
                    softcap: None,
                    ..score
                };
                let uncapped = reference_scored(&q, &toks, &k, &v, shape, plain);
                assert_ne!(bits(&uncapped), bits(&want));
            }
        }
    }

    /// Two sequences in one call, one a chunk after a cached prefix, over head sizes that take
    /// each column block of the wide kernels (64, 16, 8 floats) and query blocks whose rows
    /// span tokens: every path gives the reference's bits.
    #[test]
    fn chunked_and_batched_prefill_equal_reference_bits() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for &(nh, nkv, d) in &[(8, 4, 64), (6, 2, 24), (3, 1, 72), (4, 2, 128), (5, 5, 16)] {
            let shape = AttnShape {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
            };
            let kv_row = nkv * d;
            let n = 150;
            let k: Vec<f32> = (0..n * kv_row).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let v: Vec<f32> = (0..n * kv_row).map(|_| rng.gen_range(-2.0..2.0)).collect();
            // Sequence a: positions 0..90 cached, tokens at 90..130; sequence b: 0..20 new.
            let a: Vec<u32> = (0..130u32).map(|i| (i * 7 + 3) % n as u32).collect();
            let b: Vec<u32> = (0..20u32).map(|i| (i * 11 + 1) % n as u32).collect();
            let mut toks: Vec<&[u32]> = (90..130).map(|p| &a[..=p]).collect();
            toks.extend((0..20).map(|p| &b[..=p]));
            let q: Vec<f32> = (0..toks.len() * nh * d)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let want = reference(&q, &toks, &k, &v, shape);
            for imp in KernelPath::all_supported() {
                let mut out = vec![0f32; q.len()];
                attention_with(imp, &q, &toks, &k, &v, shape, &mut out);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&want), "{imp:?} {nh}/{nkv}x{d}");
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

#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    /// `cargo test --release -p kernels attention_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn attention_speed() {
        let (nh, nkv, d, t) = (8, 4, 64, 2048);
        let shape = AttnShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
        };
        // Line-aligned, as the worker's KV buffers and activations are.
        let mut kv = crate::LineVec::zeroed(t * nkv * d);
        for (i, x) in kv.iter_mut().enumerate() {
            *x = (i as f32 * 0.37).sin();
        }
        let mut q = crate::LineVec::zeroed(t * nh * d);
        for (i, x) in q.iter_mut().enumerate() {
            *x = (i as f32 * 0.11).cos();
        }
        let slots: Vec<u32> = (0..t as u32).collect();
        let toks: Vec<&[u32]> = (0..t).map(|p| &slots[..=p]).collect();
        let mut out = vec![0f32; q.len()];
        let flops = 4.0 * (nh * d) as f64 * (t * (t + 1) / 2) as f64;
        for path in KernelPath::all_supported() {
            attention_with(path, &q, &toks, &kv, &kv, shape, &mut out);
            let reps = 3;
            let start = Instant::now();
            for _ in 0..reps {
                attention_with(path, &q, &toks, &kv, &kv, shape, &mut out);
            }
            let dt = start.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{path:>8} prefill {t}: {:.1} ms, {:.1} GFLOP/s",
                dt * 1e3,
                flops / dt / 1e9
            );
        }
    }
}
