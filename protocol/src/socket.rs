//! ZeroMQ sockets as the actors use them: bound or connected without keys ([`Transport`]'s
//! default: ipc and loopback TCP), one message a frame, and the workers' identities. A socket
//! belongs to the one thread that uses it. The options every socket gets are `sockopt`'s.

use crate::codec::encode;
use crate::endpoint::Endpoint;
use crate::error::{ProtocolError, Result};
use crate::messages::Message;
use crate::transport::Transport;

pub use crate::sockopt::{set_max_frame, MAX_FRAME_BYTES};

/// A socket of `kind` bound at `endpoint`, without keys ([`Transport`]'s default: ipc and
/// loopback TCP only).
pub fn bind(ctx: &zmq::Context, kind: zmq::SocketType, endpoint: &Endpoint) -> Result<zmq::Socket> {
    Transport::default().bind(ctx, kind, endpoint)
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
    fn a_socket_directory_another_user_could_write_in_is_refused() {
        use crate::endpoint::{current_uid, RuntimeDir};
        use std::os::unix::fs::PermissionsExt;
        use std::path::Path;
        let base = std::env::temp_dir().join(format!("dpserve-unsafe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let ctx = zmq::Context::new();
        let ep = |dir: &Path| Endpoint::Ipc(dir.join("c.sock"));
        let refused = |dir: &Path| {
            let bind = bind(&ctx, zmq::PULL, &ep(dir)).map(|_| ());
            let connect = connect(&ctx, zmq::PUSH, &ep(dir), None).map(|_| ());
            match (bind, connect) {
                (Err(b), Err(c)) => {
                    assert!(b.is_config_error(), "{b}");
                    assert_eq!(b.to_string(), c.to_string());
                    b.to_string()
                }
                other => panic!("{}: not refused: {other:?}", dir.display()),
            }
        };
        // Writable by others, not sticky: refused; sticky (as /tmp): used.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = refused(&open);
        assert!(err.contains("others may write in it (mode 777)"), "{err}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        bind(&ctx, zmq::PULL, &ep(&open)).unwrap();
        // Another user's directory (made first at a path this user would use): refused by
        // bind, connect and RuntimeDir alike. Needs root to make one.
        if current_uid().unwrap_or(0) != 0 {
            eprintln!("skipping the other-owner case: only root can give a directory away");
        } else {
            let theirs = base.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let err = refused(&theirs);
            assert!(err.contains("belongs to uid 65534"), "{err}");
            let err = RuntimeDir::create(&theirs).unwrap_err();
            assert!(
                err.is_config_error() && err.to_string().contains("uid 65534"),
                "{err}"
            );
        }
        // A link to a directory is not a runtime directory.
        let real = base.join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, base.join("link")).unwrap();
        let err = RuntimeDir::create(base.join("link")).unwrap_err();
        assert!(err.to_string().contains("a link, not a directory"), "{err}");
        std::fs::remove_dir_all(&base).unwrap();
    }

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
        let pull = crate::sockopt::bind_configured(pull, zmq::PULL, &ep, "test").unwrap();
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
