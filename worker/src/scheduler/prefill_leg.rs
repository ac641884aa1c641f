//! A prefill worker's side of a transfer: pair each request with its decode worker's
//! `KvReady`, schedule it as any prompt, send each computed chunk's KV, and end with the first
//! token (`KvDone`). Nothing a leg does reaches the tokenizer: its decode worker answers the
//! client, so a leg that ends here (aborted, failed) tells that worker and produces no output.

use std::time::Instant;

use protocol::trace_event::Milestone;
use protocol::{DisaggLeg, FinishReason, GenerateReq, KvChunk, KvDone, KvReady, Message};

use super::legs::{Arrived, Role, Room};
use super::Scheduler;
use crate::disagg::{KvPeer, PrefillLeg};
use crate::error::RequestError;
use crate::request::Req;

/// What a `KvReady` for a room whose request ended here is answered with.
pub(super) fn ended_here() -> (u16, String) {
    (503, "the request ended on the prefill side".into())
}

impl Room {
    fn pairing() -> Self {
        Room::Pairing {
            request: None,
            ready: None,
            since: Instant::now(),
        }
    }
}

impl Scheduler {
    /// A request whose prompt this worker computes for `leg.decode_rank`. It waits for that
    /// worker's `KvReady` (which may already be here).
    pub(super) fn prefill_leg_arrived(
        &mut self,
        req: GenerateReq,
        leg: DisaggLeg,
        refused: Option<RequestError>,
    ) {
        let arrived = match refused {
            Some(e) => {
                self.note_finished(&req.rid);
                Arrived::Refused(e.status(), e.to_string())
            }
            None => Arrived::Request {
                req: Box::new(Req::generate(req)),
                decode_rank: leg.decode_rank,
            },
        };
        self.bootstrap_arrived(leg.room, arrived);
    }

    /// A room's request (or its refusal) arrived: it pairs if the `KvReady` is here. A room
    /// given up already drops a late request.
    pub(super) fn bootstrap_arrived(&mut self, room: u64, arrived: Arrived) {
        let Role::Prefill(p) = &mut self.legs.role else {
            return;
        };
        match p.bootstrap.entry(room).or_insert_with(Room::pairing) {
            Room::GivenUp { .. } => {
                if let Arrived::Request { req, .. } = arrived {
                    self.note_finished(&req.rid);
                }
            }
            Room::Pairing {
                request: Some(Arrived::Request { req: held, .. }),
                ..
            } => {
                // The controller names each transfer afresh, so only a faulty or hostile peer
                // sends a second request into a room: it never replaces the one waiting.
                let held = held.rid.clone();
                if let Arrived::Request { req, .. } = arrived {
                    tracing::warn!(room, rid = %req.rid, %held, "a second request for a transfer room; dropped");
                    self.legs.stats.transfers_failed += 1;
                    self.note_finished(&req.rid);
                }
            }
            Room::Pairing { request, .. } => {
                if request.is_some() {
                    // A refusal waits here; a request after it is as late as one after a
                    // given-up room.
                    if let Arrived::Request { req, .. } = arrived {
                        self.note_finished(&req.rid);
                    }
                    return;
                }
                *request = Some(arrived);
                self.try_pair(room);
            }
        }
    }

    /// A decode worker holds a row and slots for `r.room`.
    pub(super) fn kv_ready(&mut self, from: KvPeer, r: KvReady) {
        let Role::Prefill(p) = &mut self.legs.role else {
            return;
        };
        let room = r.room;
        p.decode_peers.insert(r.decode_rank, from.clone());
        match p.bootstrap.entry(room).or_insert_with(Room::pairing) {
            Room::GivenUp { status, reason, .. } => {
                let (status, reason) = (*status, reason.clone());
                self.legs.out.abort_room(from, room, status, reason);
            }
            Room::Pairing {
                ready: Some((_, held)),
                ..
            } => {
                // One decode worker sends one KvReady per room; another one for the same room
                // is refused without touching the transfer that holds it.
                if held.rid != r.rid || held.decode_rank != r.decode_rank {
                    let why = format!("transfer room {room} is already held by another request");
                    tracing::warn!(room, rid = %r.rid, held = %held.rid, "a second KvReady for a transfer room; refused");
                    self.legs.out.abort_room(from, room, 500, why);
                    self.legs.stats.transfers_failed += 1;
                }
            }
            Room::Pairing { ready, .. } => {
                *ready = Some((from, r));
                self.try_pair(room);
            }
        }
    }

