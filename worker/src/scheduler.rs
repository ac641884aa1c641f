//! Continuous batching. Each step is either a prefill of admitted requests (prompt chunks of at
//! most `chunked_prefill_size` tokens each, at most `max_prefill_tokens` in all) or one decode
//! token for every running request.
//!
//! Memory: a request admitted takes a row of the [`ReqToTokenPool`]; its prompt prefix comes
//! from the [`RadixCache`] when cached (locked while in use) and the rest gets fresh slots from
//! the [`KvSlotAllocator`]. After every prefill chunk, and when a request ends, its computed
//! tokens are inserted into the cache, so the next request with that prefix (or the rest of the
//! same batch under `lpm`) reuses them. When slots run short the cache evicts least recently
//! used unlocked leaves; if decode still lacks room, the requests with the fewest generated
//! tokens are retracted to the queue (their output is kept and recomputed later: nothing lost).
//!
//! The scheduler owns no sockets: `submit`/`abort`/`step` return the `TokenOut`s to send, so it
//! is tested in-process.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use protocol::{FinishReason, GenerateReq, TokenOut};

use crate::kv_alloc::KvSlotAllocator;
use crate::model::{KvBuffers, LlamaModel, SeqInput};
use crate::radix_cache::RadixCache;
use crate::req_to_token::ReqToTokenPool;
use crate::request::{Req, ReqKind};
use crate::sampling::sample;
use crate::step_budget::StepBudget;

/// `--schedule-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulePolicy {
    /// First come, first served.
    Fcfs,
    /// Longest cached prefix first; a request sharing an uncached prefix with one being
    /// prefilled waits for it instead of computing the same prefix twice.
    #[default]
    Lpm,
}

impl FromStr for SchedulePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fcfs" => Ok(SchedulePolicy::Fcfs),
            "lpm" => Ok(SchedulePolicy::Lpm),
            other => Err(format!("expected fcfs or lpm, got {other:?}")),
        }
    }
}

impl fmt::Display for SchedulePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchedulePolicy::Fcfs => "fcfs",
            SchedulePolicy::Lpm => "lpm",
        })
    }
}

/// Past this queue length `lpm` behaves as `fcfs`: sorting by prefix costs a tree walk per
/// waiting request per step.
const LPM_MAX_QUEUE: usize = 128;
/// Shared uncached prefix (tokens) from which `lpm` makes a request wait for another.
const LPM_DEDUP_MIN_TOKENS: usize = 32;

/// Scheduling limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub rank: u32,
    pub max_total_tokens: usize,
    pub max_running_requests: usize,
    /// Extra request-to-token rows (see [`crate::req_to_token`]).
    pub pre_alloc_rows: usize,
    pub chunked_prefill_size: usize,
    pub max_prefill_tokens: usize,
    pub context_len: usize,
    pub policy: SchedulePolicy,
    pub disable_radix_cache: bool,
    /// A prefill step computes only as many prompt tokens as fit in this time (learnt from
    /// earlier steps); `None`: the token limits alone decide.
    pub prefill_step_target: Option<Duration>,
}

/// Counters for `WorkerStatus`.
#[derive(Debug, Default, Clone)]
pub struct StepStats {
    pub generated_tokens: u64,
    /// Prompt tokens of admitted requests, and how many of them came from the cache.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// Why a cache flush was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct FlushRefused {
    pub running: usize,
}

impl fmt::Display for FlushRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot flush the cache while {} requests are running or queued",
            self.running
        )
    }
}

