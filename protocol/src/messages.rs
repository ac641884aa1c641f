//! Every message on the wire. Field names are the contract (see `WIRE.md`): add fields with
//! `#[serde(default)]` so older peers keep decoding, never rename or remove one.

use serde::{Deserialize, Serialize};

use crate::disagg::{DisaggLeg, DisaggMode, KvAbort, KvChunk, KvDone, KvLayout, KvReady, PeerGone};
use crate::kv_events::{KvEvents, KvSnapshotReq};
use crate::PROTOCOL_VERSION;

/// One frame: `{v: 1, msg: {<Type>: {...}}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub v: u32,
    pub msg: Message,
}

impl Envelope {
    pub fn new(msg: Message) -> Self {
        Envelope {
            v: PROTOCOL_VERSION,
            msg,
        }
    }
}

/// The message types. Externally tagged, so a frame names its type as the single key of `msg`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Message {
    GenerateReq(GenerateReq),
    EmbedReq(EmbedReq),
    Abort(Abort),
    FlushCache(FlushCache),
    TokenOut(TokenOut),
    Hello(Hello),
    HelloAck(HelloAck),
    Rejoin(Rejoin),
    Heartbeat(Heartbeat),
    WorkerStatus(WorkerStatus),
    ClusterStatus(ClusterStatus),
    Shutdown(Shutdown),
    KvReady(KvReady),
    KvChunk(KvChunk),
    KvDone(KvDone),
    KvAbort(KvAbort),
    PeerGone(PeerGone),
    KvEvents(KvEvents),
    KvSnapshotReq(KvSnapshotReq),
    Reconcile(Reconcile),
}

impl Message {
    /// The type name as it appears on the wire; used in logs and message traces.
    pub fn type_name(&self) -> &'static str {
        match self {
            Message::GenerateReq(_) => "GenerateReq",
            Message::EmbedReq(_) => "EmbedReq",
            Message::Abort(_) => "Abort",
            Message::FlushCache(_) => "FlushCache",
            Message::TokenOut(_) => "TokenOut",
            Message::Hello(_) => "Hello",
            Message::HelloAck(_) => "HelloAck",
            Message::Rejoin(_) => "Rejoin",
            Message::Heartbeat(_) => "Heartbeat",
            Message::WorkerStatus(_) => "WorkerStatus",
            Message::ClusterStatus(_) => "ClusterStatus",
            Message::Shutdown(_) => "Shutdown",
            Message::KvReady(_) => "KvReady",
            Message::KvChunk(_) => "KvChunk",
            Message::KvDone(_) => "KvDone",
            Message::KvAbort(_) => "KvAbort",
            Message::PeerGone(_) => "PeerGone",
            Message::KvEvents(_) => "KvEvents",
            Message::KvSnapshotReq(_) => "KvSnapshotReq",
            Message::Reconcile(_) => "Reconcile",
        }
    }

    /// The controller's number of a dispatched request (`dispatch_seq`), if the message is
    /// one and it is numbered (0 means not).
    pub fn dispatch_seq(&self) -> Option<u64> {
        let seq = match self {
            Message::GenerateReq(m) => m.dispatch_seq,
            Message::EmbedReq(m) => m.dispatch_seq,
            _ => 0,
        };
        (seq > 0).then_some(seq)
    }

    /// The tokenizer's `submission_seq` of a generation or embedding request, once set.
    pub fn submission_seq(&self) -> Option<u64> {
        match self {
            Message::GenerateReq(m) => m.submission_seq,
            Message::EmbedReq(m) => m.submission_seq,
            _ => None,
        }
    }

    /// Where a generation or embedding request keeps its `submission_seq`; `None` for any
    /// other message.
    pub fn submission_seq_mut(&mut self) -> Option<&mut Option<u64>> {
        match self {
            Message::GenerateReq(m) => Some(&mut m.submission_seq),
            Message::EmbedReq(m) => Some(&mut m.submission_seq),
            _ => None,
        }
    }

    /// The request id the message is about, if any.
    pub fn rid(&self) -> Option<&str> {
        match self {
            Message::GenerateReq(m) => Some(&m.rid),
            Message::EmbedReq(m) => Some(&m.rid),
            Message::Abort(m) => m.rid.as_deref(),
            Message::TokenOut(m) => Some(&m.rid),
            Message::KvReady(m) => Some(&m.rid),
            _ => None,
        }
    }
}

/// Sampling parameters of one request, already validated by the tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    pub max_new_tokens: u32,
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 1.0 means off.
    pub top_p: f32,
    /// 0 or negative means off.
    pub top_k: i32,
    /// 0.0 means off.
    pub min_p: f32,
    /// Per-request seed; without one the worker draws from its own generator.
    pub seed: Option<u64>,
    /// 1.0 means off.
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// Extra token ids that end generation (the model's EOS always does unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Added to the logit of each listed token id before sampling (OpenAI `logit_bias`), as
    /// `[token_id, bias]` pairs: a list, not a map, so msgpack readers that want string keys
    /// (Python's `strict_map_key`) decode it. Empty means none.
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 128,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// Most alternatives per output token a worker computes (`GenerateReq.top_logprobs_num` is
/// clamped to it): OpenAI's chat limit.
pub const MAX_TOP_LOGPROBS_NUM: u32 = 20;