    /// Once a room has both its request and its `KvReady`, the request joins the queue (or
    /// the decode worker hears why it cannot).
    fn try_pair(&mut self, room: u64) {
        let Role::Prefill(p) = &mut self.legs.role else {
            return;
        };
        let both = matches!(
            p.bootstrap.get(&room),
            Some(Room::Pairing {
                request: Some(_),
                ready: Some(_),
                ..
            })
        );
        if !both {
            return;
        }
        let Some(Room::Pairing {
            request: Some(request),
            ready: Some((from, ready)),
            ..
        }) = p.bootstrap.remove(&room)
        else {
            return;
        };
        let (req, decode_rank) = match request {
            Arrived::Refused(status, why) => {
                self.legs.out.abort_room(from, room, status, why);
                self.legs.stats.transfers_failed += 1;
                return;
            }
            Arrived::Request { req, decode_rank } => (req, decode_rank),
        };
        let problem = if let Some(why) = p.config.layout.mismatch(&ready.layout) {
            tracing::error!(room, decode_rank = ready.decode_rank, %why, "refusing KV transfer");
            Some(why)
        } else if ready.rid != req.rid {
            // Pairing is by request as well as by room: a room two requests name (a faulty or
            // hostile peer) never carries one request's KV to another's client.
            Some(format!(
                "transfer room {room} holds request {:?} here, {:?} on the decode worker",
                req.rid, ready.rid
            ))
        } else if ready.prompt_len != req.prompt.len() as u64 {
            Some(format!(
                "prompt lengths differ: {} here, {} on the decode worker",
                req.prompt.len(),
                ready.prompt_len
            ))
        } else {
            None
        };
        if let Some(why) = problem {
            self.legs.out.abort_room(from, room, 500, why.clone());
            self.legs.stats.transfers_failed += 1;
            self.finished_rids.push(req.rid);
            // A KvReady still to come for the room (its own request's, when two named it)
            // is refused at once rather than left to time out.
            self.give_up(room, (500, why));
            return;
        }
        let mut req = *req;
        req.leg = Some(PrefillLeg {
            room,
            decode_rank,
            to: from,
            sent: 0,
            seq: 0,
            bytes: 0,
        });
        self.waiting.push_back(req);
    }

    /// Marks `room` given up with `(status, reason)` for a late `KvReady`; a request or a
    /// `KvReady` already waiting in it is dropped or answered now.
    fn give_up(&mut self, room: u64, (status, reason): (u16, String)) {
        let Role::Prefill(p) = &mut self.legs.role else {
            return;
        };
        let since = match p.bootstrap.remove(&room) {
            Some(Room::Pairing {
                request,
                ready,
                since,
            }) => {
                if let Some((from, _)) = ready {
                    self.legs.out.abort_room(from, room, status, reason.clone());
                }
                if let Some(Arrived::Request { req, .. }) = request {
                    self.note_finished(&req.rid);
                }
                since
            }
            Some(Room::GivenUp { since, .. }) => since,
            None => Instant::now(),
        };
        if let Role::Prefill(p) = &mut self.legs.role {
            let given_up = Room::GivenUp {
                status,
                reason,
                since,
            };
            p.bootstrap.insert(room, given_up);
        }
    }

