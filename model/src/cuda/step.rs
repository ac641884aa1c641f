//! One step of a [`Net`] on the GPU: the plan uploaded, the activations allocated, each
//! layer's attention and MLP halves, and the head. The CPU pass of `forward.rs`, kernel for
//! kernel.

use kernels::cuda::cudarc::cublas::{CudaBlas, Gemm};
use kernels::cuda::cudarc::driver::CudaSlice;
use kernels::cuda::{driver_error, AttnBatch, AttnIndex, CudaKernels};
use kernels::{AttnShape, ScoreScale};

use super::{gpu_err, Elem, Layer, Net, Output};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::plan::BatchPlan;

impl<T: Elem> Net<T>
where
    CudaBlas: Gemm<T>,
{
    /// The step of `plan`: the CPU pass of `forward.rs`, kernel for kernel.
    pub(super) fn step(
        &mut self,
        c: &ModelConfig,
        plan: &BatchPlan<'_>,
        out: Output,
    ) -> Result<Vec<f32>> {
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
        StepCx {
            c,
            t,
            norm_offset,
            shape: c.attn_shape(),
            score: c.score_scale(),
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
        let post_norm = self.post_norms.as_ref().map(|(a, _)| a);
        Self::add_residual(k, cx, &s.o, post_norm, &mut s.x, &mut s.wide, &mut s.hn)
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
        let post_norm = self.post_norms.as_ref().map(|(_, m)| m);
        Self::add_residual(k, cx, &s.down, post_norm, &mut s.x, &mut s.wide, &mut s.hn)
    }

    /// `x += out`, or with Gemma's post-norm `x += rmsnorm(out)` (`out` widened to f32 into
    /// `wide` first, normed into `hn`).
    fn add_residual(
        k: &CudaKernels,
        cx: &StepCx<'_>,
        out: &CudaSlice<T>,
        post_norm: Option<&CudaSlice<T>>,
        x: &mut CudaSlice<f32>,
        wide: &mut Option<CudaSlice<f32>>,
        hn: &mut CudaSlice<T>,
    ) -> Result<()> {
        let e = gpu_err;
        match (post_norm, wide) {
            (Some(norm), Some(wide)) => {
                k.widen(out, wide).map_err(e)?;
                k.rmsnorm_plus(wide, norm, cx.norm_offset, cx.c.rms_norm_eps, hn)
                    .map_err(e)?;
                k.add_inplace(x, hn).map_err(e)?;
            }
            _ => k.add_inplace(x, out).map_err(e)?,
        }
        Ok(())
    }
}
