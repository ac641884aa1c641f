//! How an actor's sockets meet the network: plain on ipc and loopback TCP, CURVE (authenticated
//! and encrypted) on TCP when the operator gave keys, and a refusal at start for TCP beyond
//! loopback without keys unless `--insecure-tcp` says the network is trusted. Every actor takes
//! the same [`SecurityArgs`]; see docs/SECURITY.md for the model.

use std::path::PathBuf;
use std::sync::Arc;

use crate::curve::{self, AllowList, Keypair, PublicKey};
use crate::endpoint::Endpoint;
use crate::error::{ProtocolError, Result};

/// The CURVE flags every actor takes (`dpserve tokenizer`, `controller`, `worker`).
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct SecurityArgs {
    /// This process's CURVE keypair, a file made by `dpserve keygen` (mode 0600; under
    /// systemd a `LoadCredential=`). Turns on CURVE authentication and encryption on every TCP
    /// endpoint the process binds or connects to; ipc endpoints stay as they are.
    #[arg(long, env = "DPSERVE_CURVE_SECRET_KEY")]
    pub curve_secret_key: Option<PathBuf>,
    /// The public-key file of the servers this process connects to: the key of the host that
    /// runs the tokenizer and the controller. Default: this process's own public key (right on
    /// that host, and wherever its keypair is shared).
    #[arg(long, env = "DPSERVE_CURVE_SERVER_KEY", requires = "curve_secret_key")]
    pub curve_server_key: Option<PathBuf>,
    /// Directory of public-key files (`dpserve keygen`'s `.pub`) whose holders may connect to
    /// this process's TCP endpoints, read again when it changes (at most once a second under a
    /// flood of handshakes): adding a file admits a new worker host at its next connection,
    /// without a restart. This process's own key and its server key are always admitted.
    #[arg(long, env = "DPSERVE_CURVE_ALLOW_DIR", requires = "curve_secret_key")]
    pub curve_allow_dir: Option<PathBuf>,
    /// Allow TCP endpoints beyond loopback without CURVE keys: plain ZeroMQ, which anyone who
    /// reaches the port can join, read and write. Only for a network that is trusted
    /// otherwise; warned at start and shown in `/get_server_info`.
    #[arg(long, env = "DPSERVE_INSECURE_TCP")]
    pub insecure_tcp: bool,
}

impl SecurityArgs {
    /// Load the keys and check every endpoint this actor binds or connects to (`role` names
    /// the actor in the warning).
    pub fn resolve(&self, endpoints: &[&Endpoint], role: &str) -> Result<Transport> {
        let transport = match &self.curve_secret_key {
            None => Transport {
                curve: None,
                insecure: self.insecure_tcp,
            },
            Some(_) if self.insecure_tcp => {
                return Err(ProtocolError::Security {
                    reason: "--insecure-tcp with --curve-secret-key: give one or the other".into(),
                })
            }
            Some(path) => {
                if !curve::available() {
                    return Err(ProtocolError::Security {
                        reason: "this dpserve's libzmq was built without CURVE".into(),
                    });
                }
                let keypair = Keypair::load(path)?;
                let server = match &self.curve_server_key {
                    Some(path) => PublicKey::load(path)?,
                    None => keypair.public(),
                };
                let allow =
                    AllowList::new(self.curve_allow_dir.clone(), vec![keypair.public(), server])?;
                Transport::curve(keypair, server, allow)
            }
        };
        for endpoint in endpoints {
            transport.check(endpoint)?;
        }
        match &transport.curve {
            Some(curve) => tracing::info!(
                role,
                public_key = %curve.keypair.public(),
                server_key = %curve.server,
                allow_dir = ?curve.allow.dir(),
                listed = curve.allow.listed().len(),
                "CURVE on every TCP endpoint"
            ),
            None if transport.insecure && endpoints.iter().any(|e| !is_loopback(e)) => {
                tracing::warn!(
                    role,
                    "--insecure-tcp: ZeroMQ over TCP beyond loopback without CURVE; anyone who \
                     reaches these ports can join this deployment and read its traffic"
                )
            }
            None => {}
        }
        Ok(transport)
    }
}

