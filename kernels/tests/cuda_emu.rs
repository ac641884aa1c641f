//! The CUDA backend end to end without a GPU: on the CPU emulator of the driver and cuBLAS
//! (tests/emu), which runs the real kernel sources, `kernels::cuda` probes, compiles with the
//! real NVRTC, loads the modules and launches every operation of `CudaKernels`; each result is
//! checked against this crate's CPU kernels. Bit for bit where the sources promise the CPU's
//! bits (f32 embedding, RoPE, SwiGLU, residual and bias adds, KV write, attention) and, for
//! bf16 and f16, bit for bit against the CPU's f32 result rounded to the type (the kernels
//! widen exactly, compute in f32 and round once); within 1e-5 (plus a 16-bit type's ulp) for
//! RMSNorm and the GEMM, which reduce in another order.
//!
//! The loader reads `LD_LIBRARY_PATH` at process start (cudarc has no other way to point it at
//! a library), so each test here builds the emulator and re-runs this executable on an
//! `#[ignore]`d inner test with the emulator first on the path. Skips, saying why, without
//! NVRTC or without a C++ compiler, unless `DPSERVE_TEST_REQUIRE_NVRTC` is set (as in CI).
#![cfg(feature = "cuda")]

#[path = "emu/mod.rs"]
mod emu;

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm};
use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use kernels::cuda::{self, AttnBatch, AttnIndex, CudaError, CudaKernels, Storage};
use kernels::{AttnShape, ScoreScale};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The emulator's library directory, or why the test skips.
fn emulator_or_skip() -> Option<PathBuf> {
    emu::for_test()
}

#[test]
fn every_cuda_op_matches_the_cpu_kernels_on_the_emulator() {
    let Some(lib_dir) = emulator_or_skip() else {
        return;
    };
    // Threads in both orders: a missing barrier shows in one or the other.
    for reverse in ["0", "1"] {
        let env = [
            ("DPSERVE_CUDA_EMU_DEVICES", "2"),
            ("DPSERVE_CUDA_EMU_MEM_MB", "1024"),
            ("DPSERVE_CUDA_EMU_REVERSE", reverse),
        ];
        match emu::run_inner(&lib_dir, "inner_every_op", &env) {
            Ok(out) => eprintln!("{out}"),
            Err(out) => panic!("DPSERVE_CUDA_EMU_REVERSE={reverse}: {out}"),
        }
    }
}

