//! The in-flight request registry, as an actor that owns it: which rids are waiting for
//! outputs, where each one's `TokenOut`s go, and whether anything came back for it yet. HTTP
//! handlers register and unregister rids; the PULL reader delivers outputs; the PUSH sender,
//! the cluster view and shutdown end requests that cannot be answered. None of them touches
//! the map: they send messages, so there is no lock to hold across a send or to poison.
//!
//! It also keeps the tokenizer's third of the ledger check (the controller's is
//! `controller::ledger`, the worker's `worker::scheduler::ledger`): a request this tokenizer
//! still waits on must be one the controller holds, or one whose final answer is on its way.
//! Exact without any rid list on the wire, at the controller's quiet points: a status that has
//! taken every request this tokenizer sent (`taken_submission_seq` = the last `submission_seq`
//! given), counts none in flight (`num_inflight` 0) and shows every live rank idle has had
//! every final answer sent, so a request still waiting without one, at three such statuses in a
//! row (over a second: the grace for an answer still on its way from a worker), is lost: it
//! would wait for its timeout. Reported (`/get_server_info` `invariant_violations`, an error
//! log line), not repaired. Requests sent before this controller was first heard from are left
//! to `Reconcile`.
//!
//! Not here: the sockets (`bridge`) and the cluster status (`cluster_view`).

use std::collections::HashMap;
use std::time::Instant;

use actix::{Actor, Context, Handler, Message, MessageResult};
use protocol::TokenOut;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Why a rid could not be registered.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A request with this rid is in flight.
    RidInUse,
    /// `cap` requests are in flight already (`--max-in-flight-requests`).
    Full { cap: usize },
}

/// One registered request: where its outputs go, and whether anything came back for it yet.
struct Pending {
    tx: UnboundedSender<TokenOut>,
    registered: Instant,
    answered: bool,
    /// Its final output (or error) came.
    finished: bool,
    /// Its `submission_seq` once sent (`None`: not sent yet).
    seq: Option<u64>,
    /// The ledger check named it already.
    reported: bool,
}

/// A request waiting unanswered through this many quiet statuses in a row, spanning at least
/// [`LOST_AFTER`], counts as lost: the grace for a final answer still on its way from a worker
/// (the controller sends a status every ~500 ms, and at once on a membership change).
const LOST_AFTER_QUIET_STATUSES: u8 = 3;
const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Owns every registered request; see the module doc.
pub struct Registry {
    pending: HashMap<String, Pending>,
    /// Most requests in flight at once; past it a new one is refused at once.
    cap: usize,
    /// The last `submission_seq` given (0: none).
    last_seq: u64,
    /// The controller heard from, and the last `submission_seq` given when it was first heard
    /// from: requests up to it are the business of `Reconcile`, not of this check.
    controller: Option<(Option<u64>, u64)>,
    /// Quiet controller statuses in a row, and when the first of them came. Every request
    /// the check reads waited through all of them: one sent during the run would have ended
    /// it (the controller would not have taken it in yet).
    quiet_run: Option<(u8, Instant)>,
    /// What the ledger check found broken (the first few).
    violations: Vec<String>,
}

impl Registry {
    pub fn new(cap: usize) -> Self {
        Registry {
            pending: HashMap::new(),
            cap,
            last_seq: 0,
            controller: None,
            quiet_run: None,
            violations: Vec::new(),
        }
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

/// Route `TokenOut`s of `rid` to the returned channel until [`Unregister`].
#[derive(Message)]
#[rtype(result = "Result<UnboundedReceiver<TokenOut>, Refusal>")]
pub struct Register {
    pub rid: String,
}

impl Handler<Register> for Registry {
    type Result = Result<UnboundedReceiver<TokenOut>, Refusal>;

    fn handle(&mut self, msg: Register, _: &mut Context<Self>) -> Self::Result {
        if self.pending.contains_key(&msg.rid) {
            return Err(Refusal::RidInUse);
        }
        if self.pending.len() >= self.cap {
            return Err(Refusal::Full { cap: self.cap });
        }
        let (tx, rx) = unbounded_channel();
        let pending = Pending {
            tx,
            registered: Instant::now(),
            answered: false,
            finished: false,
            seq: None,
            reported: false,
        };
        self.pending.insert(msg.rid, pending);
        Ok(rx)
    }
}

/// The request ended (answered, failed or abandoned): forget it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unregister {
    pub rid: String,
}

impl Handler<Unregister> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Unregister, _: &mut Context<Self>) {
        self.pending.remove(&msg.rid);
    }
}

