//! The worker's main loop as an actor with explicit state: what arrives ([`WorkerActor::on_inbound`]),
//! one round of compute and status ([`WorkerActor::tick`]), the drain on SIGTERM
//! ([`WorkerActor::keep_running`]) and the farewell ([`WorkerActor::leave`]). Sockets stay
//! outside, behind [`Outbox`], so each handler runs in a unit test with a recording outbox.
//!
//! Why not an actor framework (actix) here: this loop is a compute loop. A step holds the
//! thread for milliseconds to seconds of model work on the rayon pool, and the design wants
//! one owner of the scheduler and its KV memory with no locks; the link thread already turns
//! the controller's socket into a channel this loop drains between steps. A mailbox with an
//! executor would add a hop per message and nothing the channel does not give.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernels::KernelPath;
use protocol::{Message, Shutdown, TokenOut, WorkerStatus};

use crate::link::{HeldRids, Inbound};
use crate::scheduler::Scheduler;

/// Status snapshots go out at most this often while the worker is busy.
const STATUS_MIN_INTERVAL: Duration = Duration::from_millis(20);
/// ...and at least this often while it is idle.
const STATUS_IDLE_INTERVAL: Duration = Duration::from_millis(1000);

/// Where the actor's messages go: outputs to the tokenizer, status and farewells to the
/// controller (through the link's outbox).
pub trait Outbox {
    fn to_tokenizer(&mut self, msg: &Message);
    fn to_controller(&mut self, msg: &Message);
    /// A KV message to a peer worker (disaggregated roles).
    fn to_peer(&mut self, send: crate::disagg::KvSend);
}

/// The actor's state besides the scheduler.
pub struct WorkerActor<O: Outbox> {
    pub(crate) rank: u32,
    drain_timeout: Duration,
    pub(crate) sched: Scheduler,
    pool: rayon::ThreadPool,
    kernel_path: KernelPath,
    max_total_tokens: usize,
    out: O,
    /// Requests accepted and not yet answered (the link reports them in its `Hello`).
    held: HeldRids,
    /// Set by a signal, a `Shutdown` from the controller or a refusal; shared with the link.
    stop: Arc<AtomicBool>,
    refused: Option<String>,
    /// When a drain must end; `None` until one starts.
    drain_deadline: Option<Instant>,
    status: StatusClock,
    /// The controller's `dispatch_seq` of the last request taken in (reported in each status,
    /// so the controller knows which of its dispatches the status counts).
    taken_seq: u64,
    /// What the ledger check found since start (`WorkerStatus.invariant_violations`).
    violations: Vec<String>,
}

/// When the next status snapshot is due.
struct StatusClock {
    last: Instant,
    /// Send one at the next tick whatever the time (the first one, so the controller sees this
    /// rank's load from the moment it joins).
    now: bool,
    last_generated: u64,
    /// `WorkerStatus.status_seq` of the last one sent (0: none yet).
    seq: u64,
}

