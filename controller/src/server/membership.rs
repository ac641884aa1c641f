//! Rank membership: joins (`Hello`, a duplicate rank, a restarted holder), liveness (heartbeat
//! timeouts, drain deadlines), rejoins after a controller restart, and failing what a lost rank
//! held.

use std::time::Instant;

use protocol::msg_trace::Milestone;
use protocol::{encode, HelloAck, Message, Rejoin, TokenOut};

use super::Controller;
use crate::ranks::Joined;

impl Controller {
    pub(super) fn expire_ranks(&mut self) {
        let now = Instant::now();
        for rank in self.ranks.drain_expired(now) {
            self.lose_rank(
                rank,
                "its drain timeout ran out",
                format!("data parallel rank {rank} did not finish draining in time"),
            );
        }
        for rank in self.ranks.expired(now) {
            let timeout_s = self.config.worker_timeout.as_secs_f64();
            let failure = format!(
                "data parallel rank {rank} stopped responding (no heartbeat for {timeout_s:.1}s)"
            );
            if self.lose_rank(rank, "it stopped sending heartbeats", failure) {
                self.cluster_changed = true;
            }
        }
    }

    /// A rank whose process exited is removed at once instead of at its heartbeat timeout (or,
    /// for a draining rank, its drain deadline): its connection closed, so a send to it fails
    /// with `EHOSTUNREACH` (the ROUTER is `ROUTER_MANDATORY`). The probe is a `Heartbeat`,
    /// which workers drop. A stalled process keeps its connection and is left to the timeout
    /// (or the deadline); so is a host that vanished without closing its TCP connections.
    pub(super) fn probe_ranks(&mut self) {
        for (rank, identity) in self.ranks.held() {
            let probe = Message::Heartbeat(protocol::Heartbeat {
                rank,
                timestamp: 0.0,
            });
            let Ok(frame) = encode(&probe) else { continue };
            // Not traced: it would add a line per rank five times a second.
            let sent = self
                .workers
                .send_multipart([identity.as_slice(), frame.as_slice()], zmq::DONTWAIT);
            if !matches!(sent, Err(zmq::Error::EHOSTUNREACH)) {
                continue;
            }
            // What it sent before closing is still readable: a worker that finished its drain
            // and said its final `Shutdown` is left to that, not counted as a death.
            self.drain_workers();
            if !self.ranks.is_holder(rank, &identity) {
                continue;
            }
            let failure =
                format!("data parallel rank {rank} stopped responding (its process exited)");
            if self.lose_rank(rank, "its connection closed", failure) {
                self.cluster_changed = true;
            }
        }
    }

    /// Remove a rank that is gone (`why`, for the log and its disaggregation peers) and fail
    /// what it held with `failure`. False when the rank was not known.
    fn lose_rank(&mut self, rank: u32, why: &str, failure: String) -> bool {
        let mode = self.ranks.holder(rank).map(|h| h.mode);
        let Some(lost) = self.ranks.remove(rank) else {
            return false;
        };
        self.kv_index.remove(rank);
        self.announce_gone(rank, mode, why);
        tracing::warn!(
            rank,
            failed_requests = lost.len(),
            live = ?self.ranks.ids(),
            "rank removed: {why}"
        );
        self.abort_on(rank, &lost);
        self.fail_requests(lost, failure);
        true
    }

    /// Best effort: a rank that only stalled (and may rejoin) must not go on computing requests
    /// whose clients were already told they failed. A dead rank fails the first send at once
    /// (`ROUTER_MANDATORY`), and the rest are not tried.
    pub(super) fn abort_on(&mut self, rank: u32, rids: &[String]) {
        for rid in rids {
            let abort = Message::Abort(protocol::Abort {
                rid: Some(rid.clone()),
            });
            if !self.send_to_worker(rank, &abort) {
                break;
            }
        }
    }

