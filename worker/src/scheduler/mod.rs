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
//!
//! Layout: this file holds the state and the public API (queues, submit, abort, outputs);
//! [`admission`] decides what enters the prefill line, [`prefill`] plans and runs prompt chunks,
//! [`decode`] makes room and runs one token for every running request. Where a request's KV
//! lives is [`KvMemory`]'s business.

mod admission;
mod decode;
mod decode_leg;
mod ledger;
mod legs;
mod prefill;
mod prefill_leg;

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use grammar::LazyGrammars;

use protocol::{DisaggMode, FinishReason, GenerateReq, TokenOut};

use crate::disagg::DisaggConfig;
use crate::error::{RequestError, WorkerError};
use crate::kv::memory::{KvMemory, KvMemoryConfig};
use crate::model_runner::ModelRunner;
use crate::request::Req;
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

/// Scheduling limits.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub rank: u32,
    pub max_total_tokens: usize,
    pub max_running_requests: usize,
    /// Extra request-to-token rows (see [`crate::kv::req_to_token`]).
    pub pre_alloc_rows: usize,
    pub chunked_prefill_size: usize,
    pub max_prefill_tokens: usize,
    pub context_len: usize,
    pub policy: SchedulePolicy,
    pub disable_radix_cache: bool,
    /// A prefill step computes only as many prompt tokens as fit in this time (learnt from
    /// earlier steps); `None`: the token limits alone decide.
    pub prefill_step_target: Option<Duration>,
    /// A prefill or decode worker's settings; `None` for a unified worker.
    pub disagg: Option<DisaggConfig>,
    /// Waiting requests at most (`--max-queued-requests`); `None`: no limit.
    pub max_queued_requests: Option<usize>,
    /// Finish-first (`--finish-first-tokens`); `None`: a waiting prompt always goes first.
    pub finish_first: Option<FinishFirst>,
}

/// Finish-first: while a running request is within `tokens` of its `max_new_tokens`, a waiting
/// prompt's prefill waits, at most `max_wait` from its arrival. On CPU ranks a prefill step
/// stops every decode, so a short answer whose few gaps take another prompt's prefill misses
/// a mean-ITL target; a prompt has TTFT to spare (docs/ENGINE.md, "Finish-first").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishFirst {
    pub tokens: usize,
    pub max_wait: Duration,
}

/// How [`Scheduler::end`] ends a request.
enum Ending {
    Abort,
    Fail(u16, String),
}

/// Counters for `WorkerStatus`.
#[derive(Debug, Default, Clone)]
pub struct StepStats {
    pub generated_tokens: u64,
    /// Prompt tokens of admitted requests, and how many of them came from the cache.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Prompt tokens computed by prefill steps, and the seconds those steps took.
    pub prefill_tokens: u64,
    pub prefill_seconds: f64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    model: ModelRunner,
    mem: KvMemory,
    /// Admitted but not yet fully prefilled, in admission order.
    prefilling: VecDeque<Req>,
    /// Not admitted yet (or retracted).
    waiting: VecDeque<Req>,
    /// Prompt computed; decoding.
    running: Vec<Req>,
    /// Ended since the last status: the controller stops counting them in flight.
    finished_rids: Vec<String>,
    /// The last rids listed finished, so a late Abort for one is not listed a second time.
    recently_finished: RecentRids,
    /// Prompt tokens per prefill step that fit in `prefill_step_target`.
    step_budget: StepBudget,
    pub stats: StepStats,
    /// Records request milestones (admitted, prefix hit) with `--trace-dir`.
    pub tracer: protocol::msg_trace::MessageTracer,
    /// Disaggregated serving: requests whose KV moves between workers.
    legs: legs::Legs,
    /// Structured output: the model's vocabulary for the requests' constraints.
    grammars: Arc<LazyGrammars>,
}

/// The last [`RecentRids::CAPACITY`] distinct rids, oldest forgotten first. A late Abort
/// follows its request's end by one message's trip through the controller, far fewer
/// requests than this apart.
#[derive(Default)]
struct RecentRids {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl RecentRids {
    const CAPACITY: usize = 4096;

    fn insert(&mut self, rid: &str) {
        if self.set.contains(rid) {
            return;
        }
        if self.order.len() == Self::CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(rid.to_string());
        self.set.insert(rid.to_string());
    }

