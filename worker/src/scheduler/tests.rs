//! Scheduler tests on the tiny built-in model: every request ends exactly once, greedy output
//! does not depend on batching, chunking or retraction, and slots always come back.

use std::collections::HashMap;

use protocol::{FinishReason, GenerateReq, SamplingParams, TokenOut};

use super::{FinishFirst, SchedulePolicy, Scheduler, SchedulerConfig};
use crate::model::{BuiltinSize, LlamaModel, ModelConfig};

pub(crate) fn config(max_total_tokens: usize, chunk: usize) -> SchedulerConfig {
    SchedulerConfig {
        rank: 0,
        max_total_tokens,
        max_running_requests: 64,
        pre_alloc_rows: 0,
        chunked_prefill_size: chunk,
        max_prefill_tokens: 4096,
        context_len: 256,
        policy: SchedulePolicy::Lpm,
        disable_radix_cache: false,
        prefill_step_target: None,
        disagg: None,
        max_queued_requests: None,
        finish_first: None,
    }
}

pub(super) fn with_config(config: SchedulerConfig) -> Scheduler {
    let model = LlamaModel::dummy(ModelConfig::builtin(BuiltinSize::Tiny), 7);
    Scheduler::new(config, model)
}

fn scheduler(max_total_tokens: usize, chunk: usize) -> Scheduler {
    with_config(config(max_total_tokens, chunk))
}

/// The pool is whole: every slot is free or evictable, none held or locked.
pub(super) fn assert_pool_whole(s: &Scheduler) {
    assert_eq!(s.used_tokens(), 0, "slots still held");
    assert_eq!(
        s.free_slots() + s.evictable_slots(),
        s.config().max_total_tokens,
        "free + evictable = total"
    );
}

pub(crate) fn req(rid: &str, prompt: Vec<u32>, max_new_tokens: u32) -> GenerateReq {
    GenerateReq {
        sampling: SamplingParams {
            max_new_tokens,
            temperature: 0.0,
            ignore_eos: true,
            ..SamplingParams::default()
        },
        ..GenerateReq::new(rid, prompt)
    }
}

pub(super) fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 3 + (seed * 131 + i * 17) % 8000)
        .collect()
}

/// Run to completion; per rid, the concatenated output ids and the final message.
pub(super) fn drain(s: &mut Scheduler) -> HashMap<String, (Vec<u32>, TokenOut)> {
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
        assert!(s
            .submit(req(&format!("r{i}"), prompt(i, 5 + i as usize), 4 + i))
            .is_none());
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
    assert_pool_whole(&s);
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
        s.submit(req(
            &format!("o{i}"),
            prompt(i, 3 + i as usize % 40),
            1 + i % 30,
        ));
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
    assert_pool_whole(&s);
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
    assert_pool_whole(&s);
    assert!(!s.has_work());
}

#[test]
fn an_abort_for_a_rid_not_held_here_lists_it_finished_and_answers_nothing() {
    let mut s = scheduler(4096, 2048);
    s.submit(req("a", prompt(1, 20), 4));
    s.take_finished_rids();
    // Its dispatch never arrived (or it ended already): the controller may still count it.
    assert!(
        s.abort(Some("ghost")).is_empty(),
        "no answer: the client has one"
    );
    assert_eq!(s.take_finished_rids(), vec!["ghost".to_string()]);
    // A rid that is held is listed once, when it ends.
    assert_eq!(s.abort(Some("a")).len(), 1);
    assert_eq!(s.take_finished_rids(), vec!["a".to_string()]);
    assert_pool_whole(&s);
}

#[test]
fn a_late_abort_for_a_request_that_ended_here_is_not_listed_finished_again() {
    let mut s = scheduler(4096, 2048);
    s.submit(req("a", prompt(1, 20), 2));
    let refused = s
        .submit(req("bad", vec![], 2))
        .expect("an empty prompt is refused");
    assert_eq!(refused.error.map(|e| e.status), Some(400));
    assert!(drain(&mut s).contains_key("a"));
    let mut listed = s.take_finished_rids();
    listed.sort();
    assert_eq!(listed, ["a", "bad"]);
    // The client went away as "a" ended, and its Abort arrives after the end was listed; the
    // controller may have sent a new request under the same rid since. Listing "a" again
    // would end that one's count in flight.
    assert!(s.abort(Some("a")).is_empty());
    assert!(s.abort(Some("bad")).is_empty());
    assert_eq!(s.take_finished_rids(), Vec::<String>::new());
    // The reused rid itself ends and is listed as usual.
    s.submit(req("a", prompt(3, 20), 2));
    assert_eq!(s.abort(Some("a")).len(), 1);
    assert_eq!(s.take_finished_rids(), ["a"]);
    // A rid never seen here is still listed.
    assert!(s.abort(Some("ghost")).is_empty());
    assert_eq!(s.take_finished_rids(), ["ghost"]);
    assert_pool_whole(&s);
}

