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
}

/// What the link thread needs.
pub struct Link {
    pub ctx: zmq::Context,
    /// The inproc PULL end of the outbox, already bound (inproc needs bind before connect).
    pub outbox: zmq::Socket,
    pub worker_addr: Endpoint,
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
pub fn run(link: Link) -> anyhow::Result<()> {
    let Link {
        ctx,
        outbox,
        worker_addr,
        hello,
        heartbeat_interval,
        inbound,
        stop,
        draining,
        tracer,
        held_rids,
    } = link;
    let rank = hello.rank;
    let dealer = protocol::socket::connect(
        &ctx,
        zmq::DEALER,
        &worker_addr,
        Some(&worker_identity(rank)),
    )?;
    let stats = FrameStats::default();
    let mut hello_frame = encode(&Message::Hello(hello.clone()))?;
    dealer.send(&hello_frame[..], 0)?;
    let mut hello_sent = Instant::now();
    let mut acked = false;
    // Since when this worker has been without a registration, and when it last said so.
    let mut unregistered_since = Instant::now();
    let mut unregistered_warned = Instant::now();
    let mut last_beat = Instant::now();
    loop {
        let (from_controller, from_scheduler) = {
            let mut items = [
                dealer.as_poll_item(zmq::POLLIN),
                outbox.as_poll_item(zmq::POLLIN),
            ];
            let timeout = heartbeat_interval.saturating_sub(last_beat.elapsed());
            match zmq::poll(&mut items, timeout.as_millis() as i64) {
                Ok(_) => (items[0].is_readable(), items[1].is_readable()),
                Err(zmq::Error::EINTR) => (false, false),
                Err(e) => return Err(e.into()),
            }
        };
        if from_scheduler {
            // Drain everything first: the final Shutdown travels this way too.
            while let Ok(frame) = outbox.recv_bytes(zmq::DONTWAIT) {
                if let Err(e) = dealer.send(&frame[..], zmq::DONTWAIT) {
                    tracing::warn!(%e, "send to controller failed");
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            // What the scheduler queued before setting the flag (its Shutdown) still goes out.
            while let Ok(frame) = outbox.recv_bytes(zmq::DONTWAIT) {
                dealer.send(&frame[..], zmq::DONTWAIT).ok();
            }
            return Ok(());
        }
        if from_controller {
            while let Ok(frame) = dealer.recv_bytes(zmq::DONTWAIT) {
                let Some(msg) = stats.decode_or_drop(&frame, "controller") else {
                    continue;
                };
                tracer.message(false, &msg, "controller", frame.len());
                let inbound_msg = match msg {
                    Message::HelloAck(ack) if ack.accepted => {
                        if !acked {
                            tracing::info!(rank, "registered with the controller");
                        }
                        acked = true;
                        continue;
                    }
                    Message::Rejoin(_) if draining.load(Ordering::Relaxed) => {
                        // Leaving anyway: what it holds still reaches the tokenizer directly.
                        tracing::info!(
                            rank,
                            "the controller does not know this draining rank; not rejoining"
                        );
                        continue;
                    }
                    Message::Rejoin(_) => {
                        if acked {
                            tracing::warn!(
                                rank,
                                "the controller does not know this rank (it restarted, or \
                                 timed the rank out); registering again"
                            );
                        }
                        acked = false;
                        // A restarted controller learns what this rank holds, to fail it
                        // should the rank die.
                        let again = Hello {
                            held_rids: held_rids.snapshot(),
                            ..hello.clone()
                        };
                        hello_frame = encode(&Message::Hello(again))?;
                        unregistered_since = Instant::now();
                        unregistered_warned = Instant::now();
                        dealer.send(&hello_frame[..], zmq::DONTWAIT).ok();
                        hello_sent = Instant::now();
                        continue;
                    }
                    Message::HelloAck(ack) => Inbound::Refused(
                        ack.reason
                            .unwrap_or_else(|| "refused without a reason".to_string()),
                    ),
                    other => Inbound::Msg(other),
                };
                if inbound.send(inbound_msg).is_err() {
                    return Ok(()); // the scheduler is gone
                }
            }
        }
        if !acked && hello_sent.elapsed() >= HELLO_RETRY {
            dealer.send(&hello_frame[..], zmq::DONTWAIT).ok();
            hello_sent = Instant::now();
        }
        if !acked && unregistered_warned.elapsed() >= UNREGISTERED_WARN_EVERY {
            tracing::warn!(
                rank,
                %worker_addr,
                waited_s = unregistered_since.elapsed().as_secs(),
                "no answer from a controller at this address yet; check --worker-addr \
                 (DPSERVE_WORKER_ADDR) and that the controller runs"
            );
            unregistered_warned = Instant::now();
        }
        if last_beat.elapsed() >= heartbeat_interval {
            let beat = encode(&Message::Heartbeat(Heartbeat {
                rank,
                timestamp: protocol::unix_time(),
            }))?;
            dealer.send(&beat[..], zmq::DONTWAIT).ok();
            last_beat = Instant::now();
        }
    }
}
