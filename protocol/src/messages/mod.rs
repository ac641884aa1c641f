//! Every message on the wire. Field names are the contract (see `WIRE.md`): add fields with
//! `#[serde(default)]` so older peers keep decoding, never rename or remove one.

use serde::{Deserialize, Serialize};

use crate::disagg::{DisaggLeg, KvAbort, KvChunk, KvDone, KvReady, PeerGone};
use crate::kv_events::{KvEvents, KvSnapshotReq};
use crate::route_record::RouteRecord;

mod check;
mod control;

pub(crate) use check::check;

pub use crate::finish::FinishReason;
pub use control::*;

/// Version carried in every envelope (`v`). A peer speaking another version is refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// The longest request id (`rid`), in bytes, anywhere in the system: the HTTP API refuses a
/// client's rid that would be longer on the wire (with the `-<index>` suffix it adds for a batch
/// or `n` > 1), and the controller and the workers refuse a request whose rid is empty or longer.
pub const MAX_RID_LEN: usize = 256;

/// Why a rid is refused, or `None`: it must be 1 to [`MAX_RID_LEN`] bytes.
pub fn rid_problem(rid: &str) -> Option<String> {
    if rid.is_empty() || rid.len() > MAX_RID_LEN {
        Some(format!(
            "rid must be 1 to {MAX_RID_LEN} bytes, got {}",
            rid.len()
        ))
    } else {
        None
    }
}

/// Seconds since the Unix epoch, as carried in `received_at` and `timestamp` fields.
pub fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

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
    /// What the generated text must match (structured output), enforced by the worker on every
    /// token. Absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
}

/// A constraint on the generated text: every sampled token keeps the text a prefix of some
/// string the constraint accepts, and the request ends (`Stop`) when the constraint can go no
/// further. Compiled by llguidance (docs/HTTP.md "Structured output").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "text", rename_all = "snake_case")]
pub enum Constraint {
    /// A JSON Schema, as JSON text (`{"type": "object"}` for any object).
    JsonSchema(String),
    /// A regular expression the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark dialect (`start: ...`).
    Lark(String),
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
            constraint: None,
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
    /// The client asked for the routing decision (`return_routing`). Absent when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub return_routing: bool,
    /// Set by the controller when `return_routing`: its decision's record for each leg it
    /// placed (one; a disaggregated request's prefill leg, then its decode leg). Absent when
    /// empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routing: Vec<RouteRecord>,
}

/// `skip_serializing_if` for flags that are absent from the wire while false.
fn is_false(b: &bool) -> bool {
    !*b
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
            return_routing: false,
            routing: Vec::new(),
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
    /// On a request's first `TokenOut` from its worker, when the client asked: the routing
    /// records the controller put in its `GenerateReq.routing`. Absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routing: Vec<RouteRecord>,
}

impl TokenOut {
    /// The final message of a request aborted before it reached a rank.
    pub fn aborted(rid: impl Into<String>) -> Self {
        TokenOut {
            finish_reason: Some(FinishReason::Abort),
            error: None,
            ..TokenOut::error(rid, 0, "")
        }
    }

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
            routing: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rids_are_one_to_max_rid_len_bytes() {
        assert!(rid_problem("").is_some());
        assert!(rid_problem("r").is_none());
        assert!(rid_problem(&"x".repeat(MAX_RID_LEN)).is_none());
        let long = rid_problem(&"x".repeat(MAX_RID_LEN + 1)).unwrap();
        assert!(long.contains("256"), "{long}");
    }

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
