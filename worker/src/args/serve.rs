//! [`ServeArgs`]: memory, batching and lifecycle flags, shared with `up` and `bench --launch`.

use super::{
    flag, DEFAULT_CHUNKED_PREFILL_SIZE, DEFAULT_DISAGG_TIMEOUT_S, DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_FINISH_FIRST_MAX_WAIT_MS, DEFAULT_FINISH_FIRST_TOKENS, DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_MAX_PREFILL_TOKENS, DEFAULT_MAX_RUNNING_REQUESTS, DEFAULT_PREFILL_STEP_TARGET_MS,
};
use crate::error;
use crate::kv::req_to_token::DecodePrealloc;
use crate::mem::DEFAULT_MEM_FRACTION;
use crate::scheduler::SchedulePolicy;

/// Memory, batching and lifecycle of one worker (also `up`'s and `bench --launch`'s).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ServeArgs {
    /// KV pool size in tokens (slots). Unset: derived from --mem-fraction of the memory free at
    /// start, less the model's weights, between one full context and max-running-requests (plus
    /// pre-allocated rows) × 2048 (× context length when --mem-fraction is set). Set, it wins.
    #[arg(long, env = "DPSERVE_MAX_TOTAL_TOKENS")]
    pub max_total_tokens: Option<usize>,
    /// Share of the memory free at start (MemAvailable, or the cgroup's headroom when tighter)
    /// that this worker's model weights and KV pool may take, in (0, 1]; used when
    /// --max-total-tokens is unset. Low by default because host memory is shared, unlike a
    /// GPU's: the OS, the page cache that reads the weights, the other actors and the forward
    /// pass's activations live in the other half, and KV pages are only touched as slots fill,
    /// so an over-large pool fails late (an OOM kill while serving), not at start. Workers
    /// sharing a host must split it: `up --dp-size N` gives each 1/N of its --mem-fraction.
    #[arg(long, env = "DPSERVE_MEM_FRACTION", default_value_t = DEFAULT_MEM_FRACTION,
          value_parser = crate::mem::parse_mem_fraction)]
    pub mem_fraction: f64,
    /// Most requests decoding at once.
    #[arg(long, env = "DPSERVE_MAX_RUNNING_REQUESTS", default_value_t = DEFAULT_MAX_RUNNING_REQUESTS)]
    pub max_running_requests: usize,
    /// Most prompt tokens of one request computed in one step (longer prompts are chunked).
    #[arg(long, env = "DPSERVE_CHUNKED_PREFILL_SIZE", default_value_t = DEFAULT_CHUNKED_PREFILL_SIZE)]
    pub chunked_prefill_size: usize,
    /// Most prompt tokens computed in one prefill step over all requests.
    #[arg(long, env = "DPSERVE_MAX_PREFILL_TOKENS", default_value_t = DEFAULT_MAX_PREFILL_TOKENS)]
    pub max_prefill_tokens: usize,
    /// Decode workers (--disaggregation-mode decode) only: extra request-to-token rows beyond
    /// --max-running-requests for requests that hold KV without running: `auto` = 2 ×
    /// max-running-requests when that is at most 32, else 0; or a row count. Other roles
    /// have none.
    #[arg(long, env = "DPSERVE_DECODE_PREALLOC_SIZE", default_value_t = DecodePrealloc::Auto)]
    pub decode_prealloc_size: DecodePrealloc,
    /// Scheduling policy.
    #[arg(long, env = "DPSERVE_SCHEDULE_POLICY", value_enum, default_value_t = SchedulePolicy::Lpm)]
    pub schedule_policy: SchedulePolicy,
    /// Do not keep or reuse prompt prefixes.
    #[arg(long, env = "DPSERVE_DISABLE_RADIX_CACHE")]
    pub disable_radix_cache: bool,
    /// Tell the controller what the prefix cache stores and evicts, as chained hashes of
    /// blocks of this many tokens (for `--load-balance-method cache_aware`); 0 = off. Every
    /// worker of a deployment must use the same size.
    #[arg(long, env = "DPSERVE_KV_EVENT_BLOCK_SIZE",
          default_value_t = protocol::kv_events::DEFAULT_KV_BLOCK_SIZE)]
    pub kv_event_block_size: usize,
    /// Context length (default: the model's `max_position_embeddings`).
    #[arg(long, env = "DPSERVE_CONTEXT_LENGTH")]
    pub context_length: Option<usize>,
    /// Compute threads of each worker (default: the CPUs the process may use; under `up`,
    /// this host's CPUs divided by --dp-size).
    #[arg(long, env = "DPSERVE_NUM_THREADS")]
    pub num_threads: Option<usize>,
    /// Heartbeat period in milliseconds (independent of model steps).
    #[arg(long, env = "DPSERVE_HEARTBEAT_INTERVAL_MS", default_value_t = DEFAULT_HEARTBEAT_INTERVAL_MS)]
    pub heartbeat_interval_ms: u64,
    /// Seconds a worker told to stop (SIGTERM) keeps running what it holds before it exits;
    /// 0 stops at once. New requests go elsewhere from the first moment.
    #[arg(long, env = "DPSERVE_DRAIN_TIMEOUT", default_value_t = DEFAULT_DRAIN_TIMEOUT_S)]
    pub drain_timeout: f64,
    /// A prefill step computes only as many prompt tokens as fit in about this many
    /// milliseconds (learnt from earlier steps), so status, aborts and SIGTERM are served
    /// promptly on any CPU; 0 = no time bound (only the token limits).
    #[arg(long, env = "DPSERVE_PREFILL_STEP_TARGET_MS", default_value_t = DEFAULT_PREFILL_STEP_TARGET_MS)]
    pub prefill_step_target_ms: u64,
    /// Finish-first: while a running request is within this many tokens of its
    /// `max_new_tokens`, a waiting prompt's prefill waits (decode steps run), for at most
    /// --finish-first-max-wait-ms, so a short answer's last tokens are not stalled by another
    /// prompt; 0 = off (a waiting prompt is always computed first).
    #[arg(long, env = "DPSERVE_FINISH_FIRST_TOKENS", default_value_t = DEFAULT_FINISH_FIRST_TOKENS)]
    pub finish_first_tokens: u32,
    /// Finish-first: the longest a waiting prompt is held back, in milliseconds from its
    /// arrival at the worker.
    #[arg(long, env = "DPSERVE_FINISH_FIRST_MAX_WAIT_MS", default_value_t = DEFAULT_FINISH_FIRST_MAX_WAIT_MS)]
    pub finish_first_max_wait_ms: u64,
    /// Requests a rank holds waiting (not yet running) at most; past it a new request is
    /// refused at once (503 with `Retry-After`), so a burst cannot grow a worker's queue
    /// without bound. Unset: no limit (the tokenizer's `--max-in-flight-requests` still bounds
    /// the whole server).
    #[arg(long, env = "DPSERVE_MAX_QUEUED_REQUESTS")]
    pub max_queued_requests: Option<usize>,
    /// Seconds a request waits for its decode worker to be ready for its KV: on a prefill
    /// worker before it is dropped, on a decode worker (waiting for a request row and KV
    /// slots) before it fails (503). Either side giving up tells the other.
    #[arg(long, env = "DPSERVE_DISAGGREGATION_BOOTSTRAP_TIMEOUT", default_value_t = DEFAULT_DISAGG_TIMEOUT_S)]
    pub disaggregation_bootstrap_timeout: f64,
    /// Decode worker: seconds a request's KV may take to arrive once its slots are ready; past
    /// it the request fails (503) and its row and slots are freed.
    #[arg(long, env = "DPSERVE_DISAGGREGATION_WAITING_TIMEOUT", default_value_t = DEFAULT_DISAGG_TIMEOUT_S)]
    pub disaggregation_waiting_timeout: f64,
}

