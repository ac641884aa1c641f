//! The control plane's bodies: a worker's registration and heartbeats, the cluster view the
//! controller publishes, reconcile after a restart, and shutdown.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::disagg::{DisaggMode, KvLayout};

/// What a worker can hold, announced in `Hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    pub max_total_tokens: u64,
    pub max_running_requests: u32,
    #[serde(default)]
    pub context_len: u64,
    #[serde(default)]
    pub vocab_size: u64,
}

/// First message of a worker: worker → controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub rank: u32,
    pub capacity: Capacity,
    pub model_id: String,
    #[serde(default)]
    pub protocol_version: u32,
    #[serde(default)]
    pub pid: u32,
    /// The requests this worker holds (running or queued) as it says `Hello`: empty on its
    /// first `Hello`, filled when it registers again after a `Rejoin`. A restarted controller
    /// adopts them, so they fail at once (503) should this rank then die, not at the
    /// tokenizer's request timeout.
    #[serde(default)]
    pub held_rids: Vec<String>,
    /// The worker's role; `null` (not on the wire) for a unified worker.
    #[serde(default, skip_serializing_if = "DisaggMode::is_null")]
    pub disaggregation_mode: DisaggMode,
    /// Where a prefill worker takes KV connections from decode workers (`tcp://…`/`ipc://…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_endpoint: Option<String>,
    /// A prefill worker's CURVE public key (Z85) when its KV socket runs CURVE: decode workers
    /// name it as the server key when they connect. Absent without CURVE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_public_key: Option<String>,
    /// What a peer must match to exchange KV with this worker (disaggregated roles only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_layout: Option<KvLayout>,
    /// The GPU this worker computes on (`--device cuda:N`); absent for CPU and simulated ranks,
    /// and from workers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuInfo>,
    /// The `dispatch_seq` of the last request this worker process was sent before this
    /// `Hello` (absent: none, or a worker that predates the field). The controller numbers
    /// this registration's dispatches after it, so every `WorkerStatus.taken_seq` the worker
    /// reports, from before this `Hello` or after, reads in one numbering; without it, a
    /// status sent before the worker reads its first new request would seem to count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_seq: Option<u64>,
    /// This worker enforces `SamplingParams.constraint` (structured output). Absent (false)
    /// from workers that predate it, which would ignore a constraint: the controller sends them
    /// no constrained request.
    #[serde(default, skip_serializing_if = "is_false")]
    pub constraints: bool,
    /// The worker's finish-first bound (`--finish-first-tokens`): while one of its running
    /// requests is within this many tokens of its `max_new_tokens`, a waiting prompt's prefill
    /// waits. A request of at most this many tokens plus one is never stalled by another
    /// prompt's prefill there, which `cache_aware` prices. Absent (0): off, or a worker that
    /// predates the field.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub finish_first_tokens: u32,
}

/// `skip_serializing_if` for flags absent from the wire while false.
fn is_false(b: &bool) -> bool {
    !*b
}

/// `skip_serializing_if` for counts absent from the wire while 0.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A worker's GPU as its driver reports it, announced in `Hello` and shown per rank by
/// `/get_server_info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The CUDA device ordinal as the worker's process numbers its GPUs, that is after
    /// `CUDA_VISIBLE_DEVICES` (a worker pinned to one GPU sees it as 0).
    pub ordinal: u32,
    /// The driver's name for it, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability as `major.minor`, e.g. `9.0`.
    pub compute_capability: String,
    /// Its memory in bytes (the total, not what was free at start).
    pub total_memory_bytes: u64,
}

impl GpuInfo {
    /// `cuda:<ordinal>`, as `--device` names it.
    pub fn device(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }
}

/// The controller's answer to `Hello`: accepted, or refused with a reason (wrong model id or
/// protocol version, rank already taken by a live worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelloAck {
    pub rank: u32,
    pub accepted: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

/// To a worker that heartbeats but is not registered (the controller restarted, or timed the
/// rank out while the worker stalled): say `Hello` again. Not a refusal; a peer that does not
/// know this type drops it, as for any unknown type: controller → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejoin {
    pub rank: u32,
}

/// Liveness signal on a timer independent of model steps: worker → controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub rank: u32,
    pub timestamp: f64,
}