/// A tokenized generation request: tokenizer → controller → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateReq {
    pub rid: String,
    pub input_ids: Vec<u32>,
    #[serde(default)]
    pub sampling: SamplingParams,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub routing_key: Option<String>,
    /// Explicit rank chosen by the client; the controller honours it or rejects the request.
    #[serde(default)]
    pub routed_dp_rank: Option<u32>,
    #[serde(default)]
    pub bootstrap_room: Option<u64>,
    #[serde(default)]
    pub return_logprob: bool,
    /// With `return_logprob`: also send, per output token, the this-many most likely tokens
    /// (`TokenOut.top_logprobs`). 0 means none.
    #[serde(default)]
    pub top_logprobs_num: u32,
    /// Unix seconds when the HTTP request arrived.
    #[serde(default)]
    pub received_at: f64,
    /// The controller's number for this request among those it dispatched to the chosen rank
    /// (1, 2, … since the rank registered, or on from its `Hello.taken_seq`); 0 until the
    /// controller sets it. The worker reports the last one it took in (`WorkerStatus.taken_seq`).
    #[serde(default)]
    pub dispatch_seq: u64,
    /// In a disaggregated deployment: the request's prefill and decode ranks and its transfer
    /// room, on both legs. Absent otherwise (and then not on the wire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disagg: Option<DisaggLeg>,
    /// The tokenizer's number for this request among every request it sent (1, 2, … per
    /// tokenizer process); the controller reports the last one it took in
    /// (`ClusterStatus.taken_submission_seq`) for the tokenizer's ledger check. Absent from
    /// tokenizers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_seq: Option<u64>,
}

impl GenerateReq {
    /// A request for `input_ids` with every other field at its wire default (what a peer that
    /// sends only `rid` and `input_ids` means).
    pub fn new(rid: impl Into<String>, input_ids: Vec<u32>) -> Self {
        GenerateReq {
            rid: rid.into(),
            input_ids,
            sampling: SamplingParams::default(),
            stream: false,
            routing_key: None,
            routed_dp_rank: None,
            bootstrap_room: None,
            return_logprob: false,
            top_logprobs_num: 0,
            received_at: 0.0,
            dispatch_seq: 0,
            disagg: None,
            submission_seq: None,
        }
    }
}

/// A tokenized embedding request: tokenizer → controller → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedReq {
    pub rid: String,
    pub input_ids: Vec<u32>,
    #[serde(default)]
    pub routing_key: Option<String>,
    #[serde(default)]
    pub routed_dp_rank: Option<u32>,
    #[serde(default)]
    pub received_at: f64,
    /// As `GenerateReq.dispatch_seq`.
    #[serde(default)]
    pub dispatch_seq: u64,
    /// As `GenerateReq.submission_seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_seq: Option<u64>,
}

/// Abort one request (`rid`) or, with `rid: null`, every request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Abort {
    #[serde(default)]
    pub rid: Option<String>,
}

/// Drop every unlocked entry of the prefix caches.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FlushCache {}

/// Why a request stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop token id (`matched_stop` says which).
    Stop,
    /// `max_new_tokens` or the context length was reached.
    Length,
    /// Aborted by the client or the operator.
    Abort,
    /// Failed; `error` says why.
    Error,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// A request-level error carried back to the HTTP layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReqError {
    /// HTTP status the tokenizer should answer with (400, 503, 500, ...).
    pub status: u16,
    pub message: String,
}

/// New tokens (or the end, or an error) for one request: worker or controller → tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenOut {
    pub rid: String,
    /// Token ids produced since the previous `TokenOut` of this request.
    #[serde(default)]
    pub output_ids: Vec<u32>,
    /// Set on the last message of a request, and only there.
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    /// The stop token id that ended the request, when `finish_reason` is `stop`.
    #[serde(default)]
    pub matched_stop: Option<u32>,
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    /// Prompt tokens whose KV came from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u32,
    #[serde(default)]
    pub dp_rank: Option<u32>,
    /// Log-probability of each id in `output_ids`, when asked for.
    #[serde(default)]
    pub logprobs: Option<Vec<f32>>,
    /// Per id in `output_ids`, when `top_logprobs_num` > 0 asked for them: the most likely
    /// `(token id, log-probability)` pairs of the distribution `logprobs` is taken from, most
    /// likely first (ties: lower id first), as `[id, logprob]` lists on the wire.
    #[serde(default)]
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    /// For an `EmbedReq`: the L2-normalised embedding.
    #[serde(default)]
    pub embedding: Option<Vec<f32>>,
    #[serde(default)]
    pub error: Option<ReqError>,
}

impl TokenOut {
    /// A final message that fails the request with `status` and `message`.
    pub fn error(rid: impl Into<String>, status: u16, message: impl Into<String>) -> Self {
        TokenOut {
            rid: rid.into(),
            output_ids: Vec::new(),
            finish_reason: Some(FinishReason::Error),
            matched_stop: None,
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: 0,
            dp_rank: None,
            logprobs: None,
            top_logprobs: None,
            embedding: None,
            error: Some(ReqError {
                status,
                message: message.into(),
            }),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numbered_requests_have_a_dispatch_seq() {
        let mut generate = GenerateReq::new("r", vec![1]);
        assert_eq!(Message::GenerateReq(generate.clone()).dispatch_seq(), None);
        generate.dispatch_seq = 58;
        assert_eq!(Message::GenerateReq(generate).dispatch_seq(), Some(58));
        let embed = EmbedReq {
            rid: "e".into(),
            input_ids: vec![1],
            routing_key: None,
            routed_dp_rank: None,
            received_at: 0.0,
            dispatch_seq: 3,
            submission_seq: None,
        };
        let mut embed = Message::EmbedReq(embed);
        assert_eq!(embed.dispatch_seq(), Some(3));
        assert_eq!(embed.submission_seq(), None);
        *embed.submission_seq_mut().unwrap() = Some(9);
        assert_eq!(embed.submission_seq(), Some(9));
        let mut abort = Message::Abort(Abort { rid: None });
        assert_eq!(abort.dispatch_seq(), None);
        assert!(abort.submission_seq_mut().is_none());
    }
}
