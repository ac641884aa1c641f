//! The controller refuses a request whose rid breaks the one rid limit
//! ([`protocol::MAX_RID_LEN`]) with a 400 to the tokenizer, and routes one at the limit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use controller::{Controller, ControllerConfig, Method, PrefixAffinityConfig};
use protocol::{Endpoint, GenerateReq, Message, MAX_RID_LEN};

fn request(rid: String) -> Message {
    Message::GenerateReq(GenerateReq {
        rid,
        input_ids: vec![1, 2, 3],
        sampling: Default::default(),
        stream: false,
        routing_key: None,
        routed_dp_rank: None,
        bootstrap_room: None,
        return_logprob: false,
        top_logprobs_num: 0,
        received_at: 0.0,
        dispatch_seq: 0,
        disagg: None,
    })
}

/// The next `TokenOut` the controller sends the tokenizer.
fn next_out(outputs: &zmq::Socket) -> protocol::TokenOut {
    loop {
        let frame = outputs.recv_bytes(0).expect("an output within the timeout");
        if let Ok(Message::TokenOut(out)) = protocol::decode(&frame) {
            return out;
        }
    }
}

#[test]
fn a_rid_over_the_limit_is_a_400_and_one_at_the_limit_is_routed() {
    let dir = tempfile::tempdir().unwrap();
    let ep = |name: &str| Endpoint::Ipc(dir.path().join(name));
    let config = ControllerConfig {
        controller_addr: ep("c.sock"),
        worker_addr: ep("w.sock"),
        tokenizer_addr: ep("t.sock"),
        method: Method::RoundRobin,
        decode_method: Method::TotalTokens,
        prefix_affinity: PrefixAffinityConfig::default(),
        trace_file: None,
        trace_dir: None,
        worker_timeout: Duration::from_secs(3),
        model_id: None,
        cluster_status_interval: Duration::from_millis(500),
    };
    let ctx = zmq::Context::new();
    let outputs = protocol::socket::bind(&ctx, zmq::PULL, &config.tokenizer_addr).unwrap();
    outputs.set_rcvtimeo(5000).unwrap();
    let requests =
        protocol::socket::connect(&ctx, zmq::PUSH, &config.controller_addr, None).unwrap();
    let controller = Controller::bind(&ctx, config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let running = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || controller.run(stop))
    };

    let long = "x".repeat(MAX_RID_LEN + 1);
    requests
        .send(protocol::encode(&request(long.clone())).unwrap(), 0)
        .unwrap();
    let out = next_out(&outputs);
    assert_eq!(out.rid, long);
    let err = out.error.expect("an error");
    assert_eq!(err.status, 400, "{err:?}");
    assert!(err.message.contains(&MAX_RID_LEN.to_string()), "{err:?}");

    // At the limit it is routed: with no rank live that is the 503 of routing, not a 400.
    let at_limit = "y".repeat(MAX_RID_LEN);
    requests
        .send(protocol::encode(&request(at_limit.clone())).unwrap(), 0)
        .unwrap();
    let out = next_out(&outputs);
    assert_eq!(out.rid, at_limit);
    assert_eq!(out.error.expect("no rank live").status, 503);

    stop.store(true, Ordering::Relaxed);
    running.join().unwrap().unwrap();
}
