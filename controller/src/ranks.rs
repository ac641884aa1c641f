//! The live set of worker ranks: registration by `Hello`, liveness by heartbeat, departure by
//! timeout or `Shutdown`, and each rank's load (last status plus speculative increments).
//!
//! Rank ids are stable: a rank that leaves and comes back is the same id, which is what lets
//! affinity methods give it back exactly its keys.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use protocol::{Capacity, DisaggMode, GpuInfo, Hello, RankInfo, WorkerStatus};

use crate::budget::{RankBudget, StatusOutcome, StatusStamp};
use crate::ledger;
use crate::policy::{stall_tpot_on, RankLoad, RankQueue, RankSet};

/// One registered rank.
#[derive(Debug)]
pub struct LiveRank {
    pub capacity: Capacity,
    pub model_id: String,
    pub pid: u32,
    pub last_seen: Instant,
    /// The newest status received (reported to the tokenizer as is).
    pub status: Option<WorkerStatus>,
    /// The load the balancers see: applied status plus speculative dispatches.
    pub budget: RankBudget,
    /// Requests dispatched to this rank and not yet reported finished: rid → the most tokens
    /// it may generate (its `max_new_tokens`; 0: not known, or none).
    pub inflight: HashMap<String, u64>,
    /// The `dispatch_seq` the last request sent to this rank carried (counts on from its
    /// `Hello.taken_seq`, or from 1).
    pub last_seq: u64,
    /// Its role in a disaggregated deployment, and a prefill rank's KV endpoint and CURVE key.
    pub mode: DisaggMode,
    pub kv_endpoint: Option<String>,
    pub kv_public_key: Option<String>,
    /// The GPU it announced (reported to the tokenizer as is).
    pub gpu: Option<GpuInfo>,
    /// What the ledger check found broken since it registered (see [`crate::ledger`]).
    pub violations: Vec<String>,
    /// It enforces structured-output constraints (`Hello.constraints`).
    pub constraints: bool,
    /// Its worker's finish-first bound (`Hello.finish_first_tokens`; 0: off).
    pub finish_first_tokens: u64,
}

impl LiveRank {
    /// A rank as its `Hello` registers it.
    fn joined(hello: &Hello) -> Self {
        LiveRank {
            capacity: hello.capacity.clone(),
            model_id: hello.model_id.clone(),
            pid: hello.pid,
            last_seen: Instant::now(),
            status: None,
            budget: RankBudget::default(),
            // What it reports holding (after a controller restart) is ours to fail should it
            // die; its load arrives with its next status.
            inflight: hello.held_rids.iter().map(|rid| (rid.clone(), 0)).collect(),
            // Numbered on from what its worker was last sent, so its statuses' taken_seq, from
            // before this registration or after, reads in this numbering.
            last_seq: hello.taken_seq.unwrap_or(0),
            mode: hello.disaggregation_mode,
            kv_endpoint: hello.kv_endpoint.clone(),
            kv_public_key: hello.kv_public_key.clone(),
            constraints: hello.constraints,
            finish_first_tokens: hello.finish_first_tokens.into(),
            gpu: hello.gpu.clone(),
            violations: Vec::new(),
        }
    }
}

/// The worker process that holds a rank: the one whose `Hello` was accepted for it, known by
/// its DEALER identity (unique per process) and pid. Kept while the rank is live or draining.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub identity: Vec<u8>,
    pub pid: u32,
    pub mode: DisaggMode,
}

/// What an accepted `Hello` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Joined {
    /// The holder repeating its `Hello` (it missed our ack, or was asked to rejoin while
    /// registered): nothing changed, nothing to log.
    Repeat,
    /// A new registration. `lost`: requests a previous holder of the rank took with it.
    New { lost: Vec<String> },
}

/// Why a `Hello` was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum HelloRefusal {
    ModelMismatch {
        expected: String,
        got: String,
    },
    ProtocolVersion {
        expected: u32,
        got: u32,
    },
    /// Another live worker process holds the rank (two units or hosts given the same rank).
    RankTaken {
        rank: u32,
        holder_pid: u32,
    },
}

impl std::fmt::Display for HelloRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloRefusal::ModelMismatch { expected, got } => write!(
                f,
                "model id {got:?} differs from this deployment's model {expected:?}"
            ),
            HelloRefusal::ProtocolVersion { expected, got } => write!(
                f,
                "protocol version {got} differs from the controller's {expected}"
            ),
            HelloRefusal::RankTaken { rank, holder_pid } => write!(
                f,
                "rank {rank} is already held by a live worker (pid {holder_pid}); \
                 every worker needs its own rank"
            ),
        }
    }
}

