//! A decode worker's side of a transfer: the pre-allocation queue (a row from the extra
//! `--decode-prealloc-size` rows and slots for the prompt, admitted against what running
//! requests may still grow into, as SGLang's `DecodePreallocQueue`), the KV frames written into
//! those slots, and the commit that makes the request a running one.

use std::collections::VecDeque;
use std::time::Instant;

use protocol::trace_event::Milestone;
use protocol::{DisaggLeg, GenerateReq, KvAbort, KvChunk, KvDone, KvReady, Message, TokenOut};
use rand::Rng;

use super::legs::{Arriving, Role};
use super::Scheduler;
use crate::disagg::{KvPeer, PrefillEndpoint, Transfer};
use crate::request::Req;

/// Output tokens at most counted per request when judging what requests may still grow into
/// (SGLang's `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`).
const CLIP_MAX_NEW_TOKENS: usize = 4096;

/// Slots `req` may still take for its output.
fn growth(req: &Req) -> usize {
    (req.params.max_new_tokens as usize)
        .min(CLIP_MAX_NEW_TOKENS)
        .saturating_sub(req.output.len())
}

impl Scheduler {
    /// A request whose prompt KV comes from `leg.prefill_rank`: into the pre-allocation queue.
    /// A room another request here still holds is refused (the controller names each transfer
    /// afresh, so only a faulty or hostile peer reuses one): KV is never written into, or
    /// answered from, another request's room.
    pub(super) fn decode_leg_arrived(
        &mut self,
        req: GenerateReq,
        leg: DisaggLeg,
    ) -> Option<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return None;
        };
        let in_use = d.transfers.get(&leg.room).map(|a| &a.req.rid).or_else(|| {
            let queued = d.prealloc.iter().find(|a| a.kv.room == leg.room);
            queued.map(|a| &a.req.rid)
        });
        if let Some(held) = in_use {
            tracing::warn!(room = leg.room, rid = %req.rid, %held, "a second request for a transfer room; refused");
            let why = format!(
                "transfer room {} is already in use by another request",
                leg.room
            );
            self.legs.stats.transfers_failed += 1;
            return Some(self.refused_out(&req.rid, 500, why));
        }
        let kv = Transfer {
            room: leg.room,
            prefill_rank: leg.prefill_rank,
            from: KvPeer::Endpoint(PrefillEndpoint::of(&leg)),
            since: Instant::now(),
            received: 0,
            next_seq: 0,
            bytes: 0,
        };
        let req = Req::generate(req);
        d.prealloc.push_back(Arriving { req, kv });
        self.admit_prealloc();
        None
    }

    /// Takes a row and the prompt's slots for queued requests, in order, while they fit with
    /// what every held request may still grow into; each one admitted says `KvReady`.
    pub(super) fn admit_prealloc(&mut self) {
        let Role::Decode(d) = &mut self.legs.role else {
            return;
        };
        if d.prealloc.is_empty() {
            return;
        }
        let held = || {
            self.running
                .iter()
                .chain(&self.prefilling)
                .chain(&d.ready)
                .chain(d.transfers.values().map(|a| &a.req))
        };
        let mut reserved: usize = held().map(growth).sum();
        let mut nothing_held = held().next().is_none();
        let mut admitted = Vec::new();
        while let Some(front) = d.prealloc.front() {
            let prompt = front.req.prompt.len();
            let available = self.mem.free_slots() + self.mem.evictable_slots();
            let fits = prompt + growth(&front.req) + reserved <= available;
            // Alone, a request that fits only its prompt still runs (it stops at the pool's end).
            if !(fits || nothing_held && prompt < available) {
                break;
            }
            let Some(mut a) = d.prealloc.pop_front() else {
                break;
            };
            if !self.mem.admit_blank(&mut a.req) {
                d.prealloc.push_front(a); // no free row
                break;
            }
            if !self.mem.ensure_free(prompt) {
                self.mem.release(&mut a.req);
                d.prealloc.push_front(a);
                break;
            }
            self.mem.grow(&a.req, prompt);
            reserved += growth(&a.req);
            nothing_held = false;
            admitted.push(a);
        }
        if !admitted.is_empty() {
            self.note_rows();
        }
        for a in admitted {
            self.send_ready(a);
        }
    }

    fn send_ready(&mut self, mut a: Arriving) {
        let Role::Decode(d) = &mut self.legs.role else {
            return;
        };
        a.kv.since = Instant::now();
        let ready = KvReady {
            room: a.kv.room,
            rid: a.req.rid.clone(),
            decode_rank: self.config.rank,
            layout: d.config.layout.clone(),
            prompt_len: a.req.prompt.len() as u64,
        };
        let (room, prefill_rank) = (a.kv.room, a.kv.prefill_rank);
        self.tracer
            .milestone(&a.req.rid, Milestone::KvReady { room, prefill_rank });
        self.legs
            .out
            .send(a.kv.from.clone(), Message::KvReady(ready), None);
        d.transfers.insert(room, a);
    }

    /// One chunk of a room's KV: checked against what the room expects, then written.
    pub(super) fn kv_chunk(&mut self, c: KvChunk, payload: Option<Vec<u8>>) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        let Some(a) = d.transfers.get_mut(&c.room) else {
            self.legs.stats.frames_dropped += 1;
            tracing::debug!(room = c.room, "KV chunk for an unknown room; dropped");
            return Vec::new();
        };
        let payload = payload.unwrap_or_default();
        let per_token = d.config.layout.bytes_per_token();
        let (t, prompt) = (&mut a.kv, a.req.prompt.len() as u64);
        let problem = if c.seq != t.next_seq {
            Some(format!("chunk {} arrived, {} expected", c.seq, t.next_seq))
        } else if c.start != t.received as u64 || c.start + c.tokens > prompt {
            Some(format!(
                "chunk for positions {}..{} does not follow {} of {prompt}",
                c.start,
                c.start + c.tokens,
                t.received
            ))
        } else if payload.len() as u64 != c.bytes || c.bytes != c.tokens * per_token {
            Some(format!(
                "chunk of {} bytes for {} tokens ({} announced, {per_token} per token)",
                payload.len(),
                c.tokens,
                c.bytes
            ))
        } else {
            None
        };
        let written = problem.is_none()
            && self
                .mem
                .write_kv(&a.req, c.start as usize, c.tokens as usize, &payload);
        if !written {
            self.legs.stats.frames_dropped += 1;
            let why = problem.unwrap_or_else(|| "chunk does not fit the KV pool".into());
            tracing::warn!(room = c.room, %why, "bad KV chunk; failing the transfer");
            return self.fail_transfer(c.room, 500, format!("KV transfer failed: {why}"));
        }
        let t = &mut a.kv;
        t.received += c.tokens as usize;
        t.next_seq += 1;
        t.bytes += c.bytes;
        Vec::new()
    }

    /// The room's last message: the prompt's KV is all here; the first token joins the output
    /// and the request waits for a running slot.
    pub(super) fn kv_done(&mut self, done: KvDone) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        let Some(a) = d.transfers.get(&done.room) else {
            self.legs.stats.frames_dropped += 1;
            return Vec::new();
        };
        if a.kv.received != a.req.prompt.len() || done.chunks != a.kv.next_seq {
            let why = format!(
                "KV transfer incomplete: {} of {} positions in {} of {} chunks",
                a.kv.received,
                a.req.prompt.len(),
                a.kv.next_seq,
                done.chunks
            );
            return self.fail_transfer(done.room, 500, why);
        }
        let Some(Arriving { mut req, kv: t }) = d.transfers.remove(&done.room) else {
            return Vec::new();
        };
        let stats = &mut self.legs.stats;
        stats.transfers += 1;
        stats.transfer_bytes += t.bytes;
        // From KvReady to KvDone: what the request waited for its prompt.
        let waited = t.since.elapsed().as_secs_f64();
        stats.transfer_seconds += waited;
        self.tracer.milestone(
            &req.rid,
            Milestone::KvReceived {
                room: t.room,
                tokens: t.received,
                bytes: t.bytes,
                ms: waited * 1e3,
            },
        );
        req.len = req.prompt.len();
        req.cached_tokens = done.cached_tokens;
        req.admitted_once = true;
        if let Some(token) = done.first_token {
            req.output.push(token);
            self.stats.generated_tokens += 1;
            if req.return_logprob {
                req.logprobs.push(done.logprob.unwrap_or(f32::NEG_INFINITY));
            }
            if req.top_logprobs_num > 0 {
                req.top_logprobs.push(done.top_logprobs.unwrap_or_default());
            }
            if !req.params.is_greedy() {
                // The prefill worker drew once from the same seed for this token: keep the
                // stream where a unified worker's would be.
                let _: f64 = req.rng.gen();
            }
        }
        if let Some(reason) = done.finish_reason {
            return vec![self.finish(req, reason, done.matched_stop)];
        }
        let out = self.progress(&mut req);
        if let Role::Decode(d) = &mut self.legs.role {
            d.ready.push_back(req);
        }
        self.admit_ready();
        vec![out]
    }

    /// Committed requests start running while the running cap allows.
    pub(super) fn admit_ready(&mut self) {
        let Role::Decode(d) = &mut self.legs.role else {
            return;
        };
        while self.running.len() + self.prefilling.len() < self.config.max_running_requests {
            let Some(req) = d.ready.pop_front() else {
                break;
            };
            self.running.push(req);
        }
    }

    /// The prefill worker gave up on the room (whether this worker holds slots for it or it
    /// still waits in the pre-allocation queue): the client gets its error.
    pub(super) fn decode_room_aborted(&mut self, abort: KvAbort) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        let arriving = match d.transfers.remove(&abort.room) {
            Some(a) => Some(a),
            None => {
                let queued = d.prealloc.iter().position(|a| a.kv.room == abort.room);
                queued.and_then(|i| d.prealloc.remove(i))
            }
        };
        let Some(Arriving { mut req, .. }) = arriving else {
            // Ours already ended (an abort crossing ours, or a late frame).
            return Vec::new();
        };
        tracing::warn!(room = abort.room, rid = %req.rid, status = abort.status, reason = %abort.reason, "the prefill worker aborted the KV transfer");
        // The prefill side knows: no abort back.
        self.tracer.milestone(
            &req.rid,
            Milestone::KvAborted {
                room: abort.room,
                reason: format!("the prefill worker gave up: {}", abort.reason),
            },
        );
        let held = req.prompt.len();
        self.mem.release_partial(&mut req, held);
        self.legs.stats.transfers_failed += 1;
        vec![self.fail(req, abort.status, abort.reason)]
    }

    /// Ends a room's transfer with an error to the client; the prefill worker is told.
    pub(super) fn fail_transfer(&mut self, room: u64, status: u16, why: String) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        match d.transfers.remove(&room) {
            Some(a) => vec![self.fail_arriving(a, true, status, why)],
            None => Vec::new(),
        }
    }

    /// Ends a transfer with an error to the client (`ready_sent`: it holds a row and the
    /// prompt's slots); its prefill worker is told.
    pub(super) fn fail_arriving(
        &mut self,
        mut a: Arriving,
        ready_sent: bool,
        status: u16,
        why: String,
    ) -> TokenOut {
        self.drop_transfer(&mut a, ready_sent);
        self.fail(a.req, status, why)
    }

    /// Every transfer (queued or under way) from prefill rank `rank` fails.
    pub(super) fn fail_transfers_from(&mut self, rank: u32, why: String) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        let from_rank = |a: &Arriving| a.kv.prefill_rank == rank;
        let (queued, keep): (VecDeque<Arriving>, _) = d.prealloc.drain(..).partition(from_rank);
        d.prealloc = keep;
        let rooms: Vec<u64> = d
            .transfers
            .iter()
            .filter(|(_, a)| from_rank(a))
            .map(|(&room, _)| room)
            .collect();
        let mut outs: Vec<TokenOut> = queued
            .into_iter()
            .map(|a| self.fail_arriving(a, false, 503, why.clone()))
            .collect();
        for room in rooms {
            outs.extend(self.fail_transfer(room, 503, why.clone()));
        }
        outs
    }

    /// Requests that waited in the pre-allocation queue longer than
    /// `--disaggregation-bootstrap-timeout`: their prefill worker waits as long for the
    /// `KvReady` and has given the room up by now, so a row taken for one would only wait for
    /// KV that never comes. Each fails (503) and its prefill worker is told.
    pub(super) fn expire_prealloc(&mut self, now: Instant) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        let timeout = d.config.bootstrap_timeout;
        let waited_too_long = |a: &Arriving| now.saturating_duration_since(a.kv.since) > timeout;
        if !d.prealloc.iter().any(waited_too_long) {
            return Vec::new();
        }
        let (late, keep): (VecDeque<Arriving>, VecDeque<Arriving>) =
            d.prealloc.drain(..).partition(waited_too_long);
        d.prealloc = keep;
        let why = format!(
            "no request row and KV slots free for {:.1}s (--disaggregation-bootstrap-timeout)",
            timeout.as_secs_f64()
        );
        late.into_iter()
            .map(|a| {
                tracing::warn!(rid = %a.req.rid, "{why}");
                self.fail_arriving(a, false, 503, why.clone())
            })
            .collect()
    }

    /// Transfers that did not finish within `--disaggregation-waiting-timeout` of their
    /// `KvReady`.
    pub(super) fn expire_transfers(&mut self, now: Instant) -> Vec<TokenOut> {
        let Role::Decode(d) = &mut self.legs.role else {
            return Vec::new();
        };
        let timeout = d.config.waiting_timeout;
        let late: Vec<(u64, u32)> = d
            .transfers
            .iter()
            .filter(|(_, a)| now.saturating_duration_since(a.kv.since) > timeout)
            .map(|(&room, a)| (room, a.kv.prefill_rank))
            .collect();
        let mut outs = Vec::new();
        for (room, rank) in late {
            let why = format!(
                "KV transfer from prefill rank {rank} timed out after {:.1}s",
                timeout.as_secs_f64()
            );
            tracing::warn!(room, "{why}");
            outs.extend(self.fail_transfer(room, 503, why));
        }
        outs
    }
}