impl<O: Outbox> WorkerActor<O> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: u32,
        drain_timeout: Duration,
        sched: Scheduler,
        pool: rayon::ThreadPool,
        kernel_path: KernelPath,
        out: O,
        held: HeldRids,
        stop: Arc<AtomicBool>,
    ) -> Self {
        WorkerActor {
            rank,
            drain_timeout,
            max_total_tokens: sched.config().max_total_tokens,
            sched,
            pool,
            kernel_path,
            out,
            held,
            stop,
            refused: None,
            drain_deadline: None,
            taken_seq: 0,
            violations: Vec::new(),
            status: StatusClock {
                last: Instant::now(),
                now: true,
                last_generated: 0,
                seq: 0,
            },
        }
    }

    /// Whether there is anything to compute (the loop blocks on its inbox only when not).
    pub fn busy(&self) -> bool {
        self.sched.has_work()
    }

    /// Why a peer refused this worker (`refused by the controller: …`), if one did.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// Between rounds: false when the worker should leave. A stop request starts a drain (the
    /// controller stops routing here at once; what is held finishes within the drain timeout),
    /// or ends the loop at once when nothing is held or the timeout is zero.
    pub fn keep_running(&mut self) -> bool {
        if self.refused.is_some() {
            return false;
        }
        if self.stop.load(Ordering::Relaxed) && self.drain_deadline.is_none() {
            if !self.sched.holds_requests() || self.drain_timeout.is_zero() {
                return false;
            }
            self.begin_drain();
        }
        match self.drain_deadline {
            Some(deadline) => self.sched.holds_requests() && Instant::now() < deadline,
            None => true,
        }
    }

    fn begin_drain(&mut self) {
        tracing::info!(
            rank = self.rank,
            running = self.sched.num_running(),
            waiting = self.sched.num_waiting(),
            drain_timeout_s = self.drain_timeout.as_secs_f64(),
            "draining before exit"
        );
        self.out.to_controller(&Message::Shutdown(Shutdown {
            rank: Some(self.rank),
            reason: "draining".into(),
            drain_timeout_s: Some(self.drain_timeout.as_secs_f64()),
        }));
        self.drain_deadline = Some(Instant::now() + self.drain_timeout);
    }

    /// One message from the controller (or the link's verdict).
    pub fn on_inbound(&mut self, item: Inbound) {
        let msg = match item {
            Inbound::Refused(reason) => {
                self.refused = Some(reason);
                self.stop.store(true, Ordering::Relaxed);
                return;
            }
            Inbound::Msg(msg) => msg,
            Inbound::Kv(kv) => {
                let outs = self.sched.on_kv(kv);
                return self.emit_all(outs);
            }
        };
        // Log lines about a request while it is taken in carry its rid.
        let _span = msg
            .rid()
            .map(|rid| tracing::info_span!("request", rid).entered());
        if let Some(seq) = msg.dispatch_seq() {
            // Requests arrive in dispatch order on one connection; a controller this worker
            // registers with again numbers on after the rejoin Hello's taken_seq (one from
            // before that field numbers from 1 again), so this is the last seen, not the largest.
            self.taken_seq = seq;
        }
        match msg {
            Message::GenerateReq(req) => self.on_generate(req),
            Message::PeerGone(gone) => {
                tracing::info!(rank = gone.rank, reason = %gone.reason, "peer rank left");
                let outs = self.sched.peer_gone(gone.rank, &gone.reason);
                self.emit_all(outs);
            }
            Message::EmbedReq(req) => self.on_embed(req),
            Message::Abort(abort) => {
                let outs = self.sched.abort(abort.rid.as_deref());
                self.emit_all(outs);
            }
            Message::FlushCache(_) => match self.sched.flush_cache() {
                Ok(freed) => tracing::info!(freed_slots = freed, "prefix cache flushed"),
                Err(refused) => tracing::warn!(%refused, "flush_cache refused"),
            },
            Message::KvSnapshotReq(_) => {
                // With the next status, which goes out at once.
                self.sched.request_kv_snapshot();
                self.status.now = true;
            }
            Message::Shutdown(s) => {
                tracing::info!(reason = %s.reason, "controller asked this worker to stop");
                self.stop.store(true, Ordering::Relaxed);
            }
            other => tracing::warn!(msg = other.type_name(), "unexpected message; dropped"),
        }
    }

    /// A generation request: refused, dropped as a duplicate, or submitted to the scheduler.
    fn on_generate(&mut self, req: protocol::GenerateReq) {
        if let Some(out) = self.refusal(&req.rid) {
            // A disaggregated leg's other side hears of it too.
            let out = self.sched.refuse(req, out);
            return self.emit_all(out);
        }
        // Held until its final output goes out (a refusal is one too). A prefill leg
        // never has one here: its decode worker answers the client.
        let answered_here =
            req.disagg.is_none() || self.sched.disagg_mode() != protocol::DisaggMode::Prefill;
        if answered_here {
            if self.duplicate(&req.rid) {
                return;
            }
            self.held.insert(&req.rid);
        }
        let out = self.sched.submit(req);
        self.emit_all(out);
    }

    /// An embedding request: refused, dropped as a duplicate, or submitted to the scheduler.
    fn on_embed(&mut self, req: protocol::EmbedReq) {
        if let Some(out) = self.refusal(&req.rid) {
            let out = self.sched.refuse_embed(out);
            return self.emit(out);
        }
        if self.duplicate(&req.rid) {
            return;
        }
        self.held.insert(&req.rid);
        if let Some(out) = self.sched.submit_embed(req.rid, req.input_ids) {
            self.emit(out);
        }
    }

    /// A request whose rid one held here already has: dropped, unanswered. The tokenizer never
    /// sends one (it refuses a rid in flight, and this worker holds a rid until its final
    /// output is sent), so only a faulty or hostile peer does; an answer to it would reach the
    /// first request's client, and running it would hold two requests under one rid.
    fn duplicate(&self, rid: &str) -> bool {
        let held = self.held.contains(rid);
        if held {
            tracing::warn!(
                rid,
                "a second request with the rid of one held here; dropped"
            );
        }
        held
    }

    /// The answer to a request this worker does not take: a rid over the limit, or any new
    /// request while draining.
    fn refusal(&self, rid: &str) -> Option<TokenOut> {
        if let Some(why) = protocol::rid_problem(rid) {
            // The controller refuses those already, so only a peer that skips it meets this.
            tracing::warn!(rid_len = rid.len(), "request refused: {why}");
            return Some(TokenOut::error(rid, 400, why));
        }
        self.drain_deadline.map(|_| {
            let mut out = TokenOut::error(
                rid,
                503,
                format!(
                    "data parallel rank {} is draining and takes no new requests",
                    self.rank
                ),
            );
            out.dp_rank = Some(self.rank);
            out
        })
    }

    /// One round: a scheduler step when there is work, then a status snapshot when one is due.
    pub fn tick(&mut self) {
        let stepped = self.sched.has_work();
        if stepped {
            let sched = &mut self.sched;
            let outs = self.pool.install(|| sched.step());
            self.emit_all(outs);
        }
        let outs = self.sched.expire();
        self.emit_all(outs);
        self.maybe_status(stepped);
    }

    /// Going idle is reported at once, not a throttle or idle interval later: `/flush_cache`
    /// and the router read "nothing running" from this status.
    fn maybe_status(&mut self, stepped: bool) {
        let went_idle = stepped && !self.sched.has_work();
        let due = self.status.last.elapsed();
        if !(self.status.now
            || went_idle
            || (stepped && due >= STATUS_MIN_INTERVAL)
            || due >= STATUS_IDLE_INTERVAL)
        {
            return;
        }
        self.check_ledger();
        let sched = &mut self.sched;
        let generated = sched.stats.generated_tokens;
        let status = WorkerStatus {
            rank: self.rank,
            timestamp: crate::clock::unix_time(),
            num_running_reqs: sched.num_running() as u32,
            num_waiting_reqs: sched.num_waiting() as u32,
            num_used_tokens: sched.used_tokens() as u64,
            max_total_tokens: self.max_total_tokens as u64,
            cache_hit_rate: sched.cache_hit_rate(),
            gen_throughput: (generated - self.status.last_generated) as f64
                / due.as_secs_f64().max(1e-3),
            finished_rids: sched.take_finished_rids(),
            num_free_tokens: sched.free_slots() as u64,
            num_evictable_tokens: sched.evictable_slots() as u64,
            kernel_path: self.kernel_path.name().to_string(),
            taken_seq: Some(self.taken_seq),
            disagg: sched.disagg_status(),
            simulated: sched.model().simulated().map(|p| p.name.clone()),
            status_seq: Some(self.status.seq + 1),
            prefill: Some(sched.prefill_status()),
            invariant_violations: self.violations.clone(),
        };
        self.status = StatusClock {
            last: Instant::now(),
            now: false,
            last_generated: generated,
            seq: self.status.seq + 1,
        };
        self.out.to_controller(&Message::WorkerStatus(status));
        // What the prefix cache stored and evicted, after the status that counts the same step.
        for batch in self.sched.take_kv_events() {
            self.out.to_controller(&Message::KvEvents(batch));
        }
    }

    /// The ledger check before each status (`scheduler/ledger.rs`): at quiet points
    /// in every build (it costs O(1) then), and rid by rid in debug builds. What it finds is
    /// kept and reported in every later status, so a soak polling the statuses sees it.
    fn check_ledger(&mut self) {
        let per_rid = cfg!(debug_assertions);
        let held = if per_rid || !self.sched.holds_requests() {
            self.held.snapshot()
        } else {
            Vec::new()
        };
        let found = self.sched.ledger_violations(&held, per_rid);
        for line in protocol::note_violations(&mut self.violations, found) {
            tracing::error!(rank = self.rank, "ledger check: {line}");
        }
    }

    /// Leaving: no request may hang, so everything still held fails with a clear error, and the
    /// controller hears why this rank goes. Returns that reason.
    pub fn leave(&mut self) -> String {
        let why = self.farewell_reason();
        let outs = self.sched.fail_all(503, &why);
        self.emit_all(outs);
        self.out.to_controller(&Message::Shutdown(Shutdown {
            rank: Some(self.rank),
            reason: why.clone(),
            drain_timeout_s: None,
        }));
        why
    }

    fn farewell_reason(&self) -> String {
        let rank = self.rank;
        match (&self.refused, self.drain_deadline) {
            // The reason names who refused (`refused by the controller: …`, `… the tokenizer: …`).
            (Some(reason), _) => format!("worker {rank} was {reason}"),
            // Only what is still held when the drain ends ran out of time.
            (None, Some(_)) if self.sched.holds_requests() => format!(
                "data parallel rank {rank} stopped: its drain timeout ({:.1}s) ran out",
                self.drain_timeout.as_secs_f64()
            ),
            (None, Some(deadline)) => format!(
                "data parallel rank {rank} drained: its requests finished in {:.1}s",
                (Instant::now() + self.drain_timeout)
                    .saturating_duration_since(deadline)
                    .as_secs_f64()
            ),
            (None, None) => format!("data parallel rank {rank} is shutting down"),
        }
    }

    /// Outputs to the tokenizer, then the KV messages the scheduler queued.
    fn emit_all(&mut self, outs: impl IntoIterator<Item = TokenOut>) {
        for out in outs {
            self.emit(out);
        }
        for send in self.sched.take_kv_out() {
            self.out.to_peer(send);
        }
    }

    /// An output to the tokenizer; a final one releases its rid.
    fn emit(&mut self, out: TokenOut) {
        if out.finish_reason.is_some() {
            self.held.remove(&out.rid);
        }
        self.out.to_tokenizer(&Message::TokenOut(out));
    }
}