/// An output from a worker (or an error from the controller) for its rid.
///
/// Every token of every stream passes through this handler: one mailbox hop between the
/// PULL reader thread and the request's channel that a shared map did not have. It costs a
/// cross-thread wake-up (microseconds) per output against a decode step of milliseconds, and
/// buys a registry no other thread can change under it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver(pub TokenOut);

impl Handler<Deliver> for Registry {
    type Result = ();

    fn handle(&mut self, Deliver(out): Deliver, _: &mut Context<Self>) {
        match self.pending.get_mut(&out.rid) {
            Some(p) => {
                p.answered = true;
                p.finished |=
                    out.finish_reason.is_some() || out.error.is_some() || out.embedding.is_some();
                // The receiver is gone only if the request just ended; nothing to do.
                let _ = p.tx.send(out);
            }
            None => tracing::debug!(rid = %out.rid, "output for unknown or finished request"),
        }
    }
}

/// `rid` went to the controller as `submission_seq` `seq` (sent before the request itself).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submitted {
    pub rid: String,
    pub seq: u64,
}

impl Handler<Submitted> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Submitted, _: &mut Context<Self>) {
        self.last_seq = self.last_seq.max(msg.seq);
        if let Some(p) = self.pending.get_mut(&msg.rid) {
            p.seq = Some(msg.seq);
        }
    }
}

/// What the ledger check reads of a `ClusterStatus`.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub struct ControllerStatus {
    pub controller_id: Option<u64>,
    pub taken_submission_seq: Option<u64>,
    pub num_inflight: Option<u64>,
    /// Every live rank's status shows nothing running, waiting or being transferred.
    pub ranks_idle: bool,
    /// When the tokenizer read it.
    pub at: Instant,
}

impl ControllerStatus {
    pub fn of(status: &protocol::ClusterStatus) -> Self {
        let idle = |r: &protocol::RankInfo| {
            r.status.as_ref().is_some_and(|s| {
                s.num_running_reqs == 0
                    && s.num_waiting_reqs == 0
                    && s.disagg
                        .as_ref()
                        .is_none_or(|d| d.num_bootstrap_reqs == 0 && d.num_transfer_reqs == 0)
            })
        };
        ControllerStatus {
            controller_id: status.controller_id,
            taken_submission_seq: status.taken_submission_seq,
            num_inflight: status.num_inflight,
            ranks_idle: status.live_ranks.iter().all(idle),
            at: Instant::now(),
        }
    }
}

impl Handler<ControllerStatus> for Registry {
    type Result = ();

    fn handle(&mut self, msg: ControllerStatus, _: &mut Context<Self>) {
        let found = self.check_ledger(&msg);
        for line in protocol::note_violations(&mut self.violations, found) {
            tracing::error!("ledger check: {line}");
        }
    }
}

impl Registry {
    /// The lost requests `status` shows, one line each (see the module doc).
    fn check_ledger(&mut self, status: &ControllerStatus) -> Vec<String> {
        let since = match self.controller {
            Some((id, since)) if id == status.controller_id => since,
            _ => {
                // A controller not heard from before: what was sent until now is Reconcile's.
                self.controller = Some((status.controller_id, self.last_seq));
                self.quiet_run = None;
                return Vec::new();
            }
        };
        let quiet = status.num_inflight == Some(0)
            && status.ranks_idle
            && status.taken_submission_seq == Some(self.last_seq)
            && self.last_seq > since;
        if !quiet {
            self.quiet_run = None;
            return Vec::new();
        }
        tracing::trace!(through = self.last_seq, "ledger check at a quiet point");
        let (count, first) = self.quiet_run.get_or_insert((0, status.at));
        *count = count.saturating_add(1);
        let (count, waited) = (*count, status.at - *first);
        if count < LOST_AFTER_QUIET_STATUSES || waited < LOST_AFTER {
            return Vec::new();
        }
        let mut lost = Vec::new();
        for (rid, p) in self.pending.iter_mut() {
            if p.finished || p.reported || p.seq.is_none_or(|seq| seq <= since) {
                continue;
            }
            p.reported = true;
            lost.push(format!(
                "rid {rid}: waiting at the tokenizer (submission_seq {}), but the controller \
                 took every request through {}, counts none in flight and every live rank is \
                 idle, at {count} statuses in a row over {:.1} s",
                p.seq.unwrap_or(0),
                self.last_seq,
                waited.as_secs_f64()
            ));
        }
        lost.sort();
        lost
    }
}

/// What the ledger check found broken since start (the first few).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct Violations;

impl Handler<Violations> for Registry {
    type Result = MessageResult<Violations>;

