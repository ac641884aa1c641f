//! A prefill step: plan one chunk per admitted request (within the step's token budget and the
//! free KV), run them in one forward pass per request kind, then settle each request: more
//! chunks to go, its first token sampled, or its embedding returned.

use std::time::Instant;

use protocol::trace_event::Milestone;
use protocol::{FinishReason, TokenOut};

use super::Scheduler;
use crate::model::SeqInput;
use crate::request::{Req, ReqKind};

/// One request's chunk in a prefill step.
struct Chunk {
    /// Index in the prefill line.
    idx: usize,
    /// Position of the chunk's first token.
    start: usize,
    tokens: Vec<u32>,
}

impl Scheduler {
    pub(super) fn prefill_step(&mut self) -> Vec<TokenOut> {
        let chunks = self.plan_chunks();
        if chunks.is_empty() {
            return self.unblock_prefill();
        }
        let started = Instant::now();
        let results = self.run_chunks(&chunks);
        let computed: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let took = started.elapsed();
        self.step_budget.observe(computed, took);
        self.stats.prefill_tokens += computed as u64;
        self.stats.prefill_seconds += took.as_secs_f64();
        self.settle(&chunks, results)
    }

    /// Chunks for this step: each request at most `chunked_prefill_size`, the step at most
    /// `max_prefill_tokens` and what fits in the step's target time, and only what the KV pool
    /// can hold now. Each chunk's slots are taken here.
    fn plan_chunks(&mut self) -> Vec<Chunk> {
        let mut budget = self.step_budget.tokens(self.config.max_prefill_tokens);
        // Keep one slot per decoding request for their next step, so prefill does not starve
        // them into retraction.
        let reserve = self.running.len();
        let mut chunks = Vec::new();
        for idx in 0..self.prefilling.len() {
            if budget == 0 {
                break;
            }
            let mut n = self.prefilling[idx]
                .pending()
                .min(self.config.chunked_prefill_size)
                .min(budget);
            if !self.mem.ensure_free(n + reserve) {
                // A tight pool: take the chunk that fits (chunked prefill makes any size work).
                n = n.min(self.mem.free_slots().saturating_sub(reserve));
                if n == 0 {
                    break; // running requests finish and free slots first
                }
            }
            let req = &self.prefilling[idx];
            self.mem.grow(req, n);
            budget -= n;
            chunks.push(Chunk {
                idx,
                start: req.len,
                tokens: req.token_range(req.len, req.len + n),
            });
        }
        chunks
    }

    /// The forward passes: per chunk, its last token's logits (generation) or hidden state
    /// (embedding); `None` where the pass failed.
    fn run_chunks(&mut self, chunks: &[Chunk]) -> Vec<Option<Vec<f32>>> {
        let mut out = vec![None; chunks.len()];
        for kind in [ReqKind::Generate, ReqKind::Embed] {
            let group: Vec<usize> = (0..chunks.len())
                .filter(|&j| self.prefilling[chunks[j].idx].kind == kind)
                .collect();
            if group.is_empty() {
                continue;
            }
            let (kv, rows) = self.mem.split();
            let seqs: Vec<SeqInput<'_>> = group
                .iter()
                .map(|&j| {
                    let c = &chunks[j];
                    let req = &self.prefilling[c.idx];
                    SeqInput {
                        new_tokens: &c.tokens,
                        start_pos: c.start,
                        slots: rows.slots(req, c.start + c.tokens.len()),
                    }
                })
                .collect();
            let cfg = self.model.config();
            let (result, width) = match kind {
                ReqKind::Generate => (self.model.forward(kv, &seqs), cfg.vocab_size),
                ReqKind::Embed => (self.model.forward_hidden(kv, &seqs), cfg.hidden_size),
            };
            match result {
                Ok(rows) => {
                    for (n, &j) in group.iter().enumerate() {
                        out[j] = Some(rows[n * width..(n + 1) * width].to_vec());
                    }
                }
                Err(e) => tracing::error!(%e, "prefill forward failed"),
            }
        }
        out
    }

    /// Advances each planned request and rebuilds the prefill line without the ones that are
    /// done with their prompt.
    fn settle(&mut self, chunks: &[Chunk], results: Vec<Option<Vec<f32>>>) -> Vec<TokenOut> {
        let mut outs = Vec::new();
        let mut line: Vec<Option<Req>> = self.prefilling.drain(..).map(Some).collect();
        for (c, result) in chunks.iter().zip(results) {
            let Some(mut req) = line[c.idx].take() else {
                continue;
            };
            let n = c.tokens.len();
            if result.is_some() {
                self.tracer.milestone(
                    &req.rid,
                    Milestone::PrefillChunk {
                        start: c.start,
                        tokens: n,
                    },
                );
                req.len += n;
                // Share what was just computed: later chunks and other requests reuse it.
                self.mem.share_computed(&mut req);
                self.send_leg_kv(&mut req);
                if req.pending() > 0 {
                    line[c.idx] = Some(req); // more chunks to go
                    continue;
                }
            } else {
                self.mem.shrink(&req, n); // the chunk's slots hold no valid KV
            }
            outs.extend(self.prompt_done(req, result));
        }
        self.prefilling = line.into_iter().flatten().collect();
        outs
    }

    /// A request whose prompt is computed (`result`: the last token's logits or hidden state;
    /// `None` when the forward pass failed): its embedding, or its first token (then it joins
    /// the running requests), or its failure.
    fn prompt_done(&mut self, mut req: Req, result: Option<Vec<f32>>) -> Option<TokenOut> {
        if let Some(leg) = req.leg.take() {
            match result {
                Some(logits) => self.leg_prompt_done(req, leg, logits),
                None => self.end_leg(req, leg, 500, "model forward failed".into()),
            }
            return None;
        }
        let out = match (req.kind, result) {
            (ReqKind::Embed, Some(hidden)) => {
                let mut out = self.finish(req, FinishReason::Stop, None);
                out.embedding = Some(l2_normalize(hidden));
                out
            }
            (ReqKind::Generate, Some(mut logits)) => {
                if req.params.max_new_tokens == 0 {
                    return Some(self.finish(req, FinishReason::Length, None));
                }
                match self.sample_and_check(&mut req, &mut logits, None) {
                    Ok(Some((reason, matched))) => self.finish(req, reason, matched),
                    Ok(None) => {
                        let out = self.progress(&mut req);
                        self.running.push(req);
                        out
                    }
                    Err(e) => self.fail(req, 400, e),
                }
            }
            _ => self.fail(req, 500, "model forward failed".into()),
        };
        Some(out)
    }

    /// No prefill chunk fits in the pool. If requests are decoding they will free slots; else
    /// retract all but the oldest prefilling request, and fail it if even it cannot fit.
    fn unblock_prefill(&mut self) -> Vec<TokenOut> {
        if !self.running.is_empty() {
            return self.decode_step();
        }
        while self.prefilling.len() > 1 {
            if let Some(req) = self.prefilling.pop_back() {
                self.retract(req);
            }
        }
        if self.mem.ensure_free(1) {
            return Vec::new(); // the head request gets the freed room next step
        }
        match self.prefilling.pop_front() {
            Some(req) => {
                let why = "not enough KV cache for this request".into();
                self.end(req, &super::Ending::Fail(503, why))
                    .into_iter()
                    .collect()
            }
            None => Vec::new(),
        }
    }
}

fn l2_normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}