#[test]
fn the_emulated_device_follows_its_environment() {
    let Some(lib_dir) = emulator_or_skip() else {
        return;
    };
    let cases: [(&str, &[(&str, &str)]); 4] = [
        ("hidden", &[("CUDA_VISIBLE_DEVICES", "")]),
        (
            "narrowed",
            &[
                ("DPSERVE_CUDA_EMU_DEVICES", "3"),
                ("CUDA_VISIBLE_DEVICES", "2,0,7,1"),
            ],
        ),
        ("turing", &[("DPSERVE_CUDA_EMU_CC", "7.5")]),
        ("ampere", &[("DPSERVE_CUDA_EMU_CC", "8.0")]),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(case, env)| {
            let mut env = env.to_vec();
            env.push(("DPSERVE_CUDA_EMU_CASE", case));
            emu::run_inner(&lib_dir, "inner_device_config", &env).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Whether this is the emulator's run of an inner test; says so when it is not.
fn inner() -> bool {
    if !emu::is_inner() {
        eprintln!("nothing to do: an outer test runs this with the CUDA emulator loaded");
    }
    emu::is_inner()
}

#[test]
#[ignore = "run by every_cuda_op_matches_the_cpu_kernels_on_the_emulator, with the emulator"]
fn inner_every_op() {
    if !inner() {
        return;
    }
    let info = cuda::probe(0).expect("probe");
    assert_eq!(info.name, "dpserve CPU emulator (not a GPU)");
    assert_eq!(info.compute_capability, (9, 0));
    assert_eq!((info.device_count, info.total_bytes), (2, 1 << 30));
    assert!(
        matches!(
            cuda::probe(2),
            Err(CudaError::OrdinalOutOfRange {
                ordinal: 2,
                count: 2,
                ..
            })
        ),
        "{:?}",
        cuda::probe(2)
    );
    let ctx = CudaContext::new(0).expect("context");
    let k = CudaKernels::load(&ctx).expect("load");
    assert_eq!(k.arch(), "compute_90");
    memory_is_counted(&ctx, k.stream());

    let gpu = Gpu {
        k: &k,
        s: k.stream().clone(),
    };
    let mut rng = StdRng::seed_from_u64(14);
    gpu.every_op::<f32>(&mut rng);
    gpu.every_op::<bf16>(&mut rng);
    gpu.every_op::<f16>(&mut rng);
    gpu.loads_are_exact::<bf16>();
    gpu.loads_are_exact::<f16>();
    gpu.empty_and_misshapen_calls();
}

#[test]
#[ignore = "run by the_emulated_device_follows_its_environment, with the emulator"]
fn inner_device_config() {
    if !inner() {
        return;
    }
    let case = std::env::var("DPSERVE_CUDA_EMU_CASE").expect("a case");
    match case.as_str() {
        "hidden" => {
            let e = cuda::probe(0).unwrap_err();
            assert!(matches!(e, CudaError::NoDevice { .. }), "{e}");
        }
        // The list stops at its first entry that is not a device (7 of 3).
        "narrowed" => {
            let info = cuda::probe(1).expect("probe");
            assert_eq!(info.device_count, 2);
            assert!(matches!(
                cuda::probe(2),
                Err(CudaError::OrdinalOutOfRange { count: 2, .. })
            ));
        }
        "turing" => {
            assert_eq!(cuda::probe(0).expect("probe").compute_capability, (7, 5));
            let ctx = CudaContext::new(0).expect("context");
            let e = CudaKernels::load(&ctx).err().expect("an error");
            assert_eq!(e, CudaError::UnsupportedArch((7, 5)));
        }
        "ampere" => {
            let ctx = CudaContext::new(0).expect("context");
            let k = CudaKernels::load(&ctx).expect("load");
            assert_eq!(k.arch(), "compute_80");
            let gpu = Gpu {
                k: &k,
                s: k.stream().clone(),
            };
            gpu.rmsnorm::<f32>(&mut StdRng::seed_from_u64(80));
            // PTX for a newer GPU is refused, as the driver's JIT does.
            let ptx = cuda::compile_source(&cuda::SOURCES[0], "compute_90")
                .expect("compile")
                .ptx;
            let e = ctx.load_module(ptx).unwrap_err();
            assert_eq!(e.0, CUresult::CUDA_ERROR_INVALID_PTX);
        }
        other => panic!("no case {other}"),
    }
}

/// Allocations count against the device's memory, and what is freed comes back.
fn memory_is_counted(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) {
    let (free, total) = ctx.mem_get_info().expect("mem_get_info");
    assert_eq!(total, 1 << 30);
    let block = stream.alloc_zeros::<u8>(16 << 20).expect("alloc");
    assert_eq!(ctx.mem_get_info().unwrap().0, free - (16 << 20));
    drop(block);
    assert_eq!(ctx.mem_get_info().unwrap().0, free);
    // SAFETY: never read (the allocation must fail).
    let e = unsafe { stream.alloc::<u8>(2 << 30) }.unwrap_err();
    assert_eq!(e.0, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
}

/// A storage type as the tests see it.
trait Elem: Storage + ValidAsZeroBits + Default + std::fmt::Debug {
    /// Where the GPU reduces in another order than the CPU: how far apart the results may be,
    /// relative to them (f32's rounding; for a 16-bit type one ulp, as the GPU's f32 value
    /// and the CPU's may round to neighbours).
    const REL: f32;
    fn widen(self) -> f32;
    fn bits(self) -> u32;
    fn from_bits(b: u16) -> Self;
}

impl Elem for f32 {
    const REL: f32 = 1e-5;
    fn widen(self) -> f32 {
        self
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
    fn from_bits(b: u16) -> Self {
        f32::from_bits(b.into())
    }
}

impl Elem for bf16 {
    const REL: f32 = 1.0 / 128.0;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
    fn from_bits(b: u16) -> Self {
        bf16::from_bits(b)
    }
}

impl Elem for f16 {
    const REL: f32 = 1.0 / 1024.0;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
    fn from_bits(b: u16) -> Self {
        f16::from_bits(b)
    }
}

/// `n` random values of `T` in `lo..hi`, and the same values as f32 (exact).
fn stored<T: Elem>(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> (Vec<T>, Vec<f32>) {
    let raw: Vec<T> = (0..n).map(|_| T::from_f32(rng.gen_range(lo..hi))).collect();
    let wide = raw.iter().map(|v| v.widen()).collect();
    (raw, wide)
}

fn rounded<T: Elem>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

fn type_name<T>() -> &'static str {
    std::any::type_name::<T>()
        .rsplit("::")
        .next()
        .unwrap_or("?")
}

/// `got` has `want`'s bits, element for element.
fn assert_same<T: Elem>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].bits() != want[i].bits()) {
        panic!(
            "{what} ({}): element {i} of {} is {:?} ({:#x}), the CPU's is {:?} ({:#x})",
            type_name::<T>(),
            got.len(),
            got[i],
            got[i].bits(),
            want[i],
            want[i].bits()
        );
    }
}

/// `got` within `T::REL` of `want`, relatively, plus `slack[i]`.
fn assert_close<T: Elem>(what: &str, got: &[T], want: &[f32], slack: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.widen();
        let tol = (T::REL + 1e-5) * w.abs() + slack[i];
        assert!(
            (g - w).abs() <= tol,
            "{what} ({}): element {i} is {g}, the CPU's {w} (tolerance {tol})",
            type_name::<T>()
        );
    }
}

/// The kernels and their stream.
struct Gpu<'a> {
    k: &'a CudaKernels,
    s: Arc<CudaStream>,
}

