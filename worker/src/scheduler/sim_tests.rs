//! A simulated rank (`--device sim`) through the real scheduler: requests end with exactly the
//! tokens they asked for, the prefix cache serves shared prompts, pseudo-tokens do not depend
//! on batching, caching or retraction, and the pools come back whole.

use protocol::{FinishReason, SamplingParams};

use super::tests::{assert_pool_whole, config, drain, prompt, req};
use super::{Scheduler, SchedulerConfig};
use crate::sim::{SimModel, SimProfile};

/// A profile so fast that tests never wait on its clock.
fn instant_profile() -> SimProfile {
    SimProfile {
        step_overhead_ms: 0.0,
        peak_tflops: 1e9,
        mem_bandwidth_gbs: 1e12,
        ..SimProfile::h100_qwen35_122b_a10b_fp8()
    }
}

fn sim(config: SchedulerConfig) -> Scheduler {
    Scheduler::new(config, SimModel::new(instant_profile(), 3))
}

#[test]
fn a_sim_rank_serves_every_request_to_its_exact_length() {
    let mut s = sim(config(4096, 64));
    assert_eq!(
        s.model().simulated().map(|p| p.name.as_str()),
        Some("h100-qwen3.5-122b-a10b-fp8")
    );
    for i in 0..12u32 {
        let mut r = req(&format!("r{i}"), prompt(i, 20 + 9 * i as usize), 30 + i);
        // EOS is not ignored and half of them sample: output length must still hold.
        r.sampling = SamplingParams {
            max_new_tokens: 30 + i,
            temperature: if i % 2 == 0 { 0.0 } else { 1.0 },
            ..SamplingParams::default()
        };
        assert!(s.submit(r).is_none());
    }
    let done = drain(&mut s);
    assert_eq!(done.len(), 12);
    for i in 0..12u32 {
        let (ids, last) = &done[&format!("r{i}")];
        assert_eq!(ids.len(), 30 + i as usize, "r{i}");
        assert_eq!(last.finish_reason, Some(FinishReason::Length), "r{i}");
        assert_eq!(last.completion_tokens, 30 + i);
        assert!(
            ids.iter().all(|&t| t > protocol::builtin::EOS_ID),
            "r{i}: {ids:?}"
        );
    }
    assert_pool_whole(&s);
}

#[test]
fn a_shared_prefix_is_served_from_the_cache_with_the_same_output() {
    let mut s = sim(config(4096, 2048));
    let system = prompt(1, 120);
    let ask = |rid: &str, q: u32| {
        let mut p = system.clone();
        p.extend(prompt(100 + q, 8));
        req(rid, p, 16)
    };
    s.submit(ask("first", 0));
    let first = drain(&mut s).remove("first").unwrap();
    assert_eq!(first.1.cached_tokens, 0);
    s.submit(ask("again", 0));
    s.submit(ask("other", 1));
    let done = drain(&mut s);
    assert_eq!(
        done["again"].0, first.0,
        "a cache hit changes no pseudo-token"
    );
    assert_eq!(
        done["again"].1.cached_tokens, 127,
        "all but the last prompt token"
    );
    assert!(
        done["other"].1.cached_tokens >= 120,
        "{:?}",
        done["other"].1
    );
    assert!(s.cache_hit_rate() > 0.5);
    assert_pool_whole(&s);
}

#[test]
fn outputs_do_not_depend_on_batching_or_retraction() {
    let alone = {
        let mut s = sim(config(4096, 2048));
        s.submit(req("target", prompt(42, 37), 40));
        drain(&mut s).remove("target").unwrap().0
    };
    // A pool of 400 slots for 16 requests of up to 80 tokens: decode runs out and retracts.
    let mut s = sim(config(400, 16));
    s.submit(req("target", prompt(42, 37), 40));
    for i in 0..15 {
        s.submit(req(&format!("r{i}"), prompt(i, 40), 40));
    }
    let done = drain(&mut s);
    assert_eq!(done.len(), 16);
    assert_eq!(done["target"].0, alone);
    assert!(done.values().all(|(ids, _)| ids.len() == 40));
    assert_pool_whole(&s);
}
