//! Structured output in the scheduler, on the tiny built-in model given a byte vocabulary (each
//! id from 3 on spells one printable ASCII byte): whatever its random weights and the seeds
//! draw, a constrained request ends with text its constraint accepts, through batching,
//! retraction and a length limit; a constraint this worker cannot serve fails its request with a
//! 400 and the worker serves on.

use std::sync::Arc;

use grammar::{Grammars, LazyGrammars};
use protocol::{Constraint, FinishReason, GenerateReq, SamplingParams};

use super::tests::{assert_pool_whole, config, drain, prompt, req, with_config};
use super::Scheduler;

const ROWS: usize = protocol::builtin::VOCAB_SIZE;

/// Id `i` ≥ 3 spells byte `0x20 + (i - 3) % 95`; 0..3 are the built-in specials.
fn pieces() -> Vec<Vec<u8>> {
    let mut v = vec![
        b"\xFF<unk>".to_vec(),
        b"\xFF<s>".to_vec(),
        b"\xFF</s>".to_vec(),
    ];
    v.extend((3..ROWS).map(|i| vec![0x20 + ((i - 3) % 95) as u8]));
    v
}

pub(super) fn byte_grammars() -> Arc<LazyGrammars> {
    let g = Grammars::from_token_bytes(pieces(), ROWS, &[protocol::builtin::EOS_ID]).unwrap();
    Arc::new(g.into())
}

pub(super) fn text(ids: &[u32]) -> String {
    let p = pieces();
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| p[i as usize].clone()).collect();
    String::from_utf8(bytes.into_iter().filter(|&b| b != 0xFF).collect()).unwrap()
}

pub(super) fn constrained(rid: &str, c: Constraint, seed: u64, max_new_tokens: u32) -> GenerateReq {
    GenerateReq {
        sampling: SamplingParams {
            max_new_tokens,
            temperature: 1.0,
            seed: Some(seed),
            constraint: Some(c),
            ..SamplingParams::default()
        },
        ..GenerateReq::new(rid, prompt(seed as u32, 6 + seed as usize % 5))
    }
}

fn scheduler_with_bytes(max_total_tokens: usize) -> Scheduler {
    let mut s = with_config(config(max_total_tokens, 2048));
    s.set_grammars(byte_grammars());
    s
}

const PERSON: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"enum": ["cat", "dog", null]}},
    "required": ["name", "age", "pet"], "additionalProperties": false}"#;

/// `text` is a document [`PERSON`] accepts.
fn assert_person(text: &str) {
    let v: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text:?}"));
    assert_eq!(o.len(), 3, "{text:?}");
    assert!(
        o["name"].as_str().is_some_and(|n| n.chars().count() <= 6),
        "{text:?}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text:?}");
    assert!(
        ["cat", "dog"].contains(&o["pet"].as_str().unwrap_or("cat")),
        "{text:?}"
    );
}

#[test]
fn a_batch_of_constrained_requests_ends_with_text_each_constraint_accepts() {
    let mut s = scheduler_with_bytes(4096);
    for seed in 0..8u64 {
        let c = if seed % 2 == 0 {
            Constraint::JsonSchema(PERSON.into())
        } else {
            Constraint::Regex(r"(yes|no), [a-f]{2,5}\.".into())
        };
        assert!(s
            .submit(constrained(&format!("r{seed}"), c, seed, 200))
            .is_none());
    }
    // An unconstrained request in the same batch is untouched.
    assert!(s.submit(req("free", prompt(99, 8), 12)).is_none());
    let done = drain(&mut s);
    for seed in 0..8u64 {
        let (ids, last) = &done[&format!("r{seed}")];
        assert_eq!(last.finish_reason, Some(FinishReason::Stop), "r{seed}");
        let t = text(ids);
        if seed % 2 == 0 {
            assert_person(&t);
        } else {
            let (word, rest) = t.split_once(", ").unwrap_or_else(|| panic!("{t:?}"));
            assert!(["yes", "no"].contains(&word), "{t:?}");
            let letters = rest.strip_suffix('.').unwrap_or_else(|| panic!("{t:?}"));
            assert!((2..=5).contains(&letters.len()), "{t:?}");
            assert!(letters.bytes().all(|b| (b'a'..=b'f').contains(&b)), "{t:?}");
            // Nothing can follow the '.': the constraint ended the text, no EOS was drawn.
            assert_eq!(last.matched_stop, None);
        }
    }
    assert_eq!(done["free"].0.len(), 12);
    assert_pool_whole(&s);
}

#[test]
fn constrained_output_survives_retraction_and_does_not_depend_on_the_batch() {
    let schema = || Constraint::JsonSchema(PERSON.into());
    let greedy = |rid: &str, seed: u64| {
        let mut r = constrained(rid, schema(), seed, 120);
        r.sampling.temperature = 0.0;
        r
    };
    let mut alone = scheduler_with_bytes(4096);
    alone.submit(greedy("g", 3));
    let alone = drain(&mut alone);
    // A pool this small retracts running requests while they decode (each grows ~30 slots).
    let mut tight = scheduler_with_bytes(120);
    tight.submit(greedy("g", 3));
    for seed in 10..16u64 {
        tight.submit(constrained(&format!("r{seed}"), schema(), seed, 120));
    }
    let done = drain(&mut tight);
    assert_eq!(
        done["g"].0, alone["g"].0,
        "greedy text alone = in a tight batch"
    );
    for (rid, (ids, last)) in &done {
        assert_eq!(last.finish_reason, Some(FinishReason::Stop), "{rid}");
        assert_person(&text(ids));
    }
    assert_pool_whole(&tight);
}

#[test]
fn max_new_tokens_still_ends_a_constrained_request() {
    let mut s = scheduler_with_bytes(4096);
    s.submit(constrained(
        "r",
        Constraint::Regex("[a-z]{50}".into()),
        1,
        7,
    ));
    let done = drain(&mut s);
    let (ids, last) = &done["r"];
    assert_eq!(last.finish_reason, Some(FinishReason::Length));
    assert_eq!(ids.len(), 7);
    assert!(
        text(ids).bytes().all(|b| b.is_ascii_lowercase()),
        "{:?}",
        text(ids)
    );
}

#[test]
fn a_constraint_this_worker_cannot_serve_fails_its_request_and_the_worker_serves_on() {
    // Without a vocabulary (the built-in model's words are not byte pieces).
    let mut s = with_config(config(4096, 2048));
    s.submit(constrained("c", Constraint::Regex("a".into()), 1, 8));
    s.submit(req("free", prompt(1, 5), 4));
    let done = drain(&mut s);
    let err = done["c"].1.error.as_ref().expect("an error");
    assert_eq!(err.status, 400);
    assert!(
        err.message.contains(grammar::BUILTIN_HAS_NO_BYTES),
        "{}",
        err.message
    );
    assert_eq!(done["free"].0.len(), 4);
    // With one, a constraint that does not compile (a peer that skipped the tokenizer's check).
    let mut s = scheduler_with_bytes(4096);
    s.submit(constrained(
        "bad",
        Constraint::Lark("start: nowhere".into()),
        1,
        8,
    ));
    let done = drain(&mut s);
    let err = done["bad"].1.error.as_ref().expect("an error");
    assert_eq!(err.status, 400);
    assert!(
        err.message.starts_with("the grammar does not compile"),
        "{}",
        err.message
    );
    assert_pool_whole(&s);
}
