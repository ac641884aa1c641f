//! The tokenizer's view of the cluster, as an actor that owns it: the controller's latest
//! `ClusterStatus` and when it arrived. The PULL reader hands it each status; HTTP handlers
//! and the PUSH sender ask for the latest. It also watches for the controller going quiet
//! and tells the [`Registry`] which requests to end then.

use std::time::{Duration, Instant};

use actix::{Actor, Addr, AsyncContext, Context, Handler, Message, MessageResult};
use protocol::ClusterStatus;

use crate::registry::{FailUnansweredSince, Registry};

/// A cluster status older than this means the controller is unreachable: `/health` turns 503
/// and requests are answered 503 with `Retry-After` at once rather than sent into a socket
/// nobody reads. The controller sends one about every 500 ms, so this is three missed.
pub const CLUSTER_STATUS_STALE_AFTER: Duration = Duration::from_millis(1500);

/// Why a request is refused while no fresh cluster status arrives.
pub const CONTROLLER_UNREACHABLE: &str =
    "the controller is unreachable (no cluster status from it recently); retry shortly";

/// How often the view checks whether the controller went quiet.
const STALE_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The latest cluster view and when it arrived (local clock: the controller may be another host).
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    pub status: ClusterStatus,
    pub received: Instant,
}

impl ClusterSnapshot {
    /// A status this recent means the controller is alive.
    pub fn is_fresh(&self) -> bool {
        self.received.elapsed() < CLUSTER_STATUS_STALE_AFTER
    }
}

/// Owns the latest [`ClusterSnapshot`]; see the module doc.
pub struct ClusterView {
    latest: Option<ClusterSnapshot>,
    registry: Addr<Registry>,
}

impl ClusterView {
    pub fn new(registry: Addr<Registry>) -> Self {
        ClusterView {
            latest: None,
            registry,
        }
    }

    /// Once the controller has gone quiet (no status for [`CLUSTER_STATUS_STALE_AFTER`]), a
    /// request sent after its last status that no worker has answered most likely went into
    /// a connection that was already dead: fail it now with a 503 (the client may retry)
    /// rather than at the request timeout.
    fn fail_unrouted_when_controller_gone(&self) {
        if let Some(snap) = self.latest.as_ref().filter(|snap| !snap.is_fresh()) {
            self.registry.do_send(FailUnansweredSince {
                since: snap.received,
                why: CONTROLLER_UNREACHABLE,
            });
        }
    }
}

impl Actor for ClusterView {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(STALE_CHECK_EVERY, |view, _| {
            view.fail_unrouted_when_controller_gone()
        });
    }
}

/// A status from the controller, just received.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Update(pub ClusterStatus);

impl Handler<Update> for ClusterView {
    type Result = ();

    fn handle(&mut self, Update(status): Update, _: &mut Context<Self>) {
        self.latest = Some(ClusterSnapshot {
            status,
            received: Instant::now(),
        });
    }
}

/// The latest snapshot, fresh or not; `None` before the first status.
#[derive(Message)]
#[rtype(result = "Option<ClusterSnapshot>")]
pub struct Latest;

impl Handler<Latest> for ClusterView {
    type Result = MessageResult<Latest>;

    fn handle(&mut self, _: Latest, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.latest.clone())
    }
}