pub struct Scheduler {
    config: SchedulerConfig,
    model: LlamaModel,
    kv: KvBuffers,
    alloc: KvSlotAllocator,
    pool: ReqToTokenPool,
    cache: RadixCache,
    /// Admitted but not yet fully prefilled, in admission order.
    prefilling: VecDeque<Req>,
    /// Not admitted yet (or retracted).
    waiting: VecDeque<Req>,
    /// Prompt computed; decoding.
    running: Vec<Req>,
    finished_rids: Vec<String>,
    /// Prompt tokens per prefill step that fit in `prefill_step_target`.
    step_budget: StepBudget,
    pub stats: StepStats,
    /// Records request milestones (admitted, prefix hit) with `--trace-dir`.
    pub tracer: protocol::msg_trace::MessageTracer,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, model: LlamaModel) -> Self {
        let kv = KvBuffers::new(model.config(), config.max_total_tokens);
        let alloc = KvSlotAllocator::new(config.max_total_tokens);
        let pool = ReqToTokenPool::new(
            config.max_running_requests,
            config.pre_alloc_rows,
            config.context_len,
        );
        Scheduler {
            step_budget: StepBudget::new(config.prefill_step_target),
            config,
            model,
            kv,
            alloc,
            pool,
            cache: RadixCache::new(),
            prefilling: VecDeque::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished_rids: Vec::new(),
            stats: StepStats::default(),
            tracer: protocol::msg_trace::MessageTracer::disabled(),
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

    /// Slots neither free nor evictable: held by requests or locked in the cache.
    pub fn used_tokens(&self) -> usize {
        self.alloc.total() - self.alloc.available() - self.cache.evictable_size()
    }

    pub fn free_slots(&self) -> usize {
        self.alloc.available()
    }

    pub fn evictable_slots(&self) -> usize {
        self.cache.evictable_size()
    }

    /// Share of queried prompt tokens found in the cache since start.
    pub fn cache_hit_rate(&self) -> f64 {
        if self.stats.prompt_tokens == 0 {
            0.0
        } else {
            self.stats.cached_tokens as f64 / self.stats.prompt_tokens as f64
        }
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
            .map(|mut req| {
                self.release(&mut req);
                self.finished_rids.push(req.rid.clone());
                self.error_out(&req.rid, status, message.to_string())
            })
            .collect()
    }

    /// Drop the whole prefix cache; refused while any request is queued or running (their
    /// cached prefixes are locked, and a flush is meant to start from a clean state).
    pub fn flush_cache(&mut self) -> Result<usize, FlushRefused> {
        let busy = self.num_running() + self.num_waiting();
        if busy > 0 {
            return Err(FlushRefused { running: busy });
        }
        let mut freed = 0;
        let alloc = &mut self.alloc;
        self.cache.reset(|slots| {
            freed += slots.len();
            alloc.free(slots)
        });
        Ok(freed)
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

    /// Make `n` slots free, evicting from the cache if needed. False if it cannot.
    fn ensure_free(&mut self, n: usize) -> bool {
        let have = self.alloc.available();
        if have < n {
            let alloc = &mut self.alloc;
            self.cache.evict(n - have, |slots| alloc.free(slots));
        }
        self.alloc.available() >= n
    }

    /// Move waiting requests into the prefill line while the running cap and the pool allow.
    fn admit(&mut self) {
        if self.waiting.is_empty() || self.num_running() >= self.config.max_running_requests {
            return;
        }
        let lpm = self.config.policy == SchedulePolicy::Lpm
            && !self.config.disable_radix_cache
            && self.waiting.len() <= LPM_MAX_QUEUE;
        if lpm {
            // Longest cached prefix first; the sort is stable, so ties stay first come.
            let mut queue: Vec<(usize, Req)> = self
                .waiting
                .drain(..)
                .map(|r| (self.cache.peek_prefix_len(&r.prompt), r))
                .collect();
            queue.sort_by_key(|(hit, _)| std::cmp::Reverse(*hit));
            self.waiting = queue.into_iter().map(|(_, r)| r).collect();
        }
        let mut deferred = VecDeque::new();
        while self.num_running() < self.config.max_running_requests {
            let Some(mut req) = self.waiting.pop_front() else {
                break;
            };
            if lpm && self.shares_uncached_prefix_with_prefilling(&req) {
                deferred.push_back(req);
                continue;
            }
            let Some(row) = self.pool.alloc() else {
                self.waiting.push_front(req);
                break;
            };
            req.row = Some(row);
            self.attach_prefix(&mut req);
            self.prefilling.push_back(req);
        }
        // Deferred requests keep their place ahead of the rest.
        while let Some(req) = deferred.pop_back() {
            self.waiting.push_front(req);
        }
    }

    /// Whether `req` would recompute, uncached, a prefix that a request being prefilled is about
    /// to put into the cache.
    fn shares_uncached_prefix_with_prefilling(&self, req: &Req) -> bool {
        let cached = self.cache.peek_prefix_len(&req.prompt);
        self.prefilling.iter().any(|other| {
            let shared = req
                .prompt
                .iter()
                .zip(&other.prompt)
                .take_while(|(a, b)| a == b)
                .count();
            shared >= cached + LPM_DEDUP_MIN_TOKENS
        })
    }

    /// Take the request's cached prefix (at most all but its last token, which must be computed
    /// to get logits) into its row and lock it.
    fn attach_prefix(&mut self, req: &mut Req) {
        let Some(row) = req.row else {
            return;
        };
        let mut hit = 0;
        if !self.config.disable_radix_cache {
            let key = req.token_range(0, req.total_len() - 1);
            let m = self.cache.match_prefix(&key);
            hit = m.slots.len();
            self.pool.row_mut(row)[..hit].copy_from_slice(&m.slots);
            self.cache.lock(m.node);
            req.cache_node = Some(m.node);
        }
        req.len = hit;
        req.cached_len = hit;
        self.tracer.event(
            "admitted",
            &req.rid,
            Some(format!("prefix_hit_tokens={hit}")),
        );
        if !req.admitted_once {
            req.admitted_once = true;
            req.cached_tokens = hit.min(req.prompt.len()) as u32;
            self.stats.prompt_tokens += req.prompt.len() as u64;
            self.stats.cached_tokens += u64::from(req.cached_tokens);
        }
    }

    /// Insert the request's computed tokens into the cache and make the tree's copy its prefix:
    /// its own duplicate slots are freed, the lock moves to the new node.
    fn cache_computed(&mut self, req: &mut Req) {
        let (Some(row), false) = (req.row, self.config.disable_radix_cache) else {
            return;
        };
        if req.len == req.cached_len {
            return;
        }
        let key = req.token_range(0, req.len);
        let value = self.pool.row(row)[..req.len].to_vec();
        let present = self.cache.insert(&key, &value);
        if present > req.cached_len {
            self.alloc.free(&value[req.cached_len..present]);
        }
        let m = self.cache.match_prefix(&key);
        debug_assert_eq!(m.slots.len(), req.len);
        self.pool.row_mut(row)[..m.slots.len()].copy_from_slice(&m.slots);
        self.cache.lock(m.node);
        if let Some(old) = req.cache_node.replace(m.node) {
            self.cache.unlock(old);
        }
        req.cached_len = req.len;
    }

    /// Give back everything the request holds: its KV goes into the cache (or back to the
    /// allocator with the cache disabled), its lock and its row are released.
    fn release(&mut self, req: &mut Req) {
        if let Some(row) = req.row {
            if self.config.disable_radix_cache {
                let slots = self.pool.row(row)[..req.len].to_vec();
                self.alloc.free(&slots);
            } else {
                self.cache_computed(req);
            }
            if let Some(node) = req.cache_node.take() {
                self.cache.unlock(node);
            }
            self.pool.free(row);
        }
        req.row = None;
        req.len = 0;
        req.cached_len = 0;
    }

    fn prefill_step(&mut self) -> Vec<TokenOut> {
        // Choose chunks: each request at most `chunked_prefill_size`, the step at most
        // `max_prefill_tokens` and what fits in the step's target time, and only what the KV
        // pool can hold now.
        let mut budget = self.step_budget.tokens(self.config.max_prefill_tokens);
        let mut planned: Vec<(usize, usize)> = Vec::new(); // (index in prefilling, chunk start)
        let mut tokens: Vec<Vec<u32>> = Vec::new();
        // Keep one slot per decoding request for their next step, so prefill does not starve
        // them into retraction.
        let reserve = self.running.len();
        for i in 0..self.prefilling.len() {
            if budget == 0 {
                break;
            }
            let mut chunk = self.prefilling[i]
                .pending()
                .min(self.config.chunked_prefill_size)
                .min(budget);
            if !self.ensure_free(chunk + reserve) {
                // A tight pool: take the chunk that fits (chunked prefill makes any size work).
                chunk = chunk.min(self.alloc.available().saturating_sub(reserve));
                if chunk == 0 {
                    break; // running requests finish and free slots first
                }
            }
            let req = &mut self.prefilling[i];
            let start = req.len;
            let row = req.row.expect("admitted requests hold a row");
            let mut fresh = Vec::with_capacity(chunk);
            self.alloc.alloc_into(chunk, &mut fresh);
            self.pool.row_mut(row)[start..start + chunk].copy_from_slice(&fresh);
            budget -= chunk;
            tokens.push(req.token_range(start, start + chunk));
            planned.push((i, start));
        }
        if planned.is_empty() {
            return self.unblock_prefill();
        }

        let started = Instant::now();
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
                .map(|&j| {
                    let (i, start) = planned[j];
                    let row = self.prefilling[i].row.unwrap_or_default();
                    SeqInput {
                        new_tokens: &tokens[j],
                        start_pos: start,
                        slots: &self.pool.row(row)[..start + tokens[j].len()],
                    }
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
                Err(e) => tracing::error!(%e, "prefill forward failed"),
            }
        }
        let computed: usize = tokens.iter().map(Vec::len).sum();
        self.step_budget.observe(computed, started.elapsed());

        // Settle each planned request; rebuild the prefill line without the finished ones.
        let mut line: Vec<Option<Req>> = self.prefilling.drain(..).map(Some).collect();
        for (j, &(i, _)) in planned.iter().enumerate() {
            let Some(mut req) = line[i].take() else {
                continue;
            };
            let computed = logits_of[j].is_some() || hidden_of[j].is_some();
            if computed {
                req.len += tokens[j].len();
                // Share what was just computed: later chunks and other requests reuse it.
                self.cache_computed(&mut req);
            } else if let Some(row) = req.row {
                // The chunk's slots hold no valid KV: back to the allocator.
                let chunk = self.pool.row(row)[req.len..req.len + tokens[j].len()].to_vec();
                self.alloc.free(&chunk);
            }
            if computed && req.pending() > 0 {
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
                _ => outs.push(self.fail(req, 500, "model forward failed".into())),
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
        if self.ensure_free(1) {
            return Vec::new(); // the head request gets the freed room next step
        }
        match self.prefilling.pop_front() {
            Some(req) => vec![self.fail(req, 503, "not enough KV cache for this request".into())],
            None => Vec::new(),
        }
    }

    fn decode_step(&mut self) -> Vec<TokenOut> {
        let mut outs = Vec::new();
        // Make room: evict from the cache, then send back half-prefilled requests (their KV
        // goes to the cache, evictable), then retract the running requests with the fewest
        // generated tokens (cheapest to redo).
        while !self.ensure_free(self.running.len()) {
            let Some(req) = self.prefilling.pop_back() else {
                break;
            };
            self.retract(req);
        }
        while !self.ensure_free(self.running.len()) && self.running.len() > 1 {
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
        let mut fresh = Vec::with_capacity(self.running.len());
        self.alloc.alloc_into(self.running.len(), &mut fresh);
        let mut tokens = Vec::with_capacity(self.running.len());
        for (req, slot) in self.running.iter().zip(&fresh) {
            let row = req.row.expect("running requests hold a row");
            self.pool.row_mut(row)[req.len] = *slot;
            tokens.push(req.token_range(req.len, req.len + 1));
        }
        let seqs: Vec<SeqInput<'_>> = self
            .running
            .iter()
            .zip(&tokens)
            .map(|(req, t)| SeqInput {
                new_tokens: t,
                start_pos: req.len,
                slots: &self.pool.row(req.row.unwrap_or_default())[..req.len + 1],
            })
            .collect();
        let vocab = self.model.config().vocab_size;
        let logits = match self.model.forward(&mut self.kv, &seqs) {
            Ok(l) => {
                for req in &mut self.running {
                    req.len += 1;
                }
                l
            }
            Err(e) => {
                // The new slots hold no valid KV: back to the allocator, never into the cache.
                tracing::error!(%e, "decode forward failed");
                self.alloc.free(&fresh);
                for req in std::mem::take(&mut self.running) {
                    outs.push(self.fail(req, 500, format!("model forward failed: {e}")));
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

    /// Put a request back in the queue; its KV stays in the cache (evictable) so resuming it
    /// may be cheap, and its output so far is kept.
    fn retract(&mut self, mut req: Req) {
        self.release(&mut req);
        self.waiting.push_front(req);
    }

    /// Sample the next token into `req` and say whether it ends the request.
    fn sample_and_check(
        &mut self,
        req: &mut Req,
        logits: &mut [f32],
    ) -> Option<(FinishReason, Option<u32>)> {
        let picked = sample(
            logits,
            &req.params,
            &mut req.rng,
            &req.prompt,
            &req.output,
            req.top_logprobs_num as usize,
        );
        let token = picked.token;
        req.output.push(token);
        if req.return_logprob {
            req.logprobs.push(picked.logprob);
        }
        if req.top_logprobs_num > 0 {
            req.top_logprobs.push(picked.top_logprobs);
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
        let out = self.token_out(req, None, None);
        req.sent = req.output.len();
        out
    }

    fn finish(&mut self, mut req: Req, reason: FinishReason, matched: Option<u32>) -> TokenOut {
        self.release(&mut req);
        self.finished_rids.push(req.rid.clone());
        self.token_out(&req, Some(reason), matched)
    }

    /// The output message for what `req` produced since its last one.
    fn token_out(&self, req: &Req, reason: Option<FinishReason>, matched: Option<u32>) -> TokenOut {
        TokenOut {
            rid: req.rid.clone(),
            output_ids: req.output[req.sent..].to_vec(),
            finish_reason: reason,
            matched_stop: matched,
            prompt_tokens: req.prompt.len() as u32,
            completion_tokens: req.output.len() as u32,
            cached_tokens: req.cached_tokens,
            dp_rank: Some(self.config.rank),
            logprobs: req
                .return_logprob
                .then(|| req.logprobs[req.sent..].to_vec()),
            top_logprobs: (req.top_logprobs_num > 0).then(|| req.top_logprobs[req.sent..].to_vec()),
            embedding: None,
            error: None,
        }
    }

    fn fail(&mut self, mut req: Req, status: u16, message: String) -> TokenOut {
        self.release(&mut req);
        self.finished_rids.push(req.rid.clone());
        self.error_out(&req.rid, status, message)
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