    fn contains(&self, rid: &str) -> bool {
        self.set.contains(rid)
    }
}

impl Scheduler {
    /// A scheduler over `model` (the real one or a simulated GPU's; see [`ModelRunner`]).
    pub fn new(config: SchedulerConfig, model: impl Into<ModelRunner>) -> Self {
        let model = model.into();
        let mem = KvMemory::new(
            model.kv_buffers(config.max_total_tokens),
            KvMemoryConfig {
                max_total_tokens: config.max_total_tokens,
                max_running_requests: config.max_running_requests,
                pre_alloc_rows: config.pre_alloc_rows,
                context_len: config.context_len,
                radix_cache: !config.disable_radix_cache,
            },
        );
        Scheduler {
            legs: legs::Legs::new(config.disagg.clone()),
            step_budget: StepBudget::new(config.prefill_step_target),
            config,
            model,
            mem,
            prefilling: VecDeque::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished_rids: Vec::new(),
            recently_finished: RecentRids::default(),
            stats: StepStats::default(),
            tracer: protocol::msg_trace::MessageTracer::disabled(),
            grammars: Arc::new(LazyGrammars::none(grammar::BUILTIN_HAS_NO_BYTES)),
        }
    }

    /// Where constraints are compiled (by default nowhere, as for the built-in model).
    pub fn set_grammars(&mut self, grammars: Arc<LazyGrammars>) {
        self.grammars = grammars;
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn model(&self) -> &ModelRunner {
        &self.model
    }

    /// Whether a step has something to compute. (Requests waiting for their KV are not work:
    /// the frames that advance them wake the worker.)
    pub fn has_work(&self) -> bool {
        !(self.prefilling.is_empty()
            && self.waiting.is_empty()
            && self.running.is_empty()
            && self.legs.ready() == 0)
    }

    /// Whether any request is held, those waiting for their KV included (a drain waits for
    /// them too).
    pub fn holds_requests(&self) -> bool {
        self.has_work() || self.legs.queued() > 0
    }

    pub fn num_running(&self) -> usize {
        self.running.len() + self.prefilling.len()
    }

    /// Queued requests, those whose KV is on its way included.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.legs.queued()
    }

    /// The prefill line for `WorkerStatus.prefill`: prompt tokens still to compute (waiting
    /// requests net of what the prefix cache holds of them now, plus the rest of those being
    /// prefilled) and the prefill steps' totals since start.
    pub fn prefill_status(&self) -> protocol::PrefillStatus {
        let waiting: usize = self
            .waiting
            .iter()
            .map(|r| {
                let cached = self.mem.peek_prefix_len(&r.prompt).max(r.len);
                r.total_len().saturating_sub(cached)
            })
            .sum();
        let prefilling: usize = self.prefilling.iter().map(Req::pending).sum();
        protocol::PrefillStatus {
            backlog_tokens: (waiting + prefilling) as u64,
            computed_tokens: self.stats.prefill_tokens,
            busy_seconds: self.stats.prefill_seconds,
        }
    }

    /// Slots neither free nor evictable: held by requests or locked in the cache.
    pub fn used_tokens(&self) -> usize {
        self.mem.used_tokens()
    }

    pub fn free_slots(&self) -> usize {
        self.mem.free_slots()
    }

    pub fn evictable_slots(&self) -> usize {
        self.mem.evictable_slots()
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

    /// Queue a generation request, or refuse it at once with a 400. A disaggregated leg goes
    /// to its role's queue (a prefill leg is answered through its decode worker, never here).
    pub fn submit(&mut self, mut req: GenerateReq) -> Option<TokenOut> {
        let check = self
            .validate(&req.input_ids, req.sampling.max_new_tokens)
            .and_then(|()| self.queue_has_room());
        match (self.legs.mode(), req.disagg.take(), check) {
            (DisaggMode::Prefill, Some(leg), check) => {
                self.prefill_leg_arrived(req, leg, check.err());
                None
            }
            (mode, leg, Err(e)) => {
                if let (DisaggMode::Decode, Some(leg)) = (mode, leg) {
                    // The prefill worker would otherwise wait for this request's KvReady.
                    let to =
                        crate::disagg::KvPeer::Endpoint(crate::disagg::PrefillEndpoint::of(&leg));
                    self.legs
                        .out
                        .abort_room(to, leg.room, e.status(), e.to_string());
                }
                Some(self.refused_out(&req.rid, e.status(), e.to_string()))
            }
            (DisaggMode::Decode, Some(leg), Ok(())) => self.decode_leg_arrived(req, leg),
            // Without a pairing (or on a unified worker) the request is computed here whole.
            (_, _, Ok(())) => {
                self.waiting.push_back(Req::generate(req));
                None
            }
        }
    }

    /// Queue an embedding request, or refuse it at once with a 400.
    pub fn submit_embed(&mut self, rid: String, input_ids: Vec<u32>) -> Option<TokenOut> {
        if let Err(e) = self
            .validate(&input_ids, 0)
            .and_then(|()| self.queue_has_room())
        {
            return Some(self.refused_out(&rid, e.status(), e.to_string()));
        }
        self.waiting.push_back(Req::embed(rid, input_ids));
        None
    }

    /// Refuses a new request while `--max-queued-requests` are waiting.
    fn queue_has_room(&self) -> Result<(), RequestError> {
        match self.config.max_queued_requests {
            Some(cap) if self.num_waiting() >= cap => Err(RequestError::QueueFull {
                rank: self.config.rank,
                cap,
            }),
            _ => Ok(()),
        }
    }

    fn validate(&self, ids: &[u32], max_new_tokens: u32) -> Result<(), RequestError> {
        let vocab = self.model.config().vocab_size;
        if ids.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if let Some(&id) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(RequestError::TokenOutsideVocab { id, vocab });
        }
        if ids.len() + max_new_tokens as usize > self.config.context_len {
            return Err(RequestError::LongerThanContext {
                prompt: ids.len(),
                max_new_tokens,
                context_len: self.config.context_len,
            });
        }
        if ids.len() + 1 > self.config.max_total_tokens {
            return Err(RequestError::LargerThanPool {
                prompt: ids.len(),
                pool: self.config.max_total_tokens,
            });
        }
        Ok(())
    }