/// Load snapshot after a scheduling step (throttled): worker → controller.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub rank: u32,
    pub timestamp: f64,
    pub num_running_reqs: u32,
    pub num_waiting_reqs: u32,
    pub num_used_tokens: u64,
    pub max_total_tokens: u64,
    pub cache_hit_rate: f64,
    pub gen_throughput: f64,
    /// Requests that ended on this rank since the previous status; the controller settles its
    /// budget and its in-flight table with them.
    #[serde(default)]
    pub finished_rids: Vec<String>,
    /// KV slots free in the allocator.
    #[serde(default)]
    pub num_free_tokens: u64,
    /// KV slots held only by the prefix cache (reclaimable by eviction). With nothing running,
    /// free + evictable = max_total_tokens.
    #[serde(default)]
    pub num_evictable_tokens: u64,
    /// The CPU kernel path the worker computes with (`avx512`, `avx2`, `neon`, `portable`);
    /// empty from workers that predate it.
    #[serde(default)]
    pub kernel_path: String,
    /// The `dispatch_seq` of the last request the worker took in before this snapshot (0: none
    /// yet): every dispatch up to it is counted here (queued, running, or in `finished_rids`),
    /// every later one is not. `None` from workers that predate it (the controller then judges
    /// by timestamps).
    #[serde(default)]
    pub taken_seq: Option<u64>,
    /// Disaggregated roles only (absent, and 0, for unified workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disagg: Option<DisaggStatus>,
    /// A simulated rank (`--device sim`) only: the name of the GPU-and-model profile whose cost
    /// model times its steps. Its tokens are pseudo-random, not a model's. Absent for real ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<String>,
    /// This status's number among those the worker process sent (1, 2, …): what orders them,
    /// since `timestamp` is the worker's wall clock, which may step back. Absent from workers
    /// that predate it (the controller then orders by `timestamp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_seq: Option<u64>,
    /// The rank's prefill line and speed, for the router's time cost. Absent from workers that
    /// predate it (the controller then counts prompt tokens, at one speed for every rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PrefillStatus>,
    /// What the worker's ledger check found broken since start (the first few, each naming the
    /// rid or the pool and the maps that disagree): at a quiet point every pool is whole and
    /// every request map empty, and every rid held for an answer is in exactly one queue.
    /// Empty, and absent from the wire, while every check held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invariant_violations: Vec<String>,
}

/// Violations a ledger check keeps and reports (`WorkerStatus.invariant_violations`,
/// `RankInfo.invariant_violations`): the first ones, since the soak fails on the first.
pub const MAX_INVARIANT_VIOLATIONS: usize = 8;

/// Adds the lines in `found` to `kept`, each once and at most [`MAX_INVARIANT_VIOLATIONS`] in
/// all; returns the lines that are new (for the log).
pub fn note_violations(kept: &mut Vec<String>, found: Vec<String>) -> Vec<String> {
    let mut new = Vec::new();
    for line in found {
        if kept.len() < MAX_INVARIANT_VIOLATIONS && !kept.contains(&line) {
            kept.push(line.clone());
            new.push(line);
        }
    }
    new
}

/// What a worker's prompt computation looks like, in its `WorkerStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PrefillStatus {
    /// Prompt tokens taken in and not yet computed: the uncached rest of every waiting
    /// request's prompt (as the prefix cache stands now) and what is left of those being
    /// prefilled. A request sent to this rank waits behind them for its first token.
    pub backlog_tokens: u64,
    /// Prompt tokens computed by prefill steps since start.
    pub computed_tokens: u64,
    /// Seconds those prefill steps took, since start: with `computed_tokens`, the rank's
    /// measured prefill speed.
    pub busy_seconds: f64,
}

/// A disaggregated worker's queues and transfers, in its `WorkerStatus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DisaggStatus {
    pub mode: DisaggMode,
    /// Prefill: requests waiting for their decode worker's `KvReady`. Decode: requests waiting
    /// for a row and KV slots (the pre-allocation queue).
    pub num_bootstrap_reqs: u32,
    /// Requests whose KV is on its way (prefill: being computed and sent; decode: slots held,
    /// frames arriving).
    pub num_transfer_reqs: u32,
    /// Decode: request rows in use beyond `max_running_requests` (pre-allocation rows held by
    /// transfers).
    pub rows_beyond_running: u32,
    /// The most `rows_beyond_running` has been since start: how much of the pre-allocation
    /// rows the load has needed.
    pub peak_rows_beyond_running: u32,
    /// Transfers completed since start, their KV bytes, and (decode) the seconds from each
    /// `KvReady` to its `KvDone` (prefill compute included).
    pub transfers: u64,
    pub transfer_bytes: u64,
    pub transfer_seconds: f64,
    /// Transfers that failed (aborted, timed out, peer gone, bad frame) since start.
    pub transfers_failed: u64,
    /// KV frames dropped: unknown room, wrong size, out of order.
    pub frames_dropped: u64,
}

