//! Hostile frames: `decode` and `FrameStats::decode_or_drop` must never panic, whatever arrives.
//!
//! Deterministic (SplitMix64 with fixed seeds), well over 100,000 frames, a second or two in the
//! dev profile. The corpus: random bytes, every prefix of every golden frame, random mutations
//! of golden frames, random MessagePack envelopes built from the real field names, deep nesting
//! and length headers that promise gigabytes.

mod common;

use std::sync::atomic::Ordering;

use common::{examples, Draws, SplitMix64};
use protocol::{decode, encode, FrameStats};

/// Decodes every frame both ways and checks the counters agree with `decode`'s verdicts.
struct Harness {
    stats: FrameStats,
    frames: u64,
    errors: u64,
    accepted: u64,
}

impl Harness {
    fn new() -> Self {
        Harness {
            stats: FrameStats::default(),
            frames: 0,
            errors: 0,
            accepted: 0,
        }
    }

    fn feed(&mut self, frame: &[u8]) {
        let direct = decode(frame);
        let counted = self.stats.decode_or_drop(frame, "fuzz");
        assert_eq!(
            direct.is_ok(),
            counted.is_some(),
            "decode and decode_or_drop disagree"
        );
        self.frames += 1;
        match direct {
            Ok(msg) => {
                self.accepted += 1;
                // Whatever is accepted re-encodes to a frame that decodes and re-encodes to the
                // same bytes (compared as bytes, since a mutated float may be NaN).
                let again = encode(&msg).expect("an accepted message re-encodes");
                let back = decode(&again).expect("a re-encoded message decodes");
                assert_eq!(encode(&back).unwrap(), again, "re-encoding is not stable");
            }
            Err(_) => self.errors += 1,
        }
    }

    fn check(&self, at_least: u64) {
        assert!(self.frames >= at_least, "only {} frames", self.frames);
        assert_eq!(self.stats.received.load(Ordering::Relaxed), self.frames);
        assert_eq!(
            self.stats.dropped(),
            self.errors,
            "dropped != number of errors"
        );
    }
}

fn golden_frames() -> Vec<Vec<u8>> {
    examples()
        .iter()
        .map(|(_, msg)| encode(msg).unwrap())
        .collect()
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = SplitMix64::new(0x5eed_0001);
    let mut h = Harness::new();
    // An envelope prefix up to the type name, so random tails reach the body decoders too.
    let prefix: &[u8] = &[0x82, 0xa1, b'v', 0x01, 0xa3, b'm', b's', b'g', 0x81];
    for i in 0..40_000 {
        let len = if rng.chance(10) {
            rng.below(512)
        } else {
            rng.below(48)
        };
        let mut frame = Vec::with_capacity(len + 32);
        if i % 2 == 1 {
            frame.extend_from_slice(prefix);
            let (_, msg) = &examples()[rng.below(13)];
            let name = msg.type_name();
            frame.push(0xa0 | name.len() as u8);
            frame.extend_from_slice(name.as_bytes());
        }
        frame.extend((0..len).map(|_| rng.byte()));
        h.feed(&frame);
    }
    h.check(40_000);
}

#[test]
fn every_truncation_of_every_golden_frame_is_an_error() {
    let mut h = Harness::new();
    for frame in golden_frames() {
        for cut in 0..frame.len() {
            h.feed(&frame[..cut]);
        }
    }
    // A strict prefix of a map is never a complete envelope.
    assert_eq!(h.accepted, 0, "a truncated frame decoded");
    h.check(1_000);
}

