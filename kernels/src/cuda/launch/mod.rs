//! Loading the compiled kernels on a GPU and launching them: one typed method per operation,
//! generic over the storage type, with the argument order of the kernel sources and the shape
//! checks that keep a launch in bounds. The KV write, paged attention and the GEMM through
//! cuBLAS are in `attention.rs`.
//!
//! NOT YET RUN ON A GPU. Every launch here runs in kernels/tests/cuda_emu.rs on the CPU
//! emulator of the driver and cuBLAS (the same kernel sources built as C++, real barriers and
//! shuffles), checked against the CPU kernels; the first GPU session repeats that check on the
//! hardware (issue 14). Keep it thin until then. RoPE and the KV write also take views
//! ([`DeviceIn`], [`DeviceOut`]), so they reach the K and V columns inside fused qkv rows.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DeviceSlice, LaunchArgs, LaunchConfig, PushKernelArg,
};

use super::probe::driver_error;
use super::{
    arch_for, check_library, compile_all, AttnIndex, CudaDtype, CudaError, CudaLibrary, Result,
    RMSNORM_THREADS,
};

mod attention;

/// A storage type the kernels take.
pub trait Storage: DeviceRepr + Copy + 'static {
    const DTYPE: CudaDtype;
    fn from_f32(v: f32) -> Self;
}

impl Storage for f32 {
    const DTYPE: CudaDtype = CudaDtype::F32;
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Storage for half::bf16 {
    const DTYPE: CudaDtype = CudaDtype::Bf16;
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
}

impl Storage for half::f16 {
    const DTYPE: CudaDtype = CudaDtype::F16;
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

/// Device memory a launch reads: a whole buffer, or a view into one (the K or V columns inside
/// fused qkv rows).
pub trait DeviceIn<T>: DeviceSlice<T> {
    /// Pushes the memory as the next kernel argument.
    fn push_in<'a>(&'a self, b: &mut LaunchArgs<'a>);
}

impl<T> DeviceIn<T> for CudaSlice<T> {
    fn push_in<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

impl<T> DeviceIn<T> for CudaView<'_, T> {
    fn push_in<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

/// Device memory a launch writes: a whole buffer, or a view into one.
pub trait DeviceOut<T>: DeviceSlice<T> {
    /// Pushes the memory as the next kernel argument.
    fn push_out<'a>(&'a mut self, b: &mut LaunchArgs<'a>);
}

impl<T> DeviceOut<T> for CudaSlice<T> {
    fn push_out<'a>(&'a mut self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

impl<T> DeviceOut<T> for CudaViewMut<'_, T> {
    fn push_out<'a>(&'a mut self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

/// Threads of the blocks whose size is free (gather, RoPE, KV write, element-wise).
const THREADS: u32 = 256;
/// Most blocks of a grid-stride launch.
const MAX_BLOCKS: u32 = 4096;

/// An [`AttnIndex`] on the GPU.
pub struct AttnBatch {
    slots: CudaSlice<u32>,
    start: CudaSlice<u32>,
    len: CudaSlice<u32>,
    tokens: usize,
}

impl AttnBatch {
    /// Uploads `index` on `stream`.
    pub fn upload(stream: &Arc<CudaStream>, index: &AttnIndex) -> Result<Self> {
        let up = |v: &[u32]| {
            // An empty upload is still a valid (one-element) buffer the kernel never reads.
            let v = if v.is_empty() { &[0][..] } else { v };
            stream
                .clone_htod(v)
                .map_err(|e| driver_error("cuMemcpyHtoD", e))
        };
        Ok(AttnBatch {
            slots: up(&index.slots)?,
            start: up(&index.start)?,
            len: up(&index.len)?,
            tokens: index.tokens(),
        })
    }
}

/// Every kernel loaded on one GPU, with a cuBLAS handle on the same stream.
pub struct CudaKernels {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: HashMap<String, CudaFunction>,
    arch: &'static str,
}

impl CudaKernels {
    /// Compiles every source for `ctx`'s GPU with NVRTC and loads it (once, at start).
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        check_library(CudaLibrary::Cublas)?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
        let arch = arch_for(cc)?;
        let stream = ctx.default_stream();
        let mut functions = HashMap::new();
        for compiled in compile_all(arch)? {
            let module = ctx
                .load_module(compiled.ptx)
                .map_err(|e| driver_error("cuModuleLoadData", e))?;
            for name in compiled.source.functions() {
                let f = module
                    .load_function(&name)
                    .map_err(|e| driver_error("cuModuleGetFunction", e))?;
                functions.insert(name, f);
            }
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas {
            op: "cublasCreate",
            text: format!("{e:?}"),
        })?;
        Ok(CudaKernels {
            stream,
            blas,
            functions,
            arch,
        })
    }