/// How sockets are secured; cheap to clone (all clones share one allow-list). A bound CURVE
/// socket's ZAP handler outlives the transport: dropping it never opens the door.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    curve: Option<Arc<Curve>>,
    insecure: bool,
}

#[derive(Debug)]
struct Curve {
    keypair: Keypair,
    server: PublicKey,
    allow: Arc<AllowList>,
}

/// What [`Transport::mode`] reports (`/get_server_info`'s `zmq_security`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityMode {
    /// CURVE on every TCP endpoint.
    Curve,
    /// No keys: ipc and loopback TCP only.
    Local,
    /// No keys, and TCP beyond loopback allowed (`--insecure-tcp`).
    Insecure,
}

impl SecurityMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityMode::Curve => "curve",
            SecurityMode::Local => "local",
            SecurityMode::Insecure => "insecure",
        }
    }
}

impl Transport {
    /// CURVE with this keypair; connections go to servers holding `server`'s secret, and
    /// bound sockets admit the keys `allow` admits.
    pub fn curve(keypair: Keypair, server: PublicKey, allow: AllowList) -> Self {
        Transport {
            curve: Some(Arc::new(Curve {
                keypair,
                server,
                allow: Arc::new(allow),
            })),
            insecure: false,
        }
    }

    /// No keys, TCP beyond loopback allowed.
    pub fn insecure() -> Self {
        Transport {
            curve: None,
            insecure: true,
        }
    }

    pub fn mode(&self) -> SecurityMode {
        match (&self.curve, self.insecure) {
            (Some(_), _) => SecurityMode::Curve,
            (None, true) => SecurityMode::Insecure,
            (None, false) => SecurityMode::Local,
        }
    }

    /// This process's public key, with CURVE.
    pub fn public_key(&self) -> Option<PublicKey> {
        self.curve.as_ref().map(|c| c.keypair.public())
    }

    /// Refuses a TCP endpoint beyond loopback when there are no keys and no `--insecure-tcp`.
    pub fn check(&self, endpoint: &Endpoint) -> Result<()> {
        if self.curve.is_none() && !self.insecure && !is_loopback(endpoint) {
            return Err(ProtocolError::InsecureTcp {
                endpoint: endpoint.to_string(),
            });
        }
        Ok(())
    }

    /// A socket of `kind` bound at `endpoint`; a CURVE server on TCP when there are keys.
    pub fn bind(
        &self,
        ctx: &zmq::Context,
        kind: zmq::SocketType,
        endpoint: &Endpoint,
    ) -> Result<zmq::Socket> {
        self.check(endpoint)?;
        let what = format!("bind {endpoint}");
        let mut sock = ctx.socket(kind).map_err(|e| ProtocolError::zmq(&what, e))?;
        if let (Some(curve), Endpoint::Tcp { .. }) = (&self.curve, endpoint) {
            curve::ensure_zap_handler(ctx, Arc::clone(&curve.allow))?;
            curve::enforce_zap(&mut sock)?;
            let set = || -> zmq::Result<()> {
                sock.set_zap_domain(curve::ZAP_DOMAIN)?;
                sock.set_curve_server(true)?;
                sock.set_curve_secretkey(curve.keypair.secret_bytes())
            };
            set().map_err(|e| ProtocolError::zmq(&what, e))?;
        }
        crate::sockopt::bind_configured(sock, kind, endpoint, &what)
    }