#[test]
fn mutated_golden_frames_never_panic() {
    let mut rng = SplitMix64::new(0x5eed_0002);
    let mut h = Harness::new();
    let golden = golden_frames();
    for i in 0..52_000 {
        let mut frame = golden[i % golden.len()].clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(frame.len().max(1));
            match rng.below(6) {
                0 | 1 => frame[at] ^= 1 << rng.below(8),
                2 => frame[at] = rng.byte(),
                3 => frame.insert(at, rng.byte()),
                4 if frame.len() > 1 => {
                    frame.remove(at);
                }
                // Interesting MessagePack markers: nil, bool, the lengths' wide forms, ext.
                _ => {
                    const MARKERS: &[u8] = &[
                        0xc0, 0xc1, 0xc3, 0xc4, 0xc7, 0xca, 0xcb, 0xcf, 0xd3, 0xdb, 0xdd, 0xdf,
                    ];
                    frame[at] = MARKERS[rng.below(MARKERS.len())];
                }
            }
        }
        if rng.chance(8) {
            let cut = rng.below(frame.len() + 1);
            frame.truncate(cut);
        }
        h.feed(&frame);
    }
    assert!(
        h.accepted > 0,
        "no mutation survived: the mutator is too blunt"
    );
    h.check(52_000);
}

