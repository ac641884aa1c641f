//! Framing: one ZeroMQ frame is one named-field MessagePack map of an [`Envelope`].
//!
//! Decoding never panics. A frame that is not an envelope, names an unknown message type or
//! carries another protocol version, or whose fields break the wire's rules (a NaN duration, an
//! empty rid: `messages/check.rs`), is an error the caller counts ([`FrameStats`]) and drops.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::IgnoredAny;
use serde::Deserialize;
use thiserror::Error;

use crate::error::ProtocolError;
use crate::messages::{Envelope, Message, PROTOCOL_VERSION};

/// Why a frame was dropped.
#[derive(Debug, Error, PartialEq)]
pub enum DecodeError {
    #[error("undecodable frame ({len} bytes): {reason}")]
    Malformed { len: usize, reason: String },
    #[error("unknown message type {name:?}")]
    UnknownType { name: String },
    #[error("protocol version {got} (this peer speaks {PROTOCOL_VERSION})")]
    Version { got: u32 },
    /// Decoded, but a field breaks the wire's rules (`messages/check.rs`): a NaN duration, an
    /// empty rid.
    #[error("invalid {name}: {reason}")]
    Invalid { name: &'static str, reason: String },
}

/// Encode a message into one frame.
pub fn encode(msg: &Message) -> Result<Vec<u8>, ProtocolError> {
    encode_envelope(&Envelope::new(msg.clone()))
}

/// Encode a complete envelope (tests use it to build frames of other versions).
pub fn encode_envelope(env: &Envelope) -> Result<Vec<u8>, ProtocolError> {
    rmp_serde::to_vec_named(env).map_err(|e| ProtocolError::Encode {
        what: env.msg.type_name(),
        reason: e.to_string(),
    })
}

/// The envelope with its message left undecoded: used to tell an unknown type or a foreign
/// version apart from garbage.
#[derive(Deserialize)]
struct RawEnvelope {
    v: u32,
    msg: BTreeMap<String, IgnoredAny>,
}

/// One value spanning the whole frame: trailing bytes mean glued or corrupt frames.
fn from_frame<T: serde::de::DeserializeOwned>(frame: &[u8]) -> Result<T, String> {
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(frame));
    let value = T::deserialize(&mut de).map_err(|e| e.to_string())?;
    match frame.len() as u64 - de.position() {
        0 => Ok(value),
        extra => Err(format!("{extra} trailing bytes after the envelope")),
    }
}

/// Decode one frame.
pub fn decode(frame: &[u8]) -> Result<Message, DecodeError> {
    // Named fields are the contract: an envelope encoded as a positional array would work
    // between Rust peers only, so refuse it here rather than let it spread.
    if !matches!(frame.first(), Some(0x80..=0x8f | 0xde | 0xdf)) {
        return Err(DecodeError::Malformed {
            len: frame.len(),
            reason: "frame is not a MessagePack map".into(),
        });
    }
    match from_frame::<Envelope>(frame) {
        Ok(env) if env.v == PROTOCOL_VERSION => match crate::messages::check(&env.msg) {
            Ok(()) => Ok(env.msg),
            Err(reason) => Err(DecodeError::Invalid {
                name: env.msg.type_name(),
                reason,
            }),
        },
        Ok(env) => Err(DecodeError::Version { got: env.v }),
        Err(err) => match from_frame::<RawEnvelope>(frame) {
            Ok(raw) if raw.v != PROTOCOL_VERSION => Err(DecodeError::Version { got: raw.v }),
            Ok(raw) if raw.msg.len() == 1 => {
                let name = raw.msg.into_keys().next().unwrap_or_default();
                if KNOWN_TYPES.contains(&name.as_str()) {
                    Err(DecodeError::Malformed {
                        len: frame.len(),
                        reason: format!("{name}: {err}"),
                    })
                } else {
                    Err(DecodeError::UnknownType { name })
                }
            }
            _ => Err(DecodeError::Malformed {
                len: frame.len(),
                reason: err,
            }),
        },
    }
}

const KNOWN_TYPES: &[&str] = &[
    "GenerateReq",
    "EmbedReq",
    "Abort",
    "FlushCache",
    "TokenOut",
    "Hello",
    "HelloAck",
    "Rejoin",
    "Heartbeat",
    "WorkerStatus",
    "ClusterStatus",
    "Shutdown",
    "KvReady",
    "KvChunk",
    "KvDone",
    "KvAbort",
    "PeerGone",
    "KvEvents",
    "KvSnapshotReq",
    "Reconcile",
];

/// Counters of frames received and dropped on one actor's sockets.
#[derive(Debug, Default)]
pub struct FrameStats {
    pub received: AtomicU64,
    pub dropped: AtomicU64,
}

impl FrameStats {
    /// Decode `frame`; on failure count it, log it at warn with the peer (the first eight, then
    /// the 2^k-th), and return `None`.
    pub fn decode_or_drop(&self, frame: &[u8], peer: &str) -> Option<Message> {
        self.received.fetch_add(1, Ordering::Relaxed);
        match decode(frame) {
            Ok(msg) => Some(msg),
            Err(err) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                // The first few, then the 2^k-th: a peer sending garbage cannot flood the log
                // (tests/e2e_wire_fuzz.rs: 33 lines for 9 171 frames to three actors), and the
                // count still shows it.
                if dropped <= 8 || dropped.is_power_of_two() {
                    tracing::warn!(peer, %err, dropped, "dropping frame");
                }
                None
            }
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
