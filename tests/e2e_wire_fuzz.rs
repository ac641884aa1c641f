//! Hostile frames to every actor over its real sockets, while clients are served: a real
//! `dpserve up` (two ranks of the built-in model), and a peer on each socket an actor binds (the
//! controller's request socket and its worker socket, the tokenizer's output socket) sending
//! every message type with extreme values (NaN, ±inf, huge counts and lengths, empty, long and
//! colliding ids, ranks that do not exist, a client's `bootstrap_room` on every request),
//! then random mutations of those frames and random bytes. Every actor keeps serving: each
//! client request ends with exactly one answer, greedy output afterwards is what it was before,
//! no ledger check finds anything, and `up` is still running (no actor died).

use crate::common;

use std::time::Duration;

use common::Server;
use protocol::{encode, Message};
use serde_json::{json, Value};

/// A message from its wire JSON (the fields a peer leaves out take their defaults).
fn msg(v: Value) -> Message {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// Every message type, each with values no honest peer sends.
fn extreme_messages() -> Vec<Message> {
    let long = "r".repeat(100_000);
    let huge_ids: Vec<u32> = (0..200_000).map(|i| i * 7919).collect();
    let held = vec!["fuzz-a"; 3];
    let removed = vec![u64::MAX; 1000];
    let stored: Vec<u64> = (0..50_000).collect();
    let reconcile = vec!["fuzz-dup"; 10_000];
    let mut out = Vec::new();
    let sampling = [
        json!({"temperature": -1.0}),
        json!({"top_p": 0.0, "top_k": i32::MIN}),
        json!({"max_new_tokens": u32::MAX}),
        json!({"min_p": 7.0, "repetition_penalty": 0.0}),
        json!({"stop_token_ids": [u32::MAX, 0, 0], "logit_bias": [[u32::MAX, 1e30]]}),
    ];
    for (i, s) in sampling.iter().enumerate() {
        out.push(msg(
            json!({"GenerateReq": {"rid": format!("fuzz-s{i}"), "input_ids": [1, 2, 3],
            "sampling": s, "bootstrap_room": 7, "top_logprobs_num": u32::MAX}}),
        ));
    }
    for (rid, ids) in [
        ("", json!([1])),
        (long.as_str(), json!([1])),
        ("fuzz-empty", json!([])),
        ("fuzz-vocab", json!([u32::MAX, 0])),
        ("fuzz-huge", json!(huge_ids)),
        ("fuzz-dup", json!([5, 6])),
        ("fuzz-dup", json!([5, 6])),
    ] {
        out.push(msg(json!({"GenerateReq": {"rid": rid, "input_ids": ids,
            "routed_dp_rank": null, "bootstrap_room": u64::MAX, "dispatch_seq": u64::MAX,
            "received_at": -1e308, "sampling": {"max_new_tokens": 2}}})));
        out.push(msg(
            json!({"EmbedReq": {"rid": rid, "input_ids": ids, "dispatch_seq": u64::MAX}}),
        ));
    }
    out.push(msg(
        json!({"GenerateReq": {"rid": "fuzz-rank", "input_ids": [1],
        "routed_dp_rank": u32::MAX, "sampling": {"max_new_tokens": 1}}}),
    ));
    out.push(msg(
        json!({"GenerateReq": {"rid": "fuzz-leg", "input_ids": [1, 2],
        "sampling": {"max_new_tokens": 1}, "disagg": {"room": 1, "prefill_rank": u32::MAX,
        "decode_rank": 0, "prefill_kv_endpoint": "ipc:///nowhere/kv.sock"}}}),
    ));
    // NaN and infinities cannot be written in JSON: set on the typed messages.
    let mut nan = protocol::GenerateReq::new("fuzz-nan", vec![1, 2]);
    nan.sampling.temperature = f32::NAN;
    nan.sampling.top_p = f32::INFINITY;
    nan.received_at = f64::NAN;
    out.push(Message::GenerateReq(nan));
    let mut bias = protocol::GenerateReq::new("fuzz-bias", vec![1, 2]);
    bias.sampling.logit_bias = vec![(1, f32::NEG_INFINITY), (2, f32::NAN)];
    out.push(Message::GenerateReq(bias));
    for rid in [json!(null), json!(""), json!(long), json!("fuzz-unknown")] {
        out.push(msg(json!({"Abort": {"rid": rid}})));
    }
    out.push(msg(json!({"FlushCache": {}})));
    out.push(msg(
        json!({"TokenOut": {"rid": "fuzz-unknown", "output_ids": [u32::MAX],
        "finish_reason": "stop", "prompt_tokens": u32::MAX, "dp_rank": u32::MAX,
        "logprobs": [1e30], "embedding": [0.0]}}),
    ));
    out.push(msg(
        json!({"TokenOut": {"rid": "", "error": {"status": 0, "message": long}}}),
    ));
    for (rank, version, model) in [(0, 1, "fuzz"), (u32::MAX, 0, ""), (9, 99, "fuzz")] {
        out.push(msg(
            json!({"Hello": {"rank": rank, "capacity": {"max_total_tokens": u64::MAX,
            "max_running_requests": 0, "context_len": 0, "vocab_size": 0}, "model_id": model,
            "protocol_version": version, "pid": 0, "held_rids": held,
            "taken_seq": u64::MAX}}),
        ));
    }
    out.push(msg(json!({"HelloAck": {"rank": 0, "accepted": false}})));
    out.push(msg(json!({"Rejoin": {"rank": u32::MAX}})));
    for t in [f64::NAN, f64::INFINITY, -1.0, 1e308] {
        out.push(Message::Heartbeat(protocol::Heartbeat {
            rank: 0,
            timestamp: t,
        }));
        out.push(Message::Shutdown(protocol::Shutdown {
            rank: Some(0),
            reason: long.clone(),
            drain_timeout_s: Some(t),
        }));
        out.push(Message::WorkerStatus(protocol::WorkerStatus {
            rank: 0,
            timestamp: t,
            cache_hit_rate: t,
            gen_throughput: t,
            num_used_tokens: u64::MAX,
            max_total_tokens: 0,
            finished_rids: vec!["fuzz-dup".into(); 1000],
            taken_seq: Some(u64::MAX),
            status_seq: Some(u64::MAX),
            ..Default::default()
        }));
    }
    out.push(msg(json!({"Shutdown": {"rank": null, "reason": ""}})));
    out.push(msg(
        json!({"ClusterStatus": {"timestamp": 1.0, "load_balance_method": long,
        "live_ranks": [], "taken_submission_seq": u64::MAX}}),
    ));
    out.push(msg(
        json!({"KvReady": {"room": 7, "rid": "fuzz-dup", "decode_rank": u32::MAX,
        "layout": {"model_id": "", "num_layers": 0, "num_kv_heads": 0, "head_dim": 0,
        "dtype": "f64"}, "prompt_len": u64::MAX}}),
    ));
    out.push(msg(
        json!({"KvChunk": {"room": 7, "seq": u32::MAX, "start": u64::MAX,
        "tokens": u64::MAX, "bytes": u64::MAX}}),
    ));
    out.push(msg(
        json!({"KvDone": {"room": 7, "chunks": u32::MAX, "first_token": u32::MAX}}),
    ));
    out.push(msg(
        json!({"KvAbort": {"room": 7, "status": 0, "reason": ""}}),
    ));
    out.push(msg(json!({"PeerGone": {"rank": 0, "reason": "fuzz"}})));
    out.push(msg(
        json!({"KvEvents": {"rank": 0, "seq": u64::MAX, "block_size": 0,
        "cleared": true, "removed": removed, "stored": stored}}),
    ));
    out.push(msg(json!({"KvSnapshotReq": {"rank": u32::MAX}})));
    out.push(msg(json!({"Reconcile": {"rids": reconcile}})));
    out
}

/// SplitMix64: the same frames every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `frames` mutated: bytes flipped, cut short, glued, or random bytes.
fn mutations(frames: &[Vec<u8>], rng: &mut Rng, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|_| {
            let mut f = frames[rng.below(frames.len())].clone();
            match rng.below(4) {
                0 => {
                    for _ in 0..1 + rng.below(8) {
                        let i = rng.below(f.len());
                        f[i] ^= 1 << rng.below(8);
                    }
                }
                1 => f.truncate(rng.below(f.len())),
                2 => f.extend(frames[rng.below(frames.len())].iter().take(64)),
                _ => f = (0..rng.below(256)).map(|_| rng.next() as u8).collect(),
            }
            f
        })
        .collect()
}