impl Gpu<'_> {
    fn up<T: DeviceRepr>(&self, v: &[T]) -> CudaSlice<T> {
        self.s.clone_htod(v).expect("upload")
    }

    fn down<T: DeviceRepr>(&self, d: &CudaSlice<T>) -> Vec<T> {
        self.s.clone_dtoh(d).expect("download")
    }

    fn every_op<T: Elem>(&self, rng: &mut StdRng)
    where
        CudaBlas: Gemm<T>,
    {
        self.embedding_gather::<T>(rng);
        self.rmsnorm::<T>(rng);
        self.head_rmsnorm::<T>(rng);
        self.rope::<T>(rng);
        self.silu_mul::<T>(rng);
        self.gelu_tanh_mul::<T>(rng);
        self.softcap::<T>(rng);
        self.add_inplace::<T>(rng);
        self.add_bias::<T>(rng);
        self.kv_write::<T>(rng);
        // A prefill chunk after a cached prefix longer than a key tile, a long decode row and a
        // one-key decode, with GQA; the widest head (two value columns per thread); a head not
        // a multiple of 8 with 2 query heads per KV head.
        let shape = |num_heads, num_kv_heads, head_dim| AttnShape {
            num_heads,
            num_kv_heads,
            head_dim,
        };
        self.attention::<T>(rng, shape(8, 2, 64), 256, &[(70, 5), (130, 1), (1, 1)]);
        self.attention::<T>(rng, shape(4, 1, 256), 32, &[(20, 2)]);
        self.attention::<T>(rng, shape(6, 3, 40), 40, &[(9, 3), (17, 1)]);
        // Gemma 2's scores: another scale and a soft cap that bites (scaled scores reach ~3).
        let gemma = ScoreScale {
            scale: 0.4,
            softcap: Some(1.5),
        };
        self.attention_scored::<T>(rng, shape(8, 2, 16), 64, &[(30, 4), (12, 1)], gemma);
        for (m, k, n) in [(5, 300, 70), (1, 64, 33), (3, 17, 1)] {
            self.linear::<T>(rng, m, k, n);
        }
    }

    fn embedding_gather<T: Elem>(&self, rng: &mut StdRng) {
        let (vocab, hidden) = (11, 300);
        let (table, wide) = stored::<T>(rng, vocab * hidden, -2.0, 2.0);
        // 11 is outside the vocabulary: a row of zeros.
        let ids = [3u32, 0, 10, 11, 5];
        let mut out = self.s.alloc_zeros::<f32>(ids.len() * hidden).unwrap();
        self.k
            .embedding_gather(&self.up(&table), &self.up(&ids), hidden, &mut out)
            .expect("embedding_gather");
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&id| match (id as usize) < vocab {
                true => wide[id as usize * hidden..][..hidden].to_vec(),
                false => vec![0.0; hidden],
            })
            .collect();
        assert_same("embedding_gather", &self.down(&out), &want);
    }

    fn rmsnorm<T: Elem>(&self, rng: &mut StdRng) {
        let (rows, dim, eps) = (3, 300, 1e-5);
        // Rows of very different scales.
        let x: Vec<f32> = (0..rows * dim)
            .map(|i| rng.gen_range(-1.0f32..1.0) * [0.01, 1.0, 100.0][i / dim])
            .collect();
        let (w, w_wide) = stored::<T>(rng, dim, 0.5, 1.5);
        let mut y = self.s.alloc_zeros::<T>(rows * dim).unwrap();
        self.k
            .rmsnorm(&self.up(&x), &self.up(&w), eps, &mut y)
            .expect("rmsnorm");
        let mut want = vec![0.0; rows * dim];
        kernels::rmsnorm(&x, &w_wide, eps, &mut want);
        assert_close("rmsnorm", &self.down(&y), &want, &vec![0.0; rows * dim]);
        // Gemma's `1 + w`: a small stored `w` whose sum with 1 the storage type could not
        // hold, added in f32 by the kernel, as the CPU does with its folded f32 weight.
        let (w, w_wide) = stored::<T>(rng, dim, -0.05, 0.05);
        self.k
            .rmsnorm_plus(&self.up(&x), &self.up(&w), 1.0, eps, &mut y)
            .expect("rmsnorm_plus");
        let one_plus: Vec<f32> = w_wide.iter().map(|w| 1.0 + w).collect();
        kernels::rmsnorm(&x, &one_plus, eps, &mut want);
        assert_close(
            "rmsnorm_plus",
            &self.down(&y),
            &want,
            &vec![0.0; rows * dim],
        );
    }

    /// The per-head norm of the key heads inside fused qkv rows (after 3 query heads), in
    /// place; every other column untouched.
    fn head_rmsnorm<T: Elem>(&self, rng: &mut StdRng) {
        let (q_heads, heads, head_dim, eps) = (3, 2, 40, 1e-6);
        let stride = (q_heads + 2 * heads) * head_dim;
        let n = 4;
        let (x, wide) = stored::<T>(rng, n * stride, -3.0, 3.0);
        let (w, w_wide) = stored::<T>(rng, head_dim, 0.5, 1.5);
        let mut x_d = self.up(&x);
        let at = q_heads * head_dim;
        self.k
            .head_rmsnorm(
                &mut x_d.slice_mut(at..),
                &self.up(&w),
                eps,
                n,
                heads,
                stride,
            )
            .expect("head_rmsnorm");
        let mut want = wide.clone();
        for t in 0..n {
            let k = &mut want[t * stride + at..][..heads * head_dim];
            kernels::rmsnorm(
                &wide[t * stride + at..][..heads * head_dim],
                &w_wide,
                eps,
                k,
            );
        }
        // The sum of squares is reduced in another order than on the CPU: within T::REL.
        let slack = vec![0.0; n * stride];
        assert_close("head_rmsnorm", &self.down(&x_d), &want, &slack);
    }

    /// RoPE of the query heads at the start of fused qkv rows; the K and V columns untouched.
    fn rope<T: Elem>(&self, rng: &mut StdRng) {
        let (heads, kv_heads, head_dim) = (10, 2, 64);
        let width = heads * head_dim;
        let stride = width + 2 * kv_heads * head_dim;
        let positions = [0, 1, 7, 100, 4095];
        let (cos, sin) = kernels::rope_tables(&positions, head_dim, 10000.0);
        let n = positions.len();
        let (x, wide) = stored::<T>(rng, n * stride, -3.0, 3.0);
        let mut x_d = self.up(&x);
        self.k
            .rope(
                &mut x_d,
                &self.up(&cos),
                &self.up(&sin),
                heads,
                head_dim,
                stride,
            )
            .expect("rope");
        let mut q: Vec<f32> = (0..n)
            .flat_map(|t| wide[t * stride..][..width].to_vec())
            .collect();
        kernels::apply_rope(&mut q, heads, head_dim, &cos, &sin);
        let mut want = x.clone();
        for t in 0..n {
            want[t * stride..][..width].copy_from_slice(&rounded::<T>(&q[t * width..][..width]));
        }
        assert_same("rope", &self.down(&x_d), &want);
    }

    fn silu_mul<T: Elem>(&self, rng: &mut StdRng) {
        let (n, inter) = (3, 700);
        let (gu, wide) = stored::<T>(rng, n * 2 * inter, -8.0, 8.0);
        let mut out = self.s.alloc_zeros::<T>(n * inter).unwrap();
        self.k
            .silu_mul(&self.up(&gu), inter, &mut out)
            .expect("silu_mul");
        let mut want = vec![0.0; n * inter];
        kernels::silu_mul(&wide, inter, &mut want);
        assert_same("silu_mul", &self.down(&out), &rounded::<T>(&want));
    }

    fn gelu_tanh_mul<T: Elem>(&self, rng: &mut StdRng) {
        let (n, inter) = (3, 700);
        let (gu, wide) = stored::<T>(rng, n * 2 * inter, -6.0, 6.0);
        let mut out = self.s.alloc_zeros::<T>(n * inter).unwrap();
        self.k
            .gelu_tanh_mul(&self.up(&gu), inter, &mut out)
            .expect("gelu_tanh_mul");
        let mut want = vec![0.0; n * inter];
        kernels::gelu_tanh_mul(&wide, inter, &mut want);
        assert_same("gelu_tanh_mul", &self.down(&out), &rounded::<T>(&want));
    }

    /// The final-logit soft cap, and the two helpers of Gemma's post-norms and embedding scale.
    fn softcap<T: Elem>(&self, rng: &mut StdRng) {
        let len = 1000;
        let (y, wide) = stored::<T>(rng, len, -20.0, 20.0);
        let mut y_d = self.up(&y);
        self.k.softcap(&mut y_d, 3.0).expect("softcap");
        let want: Vec<f32> = wide.iter().map(|v| (v / 3.0).tanh() * 3.0).collect();
        assert_same("softcap", &self.down(&y_d), &rounded::<T>(&want));
        let mut w = self.s.alloc_zeros::<f32>(len).unwrap();
        self.k.widen(&self.up(&y), &mut w).expect("widen");
        assert_eq!(self.down(&w), wide, "widen");
        self.k.scale_f32::<T>(&mut w, 1.5).expect("scale_f32");
        let scaled: Vec<f32> = wide.iter().map(|v| v * 1.5).collect();
        assert_eq!(self.down(&w), scaled, "scale_f32");
    }

    fn add_inplace<T: Elem>(&self, rng: &mut StdRng) {
        let len = 2100;
        let x: Vec<f32> = (0..len).map(|_| rng.gen_range(-4.0..4.0)).collect();
        let (y, wide) = stored::<T>(rng, len, -4.0, 4.0);
        let mut x_d = self.up(&x);
        self.k
            .add_inplace(&mut x_d, &self.up(&y))
            .expect("add_inplace");
        let mut want = x.clone();
        kernels::add_inplace(&mut want, &wide);
        assert_same("add_inplace", &self.down(&x_d), &want);
    }

    fn add_bias<T: Elem>(&self, rng: &mut StdRng) {
        let (rows, cols) = (3, 700);
        let (y, y_wide) = stored::<T>(rng, rows * cols, -4.0, 4.0);
        let (b, b_wide) = stored::<T>(rng, cols, -1.0, 1.0);
        let mut y_d = self.up(&y);
        self.k.add_bias(&mut y_d, &self.up(&b)).expect("add_bias");
        let want: Vec<f32> = (0..rows * cols)
            .map(|i| y_wide[i] + b_wide[i % cols])
            .collect();
        assert_same("add_bias", &self.down(&y_d), &rounded::<T>(&want));
    }

    /// Rows `src_stride` apart into their slots; slot 12 is outside the pool and skipped.
    fn kv_write<T: Elem>(&self, rng: &mut StdRng) {
        let (num_slots, kv_dim, src_stride) = (12, 128, 384);
        let slots = [5u32, 0, 11, 12];
        let (cache, _) = stored::<T>(rng, num_slots * kv_dim, -1.0, 1.0);
        let (src, _) = stored::<T>(rng, slots.len() * src_stride, -1.0, 1.0);
        let mut cache_d = self.up(&cache);
        self.k
            .kv_write(
                &mut cache_d,
                &self.up(&src),
                src_stride,
                &self.up(&slots),
                kv_dim,
            )
            .expect("kv_write");
        let mut want = cache.clone();
        for (t, &slot) in slots.iter().enumerate() {
            if (slot as usize) < num_slots {
                want[slot as usize * kv_dim..][..kv_dim]
                    .copy_from_slice(&src[t * src_stride..][..kv_dim]);
            }
        }
        assert_same("kv_write", &self.down(&cache_d), &want);
    }

    /// Each request `(keys, new)` has `keys` slots (random, distinct, in a pool of
    /// `num_slots`) and `new` query tokens, the last `new` positions of its row. `q` is read
    /// inside fused qkv rows and `out` written into rows wider than the heads (the gap must
    /// stay as it was).
    fn attention<T: Elem>(
        &self,
        rng: &mut StdRng,
        shape: AttnShape,
        num_slots: usize,
        requests: &[(usize, usize)],
    ) {
        let score = ScoreScale::standard(shape.head_dim);
        self.attention_scored::<T>(rng, shape, num_slots, requests, score)
    }

    fn attention_scored<T: Elem>(
        &self,
        rng: &mut StdRng,
        shape: AttnShape,
        num_slots: usize,
        requests: &[(usize, usize)],
        score: ScoreScale,
    ) {
        let width = shape.num_heads * shape.head_dim;
        let kv_width = shape.num_kv_heads * shape.head_dim;
        let (q_stride, out_stride) = (width + 2 * kv_width, width + 8);
        let mut free: Vec<u32> = (0..num_slots as u32).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.gen_range(0..=i));
        }
        let mut rows = Vec::new();
        for &(keys, _) in requests {
            rows.push(free.split_off(free.len() - keys));
        }
        let token_slots: Vec<&[u32]> = requests
            .iter()
            .zip(&rows)
            .flat_map(|(&(keys, new), row)| (keys - new + 1..=keys).map(move |len| &row[..len]))
            .collect();
        let n = token_slots.len();
        let (q, q_wide) = stored::<T>(rng, n * q_stride, -1.0, 1.0);
        let (k_cache, k_wide) = stored::<T>(rng, num_slots * kv_width, -1.0, 1.0);
        let (v_cache, v_wide) = stored::<T>(rng, num_slots * kv_width, -1.0, 1.0);
        let sentinel = T::from_f32(7.0);
        let mut out = self.up(&vec![sentinel; n * out_stride]);
        let batch = AttnBatch::upload(&self.s, &AttnIndex::from_token_slots(&token_slots))
            .expect("upload the index");
        let (k_d, v_d) = (self.up(&k_cache), self.up(&v_cache));
        self.k
            .attention_scored(
                &self.up(&q),
                q_stride,
                (&k_d, &v_d),
                &batch,
                shape,
                score,
                (&mut out, out_stride),
            )
            .expect("attention");
        let q_heads: Vec<f32> = (0..n)
            .flat_map(|t| q_wide[t * q_stride..][..width].to_vec())
            .collect();
        let mut cpu = vec![0.0; n * width];
        kernels::attention_scored(
            &q_heads,
            &token_slots,
            &k_wide,
            &v_wide,
            shape,
            score,
            &mut cpu,
        );
        let want: Vec<T> = (0..n)
            .flat_map(|t| {
                let mut row = rounded::<T>(&cpu[t * width..][..width]);
                row.resize(out_stride, sentinel);
                row
            })
            .collect();
        let what = format!(
            "attention {}x{}x{} of {requests:?}, {score:?}",
            shape.num_heads, shape.num_kv_heads, shape.head_dim
        );
        assert_same(&what, &self.down(&out), &want);
    }

    fn linear<T: Elem>(&self, rng: &mut StdRng, m: usize, k: usize, n: usize)
    where
        CudaBlas: Gemm<T>,
    {
        let (x, x_wide) = stored::<T>(rng, m * k, -1.0, 1.0);
        let (w, w_wide) = stored::<T>(rng, n * k, -1.0, 1.0);
        let mut y = self.s.alloc_zeros::<T>(m * n).unwrap();
        self.k
            .linear(&self.up(&x), m, &self.up(&w), n, &mut y)
            .expect("linear");
        let mut want = vec![0.0; m * n];
        kernels::linear(&x_wide, m, k, &w_wide, n, None, &mut want);
        // Another summation order: f32 rounding of each product's size, summed.
        let slack: Vec<f32> = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                let mag: f32 = (0..k)
                    .map(|j| (x_wide[r * k + j] * w_wide[c * k + j]).abs())
                    .sum();
                1e-5 * mag
            })
            .collect();
        assert_close(
            &format!("linear {m}x{k}x{n}"),
            &self.down(&y),
            &want,
            &slack,
        );
    }

    /// Every one of the 65536 values of a 16-bit type widens to the CPU's f32 (NaNs as NaNs).
    fn loads_are_exact<T: Elem>(&self) {
        let table: Vec<T> = (0..=u16::MAX).map(T::from_bits).collect();
        let mut out = self.s.alloc_zeros::<f32>(table.len()).unwrap();
        self.k
            .embedding_gather(&self.up(&table), &self.up(&[0u32]), table.len(), &mut out)
            .expect("embedding_gather");
        for (i, (g, v)) in self.down(&out).into_iter().zip(table).enumerate() {
            let w = v.widen();
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{} {i:#06x} loads as {g}, not {w}",
                type_name::<T>()
            );
        }
    }

    /// No launch for nothing to do; a shape that does not fit is an error, not a launch.
    fn empty_and_misshapen_calls(&self) {
        let mut x = self.s.alloc_zeros::<f32>(0).unwrap();
        let y = self.s.alloc_zeros::<f32>(0).unwrap();
        self.k.add_inplace(&mut x, &y).expect("empty add");
        let (a, w) = (self.up(&[1.0f32; 6]), self.up(&[1.0f32; 6]));
        let mut wrong = self.s.alloc_zeros::<f32>(5).unwrap();
        let e = self.k.linear(&a, 2, &w, 2, &mut wrong).unwrap_err();
        assert!(
            matches!(
                e,
                CudaError::Shape {
                    kernel: "linear",
                    ..
                }
            ),
            "{e}"
        );
    }
}