/// A small MessagePack writer, enough to build arbitrary values (the crate's encoder only
/// writes what the types allow).
mod mp {
    pub fn map(out: &mut Vec<u8>, n: usize) {
        if n < 16 {
            out.push(0x80 | n as u8);
        } else {
            out.push(0xde);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }

    pub fn array(out: &mut Vec<u8>, n: usize) {
        if n < 16 {
            out.push(0x90 | n as u8);
        } else {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }

    pub fn str(out: &mut Vec<u8>, s: &[u8]) {
        if s.len() < 32 {
            out.push(0xa0 | s.len() as u8);
        } else {
            out.push(0xd9);
            out.push(s.len() as u8);
        }
        out.extend_from_slice(s);
    }

    pub fn uint(out: &mut Vec<u8>, v: u64) {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Field names of every message and nested struct, so random maps hit real fields.
const FIELD_NAMES: &[&str] = &[
    "v",
    "msg",
    "rid",
    "input_ids",
    "sampling",
    "stream",
    "routing_key",
    "routed_dp_rank",
    "bootstrap_room",
    "return_logprob",
    "received_at",
    "dispatch_seq",
    "taken_seq",
    "status_seq",
    "prefill",
    "backlog_tokens",
    "computed_tokens",
    "busy_seconds",
    "output_ids",
    "finish_reason",
    "matched_stop",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "dp_rank",
    "logprobs",
    "embedding",
    "error",
    "status",
    "message",
    "rank",
    "capacity",
    "model_id",
    "protocol_version",
    "pid",
    "held_rids",
    "max_total_tokens",
    "max_running_requests",
    "context_len",
    "vocab_size",
    "accepted",
    "reason",
    "timestamp",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_used_tokens",
    "cache_hit_rate",
    "gen_throughput",
    "finished_rids",
    "load_balance_method",
    "live_ranks",
    "last_seen_s",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop_token_ids",
    "ignore_eos",
    "stop",
    "length",
    "abort",
];

fn random_value(rng: &mut SplitMix64, out: &mut Vec<u8>, depth: usize) {
    let pick = if depth >= 4 {
        rng.below(9)
    } else {
        rng.below(12)
    };
    match pick {
        0 => out.push(0xc0),
        1 => out.push(0xc2 | rng.below(2) as u8),
        2 => out.push(rng.byte() & 0x7f),
        3 => out.push(0xe0 | rng.byte() & 0x1f), // negative fixint
        4 => mp::uint(out, rng.next_u64()),
        5 => {
            out.push(0xca);
            out.extend_from_slice(&(rng.next_u64() as u32).to_be_bytes());
        }
        6 => {
            out.push(0xcb);
            out.extend_from_slice(&rng.next_u64().to_be_bytes());
        }
        7 => {
            let name = FIELD_NAMES[rng.below(FIELD_NAMES.len())];
            mp::str(out, name.as_bytes());
        }
        8 => {
            // bin or ext of a few bytes
            let n = rng.below(8);
            if rng.chance(2) {
                out.extend_from_slice(&[0xc4, n as u8]);
            } else {
                out.extend_from_slice(&[0xc7, n as u8, rng.byte()]);
            }
            out.extend((0..n).map(|_| rng.byte()));
        }
        9 | 10 => {
            let n = rng.below(6);
            mp::map(out, n);
            for _ in 0..n {
                let name = FIELD_NAMES[rng.below(FIELD_NAMES.len())];
                mp::str(out, name.as_bytes());
                random_value(rng, out, depth + 1);
            }
        }
        _ => {
            let n = rng.below(6);
            mp::array(out, n);
            for _ in 0..n {
                random_value(rng, out, depth + 1);
            }
        }
    }
}

#[test]
fn random_envelopes_of_real_field_names_never_panic() {
    let mut rng = SplitMix64::new(0x5eed_0003);
    let mut h = Harness::new();
    let types: Vec<&str> = examples().iter().map(|(_, m)| m.type_name()).collect();
    for _ in 0..20_000 {
        let mut frame = Vec::new();
        mp::map(&mut frame, 2);
        mp::str(&mut frame, b"v");
        if rng.chance(10) {
            random_value(&mut rng, &mut frame, 3);
        } else {
            frame.push(0x01);
        }
        mp::str(&mut frame, b"msg");
        mp::map(&mut frame, 1);
        let name = if rng.chance(10) {
            "NoSuchType"
        } else {
            types[rng.below(types.len())]
        };
        mp::str(&mut frame, name.as_bytes());
        // A body map of real field names with random values.
        let n = rng.below(12);
        mp::map(&mut frame, n);
        for _ in 0..n {
            let field = FIELD_NAMES[rng.below(FIELD_NAMES.len())];
            mp::str(&mut frame, field.as_bytes());
            random_value(&mut rng, &mut frame, 1);
        }
        h.feed(&frame);
    }
    h.check(20_000);
}

#[test]
fn deep_nesting_and_huge_length_headers_are_errors() {
    let mut h = Harness::new();
    let body_prefix = |name: &str| {
        let mut f = vec![0x82, 0xa1, b'v', 0x01, 0xa3, b'm', b's', b'g', 0x81];
        mp::str(&mut f, name.as_bytes());
        f
    };
    // Nesting far past any sane depth, as the whole frame, as a known body, as an unknown
    // body (skipped with IgnoredAny) and as an unknown envelope field.
    for depth in [100, 1_000, 10_000, 200_000] {
        for (open, filler) in [(0x91u8, 0x90u8), (0x81, 0x80)] {
            let nest = |f: &mut Vec<u8>| {
                for _ in 0..depth {
                    f.push(open);
                    if open == 0x81 {
                        mp::str(f, b"k");
                    }
                }
                f.push(filler);
            };
            let mut whole = Vec::new();
            nest(&mut whole);
            h.feed(&whole);
            for name in ["GenerateReq", "Abort", "NoSuchType"] {
                let mut f = body_prefix(name);
                nest(&mut f);
                h.feed(&f);
            }
            let mut f = vec![0x83, 0xa1, b'v', 0x01, 0xa1, b'x'];
            nest(&mut f);
            f.extend_from_slice(&[0xa3, b'm', b's', b'g', 0x81, 0xa5]);
            f.extend_from_slice(b"Abort\x80");
            h.feed(&f);
        }
    }
    // Unknown fields nested within the decoder's depth limit (1024) are legitimately skipped.
    let accepted_nested = h.accepted;
    assert!(accepted_nested > 0);

    // Length headers that promise far more than the frame holds.
    let huge: &[&[u8]] = &[
        &[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01],       // array32
        &[0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, b'v'], // map32
        &[0xdb, 0xff, 0xff, 0xff, 0xff, b'a'],       // str32
        &[0xc6, 0xff, 0xff, 0xff, 0xff, 0x00],       // bin32
        &[0xc9, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00], // ext32
    ];
    for header in huge {
        h.feed(header);
        for name in ["GenerateReq", "TokenOut", "NoSuchType"] {
            let mut f = body_prefix(name);
            f.extend_from_slice(header);
            h.feed(&f);
            // ... and in a field the type knows: a token id list.
            let mut f = body_prefix(name);
            f.extend_from_slice(&[0x82, 0xa3, b'r', b'i', b'd', 0xa1, b'r']);
            mp::str(&mut f, b"input_ids");
            f.extend_from_slice(header);
            h.feed(&f);
        }
    }
    assert_eq!(
        h.accepted, accepted_nested,
        "a frame with a lying length decoded"
    );
    h.check(50);
}