    /// The stream every launch is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The architecture the kernels were compiled for.
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    fn function(&self, op: &'static str, dtype: CudaDtype) -> Result<&CudaFunction> {
        let name = format!("{op}_{}", dtype.suffix());
        self.functions.get(&name).ok_or(CudaError::Shape {
            kernel: op,
            why: format!("{name} is not loaded"),
        })
    }

    /// `out[t, :] = table[ids[t], :]` as f32 (`table`: `[vocab, hidden]`).
    pub fn embedding_gather<T: Storage>(
        &self,
        table: &CudaSlice<T>,
        ids: &CudaSlice<u32>,
        hidden: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "embedding_gather";
        let n = ids.len();
        check(
            op,
            hidden > 0 && table.len().is_multiple_of(hidden),
            "table shape",
        )?;
        check(op, out.len() == n * hidden, "out shape")?;
        let (n_i, hidden_i, vocab) = (
            int(op, n)?,
            int(op, hidden)?,
            uint(op, table.len() / hidden)?,
        );
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(out)
            .arg(table)
            .arg(ids)
            .arg(&n_i)
            .arg(&hidden_i)
            .arg(&vocab);
        // SAFETY: the arguments are embedding_gather's (out, table, ids, n_tokens, hidden,
        // vocab) in order and type; one block per token, every row inside `out` (checked), ids
        // outside the table read nothing.
        launch(op, n, || unsafe { b.launch(rows(n, THREADS)) })
    }

    /// RMSNorm of each row of the f32 residual `x` into `y` (the weight's type).
    pub fn rmsnorm<T: Storage>(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<T>,
        eps: f32,
        y: &mut CudaSlice<T>,
    ) -> Result<()> {
        self.rmsnorm_plus(x, w, 0.0, eps, y)
    }

    /// [`Self::rmsnorm`] with the weight `w_offset + w`, the sum in f32 (Gemma: 1 + w).
    pub fn rmsnorm_plus<T: Storage>(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<T>,
        w_offset: f32,
        eps: f32,
        y: &mut CudaSlice<T>,
    ) -> Result<()> {
        let op = "rmsnorm";
        let dim = w.len();
        check(op, dim > 0 && x.len().is_multiple_of(dim), "x shape")?;
        check(op, y.len() == x.len(), "y shape")?;
        let n = x.len() / dim;
        let (n_i, dim_i) = (int(op, n)?, int(op, dim)?);
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(w)
            .arg(&w_offset)
            .arg(&eps)
            .arg(y)
            .arg(&n_i)
            .arg(&dim_i);
        // SAFETY: rmsnorm's (x, w, w_offset, eps, y, rows, dim); RMSNORM_THREADS threads as the kernel
        // requires; rows * dim elements in x and y (checked).
        launch(op, n, || unsafe { b.launch(rows(n, RMSNORM_THREADS)) })
    }

    /// RMSNorm in place of each of the `heads` heads of `head_dim` at the start of each
    /// `row_stride`-wide row of `x` (`n_tokens` rows), weight `w` `[head_dim]`: Qwen3's q/k norm.
    #[allow(clippy::too_many_arguments)]
    pub fn head_rmsnorm<T: Storage>(
        &self,
        x: &mut impl DeviceOut<T>,
        w: &CudaSlice<T>,
        eps: f32,
        n_tokens: usize,
        heads: usize,
        row_stride: usize,
    ) -> Result<()> {
        self.head_rmsnorm_plus(x, w, 0.0, eps, n_tokens, heads, row_stride)
    }