    fn handle(&mut self, _: Violations, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.violations.clone())
    }
}

/// End one request here, at once, with a 503 saying `why` (it could not be sent on).
#[derive(Message)]
#[rtype(result = "()")]
pub struct FailOne {
    pub rid: String,
    pub why: &'static str,
}

impl Handler<FailOne> for Registry {
    type Result = ();

    fn handle(&mut self, msg: FailOne, _: &mut Context<Self>) {
        if let Some(p) = self.pending.get_mut(&msg.rid) {
            fail(&msg.rid, p, msg.why);
        }
    }
}

/// End with a 503 saying `why` every request registered at or after `since` that nothing
/// answered yet: the controller went quiet at `since`, so these most likely went into a
/// connection that was already dead. Requests a worker answered go on: their tokens come
/// straight from the worker.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FailUnansweredSince {
    pub since: Instant,
    pub why: &'static str,
}

impl Handler<FailUnansweredSince> for Registry {
    type Result = ();

    fn handle(&mut self, msg: FailUnansweredSince, _: &mut Context<Self>) {
        for (rid, p) in self.pending.iter_mut() {
            if !p.answered && p.registered >= msg.since {
                fail(rid, p, msg.why);
            }
        }
    }
}

/// End with a 503 saying `why` every request whose client still waits; returns their rids
/// (the caller aborts them on their workers).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct FailAllOpen {
    pub why: String,
}

impl Handler<FailAllOpen> for Registry {
    type Result = MessageResult<FailAllOpen>;

    fn handle(&mut self, msg: FailAllOpen, _: &mut Context<Self>) -> Self::Result {
        let mut open = Vec::new();
        for (rid, p) in self.pending.iter_mut() {
            if !p.tx.is_closed() {
                fail(rid, p, &msg.why);
                open.push(rid.clone());
            }
        }
        MessageResult(open)
    }
}

/// The registered rids (how many are in flight, which ones an abort names).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct Rids;

impl Handler<Rids> for Registry {
    type Result = MessageResult<Rids>;

    fn handle(&mut self, _: Rids, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.pending.keys().cloned().collect())
    }
}

/// How many requests are registered.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Count;

impl Handler<Count> for Registry {
    type Result = usize;

    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> usize {
        self.pending.len()
    }
}

