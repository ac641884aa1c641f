//! Prefill/decode disaggregation on the wire: worker roles, the pairing the controller gives a
//! request, and the messages a prefill worker and a decode worker exchange to move a prompt's
//! KV cache (`WIRE.md` §4, "Disaggregation").
//!
//! One transfer is named by its `room` everywhere (as SGLang's `bootstrap_room`). The decode
//! worker speaks first (`KvReady`, once it holds a row and slots for the prompt), the prefill
//! worker then computes the prompt chunk by chunk and streams each chunk's KV (`KvChunk`, a
//! header frame followed by one raw frame of little-endian f32), and ends with the first
//! sampled token (`KvDone`). Either side may give up (`KvAbort`).

use serde::{Deserialize, Serialize};

use crate::finish::FinishReason;

/// `--disaggregation-mode`: what a worker computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisaggMode {
    /// Prefill and decode in one worker (no disaggregation).
    #[default]
    Null,
    /// Computes prompts and sends their KV to a decode worker.
    Prefill,
    /// Receives prompts' KV from prefill workers and decodes.
    Decode,
}

impl DisaggMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DisaggMode::Null => "null",
            DisaggMode::Prefill => "prefill",
            DisaggMode::Decode => "decode",
        }
    }

    pub fn is_null(&self) -> bool {
        *self == DisaggMode::Null
    }
}

impl std::fmt::Display for DisaggMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DisaggMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "null" => Ok(DisaggMode::Null),
            "prefill" => Ok(DisaggMode::Prefill),
            "decode" => Ok(DisaggMode::Decode),
            other => Err(format!("expected null, prefill or decode, got {other:?}")),
        }
    }
}

/// What two workers must share to exchange KV: one token's KV is `num_layers × 2 (K, V) ×
/// num_kv_heads × head_dim` values of `dtype`, layer by layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvLayout {
    pub model_id: String,
    pub num_layers: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    /// `f32` (the only one today).
    pub dtype: String,
}

impl KvLayout {
    /// Bytes of one token's KV across all layers.
    pub fn bytes_per_token(&self) -> u64 {
        let width = match self.dtype.as_str() {
            "f32" => 4,
            _ => 0,
        };
        u64::from(self.num_layers)
            * 2
            * u64::from(self.num_kv_heads)
            * u64::from(self.head_dim)
            * width
    }

    /// Why `other` cannot exchange KV with this layout, if it cannot.
    pub fn mismatch(&self, other: &KvLayout) -> Option<String> {
        (self != other).then(|| {
            format!(
                "KV layouts differ: this worker has {} ({} layers, {} KV heads × {} {}), the \
                 peer has {} ({} layers, {} KV heads × {} {})",
                self.model_id,
                self.num_layers,
                self.num_kv_heads,
                self.head_dim,
                self.dtype,
                other.model_id,
                other.num_layers,
                other.num_kv_heads,
                other.head_dim,
                other.dtype
            )
        })
    }
}

/// The pairing of one request, set by the controller on both legs (`GenerateReq.disagg`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisaggLeg {
    /// Names the transfer on both sides: a random u63 the controller draws per request (never
    /// the client's `bootstrap_room`, which two requests may share).
    pub room: u64,
    pub prefill_rank: u32,
    pub decode_rank: u32,
    /// The prefill worker's KV endpoint (from its `Hello`); the decode worker connects there.
    pub prefill_kv_endpoint: String,
    /// The prefill worker's CURVE public key (its `Hello.kv_public_key`), the server key the
    /// decode worker names. Absent without CURVE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_kv_key: Option<String>,
}

/// Decode → prefill: the decode worker holds a row and slots for the prompt; send its KV.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvReady {
    pub room: u64,
    pub rid: String,
    pub decode_rank: u32,
    /// The decode worker's layout; the prefill worker refuses (`KvAbort`) on any difference.
    pub layout: KvLayout,
    /// Prompt tokens the decode worker expects.
    pub prompt_len: u64,
}

/// Prefill → decode: the KV of prompt positions `start..start + tokens`, in the raw frame that
/// follows this one: for each layer, K of those positions then V, each position
/// `num_kv_heads × head_dim` little-endian f32 (`bytes` in all).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvChunk {
    pub room: u64,
    /// 0, 1, … per room; a frame out of order fails the transfer.
    pub seq: u32,
    pub start: u64,
    pub tokens: u64,
    pub bytes: u64,
}

/// Prefill → decode: the whole prompt's KV was sent; the first token sampled from its last
/// position, with what the client asked to know about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvDone {
    pub room: u64,
    /// `KvChunk`s sent for the room (the decode side checks it received them all).
    pub chunks: u32,
    /// `None` when `max_new_tokens` is 0 (the request ends with its prompt).
    #[serde(default)]
    pub first_token: Option<u32>,
    #[serde(default)]
    pub logprob: Option<f32>,
    #[serde(default)]
    pub top_logprobs: Option<Vec<(u32, f32)>>,
    /// Prompt tokens the prefill worker found in its prefix cache.
    #[serde(default)]
    pub cached_tokens: u32,
    /// Set when the first token already ends the request (EOS, a stop id, `max_new_tokens`
    /// of 1).
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    #[serde(default)]
    pub matched_stop: Option<u32>,
}

/// Either way: this side gave up on the room; the other frees what it holds for it. From the
/// prefill side `status` and `reason` are the client's error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvAbort {
    pub room: u64,
    pub status: u16,
    pub reason: String,
}

/// Controller → workers: a rank left (shut down, died, timed out). Decode workers fail the
/// transfers they wait for from it, prefill workers drop the rooms they would send to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerGone {
    pub rank: u32,
    pub reason: String,
}

/// A random room (u63, as SGLang's `randint(0, 2**63 - 1)`).
pub fn random_room() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS once per process and per instance varies its keys;
    // mixing in a counter and the time keeps consecutive rooms distinct.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() & (i64::MAX as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_u63_and_distinct() {
        let rooms: std::collections::HashSet<u64> = (0..1000).map(|_| random_room()).collect();
        assert_eq!(rooms.len(), 1000);
        assert!(rooms.iter().all(|&r| r <= i64::MAX as u64));
    }

    #[test]
    fn layouts_name_what_differs() {
        let a = KvLayout {
            model_id: "m".into(),
            num_layers: 2,
            num_kv_heads: 4,
            head_dim: 8,
            dtype: "f32".into(),
        };
        assert_eq!(a.bytes_per_token(), 2 * 2 * 4 * 8 * 4);
        assert!(a.mismatch(&a.clone()).is_none());
        let b = KvLayout {
            num_layers: 3,
            ..a.clone()
        };
        let why = a.mismatch(&b).unwrap();
        assert!(
            why.contains("2 layers") && why.contains("3 layers"),
            "{why}"
        );
    }
}