    /// A socket of `kind` connected to `endpoint`, with an optional identity (DEALER); a CURVE
    /// client of the server key on TCP when there are keys.
    pub fn connect(
        &self,
        ctx: &zmq::Context,
        kind: zmq::SocketType,
        endpoint: &Endpoint,
        identity: Option<&[u8]>,
    ) -> Result<zmq::Socket> {
        self.connect_to(ctx, kind, endpoint, identity, None, None)
    }

    /// [`Transport::connect`] to a server whose public key is `server` rather than the
    /// configured server key (a peer worker's KV link), taking in frames of up to `max_frame`
    /// bytes rather than [`crate::sockopt::MAX_FRAME_BYTES`].
    pub fn connect_to(
        &self,
        ctx: &zmq::Context,
        kind: zmq::SocketType,
        endpoint: &Endpoint,
        identity: Option<&[u8]>,
        server: Option<PublicKey>,
        max_frame: Option<i64>,
    ) -> Result<zmq::Socket> {
        self.check(endpoint)?;
        let what = format!("connect {endpoint}");
        let sock = ctx.socket(kind).map_err(|e| ProtocolError::zmq(&what, e))?;
        if let Some(bytes) = max_frame {
            crate::sockopt::set_max_frame(&sock, bytes, &what)?;
        }
        if let (Some(curve), Endpoint::Tcp { .. }) = (&self.curve, endpoint) {
            let server = server.unwrap_or(curve.server);
            let set = || -> zmq::Result<()> {
                sock.set_curve_serverkey(server.as_bytes())?;
                sock.set_curve_publickey(curve.keypair.public().as_bytes())?;
                sock.set_curve_secretkey(curve.keypair.secret_bytes())
            };
            set().map_err(|e| ProtocolError::zmq(&what, e))?;
        }
        crate::sockopt::connect_configured(sock, endpoint, identity, &what)
    }
}

/// Watches `sock`'s handshakes: returns the PAIR end of a socket monitor (poll it, then read
/// it with [`handshake_failure`]). `name` must be unique in the context.
pub fn watch_handshakes(ctx: &zmq::Context, sock: &zmq::Socket, name: &str) -> Result<zmq::Socket> {
    let endpoint = format!("inproc://monitor-{name}");
    let events = zmq::SocketEvent::HANDSHAKE_FAILED_AUTH.to_raw()
        | zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL.to_raw();
    sock.monitor(&endpoint, i32::from(events))
        .map_err(|e| ProtocolError::zmq(format!("monitor {name}"), e))?;
    let pair = ctx
        .socket(zmq::PAIR)
        .map_err(|e| ProtocolError::zmq(format!("monitor {name}"), e))?;
    pair.connect(&endpoint)
        .map_err(|e| ProtocolError::zmq(format!("monitor {name}"), e))?;
    Ok(pair)
}

/// The first failed handshake the monitor reported since the last call, said for an operator
/// (libzmq does not retry such a connection: the socket's peer is lost for good).
pub fn handshake_failure(monitor: &zmq::Socket, transport: &Transport) -> Option<String> {
    while let Ok(frames) = monitor.recv_multipart(zmq::DONTWAIT) {
        let [event, endpoint] = frames.as_slice() else {
            continue;
        };
        let (Some(id), Some(value)) = (event.get(..2), event.get(2..6)) else {
            continue;
        };
        let id = u16::from_le_bytes([id[0], id[1]]);
        let value = u32::from_le_bytes([value[0], value[1], value[2], value[3]]);
        let peer = String::from_utf8_lossy(endpoint);
        let own = transport.public_key().map_or_else(
            || "none: this process has no --curve-secret-key".into(),
            |k| k.z85(),
        );
        if id == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH.to_raw() {
            return Some(format!(
                "{peer} refused this process's CURVE key {own} (ZAP status {value}): copy its \
                 .pub file into --curve-allow-dir on that host, then start this process again"
            ));
        }
        if id == zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL.to_raw() {
            let why = if value == zmq_sys::ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH {
                "one side uses CURVE and the other does not".to_string()
            } else {
                format!("ZeroMQ protocol error {value:#x}; a wrong --curve-server-key?")
            };
            return Some(format!(
                "the handshake with {peer} failed: {why} (this process's key: {own})"
            ));
        }
    }
    None
}

