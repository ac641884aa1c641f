//! Frames no honest peer sends, from a registered worker and from the tokenizer's socket, over
//! real sockets: the controller drops each one (counted) and keeps routing. Before the wire
//! checks, `Shutdown { drain_timeout_s: NaN }` from any registered worker panicked it, and
//! `dpserve up` then stopped the whole deployment.

mod common;

use common::Worker;
use controller::Method;
use protocol::{
    DisaggMode, GenerateReq, Heartbeat, Message, SamplingParams, Shutdown, WorkerStatus,
};

fn shutdown(drain_timeout_s: f64) -> Message {
    Message::Shutdown(Shutdown {
        rank: Some(0),
        reason: "drain".into(),
        drain_timeout_s: Some(drain_timeout_s),
    })
}

#[test]
fn a_worker_frame_with_a_nan_or_infinite_float_is_dropped_and_routing_goes_on() {
    let c = common::start(Method::RoundRobin);
    let w = Worker::join(&c.ctx, &c.worker_addr, 0, DisaggMode::Null);
    let hostile = [
        shutdown(f64::NAN),
        shutdown(f64::INFINITY),
        shutdown(f64::NEG_INFINITY),
        shutdown(-1.0),
        Message::Heartbeat(Heartbeat {
            rank: 0,
            timestamp: f64::NAN,
        }),
        Message::WorkerStatus(WorkerStatus {
            rank: 0,
            timestamp: 1.0,
            cache_hit_rate: f64::NAN,
            ..Default::default()
        }),
        Message::WorkerStatus(WorkerStatus {
            rank: 0,
            timestamp: f64::INFINITY,
            gen_throughput: -1.0,
            ..Default::default()
        }),
    ];
    for msg in &hostile {
        // Encoding does not check: a hostile peer's frame is exactly this.
        protocol::socket::send(&w.sock, msg).unwrap();
    }
    // Had any of them been taken, the rank would be draining (no new requests) or the
    // controller gone; it still routes to it.
    c.send(&Message::GenerateReq(GenerateReq::new(
        "after",
        vec![1, 2, 3],
    )));
    assert_eq!(w.next_request().rid, "after");
    c.stop();
}

#[test]
fn a_request_frame_with_a_nan_sampling_parameter_or_an_empty_rid_is_dropped() {
    let c = common::start(Method::RoundRobin);
    let w = Worker::join(&c.ctx, &c.worker_addr, 0, DisaggMode::Null);
    let with = |rid: &str, sampling: SamplingParams| {
        Message::GenerateReq(GenerateReq {
            sampling,
            ..GenerateReq::new(rid, vec![1, 2, 3])
        })
    };
    let d = SamplingParams::default();
    for bad in [
        with(
            "t",
            SamplingParams {
                temperature: f32::NAN,
                ..d.clone()
            },
        ),
        with(
            "p",
            SamplingParams {
                top_p: f32::INFINITY,
                ..d.clone()
            },
        ),
        with(
            "b",
            SamplingParams {
                logit_bias: vec![(1, f32::NAN)],
                ..d.clone()
            },
        ),
        with("", d.clone()),
    ] {
        c.send(&bad);
    }
    c.send(&with("fine", d));
    // Only the well-formed request reaches the worker.
    assert_eq!(w.next_request().rid, "fine");
    c.stop();
}