    /// Abort one request (or all with `None`); each aborted request gets its final message.
    pub fn abort(&mut self, rid: Option<&str>) -> Vec<TokenOut> {
        let matches = |r: &Req| rid.is_none_or(|id| r.rid == id);
        match (self.end_where(matches, &Ending::Abort), rid) {
            (Some(outs), _) => outs,
            (None, Some(rid)) => {
                // Not held here. If its dispatch never arrived, it is listed finished all the
                // same, so a controller that still counts it in flight on this rank stops. If
                // it ended here already, it was listed then: listed again, it could end the
                // controller's count of a later request that reuses the rid on this rank.
                if !self.recently_finished.contains(rid) {
                    self.note_refused(rid);
                }
                Vec::new()
            }
            (None, None) => Vec::new(),
        }
    }

    /// Fail every request (worker shutting down).
    pub fn fail_all(&mut self, status: u16, message: &str) -> Vec<TokenOut> {
        let ending = Ending::Fail(status, message.to_string());
        let outs = self.end_where(|_| true, &ending).unwrap_or_default();
        // Rooms still pairing hold no request now: a decode worker whose `KvReady` waits in
        // one hears `PeerGone` when this rank leaves.
        if let legs::Role::Prefill(p) = &mut self.legs.role {
            p.bootstrap
                .retain(|_, room| matches!(room, legs::Room::GivenUp { .. }));
        }
        outs
    }

    /// Ends every request `pick` picks, in every queue, as `ending` says: the final output of
    /// each this worker answers, in queue order; `None` when none was picked. A prefill
    /// worker's legs end with no output (their decode workers are told and answer the
    /// clients).
    fn end_where(&mut self, pick: impl Fn(&Req) -> bool, ending: &Ending) -> Option<Vec<TokenOut>> {
        let legs = self.legs.take(&pick);
        let mut ended: Vec<Req> = Vec::new();
        for queue in [&mut self.waiting, &mut self.prefilling] {
            let (gone, keep): (VecDeque<Req>, VecDeque<Req>) =
                queue.drain(..).partition(|r| pick(r));
            *queue = keep;
            ended.extend(gone);
        }
        ended.extend(legs.ready);
        let (gone, keep): (Vec<Req>, Vec<Req>) = self.running.drain(..).partition(|r| pick(r));
        self.running = keep;
        ended.extend(gone);
        if ended.is_empty() && legs.unpaired.is_empty() && legs.arriving.is_empty() {
            return None;
        }
        for (room, req) in legs.unpaired {
            self.end_unpaired(room, req);
        }
        let mut outs = Vec::new();
        for (mut arriving, ready_sent) in legs.arriving {
            self.drop_transfer(&mut arriving, ready_sent);
            outs.extend(self.end(arriving.req, ending));
        }
        for req in ended {
            outs.extend(self.end(req, ending));
        }
        Some(outs)
    }

    /// Ends `req` as `ending` says: its final output, or for a prefill leg none (its decode
    /// worker is told, and answers the client).
    fn end(&mut self, mut req: Req, ending: &Ending) -> Option<TokenOut> {
        match (req.leg.take(), ending) {
            (Some(leg), Ending::Abort) => {
                let reason = "the prefill worker dropped the request".into();
                self.end_leg(req, leg, 503, reason);
                None
            }
            (Some(leg), Ending::Fail(status, message)) => {
                self.end_leg(req, leg, *status, message.clone());
                None
            }
            (None, Ending::Abort) => Some(self.finish(req, FinishReason::Abort, None)),
            (None, Ending::Fail(status, message)) => Some(self.fail(req, *status, message.clone())),
        }
    }

