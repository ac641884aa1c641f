//! Late binding over real sockets: with `cache_aware` and a hold, a request arriving while the
//! only rank's predicted wait is longer than the hold stays in the controller (the worker gets
//! nothing), an `Abort` of a held request ends it there with finish reason `abort`, and once a
//! status shows the rank about to free the held requests go out, shortest prompt first.

mod common;

use std::time::Duration;

use controller::{CacheAwareConfig, Method};
use protocol::{
    Abort, DisaggMode, FinishReason, GenerateReq, Message, PrefillStatus, WorkerStatus,
};

/// A status of rank 0 that has computed `computed` prompt tokens in `busy` seconds and has
/// `backlog` queued.
fn status(seq: u64, computed: u64, busy: f64, backlog: u64) -> Message {
    Message::WorkerStatus(WorkerStatus {
        rank: 0,
        timestamp: protocol::unix_time(),
        status_seq: Some(seq),
        max_total_tokens: 4096,
        prefill: Some(PrefillStatus {
            backlog_tokens: backlog,
            computed_tokens: computed,
            busy_seconds: busy,
        }),
        ..Default::default()
    })
}

fn request(rid: &str, len: usize) -> Message {
    let mut req = GenerateReq::new(rid, vec![7; len]);
    req.return_routing = true;
    Message::GenerateReq(req)
}

#[test]
fn a_request_waits_in_the_controller_while_every_rank_is_busy() {
    let c = common::start_with(
        Method::CacheAware,
        CacheAwareConfig {
            hold_wait: Duration::from_millis(100),
            max_hold: Duration::from_secs(30),
            ..CacheAwareConfig::default()
        },
    );
    let w = common::Worker::join(&c.ctx, &c.worker_addr, 0, DisaggMode::Null);
    let send_status = |m: Message| protocol::socket::send(&w.sock, &m).unwrap();
    // Measured at 10 000 prompt tokens a second, with 50 000 queued: 5 s before it could
    // start another prompt.
    send_status(status(1, 0, 0.0, 0));
    std::thread::sleep(Duration::from_millis(40));
    send_status(status(2, 10_000, 1.0, 50_000));
    std::thread::sleep(Duration::from_millis(100));

    c.send(&request("long", 40));
    c.send(&request("gone", 20));
    c.send(&request("short", 4));
    // For half a second the worker hears only the controller's probes.
    w.sock.set_rcvtimeo(100).unwrap();
    let until = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < until {
        let Ok(frame) = w.sock.recv_bytes(0) else {
            continue;
        };
        match protocol::decode(&frame).unwrap() {
            // cache_aware asks a new rank for its blocks; the controller probes it.
            Message::KvSnapshotReq(_) | Message::Heartbeat(_) => continue,
            other => panic!("nothing is dispatched while the rank is busy: {other:?}"),
        }
    }
    c.send(&Message::Abort(Abort {
        rid: Some("gone".into()),
    }));
    let out = c.next_out();
    assert_eq!(
        (out.rid.as_str(), out.finish_reason, out.error),
        ("gone", Some(FinishReason::Abort), None)
    );
    // The abort also went to the rank (it may hold the rid in a race): read past it.
    w.sock.set_rcvtimeo(5000).unwrap();
    loop {
        match w.next() {
            Message::Abort(a) => break assert_eq!(a.rid.as_deref(), Some("gone")),
            Message::KvSnapshotReq(_) | Message::Heartbeat(_) => continue,
            other => panic!("expected the abort, got {other:?}"),
        }
    }

    // The rank drained its queue: the held requests go out, the shorter first, each saying
    // how long it was held when its client asked for the decision.
    send_status(status(3, 60_000, 6.0, 0));
    let short = w.next_request();
    assert_eq!(short.rid, "short");
    let held_ms = short.routing[0].held_ms.expect("held_ms in the record");
    assert!(held_ms >= 500.0, "{held_ms}");
    assert_eq!(w.next_request().rid, "long");
    c.stop();
}

#[test]
fn without_a_measured_speed_or_a_hold_nothing_is_held() {
    // The default: no hold. A busy rank still gets the request at once.
    let c = common::start(Method::CacheAware);
    let w = common::Worker::join(&c.ctx, &c.worker_addr, 0, DisaggMode::Null);
    protocol::socket::send(&w.sock, &status(1, 0, 0.0, 0)).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    protocol::socket::send(&w.sock, &status(2, 10_000, 1.0, 50_000)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    c.send(&request("now", 8));
    assert_eq!(w.next_request().rid, "now");
    c.stop();

    // With a hold but no speed measured yet: routed at once too.
    let c = common::start_with(
        Method::CacheAware,
        CacheAwareConfig {
            hold_wait: Duration::from_millis(100),
            ..CacheAwareConfig::default()
        },
    );
    let w = common::Worker::join(&c.ctx, &c.worker_addr, 0, DisaggMode::Null);
    c.send(&request("unmeasured", 8));
    assert_eq!(w.next_request().rid, "unmeasured");
    c.stop();
}