    /// Sends the KV computed since the last chunk went out (the cached prefix included, on
    /// the first), in frames of at most [`crate::disagg::KV_FRAME_BYTES`].
    pub(super) fn send_leg_kv(&mut self, req: &mut Req) {
        let Some(mut leg) = req.leg.take() else {
            return;
        };
        // Not when recomputing what went out before a retraction.
        if req.len > leg.sent {
            let per_token = match &self.legs.role {
                Role::Prefill(p) => p.config.layout.bytes_per_token() as usize,
                _ => 1,
            };
            for (start, n) in crate::disagg::kv_frames(leg.sent, req.len - leg.sent, per_token) {
                let payload = self.mem.read_kv(req, start, n);
                let chunk = KvChunk {
                    room: leg.room,
                    seq: leg.seq,
                    start: start as u64,
                    tokens: n as u64,
                    bytes: payload.len() as u64,
                };
                leg.seq += 1;
                leg.bytes += payload.len() as u64;
                self.tracer.milestone(
                    &req.rid,
                    Milestone::KvSent {
                        room: leg.room,
                        decode_rank: leg.decode_rank,
                        start,
                        tokens: n,
                        bytes: payload.len() as u64,
                    },
                );
                self.legs
                    .out
                    .send(leg.to.clone(), Message::KvChunk(chunk), Some(payload));
            }
            leg.sent = req.len;
        }
        req.leg = Some(leg);
    }

    /// The prompt is computed and its KV sent: sample the first token, hand it to the decode
    /// worker, and release the request (its KV stays in this worker's prefix cache).
    pub(super) fn leg_prompt_done(&mut self, mut req: Req, leg: PrefillLeg, mut logits: Vec<f32>) {
        let (finish_reason, matched_stop) = if req.params.max_new_tokens == 0 {
            (Some(FinishReason::Length), None)
        } else {
            match self.sample_and_check(&mut req, &mut logits, None) {
                Ok(Some((reason, matched))) => (Some(reason), matched),
                Ok(None) => (None, None),
                Err(e) => return self.end_leg(req, leg, 400, e),
            }
        };
        let done = KvDone {
            room: leg.room,
            chunks: leg.seq,
            first_token: req.output.first().copied(),
            logprob: req
                .return_logprob
                .then(|| req.logprobs.first().copied())
                .flatten(),
            top_logprobs: (req.top_logprobs_num > 0)
                .then(|| req.top_logprobs.first().cloned())
                .flatten(),
            cached_tokens: req.cached_tokens,
            finish_reason,
            matched_stop,
        };
        self.legs.out.send(leg.to, Message::KvDone(done), None);
        let stats = &mut self.legs.stats;
        stats.transfers += 1;
        stats.transfer_bytes += leg.bytes;
        self.mem.release(&mut req);
        self.finished_rids.push(req.rid);
    }

    /// A paired leg ends here before its `KvDone` (aborted, failed): its decode worker hears
    /// `(status, reason)` and answers the client; a `KvReady` still on its way is answered at
    /// once.
    pub(super) fn end_leg(&mut self, mut req: Req, leg: PrefillLeg, status: u16, reason: String) {
        self.tracer.milestone(
            &req.rid,
            Milestone::KvAborted {
                room: leg.room,
                reason: "ended on the prefill side".into(),
            },
        );
        self.legs.out.abort_room(leg.to, leg.room, status, reason);
        self.legs.stats.transfers_failed += 1;
        self.give_up(leg.room, ended_here());
        self.mem.release(&mut req);
        self.note_finished(&req.rid);
    }

    /// A request ends here before its room paired (aborted, the worker stopping): no decode
    /// worker to tell yet; its `KvReady`, when it comes, is answered at once.
    pub(super) fn end_unpaired(&mut self, room: u64, req: Req) {
        self.tracer.milestone(
            &req.rid,
            Milestone::KvAborted {
                room,
                reason: "ended on the prefill side".into(),
            },
        );
        self.legs.stats.transfers_failed += 1;
        self.give_up(room, ended_here());
        self.note_finished(&req.rid);
    }