/// One live rank as the controller sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub capacity: Capacity,
    pub model_id: String,
    /// Seconds since the last heartbeat or status from this rank.
    pub last_seen_s: f64,
    #[serde(default)]
    pub status: Option<WorkerStatus>,
    /// The rank's role (`null`, not on the wire, for a unified worker).
    #[serde(default, skip_serializing_if = "DisaggMode::is_null")]
    pub disaggregation_mode: DisaggMode,
    /// The rank's GPU, as announced in its `Hello` (absent for CPU and simulated ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuInfo>,
    /// Requests the controller counts in flight on this rank (dispatched, not yet reported
    /// finished). Absent from controllers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_inflight: Option<u64>,
    /// What the controller's ledger check found broken on this rank since it registered (the
    /// first few): a rid it counts in flight on a rank whose status says it holds nothing and
    /// took every dispatch. Empty, and absent from the wire, while the check held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invariant_violations: Vec<String>,
}

/// The controller's view of the cluster, pushed to the tokenizer on change and periodically so
/// `/health` and `/get_server_info` answer without a round trip: controller → tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub timestamp: f64,
    pub load_balance_method: String,
    pub live_ranks: Vec<RankInfo>,
    /// Routing decisions since the controller started, per (method, branch): cumulative
    /// counters, so a lost or late status loses nothing (`dpserve:routing_decisions_total`).
    #[serde(default)]
    pub routing: Vec<RouteCount>,
    /// Random, drawn once per controller process: a status with another id than the last one
    /// means the controller restarted (the tokenizer then sends `Reconcile`). Absent from
    /// controllers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_id: Option<u64>,
    /// Requests the controller sent away from the rank that held the longest prefix of their
    /// prompt (by the KV index, for the methods that read it), per (method, reason: the
    /// branch that decided); cumulative (`dpserve:routing_regret_total`). Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regret: Vec<RouteCount>,
    /// The last `submission_seq` this controller took in (answered, or dispatched to a rank);
    /// absent before its first numbered request, and from controllers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_submission_seq: Option<u64>,
    /// Requests this controller counts in flight on every rank, draining ones included
    /// (`RankInfo.num_inflight` covers the live ranks only). With `taken_submission_seq` equal
    /// to the tokenizer's last and every live rank idle, 0 here means every request the
    /// tokenizer sent this controller has had its final answer sent. Absent from controllers
    /// that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_inflight: Option<u64>,
}

/// Most rids in one `Reconcile` frame; a longer list goes in several.
pub const MAX_RECONCILE_RIDS: usize = 4096;

/// The requests the tokenizer still waits on, sent once it sees a controller it has not seen
/// before (`ClusterStatus.controller_id` changed: a restart): tokenizer → controller. The
/// controller answers once the running workers have registered again (their
/// `Hello.held_rids`) with a 503 `TokenOut` for each rid that no live rank holds and that it
/// did not route itself: a request the old controller took in but never passed on, or one
/// whose rank died while no controller ran. At most [`MAX_RECONCILE_RIDS`] rids a frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reconcile {
    pub rids: Vec<String>,
}

/// How many routing decisions took one branch of one method, since the controller started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteCount {
    /// The configured `--load-balance-method`.
    pub method: String,
    /// The branch the method took (`affinity`, `spill`, `fallback`, `explicit`, `rotate`,
    /// `least_loaded`, `room`), or `refused` for requests that could not be routed.
    pub branch: String,
    pub count: u64,
}

/// A worker leaving (worker → controller, `rank` set), or an order to stop
/// (controller → worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shutdown {
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub reason: String,
    /// From a worker: it is draining and will finish what it holds within this many seconds
    /// before its final `Shutdown` (without this field). The controller stops routing to it at
    /// once but lets its in-flight requests finish.
    #[serde(default)]
    pub drain_timeout_s: Option<f64>,
}

impl Shutdown {
    /// Longest drain a worker may announce (a day); longer ones are cut to it.
    pub const MAX_DRAIN: Duration = Duration::from_secs(86_400);

    /// `drain_timeout_s` as a duration in `0..=MAX_DRAIN` (`decode` refuses a NaN, infinite or
    /// negative one; a message built in memory that holds one drains for 0 s).
    pub fn drain_timeout(&self) -> Option<Duration> {
        let s = self.drain_timeout_s?;
        let s = if s.is_finite() {
            s.clamp(0.0, Self::MAX_DRAIN.as_secs_f64())
        } else {
            0.0
        };
        Some(Duration::from_secs_f64(s))
    }
}
