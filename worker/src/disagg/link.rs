//! The KV link: one thread owns the sockets a disaggregated worker exchanges KV on, so a large
//! send never holds up the compute loop. A prefill worker binds a ROUTER (decode workers
//! connect to it); a decode worker connects one DEALER per prefill worker it hears of. What
//! arrives goes to the actor through `deliver` (its inbox); what the actor sends comes through an
//! inproc pipe as `[peer, header, payload?]`.
//!
//! A frame that does not decode is counted and dropped. A send to a decode worker that is gone
//! (ROUTER_MANDATORY) comes back to the actor as a `KvAbort` from that peer, so the room is
//! released at once rather than at its timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::{encode, Endpoint, FrameStats, KvAbort, Message};

use super::{KvInbound, KvPeer, KvSend};

/// The inproc endpoint the actor pushes KV messages to.
pub const KV_OUTBOX: &str = "inproc://worker-kv-outbox";
const POLL: Duration = Duration::from_millis(100);

/// What the KV link thread needs.
pub struct KvLink {
    pub ctx: zmq::Context,
    /// The inproc PULL end of the outbox, already bound.
    pub outbox: zmq::Socket,
    /// Prefill: the bound ROUTER. Decode: `None` (DEALERs are made as peers appear).
    pub router: Option<zmq::Socket>,
    /// The identity a decode worker's DEALERs carry.
    pub identity: Vec<u8>,
    /// CURVE or not: the prefill worker's ROUTER is bound with it, a decode worker's DEALERs
    /// connect with it, naming each prefill worker's own key.
    pub transport: protocol::Transport,
    /// The largest frame a decode worker's DEALERs take in: a chunk of a whole context's KV
    /// (see [`max_kv_frame`]).
    pub max_frame: i64,
    /// Hands a KV message received to the actor (puts it in the worker's inbox).
    pub deliver: Box<dyn Fn(KvInbound) + Send>,
    pub stop: Arc<AtomicBool>,
}

/// Binds a prefill worker's KV socket; returns it with the endpoint peers connect to.
pub fn bind(
    ctx: &zmq::Context,
    transport: &protocol::Transport,
    endpoint: &Endpoint,
) -> Result<(zmq::Socket, String), protocol::ProtocolError> {
    let router = transport.bind(ctx, zmq::ROUTER, endpoint)?;
    Ok((router, endpoint.connect_addr()))
}

/// The largest frame of a KV link: one chunk of KV cannot cover more positions than a whole
/// context (`context_len` tokens of `bytes_per_token`), plus room for its header. Never below
/// [`protocol::socket::MAX_FRAME_BYTES`].
pub fn max_kv_frame(bytes_per_token: u64, context_len: usize) -> i64 {
    let kv = bytes_per_token.saturating_mul(context_len as u64);
    i64::try_from(kv.saturating_add(1 << 20))
        .unwrap_or(i64::MAX)
        .max(protocol::socket::MAX_FRAME_BYTES)
}

/// How the actor hands a message to the link: `[peer, header, payload?]`.
pub fn send(outbox: &zmq::Socket, send: KvSend) {
    let header = match encode(&send.msg) {
        Ok(h) => h,
        Err(e) => return tracing::warn!(%e, "encode failed"),
    };
    let peer = match &send.to {
        KvPeer::Identity(id) => [b"I".as_slice(), id].concat(),
        // `E<endpoint>[NUL<key>]`: neither an endpoint nor a Z85 key holds a NUL.
        KvPeer::Endpoint(ep) => match &ep.server_key {
            Some(key) => [b"E", ep.endpoint.as_bytes(), b"\0", key.as_bytes()].concat(),
            None => [b"E", ep.endpoint.as_bytes()].concat(),
        },
    };
    let mut parts = vec![peer, header];
    parts.extend(send.payload);
    if let Err(e) = outbox.send_multipart(parts, 0) {
        tracing::warn!(%e, "KV outbox send failed");
    }
}

/// Run the link until `stop` is set.
pub fn run(link: KvLink) -> crate::error::Result<()> {
    let mut state = LinkState {
        dealers: Vec::new(),
        by_endpoint: HashMap::new(),
        stats: FrameStats::default(),
        link,
    };
    while !state.link.stop.load(Ordering::Relaxed) {
        let readable = state.poll()?;
        for (i, ready) in readable.into_iter().enumerate() {
            if !ready {
                continue;
            }
            match i {
                0 => state.forward_outbox(),
                _ => state.receive(i - 1),
            }
        }
    }
    // What the actor queued as it left (its aborts) still goes out.
    state.forward_outbox();
    Ok(())
}

struct LinkState {
    link: KvLink,
    /// Decode: one DEALER per prefill endpoint, in the order they were made.
    dealers: Vec<Dealer>,
    by_endpoint: HashMap<String, usize>,
    stats: FrameStats,
}

/// A decode worker's connection to one prefill worker's KV socket.
struct Dealer {
    endpoint: String,
    /// The server key it was made with (from the pairing): a prefill worker that comes back at
    /// the same endpoint with another key gets a new connection naming the new key.
    key: Option<String>,
    socket: zmq::Socket,
}