    /// [`Self::head_rmsnorm`] with the weight `w_offset + w` (Gemma 3: 1 + w).
    #[allow(clippy::too_many_arguments)]
    pub fn head_rmsnorm_plus<T: Storage>(
        &self,
        x: &mut impl DeviceOut<T>,
        w: &CudaSlice<T>,
        w_offset: f32,
        eps: f32,
        n_tokens: usize,
        heads: usize,
        row_stride: usize,
    ) -> Result<()> {
        let op = "head_rmsnorm";
        let head_dim = w.len();
        check(op, head_dim > 0, "empty weight")?;
        check(op, heads * head_dim <= row_stride, "row_stride")?;
        check(
            op,
            n_tokens == 0 || x.len() >= (n_tokens - 1) * row_stride + heads * head_dim,
            "x shape",
        )?;
        let n = n_tokens * heads;
        let args = (
            int(op, n_tokens)?,
            int(op, heads)?,
            int(op, head_dim)?,
            int(op, row_stride)?,
        );
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        x.push_out(&mut b);
        b.arg(w)
            .arg(&w_offset)
            .arg(&eps)
            .arg(&args.0)
            .arg(&args.1)
            .arg(&args.2)
            .arg(&args.3);
        // SAFETY: head_rmsnorm's (x, w, w_offset, eps, n_tokens, heads, head_dim, row_stride); one warp
        // per (token, head) as the kernel requires; every head it touches is inside x (checked)
        // and w has head_dim elements.
        launch(op, n, || unsafe { b.launch(rows(n, 32)) })
    }

    /// RoPE in place on the first `heads * head_dim` columns of each `row_stride`-wide row
    /// of `x`, with `cos`/`sin` `[rows, head_dim / 2]` from [`crate::rope_tables`].
    #[allow(clippy::too_many_arguments)]
    pub fn rope<T: Storage>(
        &self,
        x: &mut impl DeviceOut<T>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        heads: usize,
        head_dim: usize,
        row_stride: usize,
    ) -> Result<()> {
        let op = "rope";
        let half = head_dim / 2;
        check(
            op,
            head_dim > 0 && head_dim.is_multiple_of(2),
            "odd head_dim",
        )?;
        check(
            op,
            cos.len().is_multiple_of(half) && sin.len() == cos.len(),
            "tables",
        )?;
        let n = cos.len() / half;
        check(op, heads * head_dim <= row_stride, "row_stride")?;
        check(
            op,
            n == 0 || x.len() >= (n - 1) * row_stride + heads * head_dim,
            "x shape",
        )?;
        let args = (
            int(op, n)?,
            int(op, heads)?,
            int(op, head_dim)?,
            int(op, row_stride)?,
        );
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        x.push_out(&mut b);
        b.arg(cos)
            .arg(sin)
            .arg(&args.0)
            .arg(&args.1)
            .arg(&args.2)
            .arg(&args.3);
        // SAFETY: rope's (x, cos, sin, n_tokens, heads, head_dim, row_stride); every row it
        // touches is inside x and the tables (checked).
        launch(op, n, || unsafe { b.launch(rows(n, THREADS)) })
    }

    /// `out[t, i] = silu(gu[t, i]) · gu[t, inter + i]`.
    pub fn silu_mul<T: Storage>(
        &self,
        gu: &CudaSlice<T>,
        inter: usize,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let op = "silu_mul";
        check(op, inter > 0 && gu.len() == 2 * out.len(), "shape")?;
        check(op, out.len().is_multiple_of(inter), "shape")?;
        let n = out.len() / inter;
        let (n_i, inter_i) = (int(op, n)?, int(op, inter)?);
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(gu).arg(out).arg(&n_i).arg(&inter_i);
        // SAFETY: silu_mul's (gu, out, n_tokens, inter); a grid-stride loop over n * inter
        // outputs, inside both buffers (checked).
        launch(op, n, || unsafe { b.launch(strided(n * inter)) })
    }

    /// Gemma's GeGLU: `out[t, i] = gelu_tanh(gu[t, i]) · gu[t, inter + i]`.
    pub fn gelu_tanh_mul<T: Storage>(
        &self,
        gu: &CudaSlice<T>,
        inter: usize,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let op = "gelu_tanh_mul";
        check(op, inter > 0 && gu.len() == 2 * out.len(), "shape")?;
        check(op, out.len().is_multiple_of(inter), "shape")?;
        let n = out.len() / inter;
        let (n_i, inter_i) = (int(op, n)?, int(op, inter)?);
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(gu).arg(out).arg(&n_i).arg(&inter_i);
        // SAFETY: gelu_tanh_mul's (gu, out, n_tokens, inter); a grid-stride loop over
        // n * inter outputs, inside both buffers (checked).
        launch(op, n, || unsafe { b.launch(strided(n * inter)) })
    }

