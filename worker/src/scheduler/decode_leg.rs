//! A decode worker's side of a transfer: the pre-allocation queue (a row from the extra
//! `--decode-prealloc-size` rows and slots for the prompt, admitted against what running
//! requests may still grow into, as SGLang's `DecodePreallocQueue`), the KV frames written into
//! those slots, and the commit that makes the request a running one.

use std::collections::VecDeque;
use std::time::Instant;

use protocol::trace_event::Milestone;
use protocol::{DisaggLeg, GenerateReq, KvAbort, KvChunk, KvDone, KvReady, Message, TokenOut};
use rand::Rng;

use super::Scheduler;
use crate::disagg::{KvPeer, Transfer};
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
    pub(super) fn decode_leg_arrived(&mut self, req: GenerateReq, leg: DisaggLeg) {
        let mut req = Req::generate(req);
        req.transfer = Some(Transfer {
            room: leg.room,
            prefill_rank: leg.prefill_rank,
            from: KvPeer::Endpoint(crate::disagg::PrefillEndpoint::of(&leg)),
            since: Instant::now(),
            ready_sent: false,
            received: 0,
            next_seq: 0,
            bytes: 0,
        });
        self.legs.prealloc.push_back(req);
        self.admit_prealloc();
    }

    /// Takes a row and the prompt's slots for queued requests, in order, while they fit with
    /// what every held request may still grow into; each one admitted says `KvReady`.
    pub(super) fn admit_prealloc(&mut self) {
        if self.legs.prealloc.is_empty() {
            return;
        }
        let held = || {
            self.running
                .iter()
                .chain(&self.prefilling)
                .chain(&self.legs.ready)
                .chain(self.legs.transfers.values())
        };
        let mut reserved: usize = held().map(growth).sum();
        let mut nothing_held = held().next().is_none();
        while let Some(front) = self.legs.prealloc.front() {
            let prompt = front.prompt.len();
            let available = self.mem.free_slots() + self.mem.evictable_slots();
            let fits = prompt + growth(front) + reserved <= available;
            // Alone, a request that fits only its prompt still runs (it stops at the pool's end).
            if !(fits || nothing_held && prompt < available) {
                break;
            }
            let mut req = self.legs.prealloc.pop_front().expect("front");
            if !self.mem.admit_blank(&mut req) {
                self.legs.prealloc.push_front(req); // no free row
                break;
            }
            if !self.mem.ensure_free(prompt) {
                self.mem.release(&mut req);
                self.legs.prealloc.push_front(req);
                break;
            }
            self.mem.grow(&req, prompt);
            self.note_rows();
            reserved += growth(&req);
            nothing_held = false;
            self.send_ready(req);
        }
    }

    fn send_ready(&mut self, mut req: Req) {
        let config = self.legs.config.as_ref().expect("a decode worker");
        let t = req.transfer.as_mut().expect("a decode leg");
        t.ready_sent = true;
        t.since = Instant::now();
        let ready = KvReady {
            room: t.room,
            rid: req.rid.clone(),
            decode_rank: self.config.rank,
            layout: config.layout.clone(),
            prompt_len: req.prompt.len() as u64,
        };
        let (to, room, prefill_rank) = (t.from.clone(), t.room, t.prefill_rank);
        self.tracer
            .milestone(&req.rid, Milestone::KvReady { room, prefill_rank });
        self.legs.send(to, Message::KvReady(ready), None);
        self.legs.transfers.insert(room, req);
    }

    /// One chunk of a room's KV: checked against what the room expects, then written.
    pub(super) fn kv_chunk(&mut self, c: KvChunk, payload: Option<Vec<u8>>) -> Vec<TokenOut> {
        let Some(req) = self.legs.transfers.get_mut(&c.room) else {
            self.legs.stats.frames_dropped += 1;
            tracing::debug!(room = c.room, "KV chunk for an unknown room; dropped");
            return Vec::new();
        };
        let t = req.transfer.as_mut().expect("a decode leg");
        let payload = payload.unwrap_or_default();
        let per_token = self
            .legs
            .config
            .as_ref()
            .map_or(0, |c| c.layout.bytes_per_token());
        let prompt = req.prompt.len() as u64;
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
                .write_kv(req, c.start as usize, c.tokens as usize, &payload);
        if !written {
            self.legs.stats.frames_dropped += 1;
            let why = problem.unwrap_or_else(|| "chunk does not fit the KV pool".into());
            tracing::warn!(room = c.room, %why, "bad KV chunk; failing the transfer");
            return self.fail_transfer(c.room, 500, format!("KV transfer failed: {why}"));
        }
        let t = req.transfer.as_mut().expect("a decode leg");
        t.received += c.tokens as usize;
        t.next_seq += 1;
        t.bytes += c.bytes;
        Vec::new()
    }

    /// The room's last message: the prompt's KV is all here; the first token joins the output
    /// and the request waits for a running slot.
    pub(super) fn kv_done(&mut self, d: KvDone) -> Vec<TokenOut> {
        let Some(req) = self.legs.transfers.get(&d.room) else {
            self.legs.stats.frames_dropped += 1;
            return Vec::new();
        };
        let t = req.transfer.as_ref().expect("a decode leg");
        if t.received != req.prompt.len() || d.chunks != t.next_seq {
            let why = format!(
                "KV transfer incomplete: {} of {} positions in {} of {} chunks",
                t.received,
                req.prompt.len(),
                t.next_seq,
                d.chunks
            );
            return self.fail_transfer(d.room, 500, why);
        }
        let mut req = self.legs.transfers.remove(&d.room).expect("present");
        let t = req.transfer.take().expect("a decode leg");
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
        req.cached_tokens = d.cached_tokens;
        req.admitted_once = true;
        if let Some(token) = d.first_token {
            req.output.push(token);
            self.stats.generated_tokens += 1;
            if req.return_logprob {
                req.logprobs.push(d.logprob.unwrap_or(f32::NEG_INFINITY));
            }
            if req.top_logprobs_num > 0 {
                req.top_logprobs.push(d.top_logprobs.unwrap_or_default());
            }
            if !req.params.is_greedy() {
                // The prefill worker drew once from the same seed for this token: keep the
                // stream where a unified worker's would be.
                let _: f64 = req.rng.gen();
            }
        }
        if let Some(reason) = d.finish_reason {
            return vec![self.finish(req, reason, d.matched_stop)];
        }
        let out = self.progress(&mut req);
        self.legs.ready.push_back(req);
        self.admit_ready();
        vec![out]
    }

    /// Committed requests start running while the running cap allows.
    pub(super) fn admit_ready(&mut self) {
        while self.num_running() < self.config.max_running_requests {
            let Some(req) = self.legs.ready.pop_front() else {
                break;
            };
            self.running.push(req);
        }
    }

    /// The prefill worker gave up on the room (whether this worker holds slots for it or it
    /// still waits in the pre-allocation queue): the client gets its error.
    pub(super) fn decode_room_aborted(&mut self, a: KvAbort) -> Vec<TokenOut> {
        let in_room = |r: &Req| r.transfer.as_ref().is_some_and(|t| t.room == a.room);
        let req = match self.legs.transfers.remove(&a.room) {
            Some(req) => Some(req),
            None => {
                let queued = self.legs.prealloc.iter().position(in_room);
                queued.and_then(|i| self.legs.prealloc.remove(i))
            }
        };
        let Some(mut req) = req else {
            // Ours already ended (an abort crossing ours, or a late frame).
            return Vec::new();
        };
        tracing::warn!(room = a.room, rid = %req.rid, status = a.status, reason = %a.reason, "the prefill worker aborted the KV transfer");
        let _ = req.transfer.take(); // the prefill side knows; no abort back
        self.tracer.milestone(
            &req.rid,
            Milestone::KvAborted {
                room: a.room,
                reason: format!("the prefill worker gave up: {}", a.reason),
            },
        );
        let held = req.prompt.len();
        self.mem.release_partial(&mut req, held);
        self.legs.stats.transfers_failed += 1;
        vec![self.fail(req, a.status, a.reason)]
    }

    /// Ends a room's transfer with an error to the client; the prefill worker is told.
    pub(super) fn fail_transfer(&mut self, room: u64, status: u16, why: String) -> Vec<TokenOut> {
        match self.legs.transfers.remove(&room) {
            // `fail` releases the slots and tells the prefill worker.
            Some(req) => vec![self.fail(req, status, why)],
            None => Vec::new(),
        }
    }

    /// Every transfer (queued or under way) from prefill rank `rank` fails.
    pub(super) fn fail_transfers_from(&mut self, rank: u32, why: String) -> Vec<TokenOut> {
        let from_rank = |r: &Req| r.transfer.as_ref().is_some_and(|t| t.prefill_rank == rank);
        let (queued, keep): (VecDeque<Req>, _) =
            self.legs.prealloc.drain(..).partition(|r| from_rank(r));
        self.legs.prealloc = keep;
        let rooms: Vec<u64> = self
            .legs
            .transfers
            .iter()
            .filter(|(_, r)| from_rank(r))
            .map(|(&room, _)| room)
            .collect();
        let mut outs: Vec<TokenOut> = queued
            .into_iter()
            .map(|req| self.fail(req, 503, why.clone()))
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
        let timeout = self
            .legs
            .config
            .as_ref()
            .map(|c| c.bootstrap_timeout)
            .unwrap_or_default();
        let waited_too_long = |r: &Req| {
            r.transfer
                .as_ref()
                .is_some_and(|t| now.saturating_duration_since(t.since) > timeout)
        };
        if !self.legs.prealloc.iter().any(waited_too_long) {
            return Vec::new();
        }
        let (late, keep): (VecDeque<Req>, VecDeque<Req>) =
            self.legs.prealloc.drain(..).partition(waited_too_long);
        self.legs.prealloc = keep;
        let why = format!(
            "no request row and KV slots free for {:.1}s (--disaggregation-bootstrap-timeout)",
            timeout.as_secs_f64()
        );
        late.into_iter()
            .map(|req| {
                tracing::warn!(rid = %req.rid, "{why}");
                self.fail(req, 503, why.clone())
            })
            .collect()
    }

    /// Transfers that did not finish within `--disaggregation-waiting-timeout` of their
    /// `KvReady`.
    pub(super) fn expire_transfers(&mut self, now: Instant) -> Vec<TokenOut> {
        let timeout = self
            .legs
            .config
            .as_ref()
            .map(|c| c.waiting_timeout)
            .unwrap_or_default();
        let late: Vec<(u64, u32)> = self
            .legs
            .transfers
            .iter()
            .filter_map(|(&room, r)| {
                let t = r.transfer.as_ref()?;
                (now.saturating_duration_since(t.since) > timeout).then_some((room, t.prefill_rank))
            })
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
