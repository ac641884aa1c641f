//! The dpserve wire protocol: every message the actors exchange, the MessagePack codec that
//! frames them, and the ZeroMQ endpoint and socket helpers. See `WIRE.md` for the contract.
//!
//! This crate holds no actor logic; it is what any two peers (in any language) must agree on.

pub mod builtin;
pub mod codec;
#[cfg(feature = "transport")]
pub mod curve;
pub mod disagg;
pub mod endpoint;
pub mod error;
mod finish;
pub mod hash;
pub mod kv_events;
pub mod messages;
pub mod msg_trace;
pub mod route_record;
pub mod routing_terms;
#[cfg(feature = "transport")]
pub mod socket;
#[cfg(feature = "transport")]
mod sockopt;
pub mod trace_event;
#[cfg(feature = "transport")]
pub mod transport;

pub use codec::{decode, encode, encode_envelope, DecodeError, FrameStats};
pub use disagg::{
    random_room, DisaggLeg, DisaggMode, KvAbort, KvChunk, KvDone, KvLayout, KvReady, PeerGone,
};
pub use endpoint::{current_uid, Endpoint, RuntimeDir};
pub use error::{ProtocolError, Result};
pub use kv_events::{KvEvents, KvSnapshotReq};
pub use messages::*;
#[cfg(feature = "transport")]
pub use transport::{SecurityArgs, SecurityMode, Transport};