    /// `x *= s` on the f32 residual stream (through the entry point of storage type `T`).
    pub fn scale_f32<T: Storage>(&self, x: &mut CudaSlice<f32>, s: f32) -> Result<()> {
        let op = "scale_f32";
        let len = x.len();
        let n = len as u64;
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&s).arg(&n);
        // SAFETY: scale_f32's (x, s, n), n the length of x.
        launch(op, len, || unsafe { b.launch(strided(len)) })
    }

    /// `y = cap · tanh(y / cap)`.
    pub fn softcap<T: Storage>(&self, y: &mut CudaSlice<T>, cap: f32) -> Result<()> {
        let op = "softcap";
        let len = y.len();
        let n = len as u64;
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(y).arg(&cap).arg(&n);
        // SAFETY: softcap's (y, cap, n), n the length of y.
        launch(op, len, || unsafe { b.launch(strided(len)) })
    }

    /// `y = x` widened to f32.
    pub fn widen<T: Storage>(&self, x: &CudaSlice<T>, y: &mut CudaSlice<f32>) -> Result<()> {
        let op = "widen";
        check(op, x.len() == y.len(), "shape")?;
        let len = x.len();
        let n = len as u64;
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&n);
        // SAFETY: widen's (x, y, n), n the length of both (checked).
        launch(op, len, || unsafe { b.launch(strided(len)) })
    }

    /// `x += y` (x the f32 residual stream).
    pub fn add_inplace<T: Storage>(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<T>) -> Result<()> {
        let op = "add_inplace";
        check(op, x.len() == y.len(), "shape")?;
        let len = x.len();
        let n = len as u64;
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&n);
        // SAFETY: add_inplace's (x, y, n), n the length of both (checked).
        launch(op, len, || unsafe { b.launch(strided(len)) })
    }

    /// `y[r, c] += bias[c]`.
    pub fn add_bias<T: Storage>(&self, y: &mut CudaSlice<T>, bias: &CudaSlice<T>) -> Result<()> {
        let op = "add_bias";
        let cols = bias.len();
        check(op, cols > 0 && y.len().is_multiple_of(cols), "shape")?;
        let rows_n = y.len() / cols;
        let (r_i, c_i) = (int(op, rows_n)?, int(op, cols)?);
        let f = self.function(op, T::DTYPE)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(y).arg(bias).arg(&r_i).arg(&c_i);
        // SAFETY: add_bias's (y, b, rows, cols); rows * cols = y's length (checked).
        launch(op, rows_n, || unsafe { b.launch(strided(rows_n * cols)) })
    }
}

/// [`CudaError::Shape`] unless `ok`.
fn check(kernel: &'static str, ok: bool, why: &str) -> Result<()> {
    match ok {
        true => Ok(()),
        false => Err(CudaError::Shape {
            kernel,
            why: why.to_string(),
        }),
    }
}

/// `v` as a kernel's `int`.
fn int(kernel: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| CudaError::Shape {
        kernel,
        why: format!("{v} does not fit a 32-bit int"),
    })
}

/// `v` as a kernel's `u32`.
fn uint(kernel: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| CudaError::Shape {
        kernel,
        why: format!("{v} does not fit 32 bits"),
    })
}

/// One block of `threads` per row.
fn rows(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride launch over `n` elements.
fn strided(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS as usize) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs a launch unless there is nothing to do (`n` = 0: a zero grid is a launch error).
fn launch<E>(
    kernel: &'static str,
    n: usize,
    go: impl FnOnce() -> std::result::Result<E, cudarc::driver::DriverError>,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    go().map(|_| ()).map_err(|e| {
        let mut err = driver_error("cuLaunchKernel", e);
        if let CudaError::Driver { text, .. } = &mut err {
            *text = format!("{kernel}: {text}");
        }
        err
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_their_work_without_empty_or_oversized_launches() {
        assert_eq!(strided(1).grid_dim, (1, 1, 1));
        assert_eq!(strided(257).grid_dim, (2, 1, 1));
        assert_eq!(strided(1 << 30).grid_dim, (MAX_BLOCKS, 1, 1));
        assert_eq!(rows(7, RMSNORM_THREADS).block_dim, (RMSNORM_THREADS, 1, 1));
        assert!(int("t", 1 << 31).is_err() && int("t", (1 << 31) - 1).is_ok());
    }
}
