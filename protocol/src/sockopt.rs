//! The options every dpserve ZeroMQ socket gets (queue depth, linger, the largest frame it
//! takes in, reconnect intervals, ROUTER semantics), and binding or connecting a socket whose
//! security is already set: what `Transport` builds its sockets with.

use crate::endpoint::Endpoint;
use crate::error::{ProtocolError, Result};

/// Queue depth per peer before sends block or drop; large enough for bursts of small frames.
const HWM: i32 = 100_000;
/// How long unsent messages are kept when a socket closes.
const LINGER_MS: i32 = 1_000;
/// The largest frame a dpserve socket takes in (`ZMQ_MAXMSGSIZE`); a peer that sends a larger
/// one is disconnected by libzmq before it is read, so no frame can make an actor allocate
/// gigabytes. The largest legitimate control frame is far below it: a `GenerateReq` of a
/// whole context (128 Ki tokens are ~0.7 MB), a `KvEvents` snapshot of a multi-million-token
/// pool (tens of MB). The KV link's frames carry prompts' KV and are sized by their layout
/// ([`set_max_frame`] before connecting).
pub const MAX_FRAME_BYTES: i64 = 256 << 20;

/// Sets the largest frame `sock` takes in (before it binds or connects: libzmq copies the
/// option into each connection as it is made).
pub fn set_max_frame(sock: &zmq::Socket, bytes: i64, what: &str) -> Result<()> {
    sock.set_maxmsgsize(bytes)
        .map_err(|e| ProtocolError::zmq(what, e))
}

fn configure(sock: &zmq::Socket, what: &str) -> Result<()> {
    if sock
        .get_maxmsgsize()
        .map_err(|e| ProtocolError::zmq(what, e))?
        < 0
    {
        set_max_frame(sock, MAX_FRAME_BYTES, what)?;
    }
    sock.set_sndhwm(HWM)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    sock.set_rcvhwm(HWM)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    sock.set_linger(LINGER_MS)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    Ok(())
}

/// Give `sock` (security already set) the options every dpserve socket wants and bind it.
pub(crate) fn bind_configured(
    sock: zmq::Socket,
    kind: zmq::SocketType,
    endpoint: &Endpoint,
    what: &str,
) -> Result<zmq::Socket> {
    configure(&sock, what)?;
    if kind == zmq::ROUTER {
        // Sending to a peer that is gone is an error we see, not a silent drop. Workers use one
        // identity per process (`worker_identity`), so handover only matters for older workers
        // that send the bare `rank-<R>`: a restarted one takes over its identity.
        sock.set_router_mandatory(true)
            .map_err(|e| ProtocolError::zmq(what, e))?;
        sock.set_router_handover(true)
            .map_err(|e| ProtocolError::zmq(what, e))?;
    }
    if let Endpoint::Ipc(path) = endpoint {
        if let Some(dir) = endpoint.ipc_dir() {
            if !dir.exists() {
                crate::endpoint::RuntimeDir::create(dir)?;
            }
            crate::endpoint::check_socket_dir(dir)?;
        }
        // A socket file that still accepts connections belongs to a live process: taking the
        // path over would leave that process serving nobody, and the path dead once we exit.
        // One that refuses them is stale (a crashed run) and would make bind fail: reclaim it.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ProtocolError::EndpointInUse {
                endpoint: endpoint.to_string(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    sock.bind(&endpoint.to_string())
        .map_err(|e| ProtocolError::zmq(what, e))?;
    Ok(sock)
}

/// Give `sock` (security already set) the options every dpserve socket wants and connect it.
pub(crate) fn connect_configured(
    sock: zmq::Socket,
    endpoint: &Endpoint,
    identity: Option<&[u8]>,
    what: &str,
) -> Result<zmq::Socket> {
    configure(&sock, what)?;
    if let Some(id) = identity {
        sock.set_identity(id)
            .map_err(|e| ProtocolError::zmq(what, e))?;
    }
    sock.set_reconnect_ivl(100)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    sock.set_reconnect_ivl_max(1_000)
        .map_err(|e| ProtocolError::zmq(what, e))?;
    if let Some(dir) = endpoint.ipc_dir() {
        crate::endpoint::check_socket_dir(dir)?;
    }
    sock.connect(&endpoint.connect_addr())
        .map_err(|e| ProtocolError::zmq(what, e))?;
    Ok(sock)
}
