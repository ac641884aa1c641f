//! The Llama forward pass on an NVIDIA GPU: the batch plan of `plan.rs` executed with the
//! kernels of `kernels::cuda` (NVRTC-compiled at start) and cuBLAS, the same sequence of
//! operations as the CPU pass in `forward.rs`.
//!
//! Weights are uploaded once, in the checkpoint's storage type (f32, f16 or bf16; every
//! product and sum is computed in f32, 16-bit values rounded to nearest even when stored). The
//! residual stream is f32. The KV pool lives on the GPU in the same storage type, allocated
//! once at start ([`CudaLlama::alloc_kv`]); the scheduler's `KvBuffers` for this rank only
//! count slots. A step uploads the plan (ids, write slots, attention index, RoPE tables),
//! runs the layers, gathers each sequence's last row and copies back only those rows' logits;
//! sampling stays on the CPU.
//!
//! As on the CPU, q, k and v come from one GEMM over the fused `[q; k; v]` rows and gate and up
//! from another; Qwen3's per-head q/k norm, RoPE and the KV write reach the q, k and v columns
//! through views of those rows. RoPE scaling needs nothing here (the host builds the tables from
//! the model's frequencies, as the CPU does), nor does a sliding window (it is the plan's).
//! Gemma 2/3 (`gemma.rs`) as on the CPU: the embedding scaled, RMSNorms of `1 + w` (uploaded as
//! `w`, the kernels add 1 in f32), post-attention and post-MLP norms over the output widened to
//! f32, GeGLU, scaled and soft-capped scores, a second attention index for the local layers'
//! window and their own RoPE tables, the final logits soft-capped. Mixture-of-experts models
//! are refused ([`ModelConfig::cuda_refusal`]).
//!
//! What is batch-invariant here: the embedding gather, RoPE, KV write, the element-wise ops and
//! attention (one fixed reduction order per (token, head), nothing shared with other tokens);
//! RMSNorm (its order depends on the row width only). What is not: the GEMMs, where cuBLAS
//! picks its kernel and split from the number of rows, so a token's logits can differ in the
//! last bits between a step of 1 token and a step of 64.

use std::sync::{Arc, Mutex};

use half::{bf16, f16};
use kernels::cuda::cudarc::cublas::{CudaBlas, Gemm};
use kernels::cuda::cudarc::driver::{CudaContext, CudaSlice, DeviceRepr, ValidAsZeroBits};
use kernels::cuda::{driver_error, CudaDtype, CudaError, CudaKernels, DeviceInfo, Storage};

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::plan::BatchPlan;
use super::rope::Rope;
use super::weights::Weights;
use super::LlamaModel;

mod step;

/// A storage type a step runs in: the kernels' [`Storage`], cuBLAS's GEMM, and widening back
/// to f32 on the host.
trait Elem: Storage + ValidAsZeroBits + Send {
    fn widen(self) -> f32;
}

