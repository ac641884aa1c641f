//! Continuous batching. Each step is either a prefill of admitted requests (prompt chunks of at
//! most `chunked_prefill_size` tokens each, at most `max_prefill_tokens` in all) or one decode
//! token for every running request. Requests whose prompt is not fully computed stay at the head
//! of the prefill line; when decode runs out of KV slots the requests with the fewest generated
//! tokens are retracted to the queue (their output is kept and recomputed later: nothing lost).
//!
//! The scheduler owns no sockets: `submit`/`abort`/`step` return the `TokenOut`s to send, so it
//! is tested in-process.

use protocol::{FinishReason, GenerateReq, TokenOut};
use std::collections::VecDeque;

use crate::kv_alloc::KvSlotAllocator;
use crate::model::{KvBuffers, LlamaModel, SeqInput};
use crate::request::{Req, ReqKind};
use crate::sampling::sample;

/// Scheduling limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub rank: u32,
    pub max_total_tokens: usize,
    pub max_running_requests: usize,
    pub chunked_prefill_size: usize,
    pub max_prefill_tokens: usize,
    pub context_len: usize,
}

/// Counters for `WorkerStatus`.
#[derive(Debug, Default, Clone)]
pub struct StepStats {
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    model: LlamaModel,
    kv: KvBuffers,
    alloc: KvSlotAllocator,
    /// Admitted but not yet fully prefilled, in admission order.
    prefilling: VecDeque<Req>,
    /// Not admitted yet (or retracted).
    waiting: VecDeque<Req>,
    /// Prompt computed; decoding.
    running: Vec<Req>,
    finished_rids: Vec<String>,
    pub stats: StepStats,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, model: LlamaModel) -> Self {
        let kv = KvBuffers::new(model.config(), config.max_total_tokens);
        let alloc = KvSlotAllocator::new(config.max_total_tokens);
        Scheduler {
            config,
            model,
            kv,
            alloc,
            prefilling: VecDeque::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished_rids: Vec::new(),
            stats: StepStats::default(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    pub fn has_work(&self) -> bool {
        !(self.prefilling.is_empty() && self.waiting.is_empty() && self.running.is_empty())
    }

    pub fn num_running(&self) -> usize {
        self.running.len() + self.prefilling.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn used_tokens(&self) -> usize {
        self.alloc.used()
    }

    pub fn free_slots(&self) -> usize {
        self.alloc.available()
    }

    /// Requests finished since the last call.
    pub fn take_finished_rids(&mut self) -> Vec<String> {
        std::mem::take(&mut self.finished_rids)
    }

    /// Queue a generation request, or refuse it at once with a 400.
    pub fn submit(&mut self, req: GenerateReq) -> Option<TokenOut> {
        if let Err(message) = self.validate(&req.input_ids, req.sampling.max_new_tokens) {
            return Some(self.error_out(&req.rid, 400, message));
        }
        self.waiting.push_back(Req::generate(req));
        None
    }

    /// Queue an embedding request, or refuse it at once with a 400.
    pub fn submit_embed(&mut self, rid: String, input_ids: Vec<u32>) -> Option<TokenOut> {
        if let Err(message) = self.validate(&input_ids, 0) {
            return Some(self.error_out(&rid, 400, message));
        }
        self.waiting.push_back(Req::embed(rid, input_ids));
        None
    }

    fn validate(&self, ids: &[u32], max_new_tokens: u32) -> Result<(), String> {
        let vocab = self.model.config().vocab_size;
        if ids.is_empty() {
            return Err("the prompt is empty".into());
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            ));
        }
        let need = ids.len() + max_new_tokens as usize;
        if need > self.config.context_len {
            return Err(format!(
                "prompt ({} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context length {}",
                ids.len(),
                self.config.context_len
            ));
        }
        if ids.len() + 1 > self.config.max_total_tokens {
            return Err(format!(
                "prompt ({} tokens) does not fit in this rank's KV pool ({} tokens)",
                ids.len(),
                self.config.max_total_tokens
            ));
        }
        Ok(())
    }

    /// Abort one request (or all with `None`); each aborted request gets its final message.
    pub fn abort(&mut self, rid: Option<&str>) -> Vec<TokenOut> {
        let matches = |r: &Req| rid.is_none_or(|id| r.rid == id);
        let mut aborted = Vec::new();
        for queue in [&mut self.waiting, &mut self.prefilling] {
            let (gone, keep): (VecDeque<Req>, VecDeque<Req>) =
                queue.drain(..).partition(|r| matches(r));
            *queue = keep;
            aborted.extend(gone);
        }
        let (gone, keep): (Vec<Req>, Vec<Req>) = self.running.drain(..).partition(|r| matches(r));
        self.running = keep;
        aborted.extend(gone);
        aborted
            .into_iter()
            .map(|req| self.finish(req, FinishReason::Abort, None))
            .collect()
    }

    /// Fail every request (worker shutting down).
    pub fn fail_all(&mut self, status: u16, message: &str) -> Vec<TokenOut> {
        let mut all: Vec<Req> = self.waiting.drain(..).collect();
        all.extend(self.prefilling.drain(..));
        all.append(&mut self.running);
        all.into_iter()
            .map(|req| {
                self.alloc.free(&req.slots);
                self.finished_rids.push(req.rid.clone());
                self.error_out(&req.rid, status, message.to_string())
            })
            .collect()
    }

    /// Run one scheduling step; returns the messages it produced.
    pub fn step(&mut self) -> Vec<TokenOut> {
        self.admit();
        if !self.prefilling.is_empty() {
            self.prefill_step()
        } else if !self.running.is_empty() {
            self.decode_step()
        } else {
            Vec::new()
        }
    }

    /// Move waiting requests into the prefill line while the running cap allows.
    fn admit(&mut self) {
        while self.num_running() < self.config.max_running_requests {
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            self.prefilling.push_back(req);
        }
    }

    fn prefill_step(&mut self) -> Vec<TokenOut> {
        // Choose chunks: each request at most `chunked_prefill_size`, the step at most
        // `max_prefill_tokens`, and only what the KV pool can hold now.
        let mut budget = self.config.max_prefill_tokens;
        let mut planned: Vec<(usize, usize)> = Vec::new(); // (index in prefilling, chunk start)
        let mut tokens: Vec<Vec<u32>> = Vec::new();
        for i in 0..self.prefilling.len() {
            if budget == 0 {
                break;
            }
            let req = &mut self.prefilling[i];
            let chunk = req
                .pending()
                .min(self.config.chunked_prefill_size)
                .min(budget);
            let start = req.slots.len();
            if !self.alloc.alloc_into(chunk, &mut req.slots) {
                break; // the pool is full: running requests finish and free slots first
            }
            budget -= chunk;
            tokens.push(req.token_range(start, start + chunk));
            planned.push((i, start));
            self.stats.prompt_tokens += chunk as u64;
        }
        if planned.is_empty() {
            return self.unblock_prefill();
        }

        let mut outs = Vec::new();
        let mut logits_of = vec![None; planned.len()];
        let mut hidden_of = vec![None; planned.len()];
        for kind in [ReqKind::Generate, ReqKind::Embed] {
            let group: Vec<usize> = (0..planned.len())
                .filter(|&j| self.prefilling[planned[j].0].kind == kind)
                .collect();
            if group.is_empty() {
                continue;
            }
            let seqs: Vec<SeqInput<'_>> = group
                .iter()
                .map(|&j| SeqInput {
                    new_tokens: &tokens[j],
                    start_pos: planned[j].1,
                    slots: &self.prefilling[planned[j].0].slots,
                })
                .collect();
            let result = match kind {
                ReqKind::Generate => self.model.forward(&mut self.kv, &seqs),
                ReqKind::Embed => self.model.forward_hidden(&mut self.kv, &seqs),
            };
            let width = match kind {
                ReqKind::Generate => self.model.config().vocab_size,
                ReqKind::Embed => self.model.config().hidden_size,
            };
            match result {
                Ok(rows) => {
                    for (n, &j) in group.iter().enumerate() {
                        let row = rows[n * width..(n + 1) * width].to_vec();
                        match kind {
                            ReqKind::Generate => logits_of[j] = Some(row),
                            ReqKind::Embed => hidden_of[j] = Some(row),
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(%e, "prefill forward failed");
                    for &j in &group {
                        logits_of[j] = None;
                        hidden_of[j] = None;
                    }
                }
            }
        }

        // Settle each planned request; rebuild the prefill line without the finished ones.
        let mut line: Vec<Option<Req>> = self.prefilling.drain(..).map(Some).collect();
        for (j, &(i, _)) in planned.iter().enumerate() {
            let Some(mut req) = line[i].take() else {
                continue;
            };
            if req.pending() > 0 && (logits_of[j].is_some() || hidden_of[j].is_some()) {
                line[i] = Some(req); // more chunks to go
                continue;
            }
            match (req.kind, logits_of[j].take(), hidden_of[j].take()) {
                (ReqKind::Embed, _, Some(hidden)) => {
                    let mut out = self.finish(req, FinishReason::Stop, None);
                    out.embedding = Some(l2_normalize(hidden));
                    outs.push(out);
                }
                (ReqKind::Generate, Some(mut logits), _) => {
                    if req.params.max_new_tokens == 0 {
                        outs.push(self.finish(req, FinishReason::Length, None));
                        continue;
                    }
                    match self.sample_and_check(&mut req, &mut logits) {
                        Some((reason, matched)) => outs.push(self.finish(req, reason, matched)),
                        None => {
                            outs.push(self.progress(&mut req));
                            self.running.push(req);
                        }
                    }
                }
                _ => {
                    let rid = req.rid.clone();
                    self.alloc.free(&req.slots);
                    self.finished_rids.push(rid.clone());
                    outs.push(self.error_out(&rid, 500, "model forward failed".into()));
                }
            }
        }
        self.prefilling = line.into_iter().flatten().collect();
        outs
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
        if self.alloc.available() > 0 {
            return Vec::new(); // the head request gets the freed room next step
        }
        match self.prefilling.pop_front() {
            Some(req) => {
                let rid = req.rid.clone();
                self.alloc.free(&req.slots);
                self.finished_rids.push(rid.clone());
                vec![self.error_out(&rid, 503, "not enough KV cache for this request".into())]
            }
            None => Vec::new(),
        }
    }

    fn decode_step(&mut self) -> Vec<TokenOut> {
        let mut outs = Vec::new();
        // Make room: retract the requests with the fewest generated tokens (cheapest to redo).
        while self.alloc.available() < self.running.len() && self.running.len() > 1 {
            let victim = (0..self.running.len())
                .min_by_key(|&i| {
                    (
                        self.running[i].output.len(),
                        std::cmp::Reverse(self.running[i].arrived),
                    )
                })
                .unwrap_or(0);
            let req = self.running.swap_remove(victim);
            tracing::debug!(rid = %req.rid, "retracting request: KV pool is full");
            self.retract(req);
        }
        if self.alloc.available() < self.running.len() {
            // One request that fills the whole pool: it cannot grow further.
            for req in std::mem::take(&mut self.running) {
                outs.push(self.finish(req, FinishReason::Length, None));
            }
            return outs;
        }
        let mut tokens = Vec::with_capacity(self.running.len());
        for req in &mut self.running {
            let pos = req.slots.len();
            self.alloc.alloc_into(1, &mut req.slots);
            tokens.push((req.token_range(pos, pos + 1), pos));
        }
        let seqs: Vec<SeqInput<'_>> = self
            .running
            .iter()
            .zip(&tokens)
            .map(|(req, (t, pos))| SeqInput {
                new_tokens: t,
                start_pos: *pos,
                slots: &req.slots,
            })
            .collect();
        let vocab = self.model.config().vocab_size;
        let logits = match self.model.forward(&mut self.kv, &seqs) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(%e, "decode forward failed");
                for req in std::mem::take(&mut self.running) {
                    let rid = req.rid.clone();
                    self.alloc.free(&req.slots);
                    self.finished_rids.push(rid.clone());
                    outs.push(self.error_out(&rid, 500, format!("model forward failed: {e}")));
                }
                return outs;
            }
        };
        let mut still = Vec::with_capacity(self.running.len());
        for (n, mut req) in std::mem::take(&mut self.running).into_iter().enumerate() {
            let mut row = logits[n * vocab..(n + 1) * vocab].to_vec();
            match self.sample_and_check(&mut req, &mut row) {
                Some((reason, matched)) => outs.push(self.finish(req, reason, matched)),
                None => {
                    outs.push(self.progress(&mut req));
                    still.push(req);
                }
            }
        }
        self.running = still;
        outs
    }

    /// Put a request back in the queue without its KV; its output so far is kept.
    fn retract(&mut self, mut req: Req) {
        self.alloc.free(&req.slots);
        req.slots.clear();
        req.cached_tokens = 0;
        self.waiting.push_front(req);
    }

    /// Sample the next token into `req` and say whether it ends the request.
    fn sample_and_check(
        &mut self,
        req: &mut Req,
        logits: &mut [f32],
    ) -> Option<(FinishReason, Option<u32>)> {
        let picked = sample(logits, &req.params, &mut req.rng, &req.prompt, &req.output);
        let token = picked.token;
        req.output.push(token);
        if req.return_logprob {
            req.logprobs.push(picked.logprob);
        }
        self.stats.generated_tokens += 1;
        let eos = &self.model.config().eos_token_ids;
        if !req.params.ignore_eos && eos.contains(&token) {
            return Some((FinishReason::Stop, Some(token)));
        }
        if req.params.stop_token_ids.contains(&token) {
            return Some((FinishReason::Stop, Some(token)));
        }
        if req.output.len() >= req.params.max_new_tokens as usize
            || req.total_len() >= self.config.context_len
        {
            return Some((FinishReason::Length, None));
        }
        None
    }

    /// The tokens a running request produced since its last message.
    fn progress(&self, req: &mut Req) -> TokenOut {
        let out = TokenOut {
            rid: req.rid.clone(),
            output_ids: req.output[req.sent..].to_vec(),
            finish_reason: None,
            matched_stop: None,
            prompt_tokens: req.prompt.len() as u32,
            completion_tokens: req.output.len() as u32,
            cached_tokens: req.cached_tokens,
            dp_rank: Some(self.config.rank),
            logprobs: req
                .return_logprob
                .then(|| req.logprobs[req.sent..].to_vec()),
            embedding: None,
            error: None,
        };
        req.sent = req.output.len();
        out
    }

    fn finish(&mut self, req: Req, reason: FinishReason, matched: Option<u32>) -> TokenOut {
        self.alloc.free(&req.slots);
        self.finished_rids.push(req.rid.clone());
        TokenOut {
            rid: req.rid.clone(),
            output_ids: req.output[req.sent..].to_vec(),
            finish_reason: Some(reason),
            matched_stop: matched,
            prompt_tokens: req.prompt.len() as u32,
            completion_tokens: req.output.len() as u32,
            cached_tokens: req.cached_tokens,
            dp_rank: Some(self.config.rank),
            logprobs: req
                .return_logprob
                .then(|| req.logprobs[req.sent..].to_vec()),
            embedding: None,
            error: None,
        }
    }

    fn error_out(&self, rid: &str, status: u16, message: String) -> TokenOut {
        let mut out = TokenOut::error(rid, status, message);
        out.dp_rank = Some(self.config.rank);
        out
    }
}

fn l2_normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
