//! ZeroMQ socket construction with the options every dpserve socket wants. A socket belongs to
//! the one thread that uses it; these helpers only build and bind or connect them.

use crate::{encode, Endpoint, Message, ProtocolError, Result};

/// Queue depth per peer before sends block or drop; large enough for bursts of small frames.
const HWM: i32 = 100_000;
/// How long unsent messages are kept when a socket closes.
const LINGER_MS: i32 = 1_000;

fn configure(sock: &zmq::Socket, what: &str) -> Result<()> {
    sock.set_sndhwm(HWM)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    sock.set_rcvhwm(HWM)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    sock.set_linger(LINGER_MS)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    Ok(())
}

/// A socket of `kind` bound at `endpoint`.
pub fn bind(ctx: &zmq::Context, kind: zmq::SocketType, endpoint: &Endpoint) -> Result<zmq::Socket> {
    let what = format!("bind {endpoint}");
    let sock = ctx.socket(kind).map_err(|e| ProtocolError::zmq(&what, e))?;
    configure(&sock, &what)?;
    if kind == zmq::ROUTER {
        // Sending to a peer that is gone is an error we see, not a silent drop; a worker that
        // restarts with the same rank takes over its identity.
        sock.set_router_mandatory(true)
            .map_err(|e| ProtocolError::zmq(&what, e))?;
        sock.set_router_handover(true)
            .map_err(|e| ProtocolError::zmq(&what, e))?;
    }
    if let Endpoint::Ipc(path) = endpoint {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                crate::RuntimeDir::create(dir)?;
            }
        }
        // A stale socket file from a crashed run would make bind fail with EADDRINUSE.
        let _ = std::fs::remove_file(path);
    }
    sock.bind(&endpoint.to_string())
        .map_err(|e| ProtocolError::zmq(&what, e))?;
    Ok(sock)
}

/// A socket of `kind` connected to `endpoint`, with an optional identity (DEALER).
pub fn connect(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    endpoint: &Endpoint,
    identity: Option<&[u8]>,
) -> Result<zmq::Socket> {
    let what = format!("connect {endpoint}");
    let sock = ctx.socket(kind).map_err(|e| ProtocolError::zmq(&what, e))?;
    configure(&sock, &what)?;
    if let Some(id) = identity {
        sock.set_identity(id)
            .map_err(|e| ProtocolError::zmq(&what, e))?;
    }
    sock.set_reconnect_ivl(100)
        .map_err(|e| ProtocolError::zmq(&what, e))?;
    sock.set_reconnect_ivl_max(1_000)
        .map_err(|e| ProtocolError::zmq(&what, e))?;
    sock.connect(&endpoint.connect_addr())
        .map_err(|e| ProtocolError::zmq(&what, e))?;
    Ok(sock)
}

/// Encode and send one message as one frame.
pub fn send(sock: &zmq::Socket, msg: &Message) -> Result<usize> {
    let frame = encode(msg)?;
    sock.send(&frame[..], 0)
        .map_err(|e| ProtocolError::zmq(format!("send {}", msg.type_name()), e))?;
    Ok(frame.len())
}

/// The ROUTER identity of a worker rank.
pub fn rank_identity(rank: u32) -> Vec<u8> {
    format!("rank-{rank}").into_bytes()
}

/// Parse a ROUTER identity back into a rank.
pub fn identity_rank(identity: &[u8]) -> Option<u32> {
    std::str::from_utf8(identity)
        .ok()?
        .strip_prefix("rank-")?
        .parse()
        .ok()
}
