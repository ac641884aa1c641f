//! What the scheduler keeps for disaggregated serving (see [`crate::disagg`]): the worker's
//! role, which owns the queues a request passes through while its KV moves (so no state of the
//! other role can exist on a worker), the KV messages to send, and the entry points the actor
//! calls (`on_kv`, `peer_gone`, `expire`). The two roles' steps are in [`super::prefill_leg`]
//! and [`super::decode_leg`].

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use protocol::trace_event::Milestone;
use protocol::{DisaggMode, DisaggStatus, GenerateReq, KvAbort, KvReady, Message, TokenOut};

use super::Scheduler;
use crate::disagg::{DisaggConfig, KvInbound, KvPeer, KvSend, PrefillEndpoint, Transfer};
use crate::request::Req;

/// What this worker does with a prompt.
pub(super) enum Role {
    /// Computes every request whole.
    Unified,
    /// Computes prompts and sends their KV to decode workers.
    Prefill(PrefillSide),
    /// Takes prompts' KV from prefill workers and decodes.
    Decode(DecodeSide),
}

/// A prefill worker's rooms. Once a room pairs, its request is scheduled as any prompt (in the
/// scheduler's own queues) and carries its [`crate::disagg::PrefillLeg`].
pub(super) struct PrefillSide {
    pub config: DisaggConfig,
    /// Rooms waiting for their request or their `KvReady`, or given up.
    pub bootstrap: HashMap<u64, Room>,
    /// Each decode rank's worker as its last `KvReady` came from, so a room whose `KvReady`
    /// never came can still be given up to the worker that may hold it queued.
    pub decode_peers: HashMap<u32, KvPeer>,
}

impl PrefillSide {
    /// Takes out the requests waiting in rooms that `pick` picks (by the request and its
    /// decode rank), with their rooms.
    pub fn take_unpaired(&mut self, pick: impl Fn(&Req, u32) -> bool) -> Vec<(u64, Req)> {
        let rooms: Vec<u64> = self
            .bootstrap
            .iter()
            .filter(|(_, r)| r.request().is_some_and(|(req, to)| pick(req, to)))
            .map(|(&room, _)| room)
            .collect();
        let mut taken = Vec::with_capacity(rooms.len());
        for room in rooms {
            if let Some(Room::Pairing {
                request: Some(Arrived::Request { req, .. }),
                ..
            }) = self.bootstrap.remove(&room)
            {
                taken.push((room, *req));
            }
        }
        taken
    }
}

/// A prefill worker's room before it pairs.
pub(super) enum Room {
    /// Waiting for its request or its decode worker's `KvReady`, whichever has not come.
    Pairing {
        request: Option<Arrived>,
        ready: Option<(KvPeer, KvReady)>,
        since: Instant,
    },
    /// Given up before it paired (the decode side aborted it, the request ended here, or its
    /// bootstrap timed out): a late `KvReady` is answered at once with this status and reason,
    /// a late request is dropped. Kept one more bootstrap timeout.
    GivenUp {
        status: u16,
        reason: String,
        since: Instant,
    },
}

/// A room's request as it arrived at a prefill worker.
pub(super) enum Arrived {
    /// To compute for `decode_rank`'s worker once its `KvReady` comes.
    Request { req: Box<Req>, decode_rank: u32 },
    /// Refused here (status, reason): the decode worker is answered with it.
    Refused(u16, String),
}

impl Room {
    pub fn since(&self) -> Instant {
        match self {
            Room::Pairing { since, .. } | Room::GivenUp { since, .. } => *since,
        }
    }

    /// The request waiting in this room, if one is.
    pub fn request(&self) -> Option<(&Req, u32)> {
        match self {
            Room::Pairing {
                request: Some(Arrived::Request { req, decode_rank }),
                ..
            } => Some((req, *decode_rank)),
            _ => None,
        }
    }
}