    /// The decode worker gave up on `a.room` (its client went away, it failed, it timed out).
    pub(super) fn prefill_room_aborted(&mut self, a: protocol::KvAbort) {
        let room = a.room;
        let paired = self
            .waiting
            .iter()
            .chain(&self.prefilling)
            .any(|r| r.leg.as_ref().is_some_and(|l| l.room == room));
        if paired {
            return self.drop_legs_where(|leg| leg.room == room);
        }
        // Not paired yet: the request may be here, or still on its way. The decode side knows,
        // so a `KvReady` of its already here is not answered.
        if let Role::Prefill(p) = &mut self.legs.role {
            if let Some(Room::Pairing { ready, .. }) = p.bootstrap.get_mut(&room) {
                *ready = None;
            }
        }
        let why = format!("the decode side gave the room up: {}", a.reason);
        self.give_up(room, (a.status, why));
    }

    /// The decode rank `rank` left: nothing computed here for it can be delivered.
    pub(super) fn drop_legs_to(&mut self, rank: u32) {
        let Role::Prefill(p) = &mut self.legs.role else {
            return;
        };
        for (_, req) in p.take_unpaired(|_, to| to == rank) {
            self.finished_rids.push(req.rid);
        }
        p.decode_peers.remove(&rank);
        self.drop_legs_where(|leg| leg.decode_rank == rank);
    }

    /// Ends the queued and prefilling legs `pred` picks, without telling anyone.
    fn drop_legs_where(&mut self, pred: impl Fn(&PrefillLeg) -> bool) {
        let hit = |r: &Req| r.leg.as_ref().is_some_and(&pred);
        let mut gone = Vec::new();
        for queue in [&mut self.waiting, &mut self.prefilling] {
            let (g, keep): (Vec<Req>, Vec<Req>) = queue.drain(..).partition(|r| hit(r));
            queue.extend(keep);
            gone.extend(g);
        }
        for mut req in gone {
            if let Some(leg) = req.leg.take() {
                self.give_up(leg.room, ended_here());
                // The peer knows (it aborted, or it is gone).
                let reason = "the decode side ended the transfer".into();
                self.tracer.milestone(
                    &req.rid,
                    Milestone::KvAborted {
                        room: leg.room,
                        reason,
                    },
                );
            }
            self.mem.release(&mut req);
            self.finished_rids.push(req.rid);
            self.legs.stats.transfers_failed += 1;
        }
    }

    /// Rooms whose `KvReady` or request did not come in time. The decode side hears it from
    /// here: the worker whose `KvReady` came, or for a request still waiting for one, its
    /// decode rank's worker as known from earlier `KvReady`s (it may hold the request in its
    /// pre-allocation queue). The room is then kept as given up for one more timeout, so a
    /// `KvReady` crossing this one is refused at once instead of opening a fresh wait.
    pub(super) fn expire_bootstrap(&mut self, now: Instant) {
        let Role::Prefill(p) = &mut self.legs.role else {
            return;
        };
        let timeout = p.config.bootstrap_timeout;
        let late: Vec<u64> = p
            .bootstrap
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.since()) > timeout)
            .map(|(&room, _)| room)
            .collect();
        for room in late {
            let Role::Prefill(p) = &mut self.legs.role else {
                return;
            };
            // A room given up already: its extra timeout is over.
            let Some(Room::Pairing { request, ready, .. }) = p.bootstrap.remove(&room) else {
                continue;
            };
            self.legs.stats.transfers_failed += 1;
            let why = format!("KV bootstrap timed out after {:.1}s", timeout.as_secs_f64());
            let waiting = match request {
                Some(Arrived::Request { req, decode_rank }) => Some((req, decode_rank)),
                _ => None,
            };
            tracing::warn!(room, has_request = waiting.is_some(), "{why}");
            let decode_side = match (ready, &waiting) {
                (Some((from, _)), _) => Some(from),
                (None, Some((_, rank))) => p.decode_peers.get(rank).cloned(),
                (None, None) => None,
            };
            if let Some(to) = decode_side {
                self.legs.out.abort_room(to, room, 503, why.clone());
            }
            if let Some((req, _)) = waiting {
                self.finished_rids.push(req.rid);
            }
            self.give_up(room, (503, why));
        }
    }
}