#[cfg(test)]
use tests as tests_support;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BuiltinSize, LlamaModel, ModelConfig};
    use crate::scheduler::{SchedulePolicy, SchedulerConfig};
    use protocol::FinishReason;

    #[derive(Default)]
    pub(super) struct Recorded {
        pub(super) tokenizer: Vec<Message>,
        pub(super) controller: Vec<Message>,
        peers: Vec<crate::disagg::KvSend>,
    }

    impl Outbox for Recorded {
        fn to_tokenizer(&mut self, msg: &Message) {
            self.tokenizer.push(msg.clone());
        }
        fn to_controller(&mut self, msg: &Message) {
            self.controller.push(msg.clone());
        }
        fn to_peer(&mut self, send: crate::disagg::KvSend) {
            self.peers.push(send);
        }
    }

    /// An actor whose cache reports KV events in blocks of `block_size`.
    pub(super) fn actor_with_events(block_size: usize) -> WorkerActor<Recorded> {
        let mut a = actor(Duration::from_secs(5));
        a.sched.enable_kv_events(block_size);
        a
    }

    pub(super) fn actor(drain_timeout: Duration) -> WorkerActor<Recorded> {
        actor_with(drain_timeout, None)
    }

    fn actor_with(
        drain_timeout: Duration,
        max_queued_requests: Option<usize>,
    ) -> WorkerActor<Recorded> {
        let config = ModelConfig::builtin(BuiltinSize::Tiny);
        let model = LlamaModel::dummy(config, 7);
        let sched = Scheduler::new(
            SchedulerConfig {
                rank: 3,
                max_total_tokens: 512,
                max_running_requests: 4,
                pre_alloc_rows: 0,
                chunked_prefill_size: 64,
                max_prefill_tokens: 256,
                context_len: 128,
                policy: SchedulePolicy::Lpm,
                disable_radix_cache: false,
                prefill_step_target: None,
                disagg: None,
                max_queued_requests,
                finish_first: None,
            },
            model,
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        WorkerActor::new(
            3,
            drain_timeout,
            sched,
            pool,
            KernelPath::Portable,
            Recorded::default(),
            HeldRids::default(),
            Arc::new(AtomicBool::new(false)),
        )
    }

    pub(super) fn generate(rid: &str, max_new_tokens: u32) -> Inbound {
        let req = crate::scheduler::tests::req(rid, vec![1, 5, 9, 13], max_new_tokens);
        Inbound::Msg(Message::GenerateReq(req))
    }

    /// The final output of `rid` among what went to the tokenizer.
    fn final_of<'a>(a: &'a WorkerActor<Recorded>, rid: &str) -> Option<&'a TokenOut> {
        a.out.tokenizer.iter().find_map(|m| match m {
            Message::TokenOut(o) if o.rid == rid && o.finish_reason.is_some() => Some(o),
            _ => None,
        })
    }

    #[test]
    fn a_request_runs_to_its_end_and_the_first_status_goes_out_at_once() {
        let mut a = actor(Duration::from_secs(5));
        a.on_inbound(generate("r1", 3));
        assert_eq!(a.held.snapshot(), ["r1"]);
        while a.busy() {
            a.tick();
        }
        let out = final_of(&a, "r1").expect("a final output");
        assert_eq!(out.finish_reason, Some(FinishReason::Length));
        assert_eq!(out.completion_tokens, 3);
        assert!(
            a.held.snapshot().is_empty(),
            "the final output releases the rid"
        );
        let Some(Message::WorkerStatus(s)) = a.out.controller.first() else {
            panic!("no status: {:?}", a.out.controller);
        };
        assert_eq!((s.rank, s.kernel_path.as_str()), (3, "portable"));
        // Going idle is reported by the last tick, with the finished rid.
        let Some(Message::WorkerStatus(last)) = a.out.controller.last() else {
            panic!("no status");
        };
        assert_eq!(last.num_running_reqs, 0);
        assert!(a
            .out
            .controller
            .iter()
            .any(|m| matches!(m, Message::WorkerStatus(s) if s.finished_rids == ["r1"])));
    }

    #[test]
    fn a_stop_drains_what_is_held_and_refuses_new_requests() {
        let mut a = actor(Duration::from_secs(30));
        a.on_inbound(generate("held", 4));
        a.stop.store(true, Ordering::Relaxed);
        assert!(a.keep_running(), "something is held: drain");
        assert!(matches!(
            a.out.controller.last(),
            Some(Message::Shutdown(s)) if s.reason == "draining"
        ));
        a.on_inbound(generate("late", 4));
        let late = final_of(&a, "late").expect("refused at once");
        assert_eq!(late.error.as_ref().map(|e| e.status), Some(503));
        while a.keep_running() {
            a.tick();
        }
        assert_eq!(
            final_of(&a, "held").and_then(|o| o.finish_reason),
            Some(FinishReason::Length)
        );
        let why = a.leave();
        assert!(why.contains("drained"), "{why}");
        assert!(matches!(
            a.out.controller.last(),
            Some(Message::Shutdown(s)) if s.reason == why && s.drain_timeout_s.is_none()
        ));
    }

    #[test]
    fn leaving_fails_what_is_held_and_a_refusal_ends_the_loop() {
        let mut a = actor(Duration::ZERO);
        a.on_inbound(generate("r", 8));
        a.on_inbound(Inbound::Refused(
            "refused by the controller: model mismatch".into(),
        ));
        assert!(!a.keep_running());
        assert_eq!(
            a.refused(),
            Some("refused by the controller: model mismatch")
        );
        let why = a.leave();
        assert!(
            why.contains("refused by the controller: model mismatch"),
            "{why}"
        );
        let out = final_of(&a, "r").expect("failed, not lost");
        assert_eq!(out.error.as_ref().map(|e| e.status), Some(503));
        assert!(a.held.snapshot().is_empty());
    }

    #[test]
    fn a_status_says_the_last_dispatch_it_took_in() {
        let mut a = actor(Duration::ZERO);
        a.tick();
        let Some(Message::WorkerStatus(first)) = a.out.controller.last() else {
            panic!("no status");
        };
        assert_eq!(first.taken_seq, Some(0), "none taken in yet");
        for seq in [1, 2] {
            let Inbound::Msg(Message::GenerateReq(mut req)) = generate(&format!("r{seq}"), 2)
            else {
                unreachable!()
            };
            req.dispatch_seq = seq;
            a.on_inbound(Inbound::Msg(Message::GenerateReq(req)));
        }
        a.status.now = true; // past the 20 ms throttle
        a.tick();
        let Some(Message::WorkerStatus(s)) = a.out.controller.last() else {
            panic!("no status");
        };
        assert_eq!(
            (s.taken_seq, s.num_running_reqs + s.num_waiting_reqs),
            (Some(2), 2)
        );
        let seqs: Vec<Option<u64>> = a
            .out
            .controller
            .iter()
            .filter_map(|m| match m {
                Message::WorkerStatus(s) => Some(s.status_seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [Some(1), Some(2)], "numbered in the order sent");
    }

    /// Every rid the controller heard finished, over all statuses sent so far.
    fn reported_finished(a: &WorkerActor<Recorded>) -> Vec<String> {
        a.out
            .controller
            .iter()
            .filter_map(|m| match m {
                Message::WorkerStatus(s) => Some(s.finished_rids.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn every_refused_request_is_reported_finished_to_the_controller() {
        // The controller counts a dispatched request in flight until a status lists it
        // finished; one refused here (a bad prompt, a full queue, a drain) must be listed too,
        // or its rid stays in flight until the rank leaves and is then failed a second time.
        let mut a = actor_with(Duration::from_secs(30), Some(1));
        let bad = crate::scheduler::tests::req("bad", vec![u32::MAX], 2);
        a.on_inbound(Inbound::Msg(Message::GenerateReq(bad)));
        a.on_inbound(generate("queued", 2));
        a.on_inbound(generate("full", 2));
        a.stop.store(true, Ordering::Relaxed);
        assert!(a.keep_running(), "\"queued\" is held: drain");
        a.on_inbound(generate("late", 2));
        for rid in ["bad", "full", "late"] {
            let out = final_of(&a, rid).expect("refused at once");
            assert!(out.error.is_some(), "{rid}");
        }
        while a.keep_running() {
            a.tick();
        }
        a.status.now = true;
        a.tick();
        let mut finished = reported_finished(&a);
        finished.sort();
        assert_eq!(finished, ["bad", "full", "late", "queued"]);
    }

    #[test]
    fn a_rid_over_the_limit_is_answered_with_a_400() {
        let mut a = actor(Duration::ZERO);
        let long = "x".repeat(protocol::MAX_RID_LEN + 1);
        a.on_inbound(generate(&long, 1));
        let out = final_of(&a, &long).expect("answered");
        assert_eq!(out.finish_reason, Some(FinishReason::Error));
        assert_eq!(out.error.as_ref().map(|e| e.status), Some(400));
        assert!(!a.busy() && a.held.snapshot().is_empty());
    }
}

#[cfg(test)]
mod kv_event_tests {
    //! KV events leave with the status; a snapshot request is answered by the next one.
    use super::tests_support::*;
    use super::*;

    fn kv_events(a: &WorkerActor<Recorded>) -> Vec<protocol::KvEvents> {
        a.out
            .controller
            .iter()
            .filter_map(|m| match m {
                Message::KvEvents(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn stored_blocks_follow_the_status_and_a_requested_snapshot_lists_them_all() {
        let mut a = actor_with_events(2);
        a.on_inbound(generate("r1", 2));
        while a.busy() {
            a.tick();
        }
        let events = kv_events(&a);
        assert_eq!(events[0].seq, 1);
        assert!(events[0].cleared, "the first batch is a snapshot");
        let stored: usize = events.iter().map(|e| e.stored.len()).sum();
        // Prompt 1 5 9 13 plus the generated tokens that went into the cache: whole blocks
        // of 2.
        assert!(stored >= 2, "{events:?}");
        assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1));

        a.on_inbound(Inbound::Msg(Message::KvSnapshotReq(
            protocol::KvSnapshotReq { rank: 3 },
        )));
        a.tick();
        let snapshot = kv_events(&a).pop().expect("a snapshot");
        assert!(snapshot.cleared);
        assert_eq!(snapshot.stored.len(), stored);
        assert_eq!(snapshot.block_size, 2);
    }
}
