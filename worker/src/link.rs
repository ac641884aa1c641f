//! The worker's link to the controller: one thread owns the DEALER socket, says `Hello` until it
//! is acknowledged, sends heartbeats on its own timer (so a long model step never looks like a
//! dead worker), forwards what the scheduler sends through an inproc pipe, and hands incoming
//! messages to the scheduler over a channel.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::socket::worker_identity;
use protocol::{encode, Endpoint, FrameStats, Heartbeat, Hello, Message};

use crate::error::{Result, WorkerError};

/// The inproc endpoint the scheduler pushes controller-bound frames to.
pub const OUTBOX: &str = "inproc://worker-outbox";

/// How long to wait for a `HelloAck` before saying `Hello` again.
const HELLO_RETRY: Duration = Duration::from_secs(1);
/// How often a worker that is not registered says so in its log: a wrong `--worker-addr`, or
/// a controller that is down, must not look like a quiet, healthy worker.
const UNREGISTERED_WARN_EVERY: Duration = Duration::from_secs(10);

/// The requests this worker holds (from receipt to final output), shared by the scheduler
/// thread, which keeps it, and the link, which reports it in a `Hello` after a `Rejoin`.
#[derive(Debug, Clone, Default)]
pub struct HeldRids(Arc<Mutex<BTreeSet<String>>>);

impl HeldRids {
    pub fn insert(&self, rid: &str) {
        self.lock().insert(rid.to_string());
    }

    pub fn remove(&self, rid: &str) {
        self.lock().remove(rid);
    }

    pub fn contains(&self, rid: &str) -> bool {
        self.lock().contains(rid)
    }