fn fail(rid: &str, p: &mut Pending, why: &str) {
    p.answered = true;
    p.finished = true;
    let _ = p.tx.send(TokenOut::error(rid, 503, why));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn out(rid: &str) -> TokenOut {
        TokenOut {
            output_ids: vec![7],
            finish_reason: None,
            error: None,
            ..TokenOut::error(rid, 0, "")
        }
    }

    #[actix_rt::test]
    async fn outputs_reach_their_rid_until_it_is_unregistered() {
        let reg = Registry::new(8).start();
        let mut rx = reg
            .send(Register { rid: "a".into() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            reg.send(Register { rid: "a".into() }).await.unwrap().err(),
            Some(Refusal::RidInUse)
        );
        reg.do_send(Deliver(out("a")));
        reg.do_send(Deliver(out("nobody")));
        assert_eq!(rx.recv().await.unwrap().output_ids, vec![7]);
        assert_eq!(reg.send(Count).await.unwrap(), 1);
        reg.do_send(Unregister { rid: "a".into() });
        assert_eq!(reg.send(Count).await.unwrap(), 0);
        assert!(rx.recv().await.is_none(), "the sender went with the entry");
    }

    #[actix_rt::test]
    async fn a_stale_controller_fails_only_unanswered_requests_sent_after_its_last_status() {
        let reg = Registry::new(8).start();
        let mut before = reg
            .send(Register { rid: "old".into() })
            .await
            .unwrap()
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let since = Instant::now();
        let mut answered = reg
            .send(Register { rid: "ans".into() })
            .await
            .unwrap()
            .unwrap();
        let mut silent = reg
            .send(Register { rid: "new".into() })
            .await
            .unwrap()
            .unwrap();
        reg.do_send(Deliver(out("ans")));
        reg.send(FailUnansweredSince { since, why: "gone" })
            .await
            .unwrap();
        assert_eq!(silent.recv().await.unwrap().error.unwrap().status, 503);
        assert!(answered.recv().await.unwrap().error.is_none());
        assert!(answered.try_recv().is_err(), "an answered request goes on");
        assert!(
            before.try_recv().is_err(),
            "sent before the last status: goes on"
        );
    }

    #[actix_rt::test]
    async fn failing_all_open_skips_requests_whose_client_left() {
        let reg = Registry::new(8).start();
        let mut open = reg
            .send(Register { rid: "open".into() })
            .await
            .unwrap()
            .unwrap();
        drop(
            reg.send(Register { rid: "left".into() })
                .await
                .unwrap()
                .unwrap(),
        );
        let failed = reg
            .send(FailAllOpen {
                why: "stopping".into(),
            })
            .await
            .unwrap();
        assert_eq!(failed, vec!["open".to_string()]);
        let err = open.recv().await.unwrap().error.unwrap();
        assert_eq!((err.status, err.message.as_str()), (503, "stopping"));
    }

    /// A status of controller 1 that took everything through `taken`, read `ms` after `t0`.
    fn quiet_at(taken: u64, t0: Instant, ms: u64) -> ControllerStatus {
        ControllerStatus {
            controller_id: Some(1),
            taken_submission_seq: Some(taken),
            num_inflight: Some(0),
            ranks_idle: true,
            at: t0 + Duration::from_millis(ms),
        }
    }

    fn quiet(taken: u64) -> ControllerStatus {
        quiet_at(taken, Instant::now(), 0)
    }

    async fn sent(reg: &actix::Addr<Registry>, rid: &str, seq: u64) -> UnboundedReceiver<TokenOut> {
        let rx = reg
            .send(Register { rid: rid.into() })
            .await
            .unwrap()
            .unwrap();
        reg.do_send(Submitted {
            rid: rid.into(),
            seq,
        });
        rx
    }

    fn finished(rid: &str) -> TokenOut {
        TokenOut {
            finish_reason: Some(protocol::FinishReason::Length),
            ..out(rid)
        }
    }

    #[actix_rt::test]
    async fn a_request_the_quiet_controller_took_but_nobody_answered_is_named_once() {
        let reg = Registry::new(8).start();
        reg.send(quiet(0)).await.unwrap(); // the controller is heard from first
        let _lost = sent(&reg, "lost", 1).await;
        let _done = sent(&reg, "done", 2).await;
        reg.do_send(Deliver(finished("done")));
        let t0 = Instant::now();
        // Three quiet statuses within 100 ms (membership changes send them at once): still
        // within the grace, which is a second.
        for ms in [0, 50, 100] {
            reg.send(quiet_at(2, t0, ms)).await.unwrap();
        }
        assert!(
            reg.send(Violations).await.unwrap().is_empty(),
            "within the grace"
        );
        for ms in [600, 1100, 1600, 2100, 2600, 3100, 3600] {
            reg.send(quiet_at(2, t0, ms)).await.unwrap();
        }
        let v = reg.send(Violations).await.unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].starts_with("rid lost: waiting at the tokenizer (submission_seq 1)"),
            "{v:?}"
        );
    }

    #[actix_rt::test]
    async fn no_violation_unless_every_status_in_a_row_is_quiet_and_the_request_is_this_controllers(
    ) {
        let busy = [
            ControllerStatus {
                num_inflight: Some(1),
                ..quiet(2)
            },
            ControllerStatus {
                ranks_idle: false,
                ..quiet(2)
            },
            quiet(1), // the second request not taken in yet
            ControllerStatus {
                num_inflight: None, // a controller that predates the fields
                taken_submission_seq: None,
                ..quiet(2)
            },
        ];
        for not_quiet in busy {
            let reg = Registry::new(8).start();
            reg.send(quiet(0)).await.unwrap();
            let _a = sent(&reg, "a", 1).await;
            let _b = sent(&reg, "b", 2).await;
            // Quiet, not quiet, quiet, quiet over 1.5 s: never three quiet in a row.
            let t0 = Instant::now();
            for status in [
                quiet_at(2, t0, 0),
                not_quiet.clone(),
                quiet_at(2, t0, 1000),
                quiet_at(2, t0, 1500),
            ] {
                reg.send(status).await.unwrap();
            }
            let v = reg.send(Violations).await.unwrap();
            assert!(v.is_empty(), "{not_quiet:?}: {v:?}");
        }

        // Sent before this controller was first heard from (a restart): Reconcile's business.
        let reg = Registry::new(8).start();
        let _old = sent(&reg, "old", 1).await;
        reg.send(quiet(0)).await.unwrap();
        let _new = sent(&reg, "new", 2).await;
        reg.do_send(Deliver(finished("new")));
        let t0 = Instant::now();
        for i in 0..5 {
            reg.send(quiet_at(2, t0, i * 500)).await.unwrap();
        }
        assert!(reg.send(Violations).await.unwrap().is_empty());
    }
}
