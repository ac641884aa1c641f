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
use kernels::cuda::{
    driver_error, AttnBatch, AttnIndex, CudaDtype, CudaError, CudaKernels, DeviceInfo, Storage,
};
use kernels::{AttnShape, ScoreScale};

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::plan::BatchPlan;
use super::rope::Rope;
use super::weights::Weights;
use super::LlamaModel;

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

    /// The step of `plan`: the CPU pass of `forward.rs`, kernel for kernel.
    fn step(&mut self, c: &ModelConfig, plan: &BatchPlan<'_>, out: Output) -> Result<Vec<f32>> {
        if plan.num_slots > self.num_slots {
            return Err(ModelError::BadInput {
                reason: format!(
                    "the plan addresses {} slots; the GPU pool has {}",
                    plan.num_slots, self.num_slots
                ),
            });
        }
        let t = plan.tokens();
        if t == 0 {
            return Ok(Vec::new());
        }
        let h = c.hidden_size;
        let gpu_plan = self.upload_plan(c, plan)?;
        let cx = StepCx::new(c, t, self.norm_offset);
        let mut s = self.step_bufs(c, t)?;
        let (k, e) = (&self.kernels, gpu_err);
        k.embedding_gather(&self.embed, &gpu_plan.ids, h, &mut s.x)
            .map_err(e)?;
        if c.gemma.is_some() {
            // sqrt(hidden) rounded to f32, as on the CPU.
            k.scale_f32::<T>(&mut s.x, (h as f64).sqrt() as f32)
                .map_err(e)?;
        }
        for (l, lw) in self.layers.iter().enumerate() {
            let local = c.gemma.as_ref().is_some_and(|g| g.local_layers[l]);
            let caches = (&mut self.k_cache[l], &mut self.v_cache[l]);
            lw.attention_half(k, &cx, &gpu_plan, local, caches, &mut s)?;
            lw.mlp_half(k, &cx, &mut s)?;
        }
        self.head(c, &gpu_plan, &s.x, plan.seqs(), out)
    }

    /// The step's plan on the GPU: ids, slots, the rows whose output goes on, the attention
    /// index (and Gemma's local layers' window of it) and the RoPE tables.
    fn upload_plan(&self, c: &ModelConfig, plan: &BatchPlan<'_>) -> Result<GpuPlan> {
        let (k, e) = (&self.kernels, gpu_err);
        let last_rows: Vec<u32> = plan.logit_rows.iter().map(|&i| i as u32).collect();
        let index = AttnIndex::from_token_slots(&plan.attend);
        let batch = AttnBatch::upload(k.stream(), &index).map_err(e)?;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        self.rope.tables_into(&plan.positions, &mut cos, &mut sin);
        // Gemma: its local layers' window of every token's slots, and (Gemma 3) their RoPE.
        let local_batch = match c.gemma.as_ref().filter(|g| g.local_layers.contains(&true)) {
            // Each token's last `sliding_window` slots (`GemmaOptions::local_window`).
            Some(g) => {
                let window = index.windowed(g.sliding_window);
                Some(AttnBatch::upload(k.stream(), &window).map_err(e)?)
            }
            None => None,
        };
        let local_tables = match &self.local_rope {
            Some(r) => {
                let (mut lc, mut ls) = (Vec::new(), Vec::new());
                r.tables_into(&plan.positions, &mut lc, &mut ls);
                Some((self.to_gpu(&lc)?, self.to_gpu(&ls)?))
            }
            None => None,
        };
        Ok(GpuPlan {
            ids: self.to_gpu(&plan.ids)?,
            write_slots: self.to_gpu(&plan.write_slots)?,
            last_rows: self.to_gpu(&last_rows)?,
            batch,
            local_batch,
            tables: (self.to_gpu(&cos)?, self.to_gpu(&sin)?),
            local_tables,
        })
    }

    /// The activations of a step of `t` tokens.
    fn step_bufs(&self, c: &ModelConfig, t: usize) -> Result<StepBufs<T>> {
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let w = c.q_dim() + 2 * c.kv_dim();
        Ok(StepBufs {
            x: self.scratch::<f32>(t * h)?,
            hn: self.scratch::<T>(t * h)?,
            qkv: self.scratch::<T>(t * w)?,
            attn: self.scratch::<T>(t * c.q_dim())?,
            o: self.scratch::<T>(t * h)?,
            gu: self.scratch::<T>(t * 2 * inter)?,
            act: self.scratch::<T>(t * inter)?,
            down: self.scratch::<T>(t * h)?,
            // Gemma's post-norms read an attention or MLP output widened to f32 here.
            wide: match c.gemma {
                Some(_) => Some(self.scratch::<f32>(t * h)?),
                None => None,
            },
        })
    }

    /// Each sequence's last row of the residual stream `x` (gathered with the embedding gather
    /// over `x` as its table), normed, and projected to logits unless `out` wants the hidden
    /// state; copied back.
    fn head(
        &self,
        c: &ModelConfig,
        p: &GpuPlan,
        x: &CudaSlice<f32>,
        seqs: usize,
        out: Output,
    ) -> Result<Vec<f32>> {
        let (k, e) = (&self.kernels, gpu_err);
        let (h, v) = (c.hidden_size, c.vocab_size);
        let mut last = self.scratch::<f32>(seqs * h)?;
        k.embedding_gather(x, &p.last_rows, h, &mut last)
            .map_err(e)?;
        let mut normed = self.scratch::<T>(seqs * h)?;
        k.rmsnorm_plus(
            &last,
            &self.norm,
            self.norm_offset,
            c.rms_norm_eps,
            &mut normed,
        )
        .map_err(e)?;
        let result = match out {
            Output::Hidden => normed,
            Output::Logits => {
                let mut logits = self.scratch::<T>(seqs * v)?;
                let lm_head = self.lm_head.as_ref().unwrap_or(&self.embed);
                k.linear(&normed, seqs, lm_head, v, &mut logits)
                    .map_err(e)?;
                if let Some(cap) = c.gemma.as_ref().and_then(|g| g.final_softcap) {
                    k.softcap(&mut logits, cap).map_err(e)?;
                }
                logits
            }
        };
        // The copy back synchronises the stream: every launch above has finished, or failed
        // here.
        let host = k
            .stream()
            .clone_dtoh(&result)
            .map_err(|x| e(driver_error("cuMemcpyDtoH", x)))?;
        Ok(host.into_iter().map(T::widen).collect())
    }
}