/// A decode worker's requests whose prompt KV comes from a prefill worker.
pub(super) struct DecodeSide {
    pub config: DisaggConfig,
    /// Requests waiting for a row and slots (the pre-allocation queue).
    pub prealloc: VecDeque<Arriving>,
    /// Requests holding a row and slots while their KV arrives, by room.
    pub transfers: HashMap<u64, Arriving>,
    /// Requests whose KV arrived, waiting for a running slot.
    pub ready: VecDeque<Req>,
}

/// A decode worker's request and its transfer, until its prompt's KV is all here.
pub(super) struct Arriving {
    pub req: Req,
    pub kv: Transfer,
}

/// KV messages for the actor to send.
#[derive(Default)]
pub(super) struct KvOutbox(pub Vec<KvSend>);

impl KvOutbox {
    pub fn send(&mut self, to: KvPeer, msg: Message, payload: Option<Vec<u8>>) {
        self.0.push(KvSend { to, msg, payload });
    }

    /// Tells the other side of `room` this side gave it up.
    pub fn abort_room(&mut self, to: KvPeer, room: u64, status: u16, reason: String) {
        let abort = KvAbort {
            room,
            status,
            reason,
        };
        self.send(to, Message::KvAbort(abort), None);
    }
}

pub(super) struct Legs {
    pub role: Role,
    pub out: KvOutbox,
    /// The counters of `WorkerStatus.disagg` (its gauges are filled in as it is sent).
    pub stats: DisaggStatus,
}

impl Legs {
    pub fn new(config: Option<DisaggConfig>) -> Self {
        let role = match config {
            Some(config) if config.mode == DisaggMode::Prefill => Role::Prefill(PrefillSide {
                config,
                bootstrap: HashMap::new(),
                decode_peers: HashMap::new(),
            }),
            Some(config) if config.mode == DisaggMode::Decode => Role::Decode(DecodeSide {
                config,
                prealloc: VecDeque::new(),
                transfers: HashMap::new(),
                ready: VecDeque::new(),
            }),
            _ => Role::Unified,
        };
        Legs {
            role,
            out: KvOutbox::default(),
            stats: DisaggStatus::default(),
        }
    }

    pub fn mode(&self) -> DisaggMode {
        match self.role {
            Role::Unified => DisaggMode::Null,
            Role::Prefill(_) => DisaggMode::Prefill,
            Role::Decode(_) => DisaggMode::Decode,
        }
    }

    /// Requests held in the legs' queues (counted as waiting in the worker's status).
    pub fn queued(&self) -> usize {
        match &self.role {
            Role::Unified => 0,
            Role::Prefill(p) => p.bootstrap.values().filter_map(Room::request).count(),
            Role::Decode(d) => d.prealloc.len() + d.transfers.len() + d.ready.len(),
        }
    }

    /// A decode worker's requests whose KV arrived, waiting for a running slot (none on
    /// another role).
    pub fn ready(&self) -> usize {
        match &self.role {
            Role::Decode(d) => d.ready.len(),
            _ => 0,
        }
    }