    /// Report the radix cache's contents as KV events in blocks of `block_size` tokens (0:
    /// off); before the first request.
    pub fn enable_kv_events(&mut self, block_size: usize) {
        self.mem.enable_kv_events(block_size);
    }

    /// KV events for the controller (see [`crate::kv::events`]).
    pub fn take_kv_events(&mut self) -> Vec<protocol::KvEvents> {
        self.mem.take_kv_events(self.config.rank)
    }

    pub fn request_kv_snapshot(&mut self) {
        self.mem.request_kv_snapshot();
    }

    /// Drop the whole prefix cache; refused while any request is queued or running (their
    /// cached prefixes are locked, and a flush is meant to start from a clean state).
    pub fn flush_cache(&mut self) -> Result<usize, WorkerError> {
        let busy = self.num_running() + self.num_waiting();
        if busy > 0 {
            return Err(WorkerError::FlushBusy { running: busy });
        }
        Ok(self.mem.flush())
    }

    /// Run one scheduling step; returns the messages it produced.
    pub fn step(&mut self) -> Vec<TokenOut> {
        self.admit_ready();
        self.admit();
        let outs = if !self.prefilling.is_empty() && !self.finishing_first() {
            self.prefill_step()
        } else if !self.running.is_empty() {
            self.decode_step()
        } else {
            Vec::new()
        };
        self.admit_ready();
        self.admit_prealloc();
        outs
    }

    /// Whether the waiting prompts wait for a running request near its end ([`FinishFirst`]):
    /// only while none of them has waited its bound (the queue's order may put a newer one
    /// first); the end is `max_new_tokens` (a stop may come sooner).
    fn finishing_first(&self) -> bool {
        let Some(ff) = self.config.finish_first else {
            return false;
        };
        let oldest = self.prefilling.iter().map(|r| r.arrived).min();
        oldest.is_some_and(|t| t.elapsed() < ff.max_wait)
            && self.running.iter().any(|r| {
                (r.params.max_new_tokens as usize).saturating_sub(r.output.len()) <= ff.tokens
            })
    }

    /// The tokens a running request produced since its last message.
    fn progress(&self, req: &mut Req) -> TokenOut {
        let out = self.token_out(&mut *req, None, None);
        req.sent = req.output.len();
        out
    }

    /// Ends a request this worker answers (never a prefill leg: see [`Self::end`]).
    fn finish(&mut self, mut req: Req, reason: FinishReason, matched: Option<u32>) -> TokenOut {
        debug_assert!(req.leg.is_none(), "a prefill leg answers no client");
        self.mem.release(&mut req);
        self.note_finished(&req.rid);
        self.token_out(&mut req, Some(reason), matched)
    }

    /// The output message for what `req` produced since its last one (the first carries the
    /// routing records the client asked for).
    fn token_out(
        &self,
        req: &mut Req,
        reason: Option<FinishReason>,
        matched: Option<u32>,
    ) -> TokenOut {
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
            routing: std::mem::take(&mut req.routing),
        }
    }

    /// [`Self::finish`] with an error.
    fn fail(&mut self, mut req: Req, status: u16, message: String) -> TokenOut {
        debug_assert!(req.leg.is_none(), "a prefill leg answers no client");
        self.mem.release(&mut req);
        self.note_finished(&req.rid);
        self.error_out(&req.rid, status, message)
    }

    /// The answer to a request refused before it was taken in. The controller counted it in
    /// flight when it dispatched it, so it ends for the controller too (the next status lists
    /// it), or its rid would stay in flight until this rank leaves and then be failed again.
    fn refused_out(&mut self, rid: &str, status: u16, message: String) -> TokenOut {
        self.note_refused(rid);
        self.error_out(rid, status, message)
    }

    /// Lists a refused `rid` among the finished ones. A rid over the limit is left out: the
    /// controller refuses those itself, so it never counted one.
    fn note_refused(&mut self, rid: &str) {
        if protocol::rid_problem(rid).is_none() {
            self.note_finished(rid);
        }
    }

    /// Lists `rid` among the finished ones for the next status.
    fn note_finished(&mut self, rid: &str) {
        self.finished_rids.push(rid.to_string());
        self.recently_finished.insert(rid);
    }

    fn error_out(&self, rid: &str, status: u16, message: String) -> TokenOut {
        let mut out = TokenOut::error(rid, status, message);
        out.dp_rank = Some(self.config.rank);
        out
    }
}

#[cfg(test)]
mod constraint_tests;
#[cfg(test)]
mod legs_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
pub(crate) mod tests;