#[test]
fn recent_rids_forget_the_oldest_beyond_capacity() {
    let mut r = super::RecentRids::default();
    for i in 0..super::RecentRids::CAPACITY + 1 {
        r.insert(&format!("r{i}"));
    }
    r.insert("r5"); // present: not counted twice
    assert!(!r.contains("r0"));
    assert!(r.contains("r1") && r.contains("r5"));
    assert!(r.contains(&format!("r{}", super::RecentRids::CAPACITY)));
    assert_eq!(r.order.len(), super::RecentRids::CAPACITY);
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

#[test]
fn greedy_output_is_the_same_with_and_without_the_cache_and_policies() {
    let target = || req("target", prompt(5, 60), 16);
    let run = |cfg: SchedulerConfig, warm: bool| {
        let mut s = with_config(cfg);
        if warm {
            // Same first 40 tokens, cached before the target arrives.
            let mut p = prompt(5, 60);
            p.truncate(40);
            p.push(7);
            s.submit(req("warm", p, 3));
            drain(&mut s);
        }
        s.submit(target());
        let done = drain(&mut s);
        assert_pool_whole(&s);
        (done["target"].0.clone(), done["target"].1.cached_tokens)
    };
    let (base, cached) = run(config(4096, 2048), false);
    assert_eq!(cached, 0);
    let (hit, cached) = run(config(4096, 2048), true);
    assert_eq!(hit, base, "prefix from the cache");
    assert_eq!(cached, 40);
    let (chunked, _) = run(config(4096, 7), true);
    assert_eq!(chunked, base, "cache + chunked prefill");
    let mut no_cache = config(4096, 2048);
    no_cache.disable_radix_cache = true;
    let (plain, cached) = run(no_cache, true);
    assert_eq!(plain, base);
    assert_eq!(cached, 0, "--disable-radix-cache reuses nothing");
    let mut fcfs = config(4096, 2048);
    fcfs.policy = SchedulePolicy::Fcfs;
    assert_eq!(run(fcfs, true).0, base);
}

#[test]
fn a_repeated_prompt_reuses_all_but_its_last_token() {
    let mut s = scheduler(4096, 2048);
    s.submit(req("first", prompt(3, 100), 4));
    let first = drain(&mut s);
    s.submit(req("second", prompt(3, 100), 4));
    let second = drain(&mut s);
    assert_eq!(first["first"].1.cached_tokens, 0);
    assert_eq!(second["second"].1.cached_tokens, 99);
    assert_eq!(first["first"].0, second["second"].0);
    assert!(s.cache_hit_rate() > 0.45);
}

#[test]
fn lpm_computes_a_shared_prefix_once() {
    // Two requests with the same long prompt prefix arrive together: under lpm the second waits
    // for the first's prefix and takes it from the cache.
    let mut s = scheduler(4096, 2048);
    let mut a = prompt(11, 200);
    let mut b = a.clone();
    a.push(5);
    b.push(6);
    s.submit(req("a", a, 2));
    s.submit(req("b", b, 2));
    let done = drain(&mut s);
    assert_eq!(done["a"].1.cached_tokens, 0);
    assert_eq!(done["b"].1.cached_tokens, 200);
}

#[test]
fn flush_is_refused_while_busy_and_empties_the_cache_when_idle() {
    let mut s = scheduler(4096, 2048);
    s.submit(req("a", prompt(1, 30), 50));
    s.step();
    assert!(s.flush_cache().is_err());
    drain(&mut s);
    assert!(s.evictable_slots() > 0);
    let freed = s.flush_cache().unwrap();
    assert!(freed > 0);
    assert_eq!(s.free_slots(), 4096);
}

#[test]
fn sixty_four_concurrent_requests_under_kv_pressure_match_running_alone() {
    let reqs: Vec<GenerateReq> = (0..64)
        .map(|i| req(&format!("r{i}"), prompt(i % 8, 12 + (i as usize % 5)), 24))
        .collect();
    let mut alone = HashMap::new();
    for r in &reqs {
        let mut s = scheduler(4096, 2048);
        s.submit(r.clone());
        alone.insert(r.rid.clone(), drain(&mut s)[&r.rid].0.clone());
    }
    let mut s = scheduler(300, 64);
    for r in reqs {
        s.submit(r);
    }
    let done = drain(&mut s);
    assert_eq!(done.len(), 64);
    for (rid, (ids, _)) in &done {
        assert_eq!(ids, &alone[rid], "{rid}");
    }
    assert_pool_whole(&s);
}

/// Every message of each request, in order.
fn drain_all(s: &mut Scheduler) -> HashMap<String, Vec<TokenOut>> {
    let mut outs: HashMap<String, Vec<TokenOut>> = HashMap::new();
    let mut steps = 0;
    while s.has_work() {
        for out in s.step() {
            outs.entry(out.rid.clone()).or_default().push(out);
        }
        steps += 1;
        assert!(steps < 100_000, "scheduler does not terminate");
    }
    outs
}

#[test]
fn top_logprobs_are_sorted_and_hold_the_greedy_token_with_its_logprob() {
    let mut s = scheduler(4096, 7);
    let mut asked = req("top", prompt(3, 20), 12);
    asked.return_logprob = true;
    asked.top_logprobs_num = 5;
    s.submit(asked);
    let mut plain = req("plain", prompt(3, 20), 12);
    plain.return_logprob = true;
    s.submit(plain);
    // Alternatives come only with `return_logprob`, as SGLang.
    let mut alone = req("alone", prompt(4, 9), 3);
    alone.top_logprobs_num = 5;
    s.submit(alone);
    let outs = drain_all(&mut s);

    let (mut ids, mut lps, mut tops) = (Vec::new(), Vec::new(), Vec::new());
    for out in &outs["top"] {
        ids.extend(&out.output_ids);
        lps.extend(out.logprobs.clone().unwrap());
        let top = out
            .top_logprobs
            .clone()
            .expect("top_logprobs on every message");
        assert_eq!(top.len(), out.output_ids.len());
        tops.extend(top);
    }
    assert_eq!(ids.len(), 12);
    assert_eq!(tops.len(), 12);
    for ((id, lp), top) in ids.iter().zip(&lps).zip(&tops) {
        assert_eq!(top.len(), 5);
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "{top:?}");
        let mass: f64 = top.iter().map(|&(_, l)| (l as f64).exp()).sum();
        assert!(mass <= 1.0 + 1e-6, "{mass}");
        // Greedy: the chosen token is the most likely, with the very same number.
        assert_eq!(top[0], (*id, *lp));
    }
    // Asking for alternatives does not change the tokens or their logprobs.
    let plain_ids: Vec<u32> = outs["plain"]
        .iter()
        .flat_map(|o| o.output_ids.clone())
        .collect();
    let plain_lps: Vec<f32> = outs["plain"]
        .iter()
        .flat_map(|o| o.logprobs.clone().unwrap())
        .collect();
    assert_eq!((plain_ids, plain_lps), (ids, lps));
    assert!(outs["plain"].iter().all(|o| o.top_logprobs.is_none()));
    assert!(outs["alone"]
        .iter()
        .all(|o| o.top_logprobs.is_none() && o.logprobs.is_none()));
    assert_pool_whole(&s);
}