    /// Every request the legs' queues hold that this worker answers, with the queue's name (a
    /// prefill worker's rooms hold legs, which their decode workers answer).
    pub fn requests(&self) -> Vec<(&'static str, &Req)> {
        match &self.role {
            Role::Unified | Role::Prefill(_) => Vec::new(),
            Role::Decode(d) => {
                let mut all: Vec<(&'static str, &Req)> = Vec::new();
                all.extend(d.prealloc.iter().map(|a| ("pre-allocation", &a.req)));
                all.extend(d.transfers.values().map(|a| ("transfers", &a.req)));
                all.extend(d.ready.iter().map(|r| ("ready", r)));
                all
            }
        }
    }

    /// Takes out every request the legs' queues hold that `pick` picks: the prefill side's
    /// unpaired requests with their rooms, the decode side's transfers (with whether their
    /// `KvReady` went out) and committed requests.
    pub fn take(&mut self, pick: impl Fn(&Req) -> bool) -> Taken {
        let mut taken = Taken::default();
        match &mut self.role {
            Role::Unified => {}
            Role::Prefill(p) => taken.unpaired = p.take_unpaired(|req, _| pick(req)),
            Role::Decode(d) => {
                let (gone, keep) = d.prealloc.drain(..).partition(|a| pick(&a.req));
                d.prealloc = keep;
                taken.arriving.extend(gone.into_iter().map(|a| (a, false)));
                let rooms: Vec<u64> = d
                    .transfers
                    .iter()
                    .filter(|(_, a)| pick(&a.req))
                    .map(|(&room, _)| room)
                    .collect();
                for room in rooms {
                    taken
                        .arriving
                        .extend(d.transfers.remove(&room).map(|a| (a, true)));
                }
                let (gone, keep) = d.ready.drain(..).partition(|r| pick(r));
                d.ready = keep;
                taken.ready = gone;
            }
        }
        taken
    }
}

/// Requests taken out of the legs' queues (see [`Legs::take`]).
#[derive(Default)]
pub(super) struct Taken {
    /// A prefill worker's requests not paired yet, with their rooms.
    pub unpaired: Vec<(u64, Req)>,
    /// A decode worker's transfers, each with whether its `KvReady` went out (it holds a row
    /// and the prompt's slots).
    pub arriving: Vec<(Arriving, bool)>,
    /// A decode worker's committed requests.
    pub ready: VecDeque<Req>,
}

impl Scheduler {
    pub fn disagg_mode(&self) -> DisaggMode {
        self.legs.mode()
    }

    /// A request refused before it was taken in (a draining worker, a bad rid), as `out` says;
    /// it ends for the controller too (see `refused_out`). A prefill leg is answered through
    /// its decode worker (when its `KvReady` comes), never here; a decode leg's prefill worker
    /// is told, so it does not wait for it.
    pub fn refuse(&mut self, mut req: GenerateReq, out: TokenOut) -> Option<TokenOut> {
        let (status, reason) = out
            .error
            .as_ref()
            .map_or((503, String::new()), |e| (e.status, e.message.clone()));
        match (self.legs.mode(), req.disagg.take()) {
            (DisaggMode::Prefill, Some(leg)) => {
                self.finished_rids.push(req.rid);
                self.bootstrap_arrived(leg.room, Arrived::Refused(status, reason));
                None
            }
            (DisaggMode::Decode, Some(leg)) => {
                let to = KvPeer::Endpoint(PrefillEndpoint::of(&leg));
                self.legs.out.abort_room(to, leg.room, status, reason);
                self.note_refused(&req.rid);
                Some(out)
            }
            _ => {
                self.note_refused(&req.rid);
                Some(out)
            }
        }
    }

    /// An embedding request refused before it was taken in, as `out` says (see [`Self::refuse`]).
    pub fn refuse_embed(&mut self, out: TokenOut) -> TokenOut {
        self.note_refused(&out.rid);
        out
    }

    /// KV messages to send since the last call.
    pub fn take_kv_out(&mut self) -> Vec<KvSend> {
        std::mem::take(&mut self.legs.out.0)
    }

    /// A KV message from a peer worker.
    pub fn on_kv(&mut self, k: KvInbound) -> Vec<TokenOut> {
        let outs = match (self.legs.mode(), k.msg) {
            (DisaggMode::Prefill, Message::KvReady(r)) => {
                self.kv_ready(k.from, r);
                Vec::new()
            }
            (DisaggMode::Prefill, Message::KvAbort(a)) => {
                self.prefill_room_aborted(a);
                Vec::new()
            }
            (DisaggMode::Decode, Message::KvChunk(c)) => self.kv_chunk(c, k.payload),
            (DisaggMode::Decode, Message::KvDone(d)) => self.kv_done(d),
            (DisaggMode::Decode, Message::KvAbort(a)) => self.decode_room_aborted(a),
            (mode, other) => {
                self.legs.stats.frames_dropped += 1;
                tracing::warn!(%mode, msg = other.type_name(), "unexpected KV message; dropped");
                Vec::new()
            }
        };
        self.admit_prealloc();
        outs
    }

