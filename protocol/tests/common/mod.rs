//! Fixtures shared by the wire tests: one fixed example of every message (the golden vectors of
//! `WIRE.md`), hex helpers and a tiny seeded generator.
//!
//! Not every test binary uses every helper.
#![allow(dead_code)]

use protocol::{
    Abort, Capacity, ClusterStatus, EmbedReq, FinishReason, FlushCache, GenerateReq, GpuInfo,
    Heartbeat, Hello, HelloAck, Message, RankInfo, Rejoin, RouteCount, SamplingParams, Shutdown,
    TokenOut, WorkerStatus,
};

/// A fixed timestamp (Unix seconds) exactly representable in an f64, so examples print exactly.
pub const T0: f64 = 1_700_000_000.25;

/// The golden examples: a name (used in test failures and in `WIRE.md`) and the message.
/// Float values are exactly representable as f32, so every language prints them the same.
pub fn examples() -> Vec<(&'static str, Message)> {
    vec![
        (
            "GenerateReq",
            Message::GenerateReq(GenerateReq {
                rid: "r1".into(),
                input_ids: vec![1, 15043, 3186],
                sampling: SamplingParams {
                    max_new_tokens: 16,
                    temperature: 0.5,
                    top_p: 0.75,
                    top_k: 40,
                    min_p: 0.0,
                    seed: Some(7),
                    repetition_penalty: 1.0,
                    frequency_penalty: 0.0,
                    presence_penalty: 0.0,
                    stop_token_ids: vec![2],
                    ignore_eos: false,
                    logit_bias: vec![(3186, -2.5)],
                    constraint: None,
                },
                stream: true,
                routing_key: Some("user-42".into()),
                routed_dp_rank: None,
                bootstrap_room: None,
                return_logprob: true,
                top_logprobs_num: 2,
                received_at: T0,
                dispatch_seq: 7,
                disagg: None,
                submission_seq: None,
                return_routing: false,
                routing: Vec::new(),
            }),
        ),
        (
            "GenerateReq-disagg",
            Message::GenerateReq(GenerateReq {
                rid: "r3".into(),
                input_ids: vec![1, 15043],
                sampling: SamplingParams::default(),
                stream: false,
                routing_key: None,
                routed_dp_rank: None,
                bootstrap_room: Some(1234567890123),
                return_logprob: false,
                top_logprobs_num: 0,
                received_at: T0,
                dispatch_seq: 2,
                disagg: Some(protocol::DisaggLeg {
                    room: 1234567890123,
                    prefill_rank: 0,
                    decode_rank: 1,
                    prefill_kv_endpoint: "tcp://10.0.0.5:7010".into(),
                    prefill_kv_key: None,
                }),
                submission_seq: None,
                return_routing: false,
                routing: Vec::new(),
            }),
        ),
        (
            "GenerateReq-constraint",
            Message::GenerateReq(GenerateReq {
                sampling: SamplingParams {
                    max_new_tokens: 32,
                    temperature: 0.0,
                    constraint: Some(protocol::Constraint::JsonSchema(
                        r#"{"type":"boolean"}"#.into(),
                    )),
                    ..SamplingParams::default()
                },
                received_at: T0,
                dispatch_seq: 3,
                ..GenerateReq::new("r4", vec![1, 15043])
            }),
        ),
        (
            "EmbedReq",
            Message::EmbedReq(EmbedReq {
                rid: "e1".into(),
                input_ids: vec![1, 15043],
                routing_key: None,
                routed_dp_rank: Some(1),
                received_at: T0,
                dispatch_seq: 7,
                submission_seq: None,
            }),
        ),
        (
            "Abort",
            Message::Abort(Abort {
                rid: Some("r1".into()),
            }),
        ),
        ("Abort-all", Message::Abort(Abort { rid: None })),
        ("FlushCache", Message::FlushCache(FlushCache {})),
        (
            "TokenOut",
            Message::TokenOut(TokenOut {
                rid: "r1".into(),
                output_ids: vec![450, 2],
                finish_reason: Some(FinishReason::Stop),
                matched_stop: Some(2),
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 1,
                dp_rank: Some(0),
                logprobs: Some(vec![-0.5, -0.25]),
                top_logprobs: Some(vec![
                    vec![(450, -0.5), (1576, -1.5)],
                    vec![(2, -0.25), (29889, -2.0)],
                ]),
                embedding: None,
                error: None,
                routing: Vec::new(),
            }),
        ),
        (
            "TokenOut-error",
            Message::TokenOut(TokenOut::error("r2", 400, "rank 5 is not live")),
        ),
        (
            "Hello",
            Message::Hello(Hello {
                rank: 0,
                capacity: capacity(),
                model_id: "dpserve-builtin".into(),
                protocol_version: 1,
                pid: 4242,
                held_rids: vec!["r1".into()],
                disaggregation_mode: protocol::DisaggMode::Null,
                kv_endpoint: None,
                kv_public_key: None,
                kv_layout: None,
                gpu: None,
                taken_seq: Some(57),
                constraints: true,
                finish_first_tokens: 16,
            }),
        ),
        (
            "Hello-prefill",
            Message::Hello(Hello {
                rank: 0,
                capacity: capacity(),
                model_id: "dpserve-builtin".into(),
                protocol_version: 1,
                pid: 4243,
                held_rids: vec![],
                disaggregation_mode: protocol::DisaggMode::Prefill,
                kv_endpoint: Some("tcp://10.0.0.5:7010".into()),
                kv_public_key: None,
                kv_layout: Some(layout()),
                gpu: None,
                taken_seq: None,
                constraints: false,
                finish_first_tokens: 0,
            }),
        ),
        (
            "Hello-cuda",
            Message::Hello(Hello {
                rank: 1,
                capacity: capacity(),
                model_id: "dpserve-builtin".into(),
                protocol_version: 1,
                pid: 4244,
                held_rids: vec![],
                disaggregation_mode: protocol::DisaggMode::Null,
                kv_endpoint: None,
                kv_public_key: None,
                kv_layout: None,
                gpu: Some(gpu()),
                taken_seq: None,
                constraints: false,
                finish_first_tokens: 0,
            }),
        ),
        (
            "HelloAck",
            Message::HelloAck(HelloAck {
                rank: 0,
                accepted: true,
                reason: None,
            }),
        ),
        ("Rejoin", Message::Rejoin(Rejoin { rank: 0 })),
        (
            "Heartbeat",
            Message::Heartbeat(Heartbeat {
                rank: 0,
                timestamp: T0,
            }),
        ),
        ("WorkerStatus", Message::WorkerStatus(worker_status())),
        (
            "ClusterStatus",
            Message::ClusterStatus(ClusterStatus {
                timestamp: T0,
                load_balance_method: "prefix_affinity".into(),
                live_ranks: vec![RankInfo {
                    disaggregation_mode: Default::default(),
                    rank: 0,
                    capacity: capacity(),
                    model_id: "dpserve-builtin".into(),
                    last_seen_s: 0.5,
                    status: Some(worker_status()),
                    gpu: None,
                    num_inflight: None,
                    invariant_violations: Vec::new(),
                }],
                routing: vec![RouteCount {
                    method: "prefix_affinity".into(),
                    branch: "affinity".into(),
                    count: 7,
                }],
                controller_id: None,
                regret: Vec::new(),
                num_inflight: None,
                taken_submission_seq: None,
            }),
        ),
        (
            "KvReady",
            Message::KvReady(protocol::KvReady {
                room: 1234567890123,
                rid: "r3".into(),
                decode_rank: 1,
                layout: layout(),
                prompt_len: 2,
            }),
        ),
        (
            "KvChunk",
            Message::KvChunk(protocol::KvChunk {
                room: 1234567890123,
                seq: 0,
                start: 0,
                tokens: 2,
                bytes: 2 * 2 * 2 * 4 * 64 * 4,
            }),
        ),
        (
            "KvDone",
            Message::KvDone(protocol::KvDone {
                room: 1234567890123,
                chunks: 1,
                first_token: Some(450),
                logprob: Some(-0.5),
                top_logprobs: None,
                cached_tokens: 0,
                finish_reason: None,
                matched_stop: None,
            }),
        ),
        (
            "KvAbort",
            Message::KvAbort(protocol::KvAbort {
                room: 1234567890123,
                status: 503,
                reason: "KV bootstrap timed out after 300.0s".into(),
            }),
        ),
        (
            "PeerGone",
            Message::PeerGone(protocol::PeerGone {
                rank: 0,
                reason: "it stopped sending heartbeats".into(),
            }),
        ),
        (
            "KvEvents",
            Message::KvEvents(protocol::KvEvents {
                rank: 0,
                seq: 7,
                block_size: 32,
                cleared: false,
                removed: vec![0x6fc1_ebd4_f4d6_ea31],
                stored: vec![0xe313_56ba_2da6_54a2],
            }),
        ),
        (
            "KvEvents-snapshot",
            Message::KvEvents(protocol::KvEvents {
                rank: 1,
                seq: 1,
                block_size: 32,
                cleared: true,
                removed: vec![],
                stored: vec![0x6fc1_ebd4_f4d6_ea31, 0xe313_56ba_2da6_54a2],
            }),
        ),
        (
            "KvSnapshotReq",
            Message::KvSnapshotReq(protocol::KvSnapshotReq { rank: 1 }),
        ),
        (
            "Reconcile",
            Message::Reconcile(protocol::Reconcile {
                rids: vec!["r1".into(), "req-7".into()],
            }),
        ),
        (
            "Shutdown",
            Message::Shutdown(Shutdown {
                rank: Some(0),
                reason: "sigterm".into(),
                drain_timeout_s: Some(30.0),
            }),
        ),
    ]
}

