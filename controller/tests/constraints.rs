//! A request with a structured-output constraint goes only to a worker that says it enforces
//! constraints (`Hello.constraints`): a worker that predates the field would ignore it and
//! answer unconstrained text, so the controller answers 503 naming the rank instead; requests
//! without a constraint go to either.

mod common;

use common::Worker;
use controller::Method;
use protocol::{Constraint, DisaggMode, GenerateReq, Message, SamplingParams};

fn request(rid: &str, rank: u32, constrained: bool) -> Message {
    Message::GenerateReq(GenerateReq {
        routed_dp_rank: Some(rank),
        sampling: SamplingParams {
            constraint: constrained.then(|| Constraint::Regex("yes|no".into())),
            ..SamplingParams::default()
        },
        ..GenerateReq::new(rid, vec![1, 2, 3])
    })
}

#[test]
fn a_constrained_request_reaches_only_a_worker_that_enforces_constraints() {
    let c = common::start(Method::RoundRobin);
    let (ctx, addr) = (&c.ctx, &c.worker_addr);
    let old = Worker::join_with(ctx, addr, 0, DisaggMode::Null, false);
    let new = Worker::join_with(ctx, addr, 1, DisaggMode::Null, true);

    c.send(&request("to-old", 0, true));
    let out = c.next_out();
    assert_eq!(out.rid, "to-old");
    let err = out.error.expect("refused");
    assert_eq!(err.status, 503, "{err:?}");
    assert!(
        err.message.contains("rank 0") && err.message.contains("structured output"),
        "{err:?}"
    );

    c.send(&request("to-new", 1, true));
    let got = new.next_request();
    assert_eq!(got.rid, "to-new");
    assert!(got.sampling.constraint.is_some());

    c.send(&request("plain", 0, false));
    assert_eq!(old.next_request().rid, "plain");
    c.stop();
}