/// Ranks by id.
#[derive(Debug)]
pub struct Ranks {
    live: BTreeMap<u32, LiveRank>,
    /// Ranks that said they are draining: no new requests, but what they hold may still finish
    /// until the deadline. rank → (in-flight rids, deadline).
    draining: BTreeMap<u32, (HashMap<String, u64>, Instant)>,
    /// Who holds each live or draining rank.
    holders: BTreeMap<u32, Holder>,
    /// The model every rank must serve: fixed by `--model-id` or by the first accepted `Hello`.
    model_id: Option<String>,
    timeout: Duration,
}

impl Ranks {
    pub fn new(model_id: Option<String>, timeout: Duration) -> Self {
        Ranks {
            live: BTreeMap::new(),
            draining: BTreeMap::new(),
            holders: BTreeMap::new(),
            model_id,
            timeout,
        }
    }

    /// Register (or re-register) a rank for the worker process `identity`.
    ///
    /// A rank held (live or draining) by another process is refused while `holder_alive` (the
    /// caller found the holder's connection still up): the newcomer is the mistake, and the
    /// worker already serving keeps its rank. A holder that is gone (crashed and restarted
    /// faster than its heartbeats time out) is replaced, and the requests it held are returned
    /// as lost.
    pub fn hello(
        &mut self,
        hello: &Hello,
        identity: &[u8],
        holder_alive: bool,
    ) -> Result<Joined, HelloRefusal> {
        self.same_protocol_and_model(hello)?;
        if let Some(holder) = self.holders.get(&hello.rank) {
            let same_process = holder.identity == identity && holder.pid == hello.pid;
            if same_process {
                if let Some(existing) = self.live.get_mut(&hello.rank) {
                    existing.last_seen = Instant::now();
                    existing.capacity = hello.capacity.clone();
                    existing.gpu = hello.gpu.clone();
                    existing.finish_first_tokens = hello.finish_first_tokens.into();
                    return Ok(Joined::Repeat);
                }
            } else if holder.identity != identity && holder_alive {
                return Err(HelloRefusal::RankTaken {
                    rank: hello.rank,
                    holder_pid: holder.pid,
                });
            }
        }
        let drained: Vec<String> = self
            .draining
            .remove(&hello.rank)
            .map(|(inflight, _)| inflight.into_keys().collect())
            .unwrap_or_default();
        let mut lost: Vec<String> = self
            .live
            .remove(&hello.rank)
            .map(|old| old.inflight.into_keys().collect())
            .unwrap_or_default();
        lost.extend(drained);
        self.holders.insert(
            hello.rank,
            Holder {
                identity: identity.to_vec(),
                pid: hello.pid,
                mode: hello.disaggregation_mode,
            },
        );
        self.live.insert(hello.rank, LiveRank::joined(hello));
        Ok(Joined::New { lost })
    }

    /// Refuses a worker of another protocol version or, once the first rank set it, of
    /// another model.
    fn same_protocol_and_model(&mut self, hello: &Hello) -> Result<(), HelloRefusal> {
        if hello.protocol_version != protocol::PROTOCOL_VERSION {
            return Err(HelloRefusal::ProtocolVersion {
                expected: protocol::PROTOCOL_VERSION,
                got: hello.protocol_version,
            });
        }
        match &self.model_id {
            Some(expected) if *expected != hello.model_id => Err(HelloRefusal::ModelMismatch {
                expected: expected.clone(),
                got: hello.model_id.clone(),
            }),
            Some(_) => Ok(()),
            None => {
                self.model_id = Some(hello.model_id.clone());
                Ok(())
            }
        }
    }

    /// The process holding `rank` (live or draining), if any.
    pub fn holder(&self, rank: u32) -> Option<&Holder> {
        self.holders.get(&rank)
    }

    /// Every held rank (live or draining) with its holder's identity: whom the liveness probe
    /// asks. A draining rank counts: its process may still die with requests in flight.
    pub fn held(&self) -> Vec<(u32, Vec<u8>)> {
        self.holders
            .iter()
            .map(|(&rank, h)| (rank, h.identity.clone()))
            .collect()
    }