fn greedy(text: &str) -> Value {
    json!({"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
}

#[test]
fn hostile_frames_to_every_actor_stop_none_and_every_request_ends_once() {
    let mut server = Server::up(&["--dp-size", "2", "--worker-timeout", "5"]);
    let prompts: Vec<String> = (0..4).map(|i| format!("{i} once upon a time")).collect();
    let before: Vec<Value> = prompts
        .iter()
        .map(|p| server.post("/generate", &greedy(p)).1["output_ids"].clone())
        .collect();

    let messages = extreme_messages();
    let frames: Vec<Vec<u8>> = messages.iter().map(|m| encode(m).unwrap()).collect();
    let mut rng = Rng(51);
    let mutated = mutations(&frames, &mut rng, 3_000);

    // Clients keep sending while the frames arrive.
    let clients = server.post_concurrently(
        "/generate",
        (0..16)
            .map(|i| greedy(&format!("client {i} meets the fuzz")))
            .collect(),
    );
    let ctx = zmq::Context::new();
    let dir = server.runtime_dir.path();
    let ep = |name: &str| protocol::Endpoint::Ipc(dir.join(name));
    let to_controller = protocol::socket::connect(&ctx, zmq::PUSH, &ep("controller.sock"), None)
        .expect("the controller's request socket");
    // A worker's identity for a rank no worker holds: its Hellos are refused, the rest of
    // what it sends is not a registered rank's.
    let identity = protocol::socket::worker_identity(7);
    let as_worker =
        protocol::socket::connect(&ctx, zmq::DEALER, &ep("worker.sock"), Some(&identity))
            .expect("the controller's worker socket");
    let to_tokenizer = protocol::socket::connect(&ctx, zmq::PUSH, &ep("tokenizer.sock"), None)
        .expect("the tokenizer's output socket");
    let mut sent = 0;
    for sock in [&to_controller, &as_worker, &to_tokenizer] {
        sock.set_sndtimeo(5_000).unwrap();
        for f in frames.iter().chain(&mutated) {
            sock.send(f.as_slice(), 0).expect("a frame sent");
            sent += 1;
        }
    }
    for c in clients {
        let reply = c.join().expect("a client thread");
        // One answer each, whatever it is (an abort-all frame may end one early).
        assert!(
            reply.status == 200 || reply.body["error"].is_object(),
            "{} {}",
            reply.status,
            reply.body
        );
    }
    // A cluster view forged on the tokenizer's socket (no live rank) holds until the
    // controller's next status: at most one status interval.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.post("/generate", &greedy("again")).0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster did not serve again"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Past the tokenizer's staleness bound (1.5 s): the controller's statuses keep arriving
    // after the hostile frames and are still read as its word.
    std::thread::sleep(Duration::from_millis(2000));
    // Serving as before: the same greedy output, nothing found by any ledger check.
    for (p, want) in prompts.iter().zip(&before) {
        let (status, resp) = server.post("/generate", &greedy(p));
        assert_eq!(status, 200, "{resp}");
        assert_eq!(&resp["output_ids"], want, "{p}");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (_, info) = server.get("/get_server_info");
    assert_eq!(info["ranks"].as_array().map(Vec::len), Some(2), "{info}");
    for rank in info["ranks"].as_array().unwrap() {
        assert!(rank.get("invariant_violations").is_none(), "{rank}");
        assert!(
            rank["status"].get("invariant_violations").is_none(),
            "{rank}"
        );
    }
    assert!(
        info.get("invariant_violations")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty),
        "tokenizer ledger: {info}"
    );
    eprintln!(
        "{sent} hostile frames ({} typed, {} mutated, to 3 sockets)",
        frames.len(),
        mutated.len()
    );
    drop((to_controller, as_worker, to_tokenizer));
    // The workers drain what they hold, forged requests of any length included, for up to
    // their drain timeout (30 s): a loaded host may need most of it.
    assert!(
        server.stop_within(Duration::from_secs(45)),
        "up stopped cleanly: no actor died"
    );
}
