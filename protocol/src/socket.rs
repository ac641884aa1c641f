//! ZeroMQ socket construction with the options every dpserve socket wants. A socket belongs to
//! the one thread that uses it; these helpers only build and bind or connect them (the
//! security of TCP sockets is [`Transport`]'s).

use crate::{encode, Endpoint, Message, ProtocolError, Result, Transport};

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

/// A socket of `kind` bound at `endpoint`, without keys ([`Transport`]'s default: ipc and
/// loopback TCP only).
pub fn bind(ctx: &zmq::Context, kind: zmq::SocketType, endpoint: &Endpoint) -> Result<zmq::Socket> {
    Transport::default().bind(ctx, kind, endpoint)
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
                crate::RuntimeDir::create(dir)?;
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

/// A socket of `kind` connected to `endpoint`, with an optional identity (DEALER), without
/// keys ([`Transport`]'s default: ipc and loopback TCP only).
pub fn connect(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    endpoint: &Endpoint,
    identity: Option<&[u8]>,
) -> Result<zmq::Socket> {
    Transport::default().connect(ctx, kind, endpoint, identity)
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

/// Encode and send one message as one frame.
pub fn send(sock: &zmq::Socket, msg: &Message) -> Result<usize> {
    let frame = encode(msg)?;
    sock.send(&frame[..], 0)
        .map_err(|e| ProtocolError::zmq(format!("send {}", msg.type_name()), e))?;
    Ok(frame.len())
}

/// The bare ROUTER identity of a worker rank, as workers before per-process identities sent it.
pub fn rank_identity(rank: u32) -> Vec<u8> {
    format!("rank-{rank}").into_bytes()
}

/// The DEALER identity of one worker process: `rank-<R>.<instance>`, unique per process, so
/// two processes claiming the same rank are two peers the controller can tell apart (and
/// refuse one of) instead of one identity that ZeroMQ silently hands from one to the other.
pub fn worker_identity(rank: u32) -> Vec<u8> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let instance = nanos ^ (u64::from(std::process::id()) << 40);
    format!("rank-{rank}.{instance:x}").into_bytes()
}

/// Parse a ROUTER identity (`rank-<R>` or `rank-<R>.<instance>`) back into a rank.
pub fn identity_rank(identity: &[u8]) -> Option<u32> {
    let rest = std::str::from_utf8(identity).ok()?.strip_prefix("rank-")?;
    let rank = rest.split_once('.').map_or(rest, |(rank, _)| rank);
    rank.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_name_their_rank_and_each_process_gets_its_own() {
        assert_eq!(identity_rank(b"rank-12"), Some(12));
        assert_eq!(identity_rank(&rank_identity(3)), Some(3));
        let a = worker_identity(7);
        assert_eq!(identity_rank(&a), Some(7));
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_ne!(a, worker_identity(7));
        for bad in [&b"rank-"[..], b"rank-x", b"rank-1x.2", b"worker-1", b"\xff"] {
            assert_eq!(identity_rank(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_ipc_path_served_by_a_live_socket_is_refused_and_a_stale_one_reclaimed() {
        let dir = std::env::temp_dir().join(format!("dpserve-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.sock");
        let ep = Endpoint::Ipc(path.clone());
        // A stale socket file: created by a listener that is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let ctx = zmq::Context::new();
        let first = bind(&ctx, zmq::PULL, &ep).expect("a stale socket file is reclaimed");
        let Err(err) = bind(&ctx, zmq::PULL, &ep) else {
            panic!("a live socket was taken over");
        };
        assert!(matches!(err, ProtocolError::EndpointInUse { .. }), "{err}");
        assert!(err.to_string().contains("already served"), "{err}");
        // The first socket still owns the path.
        let push = connect(&ctx, zmq::PUSH, &ep, None).unwrap();
        push.send("still here", 0).unwrap();
        assert_eq!(first.recv_bytes(0).unwrap(), b"still here");
        drop((first, push));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_frame_over_the_limit_disconnects_its_sender_and_the_socket_keeps_serving() {
        let dir = tempfile_dir("maxmsg");
        let ep = Endpoint::Ipc(dir.join("m.sock"));
        let ctx = zmq::Context::new();
        // Every socket gets the limit.
        let default = bind(&ctx, zmq::PULL, &Endpoint::Ipc(dir.join("d.sock"))).unwrap();
        assert_eq!(default.get_maxmsgsize().unwrap(), MAX_FRAME_BYTES);
        // The same limit, small enough to cross in a test.
        let pull = ctx.socket(zmq::PULL).unwrap();
        set_max_frame(&pull, 1024, "test").unwrap();
        let pull = bind_configured(pull, zmq::PULL, &ep, "test").unwrap();
        assert_eq!(
            pull.get_maxmsgsize().unwrap(),
            1024,
            "an explicit limit is kept"
        );
        pull.set_rcvtimeo(500).unwrap();
        let big = connect(&ctx, zmq::PUSH, &ep, None).unwrap();
        big.send(vec![7u8; 4096], 0).unwrap();
        assert!(
            pull.recv_bytes(0).is_err(),
            "a frame over the limit was taken in"
        );
        let small = connect(&ctx, zmq::PUSH, &ep, None).unwrap();
        small.send("fits", 0).unwrap();
        pull.set_rcvtimeo(5_000).unwrap();
        assert_eq!(pull.recv_bytes(0).unwrap(), b"fits");
        for s in [&big, &small] {
            s.set_linger(0).unwrap();
        }
        drop((big, small, pull, default));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("dpserve-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
