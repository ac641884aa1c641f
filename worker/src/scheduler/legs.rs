//! What the scheduler keeps for disaggregated serving (see [`crate::disagg`]): the queues a
//! request passes through while its KV moves, the KV messages to send, and the entry points the
//! actor calls (`on_kv`, `peer_gone`, `expire`). The two roles' steps are in
//! [`super::prefill_leg`] and [`super::decode_leg`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use protocol::{DisaggMode, DisaggStatus, GenerateReq, KvAbort, KvReady, Message, TokenOut};

use super::prefill_leg::ended_here;
use super::Scheduler;
use crate::disagg::{DisaggConfig, KvInbound, KvPeer, KvSend};
use crate::request::Req;

/// A prefill worker's request and its decode worker's `KvReady`, whichever came first.
pub(super) struct Bootstrap {
    pub req: Option<Req>,
    /// The request was refused here (status, reason): answered to the decode worker.
    pub refused: Option<(u16, String)>,
    pub ready: Option<(KvPeer, KvReady)>,
    /// The room was given up before it paired (the decode side aborted it, the request ended
    /// here, or its bootstrap timed out), with the status and reason a late `KvReady` is
    /// answered with at once; a late request is dropped. Kept one more bootstrap timeout.
    pub aborted: Option<(u16, String)>,
    pub since: Instant,
}

#[derive(Default)]
pub(super) struct Legs {
    pub config: Option<DisaggConfig>,
    /// Prefill: rooms waiting for their request or their `KvReady`.
    pub bootstrap: HashMap<u64, Bootstrap>,
    /// Prefill: each decode rank's worker as its last `KvReady` came from, so a room whose
    /// `KvReady` never came can still be given up to the worker that may hold it queued.
    pub decode_peers: HashMap<u32, KvPeer>,
    /// Decode: requests waiting for a row and slots (the pre-allocation queue).
    pub prealloc: VecDeque<Req>,
    /// Decode: requests holding a row and slots while their KV arrives, by room.
    pub transfers: HashMap<u64, Req>,
    /// Decode: requests whose KV arrived, waiting for a running slot.
    pub ready: VecDeque<Req>,
    /// KV messages for the actor to send.
    pub out: Vec<KvSend>,
    /// Requests whose outputs must not reach the tokenizer (a prefill leg's: the decode worker
    /// answers the client).
    pub muted: HashSet<String>,
    /// The counters of `WorkerStatus.disagg` (its gauges are filled in as it is sent).
    pub stats: DisaggStatus,
}

impl Legs {
    pub fn new(config: Option<DisaggConfig>) -> Self {
        Legs {
            config,
            ..Legs::default()
        }
    }

    pub fn mode(&self) -> DisaggMode {
        self.config.as_ref().map_or(DisaggMode::Null, |c| c.mode)
    }

    /// Requests held in the legs' queues (counted as waiting in the worker's status).
    pub fn queued(&self) -> usize {
        self.bootstrap.values().filter(|b| b.req.is_some()).count()
            + self.prealloc.len()
            + self.transfers.len()
            + self.ready.len()
    }

    pub fn send(&mut self, to: KvPeer, msg: Message, payload: Option<Vec<u8>>) {
        self.out.push(KvSend { to, msg, payload });
    }

    /// Tells the other side of `room` this side gave it up. A prefill leg not yet paired has no
    /// peer to tell (its decode worker hears `PeerGone` or times out).
    pub fn abort_room(&mut self, to: KvPeer, room: u64, status: u16, reason: String) {
        if to == KvPeer::Identity(Vec::new()) {
            return;
        }
        self.send(
            to,
            Message::KvAbort(KvAbort {
                room,
                status,
                reason,
            }),
            None,
        );
    }
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
                let entry = self.bootstrap_entry(leg.room);
                entry.refused = Some((status, reason));
                self.finished_rids.push(req.rid);
                self.try_pair(leg.room);
                None
            }
            (DisaggMode::Decode, Some(leg)) => {
                let to = KvPeer::Endpoint(crate::disagg::PrefillEndpoint::of(&leg));
                self.legs.abort_room(to, leg.room, status, reason);
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
        std::mem::take(&mut self.legs.out)
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
        self.unmuted(outs)
    }

    /// A rank left the deployment: transfers with it cannot complete.
    pub fn peer_gone(&mut self, rank: u32, reason: &str) -> Vec<TokenOut> {
        let outs = match self.legs.mode() {
            DisaggMode::Prefill => {
                self.drop_legs_to(rank);
                Vec::new()
            }
            DisaggMode::Decode => self.fail_transfers_from(
                rank,
                format!("prefill rank {rank} left before its KV arrived: {reason}"),
            ),
            DisaggMode::Null => Vec::new(),
        };
        self.unmuted(outs)
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
        self.unmuted(outs)
    }

    /// For `WorkerStatus.disagg`.
    pub fn disagg_status(&self) -> Option<DisaggStatus> {
        let mode = self.legs.mode();
        if mode == DisaggMode::Null {
            return None;
        }
        let (bootstrap, transfer) = match mode {
            DisaggMode::Prefill => (
                self.legs
                    .bootstrap
                    .values()
                    .filter(|b| b.req.is_some())
                    .count(),
                self.waiting
                    .iter()
                    .chain(&self.prefilling)
                    .filter(|r| r.leg.is_some())
                    .count(),
            ),
            _ => (self.legs.prealloc.len(), self.legs.transfers.len()),
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

    /// `outs` without those of muted requests (each rid is muted for one final output).
    pub(super) fn unmuted(&mut self, mut outs: Vec<TokenOut>) -> Vec<TokenOut> {
        if !self.legs.muted.is_empty() {
            outs.retain(|o| !(o.finish_reason.is_some() && self.legs.muted.remove(&o.rid)));
        }
        outs
    }

    /// Gives back what `req` holds: a decode transfer's slots that never got their KV go to
    /// the allocator; everything else as usual. A decode request's prefill worker hears it,
    /// whether the request held slots (`KvReady` sent) or still waited for them.
    pub(super) fn release_req(&mut self, req: &mut Req) {
        match req.transfer.take() {
            Some(t) => {
                if t.ready_sent {
                    let held = req.prompt.len();
                    self.mem.release_partial(req, held);
                } else {
                    self.mem.release(req);
                }
                self.tracer.milestone(
                    &req.rid,
                    protocol::trace_event::Milestone::KvAborted {
                        room: t.room,
                        reason: "ended on the decode side before its KV arrived".into(),
                    },
                );
                // Tell the prefill worker, which may still be computing it (or wait for its
                // KvReady).
                self.legs
                    .abort_room(t.from, t.room, 499, "ended on the decode side".into());
                self.legs.stats.transfers_failed += 1;
            }
            None => self.mem.release(req),
        }
        if let Some(leg) = req.leg.take() {
            self.tracer.milestone(
                &req.rid,
                protocol::trace_event::Milestone::KvAborted {
                    room: leg.room,
                    reason: "ended on the prefill side".into(),
                },
            );
            // A prefill leg that ends here without its KvDone (aborted, failed): the decode
            // worker frees its side; the client hears from the decode worker, not from here.
            self.legs.abort_room(
                leg.to,
                leg.room,
                503,
                "the prefill worker dropped the request".into(),
            );
            self.legs.stats.transfers_failed += 1;
            self.legs.muted.insert(req.rid.clone());
            // A KvReady still on its way is answered at once.
            self.bootstrap_entry(leg.room).aborted = Some(ended_here());
        }
    }
}