/// ipc, or TCP to a loopback address or interface.
pub fn is_loopback(endpoint: &Endpoint) -> bool {
    match endpoint {
        Endpoint::Ipc(_) => true,
        Endpoint::Tcp { host, .. } => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host == "localhost"
                || host == "lo"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> Endpoint {
        s.parse().unwrap()
    }

    #[test]
    fn only_loopback_and_ipc_go_without_keys() {
        for local in [
            "ipc:///tmp/x.sock",
            "tcp://127.0.0.1:7002",
            "tcp://127.3.0.1:1",
            "tcp://[::1]:7",
            "tcp://localhost:9",
            "tcp://lo:5",
        ] {
            assert!(is_loopback(&ep(local)), "{local}");
            Transport::default().check(&ep(local)).unwrap();
        }
        for remote in [
            "tcp://10.0.0.1:7002",
            "tcp://*:7002",
            "tcp://0.0.0.0:7002",
            "tcp://eth0:1",
            "tcp://host.example:1",
        ] {
            assert!(!is_loopback(&ep(remote)), "{remote}");
            let err = Transport::default().check(&ep(remote)).unwrap_err();
            assert!(matches!(err, ProtocolError::InsecureTcp { .. }), "{err}");
            let line = err.to_string();
            assert!(
                line.contains(remote)
                    && line.contains("--curve-secret-key")
                    && line.contains("--insecure-tcp"),
                "{line}"
            );
            Transport::insecure().check(&ep(remote)).unwrap();
        }
    }

    #[test]
    fn curve_peers_talk_and_a_stranger_or_a_plain_peer_does_not() {
        let server_pair = Keypair::generate().unwrap();
        let client_pair = Keypair::generate().unwrap();
        let stranger_pair = Keypair::generate().unwrap();
        let dir = std::env::temp_dir().join(format!("dpserve-transport-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("client.pub"), client_pair.public().z85()).unwrap();
        let allow = AllowList::new(Some(dir.clone()), vec![server_pair.public()]).unwrap();
        let server = Transport::curve(server_pair.clone(), server_pair.public(), allow);
        let client_of = |pair: &Keypair| {
            Transport::curve(
                pair.clone(),
                server_pair.public(),
                AllowList::new(None, vec![]).unwrap(),
            )
        };
        let ctx = zmq::Context::new();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let endpoint = ep(&format!("tcp://127.0.0.1:{port}"));
        let pull = server.bind(&ctx, zmq::PULL, &endpoint).unwrap();
        pull.set_rcvtimeo(3_000).unwrap();
        // The socket outlives its transport (as the tokenizer's does): still guarded.
        drop(server);
        // Separate contexts for the clients: each process has its own.
        let (c1, c2, c3) = (
            zmq::Context::new(),
            zmq::Context::new(),
            zmq::Context::new(),
        );
        let stranger = client_of(&stranger_pair)
            .connect(&c2, zmq::PUSH, &endpoint, None)
            .unwrap();
        stranger.send("forged", 0).unwrap();
        let plain = Transport::default()
            .connect(&c3, zmq::PUSH, &endpoint, None)
            .unwrap();
        plain.send("plain", 0).unwrap();
        let good = client_of(&client_pair)
            .connect(&c1, zmq::PUSH, &endpoint, None)
            .unwrap();
        good.send("hello", 0).unwrap();
        assert_eq!(pull.recv_bytes(0).unwrap(), b"hello");
        // Nothing else arrives.
        pull.set_rcvtimeo(1_000).unwrap();
        assert!(
            pull.recv_bytes(0).is_err(),
            "a stranger's or a plain peer's frame got through"
        );
        drop((good, stranger, plain, pull));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