#[test]
fn embeddings_are_unit_norm_and_the_same_alone_chunked_or_cached() {
    let embed = |s: &mut Scheduler, rid: &str, ids: Vec<u32>| {
        assert!(s.submit_embed(rid.into(), ids).is_none());
        let mut outs = drain_all(s).remove(rid).unwrap();
        assert_eq!(outs.len(), 1, "one final message");
        let out = outs.pop().unwrap();
        assert_eq!(out.finish_reason, Some(FinishReason::Stop));
        out.embedding.expect("embedding")
    };
    let mut s = scheduler(4096, 2048);
    let a = embed(&mut s, "a", prompt(5, 30));
    let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    // Again: 29 of 30 tokens come from the prefix cache.
    assert_eq!(embed(&mut s, "a2", prompt(5, 30)), a);
    // Chunked by 4 tokens, batched with a generation.
    let mut chunked = scheduler(4096, 4);
    chunked.submit(req("g", prompt(6, 12), 5));
    assert_eq!(embed(&mut chunked, "a3", prompt(5, 30)), a);
    assert_ne!(embed(&mut s, "b", prompt(6, 30)), a);
    assert_pool_whole(&s);
    assert_pool_whole(&chunked);
}

#[test]
fn a_step_time_target_splits_prefill_into_short_steps_with_the_same_result() {
    let run = |target: Option<std::time::Duration>| {
        let mut s = with_config(SchedulerConfig {
            prefill_step_target: target,
            disagg: None,
            ..config(1024, 256)
        });
        s.submit(req("a", prompt(1, 220), 4));
        // Steps until the first token: the prefill steps.
        let mut steps = 0;
        let mut first = Vec::new();
        while first.is_empty() {
            first = s.step().into_iter().flat_map(|o| o.output_ids).collect();
            steps += 1;
            assert!(steps < 1000);
        }
        let rest = drain(&mut s);
        assert_pool_whole(&s);
        (steps, first, rest["a"].0.clone())
    };
    let (whole, first, rest) = run(None);
    assert_eq!(whole, 1, "220 tokens fit one step without a time target");
    // A target no step can meet: the probe step, then the minimum per step.
    let (split, first_t, rest_t) = run(Some(std::time::Duration::from_nanos(1)));
    let min = crate::step_budget::MIN_TOKENS;
    let probe = crate::step_budget::PROBE_TOKENS;
    assert_eq!(split, 1 + (220 - probe).div_ceil(min));
    assert_eq!(
        (first_t, rest_t),
        (first, rest),
        "chunking changed the output"
    );
}