impl Default for ServeArgs {
    fn default() -> Self {
        ServeArgs {
            max_total_tokens: None,
            mem_fraction: DEFAULT_MEM_FRACTION,
            max_running_requests: DEFAULT_MAX_RUNNING_REQUESTS,
            chunked_prefill_size: DEFAULT_CHUNKED_PREFILL_SIZE,
            max_prefill_tokens: DEFAULT_MAX_PREFILL_TOKENS,
            decode_prealloc_size: DecodePrealloc::Auto,
            schedule_policy: SchedulePolicy::Lpm,
            disable_radix_cache: false,
            kv_event_block_size: protocol::kv_events::DEFAULT_KV_BLOCK_SIZE,
            context_length: None,
            num_threads: None,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT_S,
            prefill_step_target_ms: DEFAULT_PREFILL_STEP_TARGET_MS,
            finish_first_tokens: DEFAULT_FINISH_FIRST_TOKENS,
            finish_first_max_wait_ms: DEFAULT_FINISH_FIRST_MAX_WAIT_MS,
            max_queued_requests: None,
            disaggregation_bootstrap_timeout: DEFAULT_DISAGG_TIMEOUT_S,
            disaggregation_waiting_timeout: DEFAULT_DISAGG_TIMEOUT_S,
        }
    }
}

impl ServeArgs {
    /// Every check of these flags that clap's parsers do not make.
    pub fn check(&self) -> error::Result<()> {
        let positive = |name: &str, v: usize| -> error::Result<()> {
            if v == 0 {
                return Err(flag(format!("--{name} must be at least 1")));
            }
            Ok(())
        };
        if let Some(tokens) = self.max_total_tokens {
            positive("max-total-tokens", tokens)?;
            if tokens > u32::MAX as usize {
                return Err(flag("--max-total-tokens must fit in 32 bits"));
            }
        }
        positive("max-running-requests", self.max_running_requests)?;
        positive("chunked-prefill-size", self.chunked_prefill_size)?;
        positive("max-prefill-tokens", self.max_prefill_tokens)?;
        if let Some(n) = self.max_queued_requests {
            positive("max-queued-requests", n)?;
        }
        if self.kv_event_block_size > protocol::kv_events::MAX_KV_BLOCK_SIZE {
            return Err(flag(format!(
                "--kv-event-block-size must be at most {}, got {}",
                protocol::kv_events::MAX_KV_BLOCK_SIZE,
                self.kv_event_block_size
            )));
        }
        // The parser checks the flag; this guards a WorkerArgs built in code.
        crate::mem::check_mem_fraction(self.mem_fraction)
            .map_err(|e| flag(format!("--mem-fraction: {e}")))?;
        if !(self.drain_timeout.is_finite() && self.drain_timeout >= 0.0) {
            return Err(flag(format!(
                "--drain-timeout must be a number of seconds >= 0, got {}",
                self.drain_timeout
            )));
        }
        for (name, v) in [
            (
                "disaggregation-bootstrap-timeout",
                self.disaggregation_bootstrap_timeout,
            ),
            (
                "disaggregation-waiting-timeout",
                self.disaggregation_waiting_timeout,
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(flag(format!(
                    "--{name} must be a number of seconds > 0, got {v}"
                )));
            }
        }
        Ok(())
    }
}
