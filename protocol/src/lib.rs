//! The dpserve wire protocol: every message the actors exchange, the MessagePack codec that
//! frames them, and the ZeroMQ endpoint and socket helpers. See `WIRE.md` for the contract.
//!
//! This crate holds no actor logic; it is what any two peers (in any language) must agree on.

pub mod builtin;
pub mod codec;
pub mod endpoint;
pub mod error;
pub mod messages;
pub mod msg_trace;
pub mod socket;
pub mod trace_event;

pub use codec::{decode, encode, encode_envelope, DecodeError, FrameStats};
pub use endpoint::{Endpoint, RuntimeDir};
pub use error::{ProtocolError, Result};
pub use messages::*;

/// Version carried in every envelope (`v`). A peer speaking another version is refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// Seconds since the Unix epoch, as carried in `received_at` and `timestamp` fields.
pub fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
