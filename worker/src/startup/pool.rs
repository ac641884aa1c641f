//! How many KV slots a rank gets: from `--mem-fraction` of the host's free memory, of the GPU's,
//! or of the modelled GPU of a simulated rank.

use crate::args::WorkerConfig;
use crate::error::{self, WorkerError};
use crate::mem;
use crate::model::{self, ModelConfig};
use crate::sim::SimModel;

#[cfg(feature = "cuda")]
use super::cuda_unavailable;

/// The KV pool size from `--mem-fraction` of the memory read before the model loaded, logged
/// with everything it came from.
pub(super) fn size_kv_pool(
    config: &WorkerConfig,
    mem_fraction_given: bool,
    mc: &ModelConfig,
    context_len: usize,
    reading: Result<mem::MemReading, String>,
    weight_bytes: u64,
) -> usize {
    let budget = mem::KvBudget {
        available_bytes: reading.as_ref().ok().map(|r| r.available_bytes),
        mem_fraction: config.mem_fraction,
        // As loaded (f32 or the checkpoint's 16-bit type, `--weight-dtype`).
        weight_bytes,
        kv_bytes_per_token: model::KvBuffers::bytes_per_slot(mc) as u64,
        context_len,
        req_to_token_rows: config.max_running_requests + config.pre_alloc_rows,
        tokens_per_request: (!mem_fraction_given).then_some(mem::KV_TOKENS_PER_RUNNING_REQUEST),
    };
    let size = budget.derive();
    let (min_tokens, max_tokens) = budget.bounds();
    match &reading {
        Ok(r) => tracing::info!(
            rank = config.rank,
            available_bytes = r.available_bytes,
            source = %r.source,
            mem_fraction = budget.mem_fraction,
            weight_bytes = budget.weight_bytes,
            budget_bytes = size.budget_bytes.unwrap_or(0),
            kv_bytes_per_token = budget.kv_bytes_per_token,
            min_tokens,
            max_tokens,
            tokens_per_request = ?budget.tokens_per_request,
            max_total_tokens = size.max_total_tokens,
            pool_bytes = budget.kv_bytes_per_token * size.max_total_tokens as u64,
            limit = size.limit.as_str(),
            "KV pool sized from --mem-fraction and max-running-requests (set --max-total-tokens to choose it)"
        ),
        Err(why) => tracing::warn!(
            rank = config.rank,
            %why,
            max_total_tokens = size.max_total_tokens,
            "free memory unknown; KV pool uses the fixed default (set --max-total-tokens to choose it)"
        ),
    }
    if size.limit == mem::PoolLimit::OneContext {
        tracing::warn!(
            rank = config.rank,
            max_total_tokens = size.max_total_tokens,
            "the memory budget is below one full context; the pool may not fit in memory"
        );
    }
    size.max_total_tokens
}

/// A simulated rank's KV pool: what the modelled GPU's memory holds beside its weights.
pub(super) fn size_sim_pool(rank: u32, sim: &SimModel) -> error::Result<usize> {
    let size = sim.cost().pool_size()?;
    tracing::info!(
        rank,
        budget_bytes = size.budget_bytes,
        kv_bytes_per_token = sim.profile().kv_bytes_per_token,
        max_total_tokens = size.tokens,
        capped = size.capped,
        "simulated KV pool sized from the modelled GPU memory less the weights (--mem-fraction \
         is the host's and does not apply; set --max-total-tokens to choose it)"
    );
    Ok(size.tokens)
}

/// The KV pool of a GPU rank: `--mem-fraction` of the GPU memory free before the model was
/// uploaded, less what the upload took and one step's activations (chunked-prefill tokens,
/// every running request), in the storage type. Too little for one full context is an error:
/// a GPU pool is allocated up front and cannot grow.
#[cfg(feature = "cuda")]
pub(super) fn size_gpu_pool(
    config: &WorkerConfig,
    m: &model::cuda::CudaLlama,
    context_len: usize,
) -> error::Result<usize> {
    let ordinal = m.gpu().ordinal;
    let (free, total) = m.mem_info().map_err(|e| cuda_unavailable(ordinal, e))?;
    let uploaded = m.gpu().free_bytes.saturating_sub(free);
    let step = m.step_bytes(config.chunked_prefill_size, config.max_running_requests);
    let budget = mem::KvBudget {
        available_bytes: Some(m.gpu().free_bytes),
        mem_fraction: config.mem_fraction,
        weight_bytes: uploaded.max(m.weight_bytes()) + step,
        kv_bytes_per_token: m.kv_bytes_per_token(),
        context_len,
        req_to_token_rows: config.max_running_requests + config.pre_alloc_rows,
        // A GPU is this worker's own: the share is the pool's, not a few thousand per request.
        tokens_per_request: None,
    };
    let size = budget.derive();
    tracing::info!(
        rank = config.rank,
        gpu_free_bytes = m.gpu().free_bytes,
        gpu_total_bytes = total,
        mem_fraction = config.mem_fraction,
        uploaded_bytes = uploaded,
        step_bytes = step,
        budget_bytes = size.budget_bytes.unwrap_or(0),
        kv_bytes_per_token = budget.kv_bytes_per_token,
        max_total_tokens = size.max_total_tokens,
        limit = size.limit.as_str(),
        "GPU KV pool sized from --mem-fraction of the GPU memory free at start (set \
         --max-total-tokens to choose it)"
    );
    if size.limit == mem::PoolLimit::OneContext {
        return Err(cuda_unavailable(
            ordinal,
            format!(
                "too little GPU memory: --mem-fraction {} of the {} MiB free leaves {} MiB for \
                 the KV pool after the model ({} MiB) and one step, less than one full context \
                 of {context_len} tokens needs ({} MiB); raise --mem-fraction, lower \
                 --context-length or set --max-total-tokens",
                config.mem_fraction,
                m.gpu().free_bytes >> 20,
                size.budget_bytes.unwrap_or(0) >> 20,
                budget.weight_bytes >> 20,
                (budget.kv_bytes_per_token * context_len as u64) >> 20,
            ),
        ));
    }
    Ok(size.max_total_tokens)
}

/// Allocates the GPU KV pool of `slots` slots, then runs one step of one token (into slot 0,
/// free, so overwritten before anything reads it): every kernel and cuBLAS call a step makes
/// has then run once, and one that cannot is a start-up refusal, not a failed request.
#[cfg(feature = "cuda")]
pub(super) fn alloc_gpu_pool(m: &model::cuda::CudaLlama, slots: usize) -> error::Result<()> {
    let ordinal = m.gpu().ordinal;
    let bytes = m.kv_bytes_per_token() * slots as u64;
    m.alloc_kv(slots).map_err(|e| {
        cuda_unavailable(
            ordinal,
            format!(
                "allocating the KV pool of {slots} tokens ({} MiB): {e}",
                bytes >> 20
            ),
        )
    })?;
    let first = [model::SeqInput {
        new_tokens: &[0],
        start_pos: 0,
        slots: &[0],
    }];
    let plan = model::BatchPlan::new(m.config(), slots, &first).map_err(WorkerError::Step)?;
    kernels::cuda::quietly("the first step", || m.forward(&plan))
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|e| cuda_unavailable(ordinal, format!("the first step failed: {e}")))?;
    Ok(())
}