impl LinkState {
    /// Which sockets are readable: the outbox first, then the ROUTER or the DEALERs.
    fn poll(&self) -> crate::error::Result<Vec<bool>> {
        let mut items = vec![self.link.outbox.as_poll_item(zmq::POLLIN)];
        if let Some(router) = &self.link.router {
            items.push(router.as_poll_item(zmq::POLLIN));
        }
        for d in &self.dealers {
            items.push(d.socket.as_poll_item(zmq::POLLIN));
        }
        match zmq::poll(&mut items, POLL.as_millis() as i64) {
            Ok(_) => Ok(items.iter().map(|i| i.is_readable()).collect()),
            Err(zmq::Error::EINTR) => Ok(vec![false; items.len()]),
            Err(error) => Err(crate::error::WorkerError::Socket {
                what: "polling the KV link",
                error,
            }),
        }
    }

    fn forward_outbox(&mut self) {
        while let Ok(parts) = self.link.outbox.recv_multipart(zmq::DONTWAIT) {
            let [peer, rest @ ..] = parts.as_slice() else {
                continue;
            };
            match peer.split_first() {
                Some((b'I', id)) => self.send_to_decode(id, rest),
                Some((b'E', peer)) => {
                    let peer = String::from_utf8_lossy(peer);
                    let (ep, key) = match peer.split_once('\0') {
                        Some((ep, key)) => (ep, Some(key)),
                        None => (&*peer, None),
                    };
                    self.send_to_prefill(ep, key, rest)
                }
                _ => tracing::warn!("KV outbox frame without a peer; dropped"),
            }
        }
    }

    /// Prefill → a decode worker. A peer that is gone fails the room at once.
    fn send_to_decode(&mut self, id: &[u8], rest: &[Vec<u8>]) {
        let Some(router) = &self.link.router else {
            return;
        };
        let mut parts: Vec<&[u8]> = vec![id];
        parts.extend(rest.iter().map(Vec::as_slice));
        if let Err(e) = router.send_multipart(parts, 0) {
            tracing::warn!(%e, peer = %String::from_utf8_lossy(id), "KV send to decode worker failed");
            if let Some(Ok(Message::KvChunk(protocol::KvChunk { room, .. })))
            | Some(Ok(Message::KvDone(protocol::KvDone { room, .. }))) =
                rest.first().map(|h| protocol::decode(h))
            {
                let abort = KvAbort {
                    room,
                    status: 503,
                    reason: format!("decode worker unreachable: {e}"),
                };
                self.deliver(KvPeer::Identity(id.to_vec()), Message::KvAbort(abort), None);
            }
        }
    }

    /// Decode → a prefill worker, connecting on first use (naming `key` as the server's). The
    /// connection is kept per endpoint *and* key: a key that differs from the one the endpoint's
    /// connection was made with (the prefill worker restarted there with a rotated key) replaces
    /// it, since only one process can hold the endpoint.
    fn send_to_prefill(&mut self, ep: &str, key: Option<&str>, rest: &[Vec<u8>]) {
        let known = self.by_endpoint.get(ep).copied();
        let idx = match known {
            Some(i) if self.dealers[i].key.as_deref() == key => i,
            _ => {
                let Some(socket) = self.connect(ep, key) else {
                    return;
                };
                let dealer = Dealer {
                    endpoint: ep.to_string(),
                    key: key.map(str::to_string),
                    socket,
                };
                match known {
                    Some(i) => {
                        tracing::info!(
                            ep,
                            "prefill worker's KV key changed; reconnecting with the new one"
                        );
                        let old = std::mem::replace(&mut self.dealers[i], dealer);
                        // What waits for the old key's handshake is never going anywhere.
                        old.socket.set_linger(0).ok();
                        i
                    }
                    None => {
                        self.dealers.push(dealer);
                        self.by_endpoint
                            .insert(ep.to_string(), self.dealers.len() - 1);
                        self.dealers.len() - 1
                    }
                }
            }
        };
        let parts: Vec<&[u8]> = rest.iter().map(Vec::as_slice).collect();
        if let Err(e) = self.dealers[idx].socket.send_multipart(parts, 0) {
            tracing::warn!(%e, ep, "KV send to prefill worker failed");
        }
    }

