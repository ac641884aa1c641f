//! The launches that read or write the KV pool (the KV write and paged attention) and the
//! GEMM through cuBLAS: the rest of [`CudaKernels`]' methods, beside the row-wise ones in
//! `mod.rs`.

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{check, int, launch, rows, uint, AttnBatch, CudaKernels, DeviceIn, Storage, THREADS};
use crate::cuda::{CudaError, Result, ATTN_MAX_HEAD_DIM, ATTN_THREADS};
use crate::{AttnShape, ScoreScale};

impl CudaKernels {
    /// `cache[slots[t], :] = src[t * src_stride ..][..kv_dim]` (one layer's K or V pool of
    /// `cache.len() / kv_dim` slots).
    pub fn kv_write<T: Storage>(
        &self,
        cache: &mut CudaSlice<T>,
        src: &impl DeviceIn<T>,
        src_stride: usize,
        slots: &CudaSlice<u32>,
        kv_dim: usize,
    ) -> Result<()> {
        let op = "kv_write";
        let n = slots.len();
        check(
            op,
            kv_dim > 0 && cache.len().is_multiple_of(kv_dim),
            "cache shape",
        )?;
        check(op, kv_dim <= src_stride, "src_stride")?;
        check(
            op,
            n == 0 || src.len() >= (n - 1) * src_stride + kv_dim,
            "src shape",
        )?;
        let args = (int(op, n)?, int(op, kv_dim)?, int(op, src_stride)?);
        let num_slots = uint(op, cache.len() / kv_dim)?;
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(cache);
        src.push_in(&mut b);
        b.arg(slots)
            .arg(&args.0)
            .arg(&args.1)
            .arg(&args.2)
            .arg(&num_slots);
        // SAFETY: kv_write's (cache, src, slots, n_tokens, kv_dim, src_stride, num_slots);
        // rows read are inside src (checked), slots past num_slots are skipped by the kernel.
        launch(op, n, || unsafe { b.launch(rows(n, THREADS)) })
    }

    /// Attention of `batch`'s query tokens (`q` rows `q_stride` apart) over one layer's K/V
    /// pools, into `out` (rows `out_stride` apart).
    #[allow(clippy::too_many_arguments)]
    pub fn attention<T: Storage>(
        &self,
        q: &CudaSlice<T>,
        q_stride: usize,
        k_cache: &CudaSlice<T>,
        v_cache: &CudaSlice<T>,
        batch: &AttnBatch,
        shape: AttnShape,
        out: &mut CudaSlice<T>,
        out_stride: usize,
    ) -> Result<()> {
        let score = ScoreScale::standard(shape.head_dim);
        let (kv, io) = ((k_cache, v_cache), (out, out_stride));
        self.attention_scored(q, q_stride, kv, batch, shape, score, io)
    }

    /// [`Self::attention`] with scores made as `score` says (Gemma's scale and soft cap).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_scored<T: Storage>(
        &self,
        q: &CudaSlice<T>,
        q_stride: usize,
        (k_cache, v_cache): (&CudaSlice<T>, &CudaSlice<T>),
        batch: &AttnBatch,
        shape: AttnShape,
        score: ScoreScale,
        (out, out_stride): (&mut CudaSlice<T>, usize),
    ) -> Result<()> {
        let op = "attention";
        let AttnShape {
            num_heads,
            num_kv_heads,
            head_dim,
        } = shape;
        let n = batch.tokens;
        let width = num_heads * head_dim;
        let kv_width = num_kv_heads * head_dim;
        check(
            op,
            num_kv_heads > 0 && num_heads.is_multiple_of(num_kv_heads),
            "gqa shape",
        )?;
        check(
            op,
            head_dim > 0 && head_dim <= ATTN_MAX_HEAD_DIM,
            "head_dim over 256",
        )?;
        check(op, num_heads <= u16::MAX as usize, "too many heads")?;
        check(op, width <= q_stride && width <= out_stride, "strides")?;
        check(
            op,
            n == 0 || q.len() >= (n - 1) * q_stride + width,
            "q shape",
        )?;
        check(
            op,
            n == 0 || out.len() >= (n - 1) * out_stride + width,
            "out shape",
        )?;
        check(
            op,
            k_cache.len() == v_cache.len() && k_cache.len().is_multiple_of(kv_width),
            "kv shape",
        )?;
        let num_slots = uint(op, k_cache.len() / kv_width)?;
        let ints = (int(op, q_stride)?, int(op, out_stride)?, int(op, n)?);
        let heads = (
            int(op, num_heads)?,
            int(op, num_kv_heads)?,
            int(op, head_dim)?,
        );
        // The CPU's scale and cap (0: none), as `crate::attention` takes them.
        let (scale, softcap) = (score.scale, score.softcap.unwrap_or(0.0));
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(q).arg(&ints.0).arg(k_cache).arg(v_cache);
        b.arg(&batch.slots).arg(&batch.start).arg(&batch.len);
        b.arg(out).arg(&ints.1).arg(&ints.2);
        b.arg(&heads.0)
            .arg(&heads.1)
            .arg(&heads.2)
            .arg(&scale)
            .arg(&softcap)
            .arg(&num_slots);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, num_heads as u32, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: attention's (q, q_stride, k_cache, v_cache, slots, slot_start, kv_len, out,
        // out_stride, n_tokens, num_heads, num_kv_heads, head_dim, scale, softcap, num_slots) in order
        // and type; ATTN_THREADS threads and head_dim <= ATTN_MAX_HEAD_DIM as it requires; q
        // and out rows inside their buffers (checked); slots past num_slots read nothing. The
        // index rows themselves are the AttnIndex's, consistent by construction.
        launch(op, n, || unsafe { b.launch(cfg) })
    }

    /// Row-major `y[m, n] = x[m, k] · w[n, k]ᵀ` through cuBLAS (f32: `cublasSgemm`; 16-bit:
    /// `cublasGemmEx` with f32 accumulation). Not batch-invariant: cuBLAS picks its kernel
    /// (and so its reduction order) from `m`.
    pub fn linear<T: Storage>(
        &self,
        x: &CudaSlice<T>,
        m: usize,
        w: &CudaSlice<T>,
        n: usize,
        y: &mut CudaSlice<T>,
    ) -> Result<()>
    where
        CudaBlas: Gemm<T>,
    {
        let op = "linear";
        check(op, m > 0 && n > 0 && w.len().is_multiple_of(n), "w shape")?;
        let k = w.len() / n;
        check(op, x.len() == m * k && y.len() == m * n, "x or y shape")?;
        // Column-major: yᵀ[n, m] = w[n, k] · xᵀ[k, m], w read transposed.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: int(op, n)?,
            n: int(op, m)?,
            k: int(op, k)?,
            alpha: T::from_f32(1.0),
            lda: int(op, k)?,
            ldb: int(op, k)?,
            beta: T::from_f32(0.0),
            ldc: int(op, n)?,
        };
        // SAFETY: the leading dimensions and sizes describe exactly w ([n, k]), x ([m, k])
        // and y ([m, n]), row-major (checked above).
        unsafe { self.blas.gemm(cfg, w, x, y) }.map_err(|e| CudaError::Blas {
            op: "gemm",
            text: format!("{e:?}"),
        })
    }
}