    pub fn snapshot(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // A panic elsewhere mid-update leaves a set that is still usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the link hands the scheduler.
#[derive(Debug)]
pub enum Inbound {
    Msg(Message),
    /// The controller refused this worker; the reason is fatal.
    Refused(String),
    /// A KV message from a peer worker (disaggregated roles; see [`crate::disagg::link`]).
    Kv(crate::disagg::KvInbound),
}

/// What the link thread needs.
pub struct Link {
    pub ctx: zmq::Context,
    /// The inproc PULL end of the outbox, already bound (inproc needs bind before connect).
    pub outbox: zmq::Socket,
    pub worker_addr: Endpoint,
    pub transport: protocol::Transport,
    /// The failed handshakes of the actor's PUSH to the tokenizer, watched here (the actor
    /// thread does not poll).
    pub tokenizer_handshakes: zmq::Socket,
    pub hello: Hello,
    pub heartbeat_interval: Duration,
    pub inbound: Sender<Inbound>,
    pub stop: Arc<AtomicBool>,
    /// Set once the worker is stopping or draining (SIGTERM, or the controller said so).
    pub draining: Arc<AtomicBool>,
    pub tracer: protocol::msg_trace::MessageTracer,
    /// Reported in the `Hello` that answers a `Rejoin`.
    pub held_rids: HeldRids,
}

/// Run the link until `stop` is set.
pub fn run(link: Link) -> Result<()> {
    let dealer = link.transport.connect(
        &link.ctx,
        zmq::DEALER,
        &link.worker_addr,
        Some(&worker_identity(link.hello.rank)),
    )?;
    // A refused handshake (an unlisted CURVE key, CURVE on one side only) is not retried by
    // libzmq: the worker says why and stops instead of waiting for a registration that cannot
    // come.
    let monitor = protocol::transport::watch_handshakes(&link.ctx, &dealer, "controller-link")?;
    let mut state = LinkState::new(link, dealer, monitor)?;
    loop {
        let (from_controller, from_worker) = state.poll()?;
        if from_worker {
            // Drain everything first: the final Shutdown travels this way too.
            state.forward_outbox(true);
        }
        if state.link.stop.load(Ordering::Relaxed) {
            // What the worker queued before setting the flag (its Shutdown) still goes out.
            state.forward_outbox(false);
            return Ok(());
        }
        if from_controller && !state.receive()? {
            return Ok(()); // the worker is gone
        }
        state.keep_registered()?;
    }
}

/// The link thread's state: its sockets and where its registration stands.
struct LinkState {
    link: Link,
    dealer: zmq::Socket,
    /// The dealer's failed handshakes ([`protocol::transport::watch_handshakes`]).
    monitor: zmq::Socket,
    stats: FrameStats,
    /// The `Hello` to (re)send until the controller acknowledges it.
    hello_frame: Vec<u8>,
    hello_sent: Instant,
    acked: bool,
    /// Since when this worker has been without a registration, and when it last said so.
    unregistered_since: Instant,
    unregistered_warned: Instant,
    last_beat: Instant,
    /// The `dispatch_seq` of the last request handed to the worker (0: none), reported in a
    /// rejoin's `Hello` so the controller numbers on after it.
    last_dispatch_seq: u64,
}

impl LinkState {
    fn new(link: Link, dealer: zmq::Socket, monitor: zmq::Socket) -> Result<Self> {
        let hello_frame = encode(&Message::Hello(link.hello.clone()))?;
        dealer
            .send(&hello_frame[..], 0)
            .map_err(|error| WorkerError::Socket {
                what: "sending the Hello",
                error,
            })?;
        let now = Instant::now();
        Ok(LinkState {
            link,
            dealer,
            monitor,
            stats: FrameStats::default(),
            hello_frame,
            hello_sent: now,
            acked: false,
            unregistered_since: now,
            unregistered_warned: now,
            last_beat: now,
            last_dispatch_seq: 0,
        })
    }

    fn rank(&self) -> u32 {
        self.link.hello.rank
    }

    /// Waits (at most until the next heartbeat is due) for frames from the controller or from
    /// the worker's outbox.
    fn poll(&self) -> Result<(bool, bool)> {
        let mut items = [
            self.dealer.as_poll_item(zmq::POLLIN),
            self.link.outbox.as_poll_item(zmq::POLLIN),
            self.monitor.as_poll_item(zmq::POLLIN),
            self.link.tokenizer_handshakes.as_poll_item(zmq::POLLIN),
        ];
        let timeout = self
            .link
            .heartbeat_interval
            .saturating_sub(self.last_beat.elapsed());
        match zmq::poll(&mut items, timeout.as_millis() as i64) {
            Ok(_) => {
                let watched = [
                    (items[2].is_readable(), &self.monitor, "the controller"),
                    (
                        items[3].is_readable(),
                        &self.link.tokenizer_handshakes,
                        "the tokenizer",
                    ),
                ];
                for (readable, monitor, peer) in watched {
                    let failure = readable
                        .then(|| {
                            protocol::transport::handshake_failure(monitor, &self.link.transport)
                        })
                        .flatten();
                    if let Some(reason) = failure {
                        tracing::error!(rank = self.rank(), %reason, "cannot reach {peer}");
                        let why = format!("refused by {peer}: {reason}");
                        let _ = self.link.inbound.send(Inbound::Refused(why));
                    }
                }
                Ok((items[0].is_readable(), items[1].is_readable()))
            }
            Err(zmq::Error::EINTR) => Ok((false, false)),
            Err(error) => Err(WorkerError::Socket {
                what: "polling the controller link",
                error,
            }),
        }
    }

    /// Sends the controller everything the worker queued.
    fn forward_outbox(&self, warn: bool) {
        while let Ok(frame) = self.link.outbox.recv_bytes(zmq::DONTWAIT) {
            if let Err(e) = self.dealer.send(&frame[..], zmq::DONTWAIT) {
                if warn {
                    tracing::warn!(%e, "send to controller failed");
                }
            }
        }
    }

    /// Takes every frame the controller sent; false when the worker is gone.
    fn receive(&mut self) -> Result<bool> {
        while let Ok(frame) = self.dealer.recv_bytes(zmq::DONTWAIT) {
            let Some(msg) = self.stats.decode_or_drop(&frame, "controller") else {
                continue;
            };
            self.link
                .tracer
                .message(false, &msg, "controller", frame.len());
            let Some(inbound) = self.on_message(msg)? else {
                continue;
            };
            if self.link.inbound.send(inbound).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Registration messages are the link's own; everything else goes to the worker.
    fn on_message(&mut self, msg: Message) -> Result<Option<Inbound>> {
        let rank = self.rank();
        Ok(match msg {
            Message::HelloAck(ack) if ack.accepted => {
                if !self.acked {
                    tracing::info!(rank, "registered with the controller");
                }
                self.acked = true;
                None
            }
            Message::HelloAck(ack) => Some(Inbound::Refused(format!(
                "refused by the controller: {}",
                ack.reason.as_deref().unwrap_or("no reason given")
            ))),
            Message::Rejoin(_) if self.link.draining.load(Ordering::Relaxed) => {
                // Leaving anyway: what it holds still reaches the tokenizer directly.
                tracing::info!(
                    rank,
                    "the controller does not know this draining rank; not rejoining"
                );
                None
            }
            Message::Rejoin(_) => {
                self.rejoin()?;
                None
            }
            // The controller's probe of this connection (it notices a closed one at once).
            Message::Heartbeat(_) => None,
            other => {
                // In order on this connection, so the worker takes them in this order.
                if let Some(seq) = other.dispatch_seq() {
                    self.last_dispatch_seq = seq;
                }
                Some(Inbound::Msg(other))
            }
        })
    }

    /// The controller does not know this rank (it restarted, or timed the rank out): register
    /// again, telling a restarted controller what this rank holds, to fail it should the rank
    /// die.
    fn rejoin(&mut self) -> Result<()> {
        if self.acked {
            tracing::warn!(
                rank = self.rank(),
                "the controller does not know this rank (it restarted, or timed the rank out); \
                 registering again"
            );
        }
        self.acked = false;
        let again = Hello {
            held_rids: self.link.held_rids.snapshot(),
            taken_seq: (self.last_dispatch_seq > 0).then_some(self.last_dispatch_seq),
            ..self.link.hello.clone()
        };
        self.hello_frame = encode(&Message::Hello(again))?;
        self.unregistered_since = Instant::now();
        self.unregistered_warned = Instant::now();
        self.dealer.send(&self.hello_frame[..], zmq::DONTWAIT).ok();
        self.hello_sent = Instant::now();
        Ok(())
    }

    /// Until acknowledged, the `Hello` is sent again (and its absence warned about); a
    /// heartbeat goes out every interval.
    fn keep_registered(&mut self) -> Result<()> {
        if !self.acked && self.hello_sent.elapsed() >= HELLO_RETRY {
            self.dealer.send(&self.hello_frame[..], zmq::DONTWAIT).ok();
            self.hello_sent = Instant::now();
        }
        if !self.acked && self.unregistered_warned.elapsed() >= UNREGISTERED_WARN_EVERY {
            tracing::warn!(
                rank = self.rank(),
                worker_addr = %self.link.worker_addr,
                waited_s = self.unregistered_since.elapsed().as_secs(),
                "no answer from a controller at this address yet; check --worker-addr \
                 (DPSERVE_WORKER_ADDR) and that the controller runs"
            );
            self.unregistered_warned = Instant::now();
        }
        if self.last_beat.elapsed() >= self.link.heartbeat_interval {
            let beat = encode(&Message::Heartbeat(Heartbeat {
                rank: self.rank(),
                timestamp: crate::clock::unix_time(),
            }))?;
            self.dealer.send(&beat[..], zmq::DONTWAIT).ok();
            self.last_beat = Instant::now();
        }
        Ok(())
    }
}