impl Elem for f32 {
    fn widen(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl Elem for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// One decoder layer on the GPU. Matrices are row-major `[out, in]`, as [`CudaKernels::linear`]
/// takes them.
struct Layer<T> {
    attn_norm: CudaSlice<T>,
    /// `[q_dim + 2·kv_dim, hidden]`: q rows, then k rows, then v rows.
    wqkv: CudaSlice<T>,
    /// The q, k and v biases, fused the same way (Qwen2-style models).
    bqkv: Option<CudaSlice<T>>,
    /// Qwen3's per-head q and k RMSNorm weights, `[head_dim]` each.
    qk_norm: Option<(CudaSlice<T>, CudaSlice<T>)>,
    wo: CudaSlice<T>,
    /// The output projection's bias (Llama / Qwen3 with `attention_bias`).
    bo: Option<CudaSlice<T>>,
    mlp_norm: CudaSlice<T>,
    /// `[2·intermediate, hidden]`: gate rows, then up rows.
    wgu: CudaSlice<T>,
    /// The gate and up biases, fused the same way, and the down bias (Llama's `mlp_bias`).
    bgu: Option<CudaSlice<T>>,
    wdown: CudaSlice<T>,
    bdown: Option<CudaSlice<T>>,
    /// Gemma's norms of the attention output and of the MLP output.
    post_norms: Option<(CudaSlice<T>, CudaSlice<T>)>,
}

/// The model's weights and KV pool on one GPU, in storage type `T`.
struct Net<T> {
    kernels: CudaKernels,
    embed: CudaSlice<T>,
    layers: Vec<Layer<T>>,
    norm: CudaSlice<T>,
    /// `None`: tied to `embed`.
    lm_head: Option<CudaSlice<T>>,
    /// What the host builds each step's cos/sin tables from (scaling applied).
    rope: Rope,
    /// Gemma 3's local layers' RoPE.
    local_rope: Option<Rope>,
    /// What every RMSNorm adds to its stored weight: 1 for Gemma (whose `1 + w` the host holds
    /// folded; `w` goes up unfolded, so a 16-bit type keeps its bits and the sum is in f32, as
    /// in transformers), else 0.
    norm_offset: f32,
    /// Per layer, K and V of every slot: `[num_slots, kv_dim]`. Empty until `alloc_kv`.
    k_cache: Vec<CudaSlice<T>>,
    v_cache: Vec<CudaSlice<T>>,
    num_slots: usize,
}

/// [`Net`] in the checkpoint's type.
enum AnyNet {
    F32(Net<f32>),
    Bf16(Net<bf16>),
    F16(Net<f16>),
}

/// What a step returns for each sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Logits,
    Hidden,
}

/// A Llama model on an NVIDIA GPU.
pub struct CudaLlama {
    config: ModelConfig,
    gpu: DeviceInfo,
    dtype: CudaDtype,
    ctx: Arc<CudaContext>,
    weight_bytes: u64,
    /// Steps take `&self` (the scheduler's model is shared); the KV pool they write is behind
    /// this lock, uncontended (one scheduler thread).
    net: Mutex<AnyNet>,
}

impl std::fmt::Debug for CudaLlama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaLlama")
            .field("config", &self.config)
            .field("gpu", &self.gpu)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

fn gpu_err(e: CudaError) -> ModelError {
    ModelError::Gpu(e.to_string())
}

/// Bytes of one value of `dtype`.
fn elem_bytes(dtype: CudaDtype) -> usize {
    match dtype {
        CudaDtype::F32 => 4,
        CudaDtype::Bf16 | CudaDtype::F16 => 2,
    }
}

impl CudaLlama {
    /// Opens `gpu` (as [`kernels::cuda::probe`] found it), compiles the kernels for it and
    /// uploads `model`'s weights in their stored type. No KV pool yet: [`Self::alloc_kv`] sizes
    /// it from what is left.
    pub fn upload(model: &LlamaModel, gpu: DeviceInfo) -> std::result::Result<Self, CudaError> {
        if let Some(why) = model.config.cuda_refusal() {
            return Err(CudaError::Shape {
                kernel: "the model",
                why,
            });
        }
        let ctx = CudaContext::new(gpu.ordinal as usize)
            .map_err(|e| driver_error("CudaContext::new", e))?;
        let kernels = CudaKernels::load(&ctx)?;
        let (w, c) = (&model.weights, &model.config);
        let dtype = model.stored_dtype();
        let off = if c.gemma.is_some() { 1.0 } else { 0.0 };
        let net = match dtype {
            CudaDtype::F32 => AnyNet::F32(Net::upload(kernels, w, off)?),
            CudaDtype::Bf16 => AnyNet::Bf16(Net::upload(kernels, w, off)?),
            CudaDtype::F16 => AnyNet::F16(Net::upload(kernels, w, off)?),
        };
        Ok(CudaLlama {
            config: c.clone(),
            gpu,
            dtype,
            ctx,
            weight_bytes: (c.num_params() * elem_bytes(dtype)) as u64,
            net: Mutex::new(net),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The GPU as the probe found it at start.
    pub fn gpu(&self) -> &DeviceInfo {
        &self.gpu
    }

    /// The storage type of weights and KV.
    pub fn dtype(&self) -> CudaDtype {
        self.dtype
    }

    /// Bytes the weights take on the GPU.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Bytes of K and V one token slot takes across all layers, in the storage type.
    pub fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.config;
        (c.num_hidden_layers * 2 * c.kv_dim() * elem_bytes(self.dtype)) as u64
    }

    /// The activations of a step of `tokens` new tokens and `seqs` sequences, in bytes: what
    /// the pool must leave free on the GPU.
    pub fn step_bytes(&self, tokens: usize, seqs: usize) -> u64 {
        let c = &self.config;
        let elem = elem_bytes(self.dtype);
        // x (f32), then hn, q, k, v, attn, o, gu, act, down in the storage type, plus the
        // plan's ids, slots and RoPE tables.
        let per_token = 4 * c.hidden_size
            + elem * (3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size)
            + 4 * (3 + c.head_dim);
        // The gathered last rows, their norm and logits, and the attention index's rows.
        let mut per_seq = 4 * c.hidden_size
            + elem * (c.hidden_size + c.vocab_size)
            + 4 * c.vocab_size
            + 4 * c.max_position_embeddings;
        let mut per_token = per_token;
        if c.gemma.is_some() {
            // The widened post-norm input (f32), the local layers' RoPE tables, and their
            // attention index (the same rows again, each token's start moved).
            per_token += 4 * c.hidden_size + 4 * c.head_dim + 4 * 2;
            per_seq += 4 * c.max_position_embeddings;
        }
        (tokens * per_token + seqs * per_seq) as u64
    }

    /// Free and total memory of the GPU now.
    pub fn mem_info(&self) -> std::result::Result<(u64, u64), CudaError> {
        self.ctx
            .mem_get_info()
            .map(|(free, total)| (free as u64, total as u64))
            .map_err(|e| driver_error("cuMemGetInfo", e))
    }

    /// Allocates the KV pool (zeroed): `num_slots` slots per layer, K and V.
    pub fn alloc_kv(&self, num_slots: usize) -> std::result::Result<(), CudaError> {
        let c = &self.config;
        match &mut *self.lock() {
            AnyNet::F32(n) => n.alloc_kv(c, num_slots),
            AnyNet::Bf16(n) => n.alloc_kv(c, num_slots),
            AnyNet::F16(n) => n.alloc_kv(c, num_slots),
        }
    }

    /// Slots of the KV pool on the GPU.
    pub fn num_slots(&self) -> usize {
        match &*self.lock() {
            AnyNet::F32(n) => n.num_slots,
            AnyNet::Bf16(n) => n.num_slots,
            AnyNet::F16(n) => n.num_slots,
        }
    }

    /// The logits of each sequence's last new token, `[plan.seqs(), vocab]`; K/V of every new
    /// token written to its slot.
    pub fn forward(&self, plan: &BatchPlan<'_>) -> Result<Vec<f32>> {
        self.step(plan, Output::Logits)
    }

    /// The final-normed hidden state of each sequence's last new token, `[plan.seqs(), hidden]`.
    pub fn forward_hidden(&self, plan: &BatchPlan<'_>) -> Result<Vec<f32>> {
        self.step(plan, Output::Hidden)
    }

    fn step(&self, plan: &BatchPlan<'_>, out: Output) -> Result<Vec<f32>> {
        // The scheduler may step from a thread other than the one that uploaded (a compute
        // pool's): cuBLAS calls need the context current there, which cudarc's own calls see to
        // only for themselves.
        self.ctx
            .bind_to_thread()
            .map_err(|e| gpu_err(driver_error("cuCtxSetCurrent", e)))?;
        let c = &self.config;
        match &mut *self.lock() {
            AnyNet::F32(n) => n.step(c, plan, out),
            AnyNet::Bf16(n) => n.step(c, plan, out),
            AnyNet::F16(n) => n.step(c, plan, out),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AnyNet> {
        // A panic mid-step leaves nothing half-updated that a later step trusts (the KV slots
        // of a failed step are freed by the scheduler), so a poisoned lock is still usable.
        self.net.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: Elem> Net<T>
where
    CudaBlas: Gemm<T>,
{
    /// Uploads `w` as `T` (exact: the f32 values were widened from `T` when loaded, or are f32).
    fn upload(
        kernels: CudaKernels,
        w: &Weights,
        norm_offset: f32,
    ) -> std::result::Result<Self, CudaError> {
        let stream = kernels.stream().clone();
        let up = |v: &[f32]| -> std::result::Result<CudaSlice<T>, CudaError> {
            let host: Vec<T> = v.iter().map(|&x| T::from_f32(x)).collect();
            stream
                .clone_htod(&host)
                .map_err(|e| driver_error("cuMemcpyHtoD", e))
        };
        // `(1 + w) - 1` is `w` exactly: the sum was exact in f32, or rounded to what the
        // kernel's `1 + w` rounds to again.
        let up_norm = |v: &[f32]| {
            let raw: Vec<f32> = v.iter().map(|&x| x - norm_offset).collect();
            up(&raw)
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for lw in &w.layers {
            layers.push(Layer {
                attn_norm: up_norm(&lw.attn_norm)?,
                wqkv: up(&lw.wqkv.unpack())?,
                bqkv: match &lw.bqkv {
                    Some(b) => Some(up(b)?),
                    None => None,
                },
                qk_norm: match &lw.qk_norm {
                    Some((qn, kn)) => Some((up_norm(qn)?, up_norm(kn)?)),
                    None => None,
                },
                wo: up(&lw.wo.unpack())?,
                bo: match &lw.bo {
                    Some(b) => Some(up(b)?),
                    None => None,
                },
                mlp_norm: up_norm(&lw.mlp_norm)?,
                wgu: up(&lw.wgu.unpack())?,
                bgu: match &lw.bgu {
                    Some(b) => Some(up(b)?),
                    None => None,
                },
                wdown: up(&lw.wdown.unpack())?,
                bdown: match &lw.bdown {
                    Some(b) => Some(up(b)?),
                    None => None,
                },
                post_norms: match &lw.post_norms {
                    Some((a, m)) => Some((up_norm(a)?, up_norm(m)?)),
                    None => None,
                },
            });
        }
        Ok(Net {
            embed: up(&w.embed.unpack())?,
            layers,
            norm: up_norm(&w.norm)?,
            lm_head: match &w.lm_head {
                Some(m) => Some(up(&m.unpack())?),
                None => None,
            },
            rope: w.rope.clone(),
            local_rope: w.local_rope.clone(),
            norm_offset,
            k_cache: Vec::new(),
            v_cache: Vec::new(),
            num_slots: 0,
            kernels,
        })
    }

    fn alloc_kv(
        &mut self,
        c: &ModelConfig,
        num_slots: usize,
    ) -> std::result::Result<(), CudaError> {
        let stream = self.kernels.stream().clone();
        let len = num_slots * c.kv_dim();
        let zeros = || {
            stream
                .alloc_zeros::<T>(len)
                .map_err(|e| driver_error("cuMemAlloc", e))
        };
        // Freed first, so a resize never holds two pools.
        self.k_cache.clear();
        self.v_cache.clear();
        self.num_slots = 0;
        for _ in 0..c.num_hidden_layers {
            self.k_cache.push(zeros()?);
            self.v_cache.push(zeros()?);
        }
        self.num_slots = num_slots;
        Ok(())
    }

    /// Uploads `v` (an array of the plan).
    fn to_gpu<U: DeviceRepr>(&self, v: &[U]) -> Result<CudaSlice<U>> {
        self.kernels
            .stream()
            .clone_htod(v)
            .map_err(|e| gpu_err(driver_error("cuMemcpyHtoD", e)))
    }

    /// `len` values of `U`, uninitialised (every kernel writing one writes all of it).
    fn scratch<U: Storage>(&self, len: usize) -> Result<CudaSlice<U>> {
        // SAFETY: each buffer made here is the output of a kernel or GEMM that writes every
        // element before anything reads it (see `step`); none is copied back unwritten.
        unsafe { self.kernels.stream().alloc::<U>(len) }
            .map_err(|e| gpu_err(driver_error("cuMemAlloc", e)))
    }
}
