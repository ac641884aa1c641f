//! The in-flight request registry, as an actor that owns it: which rids are waiting for
//! outputs, where each one's `TokenOut`s go, and whether anything came back for it yet. HTTP
//! handlers register and unregister rids; the PULL reader delivers outputs; the PUSH sender,
//! the cluster view and shutdown end requests that cannot be answered. None of them touches
//! the map: they send messages, so there is no lock to hold across a send or to poison.
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
}

/// Owns every registered request; see the module doc.
pub struct Registry {
    pending: HashMap<String, Pending>,
    /// Most requests in flight at once; past it a new one is refused at once.
    cap: usize,
}

impl Registry {
    pub fn new(cap: usize) -> Self {
        Registry {
            pending: HashMap::new(),
            cap,
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
                // The receiver is gone only if the request just ended; nothing to do.
                let _ = p.tx.send(out);
            }
            None => tracing::debug!(rid = %out.rid, "output for unknown or finished request"),
        }
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
}
