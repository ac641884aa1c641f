//! The dpserve wire protocol: every message the actors exchange, the MessagePack codec that
//! frames them, and the ZeroMQ endpoint and socket helpers. See `WIRE.md` for the contract.
//!
//! This crate holds no actor logic; it is what any two peers (in any language) must agree on.

pub mod builtin;
pub mod codec;
pub mod curve;
pub mod disagg;
pub mod endpoint;
pub mod error;
pub mod hash;
pub mod kv_events;
pub mod messages;
pub mod msg_trace;
pub mod route_record;
pub mod routing_terms;
pub mod socket;
pub mod trace_event;
pub mod transport;

pub use codec::{decode, encode, encode_envelope, DecodeError, FrameStats};
pub use disagg::{
    random_room, DisaggLeg, DisaggMode, KvAbort, KvChunk, KvDone, KvLayout, KvReady, PeerGone,
};
pub use endpoint::{current_uid, Endpoint, RuntimeDir};
pub use error::{ProtocolError, Result};
pub use kv_events::{KvEvents, KvSnapshotReq};
pub use messages::*;
pub use transport::{SecurityArgs, SecurityMode, Transport};

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
}