    /// Whether `identity` is the process holding `rank`. Anything a worker sends is only
    /// believed from the holder: a refused duplicate's heartbeats must not keep the rank alive,
    /// nor its `Shutdown` remove it.
    pub fn is_holder(&self, rank: u32, identity: &[u8]) -> bool {
        self.holders
            .get(&rank)
            .is_some_and(|h| h.identity == identity)
    }

    pub fn is_live(&self, rank: u32) -> bool {
        self.live.contains_key(&rank)
    }

    /// Why `rank` may not be sent a request with a structured-output constraint (a worker
    /// that predates `Hello.constraints` would ignore it); `None` when it may.
    pub fn refuses_constraints(&self, rank: u32) -> Option<String> {
        match self.live.get(&rank) {
            Some(r) if !r.constraints => Some(format!(
                "data parallel rank {rank} runs a worker that does not enforce structured output \
                 (it predates Hello.constraints); upgrade it"
            )),
            _ => None,
        }
    }

    pub fn ids(&self) -> Vec<u32> {
        self.live.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Whether `rank` said it is draining and has not left yet.
    pub fn is_draining(&self, rank: u32) -> bool {
        self.draining.contains_key(&rank)
    }

    /// A heartbeat from `identity`; false when it does not hold a live `rank`.
    pub fn seen(&mut self, rank: u32, identity: &[u8]) -> bool {
        if !self.is_holder(rank, identity) {
            return false;
        }
        match self.live.get_mut(&rank) {
            Some(r) => {
                r.last_seen = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Whether `rank`'s last status showed requests running or waiting on it.
    pub fn is_busy(&self, rank: u32) -> bool {
        let status = self.live.get(&rank).and_then(|r| r.status.as_ref());
        status.is_some_and(|s| s.num_running_reqs + s.num_waiting_reqs > 0)
    }

    /// A status snapshot: settles finished requests, and feeds the budget (which skips stale
    /// snapshots and applies at most one per refresh interval).
    pub fn status(&mut self, status: WorkerStatus, identity: &[u8]) -> bool {
        if !self.is_holder(status.rank, identity) {
            return false;
        }
        let now = Instant::now();
        if let Some((inflight, _)) = self.draining.get_mut(&status.rank) {
            for rid in &status.finished_rids {
                inflight.remove(rid);
            }
            return true;
        }
        let Some(r) = self.live.get_mut(&status.rank) else {
            return false;
        };
        r.last_seen = now;
        for rid in &status.finished_rids {
            r.inflight.remove(rid);
        }
        if r.budget.on_status(&status, now) != StatusOutcome::Stale {
            let found = ledger::quiet_disagreements(status.rank, &status, r.last_seq, &r.inflight);
            for line in protocol::note_violations(&mut r.violations, found) {
                tracing::error!(rank = status.rank, "ledger check: {line}");
            }
        }
        let stamp = StatusStamp::of(&status);
        if !r
            .status
            .as_ref()
            .is_some_and(|old| stamp.before(StatusStamp::of(old)))
        {
            r.status = Some(status);
        }
        true
    }

    /// The number the next request sent to `rank` carries (`GenerateReq.dispatch_seq`); 0 for
    /// a rank that is not live.
    pub fn next_dispatch_seq(&mut self, rank: u32) -> u64 {
        self.live.get_mut(&rank).map_or(0, |r| {
            r.last_seq += 1;
            r.last_seq
        })
    }

    /// Account a request dispatched to `rank` with number `seq` that may generate up to
    /// `max_new_tokens`.
    pub fn dispatched(
        &mut self,
        rank: u32,
        rid: &str,
        tokens: u64,
        prefill_tokens: u64,
        seq: u64,
        max_new_tokens: u64,
    ) {
        self.dispatched_leg(rank, rid, tokens, prefill_tokens, seq);
        if let Some(r) = self.live.get_mut(&rank) {
            r.inflight.insert(rid.to_string(), max_new_tokens);
        }
    }

    /// Account the prefill leg of a disaggregated request: load only. Its rid is the decode
    /// rank's to answer (and to fail should that rank die); should this rank die, its decode
    /// peers hear `PeerGone` and fail what waited for it.
    pub fn dispatched_leg(
        &mut self,
        rank: u32,
        rid: &str,
        tokens: u64,
        prefill_tokens: u64,
        seq: u64,
    ) {
        if let Some(r) = self.live.get_mut(&rank) {
            r.budget.on_dispatch(
                rid,
                tokens,
                prefill_tokens,
                seq,
                Instant::now(),
                protocol::unix_time(),
            );
        }
    }

    /// Whether any live rank has a disaggregated role.
    pub fn disaggregated(&self) -> bool {
        self.live.values().any(|r| !r.mode.is_null())
    }

    /// Live ranks of `mode`, each with its entry (a prefill rank's KV endpoint and key).
    pub fn of_mode(&self, mode: DisaggMode) -> Vec<(u32, &LiveRank)> {
        self.live
            .iter()
            .filter(|(_, r)| r.mode == mode)
            .map(|(&rank, r)| (rank, r))
            .collect()
    }

    /// Apply status snapshots that were held back by the refresh interval.
    pub fn refresh(&mut self) {
        let now = Instant::now();
        for r in self.live.values_mut() {
            r.budget.refresh(now);
        }
    }

    /// Whether a live or draining rank holds `rid` (dispatched here and not reported finished,
    /// or listed in its `Hello` after a controller restart).
    pub fn holds(&self, rid: &str) -> bool {
        self.live.values().any(|r| r.inflight.contains_key(rid))
            || self
                .draining
                .values()
                .any(|(inflight, _)| inflight.contains_key(rid))
    }

    /// Forget a rank that said `Shutdown` or timed out (live or draining); returns the requests
    /// it still held.
    pub fn remove(&mut self, rank: u32) -> Option<Vec<String>> {
        self.holders.remove(&rank);
        let live = self.live.remove(&rank).map(|r| r.inflight);
        let draining = self.draining.remove(&rank).map(|(inflight, _)| inflight);
        match (live, draining) {
            (None, None) => None,
            (a, b) => Some(a.into_iter().chain(b).flat_map(|m| m.into_keys()).collect()),
        }
    }

    /// A rank that is draining leaves routing at once; its requests may finish until
    /// `drain_timeout` (plus the heartbeat timeout, for the last status to arrive) has passed.
    pub fn start_drain(&mut self, rank: u32, drain_timeout: Duration) -> bool {
        match self.live.remove(&rank) {
            Some(r) => {
                let deadline = Instant::now() + drain_timeout + self.timeout;
                self.draining.insert(rank, (r.inflight, deadline));
                true
            }
            None => false,
        }
    }

    /// Draining ranks whose deadline has passed by `now`.
    pub fn drain_expired(&self, now: Instant) -> Vec<u32> {
        self.draining
            .iter()
            .filter(|(_, (_, deadline))| now > *deadline)
            .map(|(&rank, _)| rank)
            .collect()
    }

    /// Ranks whose last sign of life is older than the timeout by `now`.
    pub fn expired(&self, now: Instant) -> Vec<u32> {
        self.live
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.last_seen) > self.timeout)
            .map(|(&rank, _)| rank)
            .collect()
    }

    /// The loads the balancers see. Call [`Ranks::refresh`] first to apply due snapshots.
    pub fn rank_set(&self) -> RankSet {
        self.rank_set_where(|_| true)
    }

    /// As [`Ranks::rank_set`], for the ranks whose role `keep` accepts.
    pub fn rank_set_where(&self, keep: impl Fn(DisaggMode) -> bool) -> RankSet {
        let kept = || self.live.iter().filter(|(_, r)| keep(r.mode));
        RankSet::new(
            kept()
                .map(|(&rank, r)| {
                    let (active_requests, active_tokens) = r.budget.load();
                    RankLoad {
                        rank,
                        active_requests,
                        active_tokens,
                    }
                })
                .collect(),
        )
        .with_queues(
            kept()
                .map(|(&rank, r)| RankQueue {
                    stall_tpot: r
                        .inflight
                        .values()
                        .map(|&n| stall_tpot_on(n, r.finish_first_tokens))
                        .sum(),
                    finish_first_tokens: r.finish_first_tokens,
                    ..r.budget.queue(rank)
                })
                .collect(),
        )
    }

    /// Requests counted in flight on every rank, live or draining.
    pub fn num_inflight(&self) -> u64 {
        let live: usize = self.live.values().map(|r| r.inflight.len()).sum();
        let draining: usize = self
            .draining
            .values()
            .map(|(inflight, _)| inflight.len())
            .sum();
        (live + draining) as u64
    }

    /// The live ranks as reported to the tokenizer.
    pub fn infos(&self) -> Vec<RankInfo> {
        let now = Instant::now();
        self.live
            .iter()
            .map(|(&rank, r)| RankInfo {
                rank,
                capacity: r.capacity.clone(),
                model_id: r.model_id.clone(),
                last_seen_s: now.duration_since(r.last_seen).as_secs_f64(),
                status: r.status.clone(),
                disaggregation_mode: r.mode,
                gpu: r.gpu.clone(),
                num_inflight: Some(r.inflight.len() as u64),
                invariant_violations: r.violations.clone(),
            })
            .collect()
    }

    pub fn pid(&self, rank: u32) -> Option<u32> {
        self.live.get(&rank).map(|r| r.pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(rank: u32, model: &str) -> Hello {
        Hello {
            rank,
            capacity: Capacity {
                max_total_tokens: 1000,
                max_running_requests: 8,
                context_len: 512,
                vocab_size: 512,
            },
            model_id: model.into(),
            protocol_version: protocol::PROTOCOL_VERSION,
            pid: 1,
            held_rids: Vec::new(),
            disaggregation_mode: protocol::DisaggMode::Null,
            kv_endpoint: None,
            kv_public_key: None,
            kv_layout: None,
            gpu: None,
            taken_seq: None,
            constraints: false,
            finish_first_tokens: 0,
        }
    }

    fn id(rank: u32) -> Vec<u8> {
        format!("rank-{rank}.1").into_bytes()
    }

    /// Ranks `ids` joined, all serving model "a".
    fn joined(ids: &[u32]) -> Ranks {
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        for &r in ids {
            ranks.hello(&hello(r, "a"), &id(r), false).unwrap();
        }
        ranks
    }

    /// A status of `rank` saying `rid` finished (nothing else known).
    fn finished(ranks: &mut Ranks, rank: u32, rid: &str) {
        ranks.status(
            WorkerStatus {
                rank,
                timestamp: 1.0,
                finished_rids: vec![rid.into()],
                ..Default::default()
            },
            &id(rank),
        );
    }

    #[test]
    fn first_hello_fixes_the_model() {
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        assert!(ranks.hello(&hello(0, "a"), &id(0), false).is_ok());
        assert!(matches!(
            ranks.hello(&hello(1, "b"), &id(1), false),
            Err(HelloRefusal::ModelMismatch { .. })
        ));
        assert_eq!(ranks.ids(), vec![0]);
    }

    #[test]
    fn wrong_protocol_version_is_refused() {
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        let mut h = hello(0, "a");
        h.protocol_version = 99;
        assert!(matches!(
            ranks.hello(&h, &id(0), false),
            Err(HelloRefusal::ProtocolVersion { .. })
        ));
    }

    #[test]
    fn the_gpu_a_rank_announces_reaches_the_tokenizer_as_is() {
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        let gpu = GpuInfo {
            ordinal: 1,
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            total_memory_bytes: 150_754_820_096,
        };
        let mut on_gpu = hello(1, "a");
        on_gpu.gpu = Some(gpu.clone());
        ranks.hello(&hello(0, "a"), &id(0), false).unwrap();
        ranks.hello(&on_gpu, &id(1), false).unwrap();
        let gpus: Vec<Option<GpuInfo>> = ranks.infos().into_iter().map(|r| r.gpu).collect();
        assert_eq!(gpus, vec![None, Some(gpu)]);
    }

    #[test]
    fn speculative_load_is_replaced_by_status_and_finished_rids_settle() {
        let mut ranks = joined(&[0]);
        ranks.dispatched(0, "x", 10, 0, 0, 0);
        ranks.dispatched(0, "y", 5, 0, 0, 0);
        assert_eq!(ranks.rank_set().loads()[0].active_requests, 2);
        // A snapshot taken after both dispatches counts them itself.
        ranks.status(
            WorkerStatus {
                rank: 0,
                timestamp: protocol::unix_time() + 1.0,
                num_running_reqs: 1,
                num_used_tokens: 5,
                finished_rids: vec!["x".into()],
                ..Default::default()
            },
            &id(0),
        );
        let load = ranks.rank_set().loads()[0];
        assert_eq!((load.active_requests, load.active_tokens), (1, 5));
        assert_eq!(ranks.remove(0), Some(vec!["y".to_string()]));
    }

    #[test]
    fn a_rank_registered_again_counts_what_was_sent_since_before_its_worker_reads_it() {
        // The worker took in dispatches 1..=57 from a controller that then restarted; it
        // registers with this one, which sends it two requests.
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        let again = Hello {
            taken_seq: Some(57),
            ..hello(0, "a")
        };
        ranks.hello(&again, &id(0), false).unwrap();
        for rid in ["x", "y"] {
            let seq = ranks.next_dispatch_seq(0);
            ranks.dispatched(0, rid, 10, 0, seq, 0);
        }
        // Before it reads either, its status says the last dispatch it took in: 57, numbered
        // by the old controller. Neither new request is counted there.
        ranks.status(
            WorkerStatus {
                rank: 0,
                timestamp: protocol::unix_time(),
                taken_seq: Some(57),
                ..Default::default()
            },
            &id(0),
        );
        let load = ranks.rank_set().loads()[0];
        assert_eq!((load.active_requests, load.active_tokens), (2, 20));
    }

    #[test]
    fn the_status_reported_is_the_newest_sent_whatever_the_worker_clock_says() {
        let mut ranks = joined(&[0]);
        // The second status was sent after a clock step back of an hour.
        for (status_seq, timestamp, running) in [(1, 5000.0, 4), (2, 1400.0, 1)] {
            let status = WorkerStatus {
                rank: 0,
                timestamp,
                num_running_reqs: running,
                status_seq: Some(status_seq),
                ..Default::default()
            };
            ranks.status(status, &id(0));
        }
        let info = ranks.infos().remove(0);
        assert_eq!(info.status.map(|s| s.num_running_reqs), Some(1));
    }

    #[test]
    fn the_stall_a_rank_can_bear_sums_its_requests_lengths_until_they_finish() {
        let mut ranks = joined(&[0, 1]);
        // 1/(5−1) + 1/(3−1); a one-token answer and an embedding (0: not known) add nothing.
        ranks.dispatched(0, "x", 10, 0, 1, 5);
        ranks.dispatched(0, "y", 10, 0, 2, 3);
        ranks.dispatched(0, "z", 10, 0, 3, 1);
        ranks.dispatched(1, "e", 10, 0, 1, 0);
        let stall = |ranks: &Ranks, i: usize| ranks.rank_set().queue(i).stall_tpot;
        assert_eq!((stall(&ranks, 0), stall(&ranks, 1)), (0.75, 0.0));
        finished(&mut ranks, 0, "y");
        assert_eq!(stall(&ranks, 0), 0.25);
    }

    #[test]
    fn a_rank_that_finishes_first_bears_no_stall_for_answers_within_its_bound() {
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        for (rank, finish_first_tokens) in [(0, 4), (1, 0)] {
            let hello = Hello {
                finish_first_tokens,
                ..hello(rank, "a")
            };
            ranks.hello(&hello, &id(rank), false).unwrap();
        }
        // Within 4 + 1 tokens a request is never stalled on rank 0; one of 6 still is.
        for rank in [0, 1] {
            ranks.dispatched(rank, &format!("a{rank}"), 10, 0, 1, 5);
            ranks.dispatched(rank, &format!("b{rank}"), 10, 0, 2, 6);
        }
        let set = ranks.rank_set();
        let (q0, q1) = (set.queue(0), set.queue(1));
        assert_eq!((q0.finish_first_tokens, q1.finish_first_tokens), (4, 0));
        assert_eq!((q0.stall_tpot, q1.stall_tpot), (0.2, 0.25 + 0.2));
    }

    #[test]
    fn requests_in_flight_are_counted_on_live_and_draining_ranks() {
        let mut ranks = joined(&[0, 1]);
        ranks.dispatched(0, "x", 10, 0, 0, 0);
        ranks.dispatched(1, "y", 10, 0, 0, 0);
        ranks.dispatched(1, "z", 10, 0, 0, 0);
        assert_eq!(ranks.num_inflight(), 3);
        assert!(ranks.start_drain(1, Duration::from_secs(30)));
        assert_eq!(
            ranks.num_inflight(),
            3,
            "a draining rank's requests still count"
        );
    }

    #[test]
    fn a_draining_rank_leaves_routing_but_keeps_its_requests_until_it_ends() {
        let mut ranks = joined(&[0]);
        ranks.dispatched(0, "x", 10, 0, 0, 0);
        ranks.dispatched(0, "y", 10, 0, 0, 0);
        assert!(ranks.start_drain(0, Duration::from_secs(30)));
        assert!(
            ranks.ids().is_empty(),
            "no new requests go to a draining rank"
        );
        finished(&mut ranks, 0, "x");
        assert!(ranks.drain_expired(Instant::now()).is_empty());
        assert_eq!(
            ranks.held(),
            vec![(0, id(0))],
            "a draining rank is still probed: its process may die before its requests end"
        );
        assert_eq!(ranks.remove(0), Some(vec!["y".to_string()]));
        assert!(ranks.held().is_empty());
    }

    #[test]
    fn a_rid_the_worker_never_settles_is_reported_at_its_next_quiet_status() {
        let mut ranks = joined(&[0]);
        for rid in ["kept", "lost"] {
            let seq = ranks.next_dispatch_seq(0);
            ranks.dispatched(0, rid, 10, 0, seq, 0);
        }
        // The worker took both, finished one and forgot the other: it holds nothing.
        let quiet = |status_seq, finished: &[&str]| WorkerStatus {
            rank: 0,
            timestamp: protocol::unix_time(),
            taken_seq: Some(2),
            status_seq: Some(status_seq),
            finished_rids: finished.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        };
        ranks.status(quiet(1, &["kept"]), &id(0));
        ranks.status(quiet(2, &[]), &id(0));
        let info = ranks.infos().remove(0);
        assert_eq!(info.num_inflight, Some(1));
        assert_eq!(info.invariant_violations.len(), 1, "reported once");
        assert!(
            info.invariant_violations[0].starts_with("rid lost: in flight on rank 0"),
            "{:?}",
            info.invariant_violations
        );
    }

    #[test]
    fn silent_ranks_expire() {
        let timeout = Duration::from_secs(3);
        let mut ranks = Ranks::new(None, timeout);
        ranks.hello(&hello(3, "a"), &id(3), false).unwrap();
        let t0 = Instant::now();
        assert!(ranks.expired(t0 + timeout / 2).is_empty());
        assert_eq!(
            ranks.expired(t0 + timeout + Duration::from_millis(1)),
            vec![3]
        );
    }

    #[test]
    fn a_draining_rank_past_its_deadline_leaves_with_what_it_still_held() {
        let timeout = Duration::from_secs(3);
        let mut ranks = Ranks::new(None, timeout);
        ranks.hello(&hello(0, "a"), &id(0), false).unwrap();
        ranks.dispatched(0, "x", 10, 0, 0, 0);
        let drain = Duration::from_secs(30);
        let t0 = Instant::now();
        assert!(ranks.start_drain(0, drain));
        // The deadline is the drain timeout plus the heartbeat timeout (for its last status).
        assert!(ranks.drain_expired(t0 + drain).is_empty());
        let late = Instant::now() + drain + timeout + Duration::from_millis(1);
        assert_eq!(ranks.drain_expired(late), vec![0]);
        assert_eq!(ranks.remove(0), Some(vec!["x".to_string()]));
    }

    #[test]
    fn a_second_process_claiming_a_held_rank_is_refused_while_the_holder_lives() {
        let mut ranks = Ranks::new(None, Duration::from_secs(3));
        assert_eq!(
            ranks.hello(&hello(0, "a"), b"rank-0.first", false),
            Ok(Joined::New { lost: vec![] })
        );
        ranks.dispatched(0, "x", 10, 0, 0, 0);
        let mut dup = hello(0, "a");
        dup.pid = 2;
        assert_eq!(
            ranks.hello(&dup, b"rank-0.second", true),
            Err(HelloRefusal::RankTaken {
                rank: 0,
                holder_pid: 1
            })
        );
        // Only the holder is believed: the duplicate's heartbeats are not the rank's.
        assert!(!ranks.seen(0, b"rank-0.second"));
        assert!(ranks.seen(0, b"rank-0.first"));
        // The holder repeating its Hello changes nothing.
        assert_eq!(
            ranks.hello(&hello(0, "a"), b"rank-0.first", false),
            Ok(Joined::Repeat)
        );
        // A holder whose connection is gone (crashed, restarted before it timed out) is
        // replaced, and what it held is lost.
        assert_eq!(
            ranks.hello(&dup, b"rank-0.second", false),
            Ok(Joined::New {
                lost: vec!["x".to_string()]
            })
        );
        assert!(ranks.is_holder(0, b"rank-0.second"));
    }
}