    pub(super) fn on_hello(&mut self, identity: &[u8], hello: &protocol::Hello) {
        let rank = hello.rank;
        // Another process holding the rank keeps it while its connection is up; a dead one
        // (crashed and restarted before its heartbeats timed out) is replaced.
        // A different process taking the rank over means the old one is gone.
        let replaced = self
            .ranks
            .holder(rank)
            .filter(|h| h.identity != identity)
            .map(|h| h.mode);
        let holder_alive = match self.ranks.holder(rank) {
            Some(h) if h.identity != identity => {
                let old = h.identity.clone();
                self.holder_reachable(&old, rank)
            }
            _ => false,
        };
        match self.ranks.hello(hello, identity, holder_alive) {
            Ok(Joined::Repeat) => {
                tracing::debug!(
                    rank,
                    pid = hello.pid,
                    "repeated Hello from the rank's holder"
                );
                self.send_ack(identity, rank, true, None);
            }
            Ok(Joined::New { lost }) if self.rejoins.was_asked(rank) => {
                // Summarised with the others (see `summarise_rejoins`).
                tracing::debug!(
                    rank,
                    pid = hello.pid,
                    held = hello.held_rids.len(),
                    "rank registered again"
                );
                self.rejoins.rejoined(rank);
                self.send_ack(identity, rank, true, None);
                self.kv_joined(identity, rank);
                self.fail_requests(lost, format!("data parallel rank {rank} restarted"));
                self.cluster_changed = true;
            }
            Ok(Joined::New { lost }) => {
                if replaced.is_some() {
                    self.announce_gone(rank, replaced, "it restarted");
                }
                tracing::info!(
                    rank,
                    pid = hello.pid,
                    max_total_tokens = hello.capacity.max_total_tokens,
                    max_running_requests = hello.capacity.max_running_requests,
                    gpu = hello.gpu.as_ref().map(|g| format!("{} ({})", g.device(), g.name)),
                    live = ?self.ranks.ids(),
                    "rank joined"
                );
                self.send_ack(identity, rank, true, None);
                self.kv_joined(identity, rank);
                self.fail_requests(lost, format!("data parallel rank {rank} restarted"));
                self.cluster_changed = true;
            }
            Err(refusal) => {
                tracing::error!(rank, pid = hello.pid, %refusal, "refusing worker");
                self.send_ack(identity, rank, false, Some(refusal.to_string()));
            }
        }
    }

    /// Whether the worker process `identity` is still connected. ROUTER_MANDATORY makes a send
    /// to a peer whose connection is gone fail at once (EHOSTUNREACH); the probe is a repeat of
    /// the ack it already had, which a registered worker ignores.
    pub(super) fn holder_reachable(&mut self, identity: &[u8], rank: u32) -> bool {
        let probe = Message::HelloAck(HelloAck {
            rank,
            accepted: true,
            reason: None,
        });
        let Ok(frame) = encode(&probe) else {
            return true;
        };
        !matches!(
            self.workers
                .send_multipart([identity, frame.as_slice()], zmq::DONTWAIT),
            Err(zmq::Error::EHOSTUNREACH)
        )
    }

    pub(super) fn fail_requests(&mut self, rids: Vec<String>, why: String) {
        for rid in rids {
            self.tracer
                .milestone(&rid, Milestone::Failed { error: why.clone() });
            self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(rid, 503, why.clone())));
        }
    }

    /// Answer a `Hello` to the process that sent it (which may not be the rank's holder).
    pub(super) fn send_ack(
        &mut self,
        identity: &[u8],
        rank: u32,
        accepted: bool,
        reason: Option<String>,
    ) {
        self.send_to_peer(
            identity,
            rank,
            &Message::HelloAck(HelloAck {
                rank,
                accepted,
                reason,
            }),
        );
    }

    /// A worker that heartbeats without being registered (this controller restarted, or timed
    /// the rank out while it was stalled) is told to say `Hello` again rather than left
    /// orphaned. A draining rank is still known and is not asked.
    pub(super) fn ask_to_rejoin(&mut self, identity: &[u8], rank: u32) {
        // A draining holder is known; another process claiming a held rank already said
        // `Hello` (and is refused), asking it again would only repeat that.
        if self.ranks.holder(rank).is_some() {
            return;
        }
        if !self.rejoins.ask(identity, rank, Instant::now()) {
            return;
        }
        tracing::debug!(
            rank,
            "worker not registered here; asking it to say Hello again"
        );
        self.send_to_peer(identity, rank, &Message::Rejoin(Rejoin { rank }));
    }

    /// One line for a wave of `Rejoin`s (a controller restart asks every running worker at
    /// once), once it is over (see `rejoin`).
    pub(super) fn summarise_rejoins(&mut self) {
        if let Some(wave) = self.rejoins.summary(Instant::now()) {
            tracing::info!(
                rejoined = ?wave.rejoined,
                not_back = ?wave.not_back,
                live = ?self.ranks.ids(),
                "running workers not registered here (this controller restarted, or timed them \
                 out) were asked to say Hello again"
            );
        }
    }
}