/// A step's plan on the GPU (see [`Net::upload_plan`]).
struct GpuPlan {
    ids: CudaSlice<u32>,
    write_slots: CudaSlice<u32>,
    last_rows: CudaSlice<u32>,
    batch: AttnBatch,
    /// Gemma's local layers' attention index: each token's last `sliding_window` slots.
    local_batch: Option<AttnBatch>,
    /// RoPE's `(cos, sin)` for every new token, and Gemma 3's local layers' own.
    tables: (CudaSlice<f32>, CudaSlice<f32>),
    local_tables: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
}

/// A step's activations: the residual stream `x` (f32) and the scratch in the storage type.
struct StepBufs<T> {
    x: CudaSlice<f32>,
    hn: CudaSlice<T>,
    qkv: CudaSlice<T>,
    attn: CudaSlice<T>,
    o: CudaSlice<T>,
    gu: CudaSlice<T>,
    act: CudaSlice<T>,
    down: CudaSlice<T>,
    /// Gemma's post-norm input, widened to f32.
    wide: Option<CudaSlice<f32>>,
}

/// What every layer of a step reads besides its weights.
struct StepCx<'a> {
    c: &'a ModelConfig,
    /// New tokens in the step.
    t: usize,
    norm_offset: f32,
    shape: AttnShape,
    score: ScoreScale,
}

impl<'a> StepCx<'a> {
    fn new(c: &'a ModelConfig, t: usize, norm_offset: f32) -> Self {
        let score = match &c.gemma {
            Some(g) => ScoreScale {
                scale: g.attention_scale,
                softcap: g.attn_softcap,
            },
            None => ScoreScale::standard(c.head_dim),
        };
        let shape = AttnShape {
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        };
        StepCx {
            c,
            t,
            norm_offset,
            shape,
            score,
        }
    }
}