    /// A rank left the deployment: transfers with it cannot complete.
    pub fn peer_gone(&mut self, rank: u32, reason: &str) -> Vec<TokenOut> {
        match self.legs.mode() {
            DisaggMode::Prefill => {
                self.drop_legs_to(rank);
                Vec::new()
            }
            DisaggMode::Decode => self.fail_transfers_from(
                rank,
                format!("prefill rank {rank} left before its KV arrived: {reason}"),
            ),
            DisaggMode::Null => Vec::new(),
        }
    }

    /// Timeouts, and pre-allocation for what freed up: called every round, busy or not.
    pub fn expire(&mut self) -> Vec<TokenOut> {
        self.expire_at(Instant::now())
    }

    /// [`Self::expire`] as of `now` (tests step a clock instead of sleeping).
    pub fn expire_at(&mut self, now: Instant) -> Vec<TokenOut> {
        let outs = match self.legs.mode() {
            DisaggMode::Prefill => {
                self.expire_bootstrap(now);
                Vec::new()
            }
            DisaggMode::Decode => {
                let mut outs = self.expire_prealloc(now);
                outs.extend(self.expire_transfers(now));
                outs
            }
            DisaggMode::Null => Vec::new(),
        };
        self.admit_prealloc();
        outs
    }

    /// For `WorkerStatus.disagg`.
    pub fn disagg_status(&self) -> Option<DisaggStatus> {
        let (mode, bootstrap, transfer) = match &self.legs.role {
            Role::Unified => return None,
            Role::Prefill(_) => (
                DisaggMode::Prefill,
                self.legs.queued(),
                self.waiting
                    .iter()
                    .chain(&self.prefilling)
                    .filter(|r| r.leg.is_some())
                    .count(),
            ),
            Role::Decode(d) => (DisaggMode::Decode, d.prealloc.len(), d.transfers.len()),
        };
        Some(DisaggStatus {
            mode,
            num_bootstrap_reqs: bootstrap as u32,
            num_transfer_reqs: transfer as u32,
            rows_beyond_running: self.rows_beyond_running(),
            ..self.legs.stats.clone()
        })
    }

    /// Request rows in use beyond the running cap (pre-allocation rows held by transfers).
    fn rows_beyond_running(&self) -> u32 {
        self.mem
            .rows_in_use()
            .saturating_sub(self.config.max_running_requests) as u32
    }

    /// Records the high-water mark of [`Self::rows_beyond_running`].
    pub(super) fn note_rows(&mut self) {
        let now = self.rows_beyond_running();
        let peak = &mut self.legs.stats.peak_rows_beyond_running;
        *peak = (*peak).max(now);
    }

    /// Gives back what a decode worker's transfer holds, ended on this side before its KV all
    /// arrived: slots that never got their KV go to the allocator (`ready_sent`: it holds a
    /// row and the prompt's slots), and its prefill worker hears it, whether it still computes
    /// the prompt or waits for the `KvReady`. The request itself is then ended as any other.
    pub(super) fn drop_transfer(&mut self, a: &mut Arriving, ready_sent: bool) {
        if ready_sent {
            let held = a.req.prompt.len();
            self.mem.release_partial(&mut a.req, held);
        }
        self.tracer.milestone(
            &a.req.rid,
            Milestone::KvAborted {
                room: a.kv.room,
                reason: "ended on the decode side before its KV arrived".into(),
            },
        );
        let to = a.kv.from.clone();
        self.legs
            .out
            .abort_room(to, a.kv.room, 499, "ended on the decode side".into());
        self.legs.stats.transfers_failed += 1;
    }
}
