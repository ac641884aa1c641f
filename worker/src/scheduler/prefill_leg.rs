//! A prefill worker's side of a transfer: pair each request with its decode worker's
//! `KvReady`, schedule it as any prompt, send each computed chunk's KV, and end with the first
//! token (`KvDone`) instead of an output to the client.

use std::time::Instant;

use protocol::trace_event::Milestone;
use protocol::{DisaggLeg, FinishReason, GenerateReq, KvChunk, KvDone, KvReady, Message};

use super::legs::Bootstrap;
use super::Scheduler;
use crate::disagg::{KvPeer, PrefillLeg};
use crate::error::RequestError;
use crate::request::Req;

/// What a `KvReady` for a room whose request ended here is answered with.
pub(super) fn ended_here() -> (u16, String) {
    (503, "the request ended on the prefill side".into())
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
        let room = leg.room;
        let rid = req.rid.clone();
        let entry = self.bootstrap_entry(room);
        match refused {
            Some(e) => {
                entry.refused = Some((e.status(), e.to_string()));
                self.note_finished(&rid);
            }
            None => {
                let mut req = Req::generate(req);
                req.leg = Some(PrefillLeg {
                    room,
                    decode_rank: leg.decode_rank,
                    to: KvPeer::Identity(Vec::new()), // set when its KvReady comes
                    sent: 0,
                    seq: 0,
                    bytes: 0,
                });
                entry.req = Some(req);
            }
        }
        self.try_pair(room);
    }

    /// A decode worker holds a row and slots for `r.room`.
    pub(super) fn kv_ready(&mut self, from: KvPeer, r: KvReady) {
        let room = r.room;
        self.legs.decode_peers.insert(r.decode_rank, from.clone());
        self.bootstrap_entry(room).ready = Some((from, r));
        self.try_pair(room);
    }

    pub(super) fn bootstrap_entry(&mut self, room: u64) -> &mut Bootstrap {
        self.legs
            .bootstrap
            .entry(room)
            .or_insert_with(|| Bootstrap {
                req: None,
                refused: None,
                ready: None,
                aborted: None,
                since: Instant::now(),
            })
    }

    /// Once a room has both its request and its `KvReady`, the request joins the queue (or
    /// the decode worker hears why it cannot).
    pub(super) fn try_pair(&mut self, room: u64) {
        let Some(entry) = self.legs.bootstrap.get_mut(&room) else {
            return;
        };
        if let Some((status, why)) = entry.aborted.clone() {
            // Kept until the bootstrap timeout so a request or a KvReady arriving late is
            // answered at once.
            let ready = entry.ready.take();
            if let Some(req) = entry.req.take() {
                self.note_finished(&req.rid);
            }
            if let Some((from, _)) = ready {
                self.legs.abort_room(from, room, status, why);
            }
            return;
        }
        if entry.ready.is_none() || (entry.req.is_none() && entry.refused.is_none()) {
            return;
        }
        let entry = self.legs.bootstrap.remove(&room).expect("present");
        let (from, ready) = entry.ready.expect("checked");
        let layout = &self.legs.config.as_ref().expect("a prefill worker").layout;
        let problem = match (&entry.refused, &entry.req) {
            (Some((status, why)), _) => Some((*status, why.clone())),
            (None, Some(req)) => {
                if let Some(why) = layout.mismatch(&ready.layout) {
                    tracing::error!(room, decode_rank = ready.decode_rank, %why, "refusing KV transfer");
                    Some((500, why))
                } else if ready.prompt_len != req.prompt.len() as u64 {
                    Some((
                        500,
                        format!(
                            "prompt lengths differ: {} here, {} on the decode worker",
                            req.prompt.len(),
                            ready.prompt_len
                        ),
                    ))
                } else {
                    None
                }
            }
            (None, None) => unreachable!("checked"),
        };
        if let Some((status, reason)) = problem {
            self.legs.abort_room(from, room, status, reason);
            self.legs.stats.transfers_failed += 1;
            if let Some(req) = entry.req {
                self.finished_rids.push(req.rid);
            }
            return;
        }
        let mut req = entry.req.expect("checked");
        if let Some(leg) = req.leg.as_mut() {
            leg.to = from;
        }
        self.waiting.push_back(req);
    }

    /// Sends the KV computed since the last chunk went out (the cached prefix included, on
    /// the first), in frames of at most [`crate::disagg::KV_FRAME_BYTES`].
    pub(super) fn send_leg_kv(&mut self, req: &mut Req) {
        let Some(sent) = req.leg.as_ref().map(|l| l.sent) else {
            return;
        };
        if req.len <= sent {
            return; // recomputing what went out before a retraction
        }
        let per_token = self
            .legs
            .config
            .as_ref()
            .map_or(1, |c| c.layout.bytes_per_token() as usize);
        for (start, n) in crate::disagg::kv_frames(sent, req.len - sent, per_token) {
            let payload = self.mem.read_kv(req, start, n);
            let leg = req.leg.as_mut().expect("checked");
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
                .send(leg.to.clone(), Message::KvChunk(chunk), Some(payload));
        }
        if let Some(leg) = req.leg.as_mut() {
            leg.sent = req.len;
        }
    }

    /// The prompt is computed and its KV sent: sample the first token, hand it to the decode
    /// worker, and release the request (its KV stays in this worker's prefix cache).
    pub(super) fn leg_prompt_done(&mut self, mut req: Req, mut logits: Vec<f32>) {
        let (finish_reason, matched_stop) = if req.params.max_new_tokens == 0 {
            (Some(FinishReason::Length), None)
        } else {
            match self.sample_and_check(&mut req, &mut logits) {
                Some((reason, matched)) => (Some(reason), matched),
                None => (None, None),
            }
        };
        let leg = req.leg.take().expect("a prefill leg");
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
        self.legs.send(leg.to, Message::KvDone(done), None);
        let stats = &mut self.legs.stats;
        stats.transfers += 1;
        stats.transfer_bytes += leg.bytes;
        self.mem.release(&mut req);
        self.finished_rids.push(req.rid);
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
        // Not paired yet: the request may be here, or still on its way.
        let entry = self.bootstrap_entry(room);
        entry.aborted = Some((
            a.status,
            format!("the decode side gave the room up: {}", a.reason),
        ));
        entry.ready = None;
        self.try_pair(room);
    }

    /// The decode rank `rank` left: nothing computed here for it can be delivered.
    pub(super) fn drop_legs_to(&mut self, rank: u32) {
        let gone: Vec<u64> = self
            .legs
            .bootstrap
            .iter()
            .filter(|(_, b)| {
                b.req
                    .as_ref()
                    .and_then(|r| r.leg.as_ref())
                    .map(|l| l.decode_rank)
                    == Some(rank)
            })
            .map(|(&room, _)| room)
            .collect();
        for room in gone {
            if let Some(req) = self.legs.bootstrap.remove(&room).and_then(|b| b.req) {
                self.finished_rids.push(req.rid);
            }
        }
        self.legs.decode_peers.remove(&rank);
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
                self.bootstrap_entry(leg.room).aborted = Some(ended_here());
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
        let timeout = self
            .legs
            .config
            .as_ref()
            .map(|c| c.bootstrap_timeout)
            .unwrap_or_default();
        let late: Vec<u64> = self
            .legs
            .bootstrap
            .iter()
            .filter(|(_, b)| now.saturating_duration_since(b.since) > timeout)
            .map(|(&room, _)| room)
            .collect();
        for room in late {
            let Some(entry) = self.legs.bootstrap.remove(&room) else {
                continue;
            };
            if entry.aborted.is_some() {
                continue; // given up already; its extra timeout is over
            }
            self.legs.stats.transfers_failed += 1;
            let why = format!("KV bootstrap timed out after {:.1}s", timeout.as_secs_f64());
            tracing::warn!(room, has_request = entry.req.is_some(), "{why}");
            let decode_side = match (entry.ready, &entry.req) {
                (Some((from, _)), _) => Some(from),
                (None, Some(req)) => req
                    .leg
                    .as_ref()
                    .and_then(|l| self.legs.decode_peers.get(&l.decode_rank))
                    .cloned(),
                (None, None) => None,
            };
            if let Some(to) = decode_side {
                self.legs.abort_room(to, room, 503, why.clone());
            }
            if let Some(req) = entry.req {
                self.finished_rids.push(req.rid);
            }
            self.bootstrap_entry(room).aborted = Some((503, why));
        }
    }
}
