//! The machine's ceilings, measured in the same run as an engine benchmark so its numbers can be
//! read as fractions of them: peak f32 fused multiply-add throughput of a kernel path (every
//! rayon thread, registers only) and memory-copy bandwidth (every thread, buffers far larger
//! than the caches). Not used when serving.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::path::KernelPath;

/// Independent accumulator chains per thread: enough to cover the fma latency on two ports.
#[cfg(target_arch = "x86_64")]
const CHAINS: usize = 10;
/// Iterations between clock reads.
const BATCH: usize = 1 << 16;

/// Peak f32 GFLOP/s (an fma counts 2) of `path` over every rayon thread, run for about `dur`.
///
/// # Panics
/// If `path` is not supported by this CPU.
pub fn fma_gflops(path: KernelPath, dur: Duration) -> f64 {
    assert!(
        path.supported(),
        "kernel path {path} is not supported by this CPU"
    );
    let threads = rayon::current_num_threads();
    let flops: f64 = (0..threads)
        .into_par_iter()
        .map(|_| {
            let t = Instant::now();
            let mut n = 0usize;
            let mut sink = 0f32;
            while t.elapsed() < dur {
                let (fmas, s) = fma_loop(path, BATCH);
                sink += s;
                n += BATCH * fmas;
            }
            black_box(sink);
            2.0 * n as f64 / t.elapsed().as_secs_f64()
        })
        .sum();
    flops / 1e9
}

/// `iters` rounds of independent vector fmas; returns the lane fmas per round and a value that
/// depends on every result (so nothing is optimised away).
fn fma_loop(path: KernelPath, iters: usize) -> (usize, f32) {
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked that the CPU supports the path's features.
        KernelPath::Avx512 => (16 * CHAINS, unsafe { x86::fma512(iters) }),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        KernelPath::Avx2 => (8 * CHAINS, unsafe { x86::fma256(iters) }),
        _ => (LANES_GENERIC * CHAINS_GENERIC, generic(path, iters)),
    }
}

/// Lanes of the generic loop, as the generic GEMM's accumulators (the compiler picks the
/// vector width: 4 × 128-bit on NEON, 2 × 256-bit with x86 fma).
const LANES_GENERIC: usize = 16;
/// Chains of the generic loop: 24 NEON registers, 12 AVX ones.
const CHAINS_GENERIC: usize = 6;

crate::path::multiversion! {
    fn generic(iters: usize) -> f32 => generic_body;
}

#[inline(always)]
fn generic_body(iters: usize) -> f32 {
    let mut acc = [1f32; LANES_GENERIC * CHAINS_GENERIC];
    let (m, a) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = v.mul_add(m, a);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// # Safety
    /// The CPU must support avx512f.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma512(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        let (m, a) = (
            _mm512_set1_ps(black_box(0.999_999)),
            _mm512_set1_ps(black_box(1e-7)),
        );
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, m, a);
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
        _mm512_reduce_add_ps(s)
    }

    /// # Safety
    /// The CPU must support avx2 and fma.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma256(iters: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        let (m, a) = (
            _mm256_set1_ps(black_box(0.999_999)),
            _mm256_set1_ps(black_box(1e-7)),
        );
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, m, a);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
        let mut out = [0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }
}

/// Memory-copy bandwidth in GB/s (bytes read plus bytes written, as STREAM counts "copy"),
/// median of `reps` copies of `bytes` split over every rayon thread.
pub fn copy_gbps(bytes: usize, reps: usize) -> f64 {
    let n = bytes / 4;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let chunk = n.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
    // Touch both once so page faults are not measured.
    dst.par_chunks_mut(chunk)
        .zip(src.par_chunks(chunk))
        .for_each(|(d, s)| d.copy_from_slice(s));
    let mut times: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s));
            black_box(&dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * (n * 4) as f64 / times[times.len() / 2] / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_positive_on_every_path() {
        for p in KernelPath::all_supported() {
            assert!(fma_gflops(p, Duration::from_millis(20)) > 0.0, "{p}");
        }
        assert!(copy_gbps(1 << 20, 3) > 0.0);
    }
}
