//! A disaggregated deployment as the controller sees it, over real sockets with workers played
//! by DEALER sockets: each request goes to one prefill rank and one decode rank with the same
//! room (its own, whatever `bootstrap_room` the client gave) and the prefill worker's KV endpoint, an explicit rank picks the decode side, a missing
//! role is a 503, and a rank that leaves is announced to the other role (`PeerGone`).

mod common;

use common::Worker;
use controller::Method;
use protocol::{DisaggMode, GenerateReq, Message, Shutdown};

fn request(rid: &str, routed_dp_rank: Option<u32>) -> Message {
    Message::GenerateReq(GenerateReq {
        routed_dp_rank,
        ..GenerateReq::new(rid, vec![1, 2, 3])
    })
}

#[test]
fn requests_are_paired_and_departures_announced() {
    let c = common::start(Method::RoundRobin);
    let (ctx, worker_addr) = (&c.ctx, &c.worker_addr);
    let send = |msg: Message| c.send(&msg);

    // Only a prefill rank: no decode rank to pair with.
    let p0 = Worker::join(ctx, worker_addr, 0, DisaggMode::Prefill);
    send(request("lonely", None));
    let out = c.next_out();
    assert_eq!(out.rid, "lonely");
    let err = out.error.expect("refused");
    assert_eq!(
        (err.status, err.message.as_str()),
        (503, "no live decode rank")
    );

    let d1 = Worker::join(ctx, worker_addr, 1, DisaggMode::Decode);
    let d2 = Worker::join(ctx, worker_addr, 2, DisaggMode::Decode);
    // Both legs carry the same pairing; the prefill leg comes first.
    send(request("a", None));
    let leg_p = p0.next_request();
    let leg = leg_p.disagg.clone().expect("paired");
    assert_eq!(leg.prefill_rank, 0);
    assert_eq!(leg.prefill_kv_endpoint, "ipc:///kv-0.sock");
    assert_eq!(leg_p.bootstrap_room, None, "the client's field, untouched");
    assert!(leg.room <= i64::MAX as u64);
    let decode = if leg.decode_rank == 1 { &d1 } else { &d2 };
    let leg_d = decode.next_request();
    assert_eq!(leg_d.rid, "a");
    assert_eq!(leg_d.disagg, Some(leg.clone()));

    // A client's bootstrap_room never names the transfer: two requests that give the same one
    // (two clients, or the choices of one n > 1 request) each get a room of their own.
    let mut rooms = Vec::new();
    for rid in ["same-1", "same-2"] {
        send(Message::GenerateReq(GenerateReq {
            bootstrap_room: Some(42),
            ..GenerateReq::new(rid, vec![1, 2, 3])
        }));
        let leg_p = p0.next_request();
        assert_eq!(
            leg_p.bootstrap_room,
            Some(42),
            "kept for follow_bootstrap_room"
        );
        let leg = leg_p.disagg.expect("paired");
        assert_ne!(leg.room, 42);
        let decode = if leg.decode_rank == 1 { &d1 } else { &d2 };
        assert_eq!(decode.next_request().disagg.map(|l| l.room), Some(leg.room));
        rooms.push(leg.room);
    }
    assert_ne!(rooms[0], rooms[1], "one transfer room per request");

    // An explicit rank applies to the decode side.
    send(request("b", Some(2)));
    let leg = p0.next_request().disagg.expect("paired");
    assert_eq!(leg.decode_rank, 2);
    assert_eq!(d2.next_request().rid, "b");

    // A prefill rank that leaves is announced to every decode rank.
    protocol::socket::send(
        &p0.sock,
        &Message::Shutdown(Shutdown {
            rank: Some(0),
            reason: "killed".into(),
            drain_timeout_s: None,
        }),
    )
    .unwrap();
    for d in [&d1, &d2] {
        match d.next() {
            Message::PeerGone(g) => assert_eq!((g.rank, g.reason.as_str()), (0, "killed")),
            other => panic!("rank {}: expected PeerGone, got {other:?}", d.rank),
        }
    }
    send(request("c", None));
    let err = c.next_out().error.expect("refused");
    assert_eq!(
        (err.status, err.message.as_str()),
        (503, "no live prefill rank")
    );

    c.stop();
}
