//! Scheduler tests on the tiny built-in model: every request ends exactly once, greedy output
//! does not depend on batching, chunking or retraction, and slots always come back.

use std::collections::HashMap;

use protocol::{FinishReason, GenerateReq, SamplingParams, TokenOut};

use super::{Scheduler, SchedulerConfig};
use crate::model::{BuiltinSize, LlamaModel, ModelConfig};

fn scheduler(max_total_tokens: usize, chunk: usize) -> Scheduler {
    let model = LlamaModel::dummy(ModelConfig::builtin(BuiltinSize::Tiny), 7);
    Scheduler::new(
        SchedulerConfig {
            rank: 0,
            max_total_tokens,
            max_running_requests: 64,
            chunked_prefill_size: chunk,
            max_prefill_tokens: 4096,
            context_len: 256,
        },
        model,
    )
}

fn req(rid: &str, prompt: Vec<u32>, max_new_tokens: u32) -> GenerateReq {
    GenerateReq {
        rid: rid.into(),
        input_ids: prompt,
        sampling: SamplingParams {
            max_new_tokens,
            temperature: 0.0,
            ignore_eos: true,
            ..SamplingParams::default()
        },
        stream: false,
        routing_key: None,
        routed_dp_rank: None,
        bootstrap_room: None,
        return_logprob: false,
        received_at: 0.0,
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 3 + (seed * 131 + i * 17) % 8000).collect()
}

/// Run to completion; per rid, the concatenated output ids and the final message.
fn drain(s: &mut Scheduler) -> HashMap<String, (Vec<u32>, TokenOut)> {
    let mut ids: HashMap<String, Vec<u32>> = HashMap::new();
    let mut done = HashMap::new();
    let mut steps = 0;
    while s.has_work() {
        for out in s.step() {
            assert!(!done.contains_key(&out.rid), "{} finished twice", out.rid);
            ids.entry(out.rid.clone())
                .or_default()
                .extend(&out.output_ids);
            if out.finish_reason.is_some() {
                let all = ids.remove(&out.rid).unwrap_or_default();
                done.insert(out.rid.clone(), (all, out));
            }
        }
        steps += 1;
        assert!(steps < 100_000, "scheduler does not terminate");
    }
    assert!(ids.is_empty(), "unfinished streams: {:?}", ids.keys());
    done
}

#[test]
fn every_request_finishes_once_with_its_tokens() {
    let mut s = scheduler(4096, 2048);
    for i in 0..10 {
        assert!(s.submit(req(&format!("r{i}"), prompt(i, 5 + i as usize), 4 + i)).is_none());
    }
    let done = drain(&mut s);
    assert_eq!(done.len(), 10);
    for i in 0..10u32 {
        let (ids, last) = &done[&format!("r{i}")];
        assert_eq!(ids.len(), 4 + i as usize);
        assert_eq!(last.finish_reason, Some(FinishReason::Length));
        assert_eq!(last.completion_tokens, 4 + i);
        assert_eq!(last.prompt_tokens, 5 + i);
    }
    assert_eq!(s.used_tokens(), 0, "all slots returned");
    assert_eq!(s.take_finished_rids().len(), 10);
}

#[test]
fn greedy_output_is_the_same_alone_batched_chunked_and_retracted() {
    let target = || req("target", prompt(42, 37), 24);
    let alone = {
        let mut s = scheduler(4096, 2048);
        s.submit(target());
        drain(&mut s)["target"].0.clone()
    };
    // In a batch of 64 with other prompts, prefill chunked by 5 tokens.
    let mut s = scheduler(8192, 5);
    for i in 0..63 {
        s.submit(req(&format!("o{i}"), prompt(i, 3 + i as usize % 40), 1 + i % 30));
    }
    s.submit(target());
    assert_eq!(drain(&mut s)["target"].0, alone, "batched + chunked");

    // A KV pool too small for everyone: requests are retracted and resumed.
    let mut s = scheduler(160, 16);
    for i in 0..8 {
        s.submit(req(&format!("o{i}"), prompt(i, 10), 30));
    }
    s.submit(target());
    let done = drain(&mut s);
    assert_eq!(done.len(), 9, "nothing lost under KV pressure");
    assert_eq!(done["target"].0, alone, "retracted and resumed");
    assert_eq!(s.used_tokens(), 0);
}

#[test]
fn abort_returns_slots_and_ends_the_request() {
    let mut s = scheduler(4096, 2048);
    s.submit(req("a", prompt(1, 20), 100));
    s.submit(req("b", prompt(2, 20), 100));
    s.step();
    s.step();
    assert!(s.used_tokens() > 0);
    let outs = s.abort(Some("a"));
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].finish_reason, Some(FinishReason::Abort));
    let outs = s.abort(None);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].rid, "b");
    assert_eq!(s.used_tokens(), 0);
    assert!(!s.has_work());
}

#[test]
fn invalid_requests_are_refused_with_400() {
    let mut s = scheduler(64, 2048);
    let cases = [
        req("empty", vec![], 4),
        req("vocab", vec![1, 999_999], 4),
        req("context", prompt(1, 10), 1000),
        req("pool", prompt(1, 100), 4),
    ];
    for r in cases {
        let rid = r.rid.clone();
        let out = s.submit(r).unwrap_or_else(|| panic!("{rid} accepted"));
        assert_eq!(out.error.as_ref().map(|e| e.status), Some(400), "{rid}");
    }
    assert!(!s.has_work());
}

#[test]
fn eos_and_stop_tokens_end_generation() {
    let mut s = scheduler(4096, 2048);
    let first = {
        s.submit(req("probe", prompt(9, 6), 3));
        drain(&mut s)["probe"].0.clone()
    };
    let mut r = req("stop", prompt(9, 6), 10);
    r.sampling.stop_token_ids = vec![first[1]];
    s.submit(r);
    let done = drain(&mut s);
    let (ids, last) = &done["stop"];
    assert_eq!(ids, &first[..2].to_vec());
    assert_eq!(last.finish_reason, Some(FinishReason::Stop));
    assert_eq!(last.matched_stop, Some(first[1]));
}