    /// A DEALER to the prefill worker at `ep`, naming `key` as its server key.
    fn connect(&self, ep: &str, key: Option<&str>) -> Option<zmq::Socket> {
        let endpoint: Endpoint = match ep.parse() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(%e, ep, "bad prefill KV endpoint");
                return None;
            }
        };
        let server = match key.map(protocol::curve::PublicKey::from_z85).transpose() {
            Ok(server) => server,
            Err(e) => {
                tracing::warn!(%e, ep, "bad prefill KV key");
                return None;
            }
        };
        let link = &self.link;
        let made = link.transport.connect_to(
            &link.ctx,
            zmq::DEALER,
            &endpoint,
            Some(&link.identity),
            server,
            Some(link.max_frame),
        );
        made.map_err(|e| tracing::warn!(%e, ep, "connecting to prefill worker failed"))
            .ok()
    }

    /// From the ROUTER (`which` = 0 on a prefill worker) or DEALER `which`.
    fn receive(&mut self, which: usize) {
        loop {
            let (from, sock) = match &self.link.router {
                Some(r) => (None, r),
                None => {
                    let d = &self.dealers[which];
                    let from = super::PrefillEndpoint {
                        endpoint: d.endpoint.clone(),
                        server_key: d.key.clone(),
                    };
                    (Some(KvPeer::Endpoint(from)), &d.socket)
                }
            };
            let mut parts = match sock.recv_multipart(zmq::DONTWAIT) {
                Ok(p) => p,
                Err(_) => return,
            };
            // [identity,] header [, payload]
            let skip = usize::from(from.is_none());
            if !(1..=2).contains(&(parts.len().saturating_sub(skip))) {
                self.stats.decode_or_drop(&[], "KV peer (bad multipart)");
                continue;
            }
            let payload = (parts.len() - skip == 2).then(|| parts.pop()).flatten();
            let from = from.unwrap_or_else(|| KvPeer::Identity(parts[0].clone()));
            if let Some(msg) = self.stats.decode_or_drop(&parts[skip], "KV peer") {
                self.deliver(from, msg, payload);
            }
        }
    }

    fn deliver(&self, from: KvPeer, msg: Message, payload: Option<Vec<u8>>) {
        (self.link.deliver)(KvInbound { from, msg, payload });
    }
}

#[cfg(test)]
mod tests {
    use protocol::curve::{AllowList, Keypair};
    use protocol::Transport;

    use super::*;

    /// A prefill worker's KV ROUTER on `endpoint` in its own context (its own process), a CURVE
    /// server with `pair` admitting `client`.
    fn prefill(
        pair: &Keypair,
        client: &Keypair,
        endpoint: &Endpoint,
    ) -> (zmq::Context, zmq::Socket) {
        let ctx = zmq::Context::new();
        let allow = AllowList::new(None, vec![client.public()]).unwrap();
        let transport = Transport::curve(pair.clone(), pair.public(), allow);
        // The previous one's listener closes on its I/O thread, a moment after its close.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let router = loop {
            match transport.bind(&ctx, zmq::ROUTER, endpoint) {
                Ok(r) => break r,
                Err(e) if std::time::Instant::now() > deadline => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        router.set_rcvtimeo(3_000).unwrap();
        (ctx, router)
    }

    #[test]
    fn a_kv_frame_may_carry_a_whole_context_and_never_less_than_a_control_frame() {
        let floor = protocol::socket::MAX_FRAME_BYTES;
        assert_eq!(max_kv_frame(16 << 10, 4096), floor);
        // 80 layers × 8 KV heads × 128 × 2 × 4 bytes, 32 Ki positions: ~20 GiB.
        let big = 80 * 8 * 128 * 2 * 4;
        assert_eq!(
            max_kv_frame(big, 32 << 10),
            (big as i64) * (32 << 10) + (1 << 20)
        );
        assert_eq!(max_kv_frame(u64::MAX, usize::MAX), i64::MAX);
    }

    #[test]
    fn a_prefill_worker_back_at_its_endpoint_with_a_rotated_key_is_reached_with_the_new_one() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let ep = format!("tcp://127.0.0.1:{port}");
        let endpoint: Endpoint = ep.parse().unwrap();
        let decode_pair = Keypair::generate().unwrap();
        let ctx = zmq::Context::new();
        let outbox = ctx.socket(zmq::PULL).unwrap();
        let mut state = LinkState {
            link: KvLink {
                ctx: ctx.clone(),
                outbox,
                router: None,
                identity: b"d1".to_vec(),
                transport: Transport::curve(
                    decode_pair.clone(),
                    decode_pair.public(),
                    AllowList::new(None, vec![]).unwrap(),
                ),
                deliver: Box::new(|_| {}),
                stop: Arc::new(AtomicBool::new(false)),
                max_frame: protocol::socket::MAX_FRAME_BYTES,
            },
            dealers: Vec::new(),
            by_endpoint: HashMap::new(),
            stats: FrameStats::default(),
        };
        let (first, second) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
        for (round, pair) in [&first, &second].into_iter().enumerate() {
            let (pctx, router) = prefill(pair, &decode_pair, &endpoint);
            let key = pair.public().z85();
            let frame = format!("round {round}").into_bytes();
            state.send_to_prefill(&ep, Some(&key), std::slice::from_ref(&frame));
            let got = router.recv_multipart(0).unwrap_or_else(|e| {
                panic!("round {round}: nothing reached the prefill worker ({e})")
            });
            assert_eq!(got, [b"d1".to_vec(), frame]);
            // The prefill worker goes away; the next one binds the same endpoint.
            router.set_linger(0).unwrap();
            drop((router, pctx));
        }
        assert_eq!(state.dealers.len(), 1, "one connection per endpoint");
        state.dealers.clear();
    }
}