impl<T: Elem> Layer<T>
where
    CudaBlas: Gemm<T>,
{
    /// `x += o(attention(rope(qkv(rmsnorm(x)))))` (with Gemma's post-norm), the step's K and V
    /// written into the layer's `caches` first; `local`: a Gemma local layer (its window and,
    /// Gemma 3, its RoPE).
    fn attention_half(
        &self,
        k: &CudaKernels,
        cx: &StepCx<'_>,
        p: &GpuPlan,
        local: bool,
        (k_cache, v_cache): (&mut CudaSlice<T>, &mut CudaSlice<T>),
        s: &mut StepBufs<T>,
    ) -> Result<()> {
        let (c, t, off, e) = (cx.c, cx.t, cx.norm_offset, gpu_err);
        let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
        let w = qd + 2 * kvd;
        let (cos, sin) = match (&p.local_tables, local) {
            (Some((lc, ls)), true) => (lc, ls),
            _ => (&p.tables.0, &p.tables.1),
        };
        let batch = match (&p.local_batch, local) {
            (Some(b), true) => b,
            _ => &p.batch,
        };
        k.rmsnorm_plus(&s.x, &self.attn_norm, off, c.rms_norm_eps, &mut s.hn)
            .map_err(e)?;
        k.linear(&s.hn, t, &self.wqkv, w, &mut s.qkv).map_err(e)?;
        if let Some(b) = &self.bqkv {
            k.add_bias(&mut s.qkv, b).map_err(e)?;
        }
        // q at column 0 of each row, k at q_dim, v at q_dim + kv_dim.
        if let Some((qn, kn)) = &self.qk_norm {
            let eps = c.rms_norm_eps;
            k.head_rmsnorm_plus(&mut s.qkv, qn, off, eps, t, c.num_attention_heads, w)
                .map_err(e)?;
            let kv_heads = c.num_key_value_heads;
            k.head_rmsnorm_plus(&mut s.qkv.slice_mut(qd..), kn, off, eps, t, kv_heads, w)
                .map_err(e)?;
        }
        k.rope(&mut s.qkv, cos, sin, c.num_attention_heads, hd, w)
            .map_err(e)?;
        k.rope(
            &mut s.qkv.slice_mut(qd..),
            cos,
            sin,
            c.num_key_value_heads,
            hd,
            w,
        )
        .map_err(e)?;
        k.kv_write(k_cache, &s.qkv.slice(qd..), w, &p.write_slots, kvd)
            .map_err(e)?;
        k.kv_write(v_cache, &s.qkv.slice(qd + kvd..), w, &p.write_slots, kvd)
            .map_err(e)?;
        let kv = (&*k_cache, &*v_cache);
        k.attention_scored(&s.qkv, w, kv, batch, cx.shape, cx.score, (&mut s.attn, qd))
            .map_err(e)?;
        k.linear(&s.attn, t, &self.wo, c.hidden_size, &mut s.o)
            .map_err(e)?;
        if let Some(b) = &self.bo {
            k.add_bias(&mut s.o, b).map_err(e)?;
        }
        match (&self.post_norms, &mut s.wide) {
            (Some((pa, _)), Some(wide)) => {
                k.widen(&s.o, wide).map_err(e)?;
                k.rmsnorm_plus(wide, pa, off, c.rms_norm_eps, &mut s.hn)
                    .map_err(e)?;
                k.add_inplace(&mut s.x, &s.hn).map_err(e)?;
            }
            _ => k.add_inplace(&mut s.x, &s.o).map_err(e)?,
        }
        Ok(())
    }

    /// `x += down(act(gate_up(rmsnorm(x))))`: SwiGLU, or Gemma's GeGLU with its post-norm.
    fn mlp_half(&self, k: &CudaKernels, cx: &StepCx<'_>, s: &mut StepBufs<T>) -> Result<()> {
        let (c, t, off, e) = (cx.c, cx.t, cx.norm_offset, gpu_err);
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        k.rmsnorm_plus(&s.x, &self.mlp_norm, off, c.rms_norm_eps, &mut s.hn)
            .map_err(e)?;
        k.linear(&s.hn, t, &self.wgu, 2 * inter, &mut s.gu)
            .map_err(e)?;
        if let Some(b) = &self.bgu {
            k.add_bias(&mut s.gu, b).map_err(e)?;
        }
        match c.gemma {
            Some(_) => k.gelu_tanh_mul(&s.gu, inter, &mut s.act).map_err(e)?,
            None => k.silu_mul(&s.gu, inter, &mut s.act).map_err(e)?,
        }
        k.linear(&s.act, t, &self.wdown, h, &mut s.down)
            .map_err(e)?;
        if let Some(b) = &self.bdown {
            k.add_bias(&mut s.down, b).map_err(e)?;
        }
        match (&self.post_norms, &mut s.wide) {
            (Some((_, pf)), Some(wide)) => {
                k.widen(&s.down, wide).map_err(e)?;
                k.rmsnorm_plus(wide, pf, off, c.rms_norm_eps, &mut s.hn)
                    .map_err(e)?;
                k.add_inplace(&mut s.x, &s.hn).map_err(e)?;
            }
            _ => k.add_inplace(&mut s.x, &s.down).map_err(e)?,
        }
        Ok(())
    }
}