fn layout() -> protocol::KvLayout {
    protocol::KvLayout {
        model_id: "dpserve-builtin".into(),
        num_layers: 2,
        num_kv_heads: 4,
        head_dim: 64,
        dtype: "f32".into(),
    }
}

/// GPU 1 of a host with H200s, as a `--device cuda:1` worker announces it.
pub fn gpu() -> GpuInfo {
    GpuInfo {
        ordinal: 1,
        name: "NVIDIA H200".into(),
        compute_capability: "9.0".into(),
        total_memory_bytes: 150_754_820_096,
    }
}

fn capacity() -> Capacity {
    Capacity {
        max_total_tokens: 65536,
        max_running_requests: 64,
        context_len: 8192,
        vocab_size: 8192,
    }
}

fn worker_status() -> WorkerStatus {
    WorkerStatus {
        rank: 0,
        timestamp: T0,
        num_running_reqs: 2,
        num_waiting_reqs: 1,
        num_used_tokens: 300,
        max_total_tokens: 65536,
        cache_hit_rate: 0.25,
        gen_throughput: 120.5,
        finished_rids: vec!["r0".into()],
        num_free_tokens: 65000,
        num_evictable_tokens: 236,
        kernel_path: "avx2".into(),
        taken_seq: Some(7),
        disagg: None,
        simulated: None,
        status_seq: Some(12),
        prefill: None,
        invariant_violations: Vec::new(),
    }
}

/// Lower-case hex without separators.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parse hex, ignoring ASCII whitespace (so long vectors can be wrapped in the source).
pub fn from_hex(hex: &str) -> Vec<u8> {
    let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let pairs = digits.chunks_exact(2);
    assert!(pairs.remainder().is_empty(), "odd number of hex digits");
    pairs
        .map(|pair| {
            let s = std::str::from_utf8(pair).expect("hex is ASCII");
            u8::from_str_radix(s, 16).expect("valid hex digit")
        })
        .collect()
}

/// The fuzz cases' generator: SplitMix64, whose sequence is fixed forever (unlike
/// `rand::StdRng`, which may change between `rand` versions), so a failing case stays
/// reproducible.
pub use protocol::hash::SplitMix64;

/// The draws the fuzz cases make beyond the generator's own.
pub trait Draws {
    fn byte(&mut self) -> u8;
    fn chance(&mut self, one_in: usize) -> bool;
}

impl Draws for SplitMix64 {
    fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Hex as `WIRE.md` and `golden.rs` quote it: bytes separated by spaces, 16 to a line.
pub fn to_hex_lines(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}
