//! Prefill/decode disaggregation inside a worker: the role's settings, the state a request
//! carries while its KV moves between workers, and the socket thread that moves it
//! ([`link`]). The scheduler's side of it lives in `scheduler/prefill_leg.rs` (a prefill worker
//! computing a prompt for a decode worker) and `scheduler/decode_leg.rs` (a decode worker
//! pre-allocating, receiving and committing a prompt's KV).
//!
//! The life of a request in a 1P + 1D pair (`protocol::disagg` has the messages):
//! 1. The controller sends the request to both workers with the same `room`.
//! 2. Decode: the request waits in the pre-allocation queue until a request row (the extra
//!    `--decode-prealloc-size` rows exist for this) and slots for its prompt and expected output
//!    are free, then takes them and says `KvReady`.
//! 3. Prefill: the request waits (bootstrap) for that `KvReady`, then is scheduled as any other
//!    prompt (prefix cache, chunked prefill). After each chunk it sends the chunk's KV (`KvChunk`),
//!    after the last the first sampled token (`KvDone`), and releases the request.
//! 4. Decode: writes each chunk into its slots, commits on `KvDone` (the first token streams to
//!    the client) and decodes the request like one it prefilled itself.
//!
//! Failures end a transfer on both sides: `KvAbort` (either way), `PeerGone` from the
//! controller when a rank leaves, and timeouts: `--disaggregation-bootstrap-timeout` bounds the
//! wait for `KvReady` on both sides (the prefill side's bootstrap, the decode side's
//! pre-allocation queue; either side giving up tells the other), and
//! `--disaggregation-waiting-timeout` bounds a decode transfer from `KvReady` to `KvDone`.

pub mod link;

use std::time::{Duration, Instant};

use protocol::{DisaggMode, KvLayout, Message};

/// Largest KV payload of one `KvChunk` frame. A computed chunk of a prompt goes out as several
/// frames of at most this size: the receiver writes one while the next is on its way, and
/// buffers this small are reused by the allocator instead of being mapped (and faulted in)
/// afresh for every frame (32 MiB frames moved at a third of the speed of 4 MiB ones).
pub const KV_FRAME_BYTES: usize = 4 << 20;

/// The `(start, tokens)` frames positions `start..start + n` go out in, at `bytes_per_token`.
pub fn kv_frames(
    start: usize,
    n: usize,
    bytes_per_token: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let per_frame = (KV_FRAME_BYTES / bytes_per_token.max(1)).max(1);
    (start..start + n)
        .step_by(per_frame)
        .map(move |s| (s, per_frame.min(start + n - s)))
}

/// A worker's disaggregation settings.
#[derive(Debug, Clone)]
pub struct DisaggConfig {
    pub mode: DisaggMode,
    /// This worker's KV layout (checked against every peer's).
    pub layout: KvLayout,
    /// Prefill: how long a request waits for its decode worker's `KvReady`. Decode: how long
    /// a request waits in the pre-allocation queue for a row and slots (as long as its
    /// prefill worker waits for the `KvReady` that would follow).
    pub bootstrap_timeout: Duration,
    /// Decode: how long a transfer may take from `KvReady` to `KvDone`.
    pub waiting_timeout: Duration,
}

/// The other end of a KV message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KvPeer {
    /// A decode worker, by the identity of its connection to this prefill worker's socket.
    Identity(Vec<u8>),
    /// A prefill worker, by its KV endpoint.
    Endpoint(PrefillEndpoint),
}

/// A prefill worker's KV socket as a decode worker reaches it: the endpoint, and the CURVE
/// public key (Z85) to name as the server's, from the pairing (`DisaggLeg.prefill_kv_key`).
/// Two are the same peer when their endpoints are: the key only says how to connect.
#[derive(Debug, Clone)]
pub struct PrefillEndpoint {
    pub endpoint: String,
    pub server_key: Option<String>,
}

impl PrefillEndpoint {
    /// Where the decode leg `leg` takes its KV from.
    pub fn of(leg: &protocol::DisaggLeg) -> Self {
        PrefillEndpoint {
            endpoint: leg.prefill_kv_endpoint.clone(),
            server_key: leg.prefill_kv_key.clone(),
        }
    }
}

impl PartialEq for PrefillEndpoint {
    fn eq(&self, other: &Self) -> bool {
        self.endpoint == other.endpoint
    }
}

impl Eq for PrefillEndpoint {}

impl std::hash::Hash for PrefillEndpoint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.endpoint.hash(state);
    }
}

impl From<&str> for PrefillEndpoint {
    fn from(endpoint: &str) -> Self {
        PrefillEndpoint {
            endpoint: endpoint.to_string(),
            server_key: None,
        }
    }
}

/// A KV message to send (header, and the raw payload of a `KvChunk`).
#[derive(Debug, Clone, PartialEq)]
pub struct KvSend {
    pub to: KvPeer,
    pub msg: Message,
    pub payload: Option<Vec<u8>>,
}

/// A KV message received.
#[derive(Debug, Clone, PartialEq)]
pub struct KvInbound {
    pub from: KvPeer,
    pub msg: Message,
    pub payload: Option<Vec<u8>>,
}

/// A prefill worker's request computed for a decode worker, from the moment it paired with
/// that worker's `KvReady` (before that it waits in the scheduler's bootstrap, with no leg).
#[derive(Debug, Clone)]
pub struct PrefillLeg {
    pub room: u64,
    pub decode_rank: u32,
    /// The decode worker whose `KvReady` it paired with.
    pub to: KvPeer,
    /// Positions whose KV went out.
    pub sent: usize,
    /// `KvChunk`s sent.
    pub seq: u32,
    pub bytes: u64,
}

/// A decode worker's request whose prompt KV comes from a prefill worker.
#[derive(Debug, Clone)]
pub struct Transfer {
    pub room: u64,
    pub prefill_rank: u32,
    pub from: KvPeer,
    /// Since when it waits in its current state (queued, or `KvReady` sent: which of the
    /// scheduler's two queues holds it says which).
    pub since: Instant,
    /// Positions whose KV arrived.
    pub received: usize,
    /// The next `KvChunk.seq` expected.
    pub next_seq: u32,
    pub bytes: u64,
}