#[test]
fn past_max_queued_requests_a_new_request_is_refused_with_a_503() {
    let mut s = with_config(SchedulerConfig {
        max_queued_requests: Some(2),
        ..config(4096, 64)
    });
    assert!(s.submit(req("a", prompt(1, 8), 2)).is_none());
    assert!(s.submit(req("b", prompt(2, 8), 2)).is_none());
    let out = s
        .submit(req("c", prompt(3, 8), 2))
        .expect("refused at once");
    let err = out.error.expect("an error");
    assert_eq!(err.status, 503, "{}", err.message);
    assert!(
        err.message.contains("max-queued-requests"),
        "{}",
        err.message
    );
    // Once the queue drains, requests are taken again.
    let done = drain(&mut s);
    assert_eq!(done.len(), 2);
    assert!(s.submit(req("d", prompt(4, 8), 2)).is_none());
}

/// The rids that got a token in each step, from `b`'s arrival (after `a`'s first token) to the
/// end, and every request's output.
fn steps_after_a_second_prompt(finish_first: Option<FinishFirst>) -> (Vec<Vec<String>>, Vec<u32>) {
    let mut s = with_config(SchedulerConfig {
        finish_first,
        ..config(1024, 256)
    });
    s.submit(req("a", prompt(1, 20), 4));
    let first = s.step();
    assert_eq!(first.len(), 1, "a's prefill gives its first token");
    s.submit(req("b", prompt(2, 20), 3));
    let (mut order, mut out) = (Vec::new(), first[0].output_ids.clone());
    while s.has_work() {
        let step = s.step();
        out.extend(step.iter().flat_map(|o| o.output_ids.iter().copied()));
        order.push(
            step.into_iter()
                .filter(|o| !o.output_ids.is_empty())
                .map(|o| o.rid)
                .collect(),
        );
    }
    assert_pool_whole(&s);
    (order, out)
}

#[test]
fn finish_first_holds_a_prompt_while_an_answer_ends_and_never_past_its_bound() {
    let v = |rids: &[&str]| rids.iter().map(|r| r.to_string()).collect::<Vec<_>>();
    let ff = |tokens, ms| {
        Some(FinishFirst {
            tokens,
            max_wait: std::time::Duration::from_millis(ms),
        })
    };
    // Off: b's prefill goes first (b's first token), then both decode together.
    let (off, out_off) = steps_after_a_second_prompt(None);
    assert_eq!(off[0], v(&["b"]), "{off:?}");
    // a has 3 tokens left: with 3, b waits while a decodes to its end.
    let (on, out_on) = steps_after_a_second_prompt(ff(3, 60_000));
    assert_eq!(
        &on[..4],
        &[v(&["a"]), v(&["a"]), v(&["a"]), v(&["b"])],
        "{on:?}"
    );
    // With 1, b waits only once a is within one token of its end: b first, as off.
    let (near, _) = steps_after_a_second_prompt(ff(1, 60_000));
    assert_eq!(near[0], v(&["b"]), "{near:?}");
    // A prompt that has waited its bound goes first however near an answer is to its end.
    let (bounded, _) = steps_after_a_second_prompt(ff(3, 0));
    assert_eq!(bounded[0], v(&["b"]), "{bounded:?}");
    // The order of steps never changes a token (greedy, batch-invariant).
    let (mut a, mut b) = (out_off.clone(), out_on.clone());
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
}
