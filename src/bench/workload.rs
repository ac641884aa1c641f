//! The generated-shared-prefix (GSP) workload of SGLang's `bench_serving`: `num_groups` system
//! prompts, `prompts_per_group` questions each, every request = system prompt ‖ question, all
//! shuffled. Prompts are random token ids drawn directly (no tokenizer round trip), so lengths
//! are exact and the workload is the same for every backend and method given the seed.
//!
//! Lengths follow bench_serving's range ratio: each system prompt, question and output length is
//! drawn uniformly from `[max(1, ⌊len · ratio⌋), len]` (ratio 1.0 = fixed lengths). This module
//! only builds the request list; sending it is `client.rs`'s job, timing it `metrics.rs`'s.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Token ids below this are specials in every built-in and common vocabulary (pad, bos, eos).
pub const FIRST_PLAIN_TOKEN: u32 = 3;

/// Shape of a GSP workload (bench_serving's `--gsp-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct GspConfig {
    pub num_groups: usize,
    pub prompts_per_group: usize,
    pub system_prompt_len: usize,
    pub question_len: usize,
    pub output_len: usize,
    pub range_ratio: f64,
    /// Send one routing key per group (`x-smg-routing-key`).
    pub send_routing_key: bool,
}

/// One request of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRequest {
    /// Position in the shuffled workload (send order).
    pub index: usize,
    pub group: usize,
    pub input_ids: Vec<u32>,
    pub output_len: usize,
    /// `x-smg-routing-key` value, when the workload sends one.
    pub routing_key: Option<String>,
}

impl BenchRequest {
    pub fn prompt_len(&self) -> usize {
        self.input_ids.len()
    }
}

/// A length drawn from `[max(1, ⌊len · ratio⌋), len]`.
pub fn sample_len(rng: &mut impl Rng, len: usize, ratio: f64) -> usize {
    if len == 0 {
        return 0;
    }
    let low = ((len as f64 * ratio.clamp(0.0, 1.0)).floor() as usize).clamp(1, len);
    rng.gen_range(low..=len)
}

fn random_ids(rng: &mut impl Rng, len: usize, vocab_size: u32) -> Vec<u32> {
    (0..len)
        .map(|_| rng.gen_range(FIRST_PLAIN_TOKEN..vocab_size))
        .collect()
}

/// The routing key of group `g`.
pub fn group_key(g: usize) -> String {
    format!("gsp-group-{g}")
}

/// Builds the shuffled workload; `num_prompts` (when set) keeps the first that many.
/// Same `seed` and arguments → the same requests in the same order.
pub fn generate(
    cfg: &GspConfig,
    vocab_size: u32,
    num_prompts: Option<usize>,
    seed: u64,
) -> anyhow::Result<Vec<BenchRequest>> {
    anyhow::ensure!(
        vocab_size > FIRST_PLAIN_TOKEN,
        "vocab_size {vocab_size} leaves no ids above the specials"
    );
    anyhow::ensure!(
        cfg.num_groups > 0 && cfg.prompts_per_group > 0,
        "--gsp-num-groups and --gsp-prompts-per-group must be at least 1"
    );
    anyhow::ensure!(cfg.output_len > 0, "--gsp-output-len must be at least 1");
    anyhow::ensure!(
        (0.0..=1.0).contains(&cfg.range_ratio),
        "--gsp-range-ratio must be in [0, 1], got {}",
        cfg.range_ratio
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let system_prompts: Vec<Vec<u32>> = (0..cfg.num_groups)
        .map(|_| {
            let len = sample_len(&mut rng, cfg.system_prompt_len, cfg.range_ratio);
            random_ids(&mut rng, len, vocab_size)
        })
        .collect();
    let mut requests = Vec::with_capacity(cfg.num_groups * cfg.prompts_per_group);
    for (group, system) in system_prompts.iter().enumerate() {
        for _ in 0..cfg.prompts_per_group {
            let qlen = sample_len(&mut rng, cfg.question_len, cfg.range_ratio).max(1);
            let mut input_ids = system.clone();
            input_ids.extend(random_ids(&mut rng, qlen, vocab_size));
            requests.push(BenchRequest {
                index: 0,
                group,
                input_ids,
                output_len: sample_len(&mut rng, cfg.output_len, cfg.range_ratio),
                routing_key: cfg.send_routing_key.then(|| group_key(group)),
            });
        }
    }
    requests.shuffle(&mut rng);
    if let Some(n) = num_prompts {
        requests.truncate(n);
    }
    for (i, r) in requests.iter_mut().enumerate() {
        r.index = i;
    }
    Ok(requests)
}

/// A warm-up prompt that shares no prefix with the workload (a different seed stream), so
/// warming up does not pre-fill any rank's cache with a group's system prompt.
pub fn warmup_request(vocab_size: u32, len: usize, output_len: usize, seed: u64) -> BenchRequest {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5741_524d_5550); // "WARMUP"
    BenchRequest {
        index: usize::MAX,
        group: usize::MAX,
        input_ids: random_ids(&mut rng, len.max(1), vocab_size.max(FIRST_PLAIN_TOKEN + 1)),
        output_len: output_len.max(1),
        routing_key: None,
    }
}

/// Send times (seconds after start) for `n` requests: all at 0 for an infinite rate (a burst),
/// else a Poisson process (exponential gaps with mean `1 / rate`), as bench_serving.
pub fn arrival_times(n: usize, request_rate: f64, seed: u64) -> Vec<f64> {
    if !request_rate.is_finite() || request_rate <= 0.0 {
        return vec![0.0; n];
    }
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1));
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                // Inverse CDF of the exponential; 1 - u is in (0, 1].
                let u: f64 = rng.gen();
                t += -(1.0 - u).ln() / request_rate;
            }
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(ratio: f64) -> GspConfig {
        GspConfig {
            num_groups: 4,
            prompts_per_group: 5,
            system_prompt_len: 100,
            question_len: 20,
            output_len: 8,
            range_ratio: ratio,
            send_routing_key: true,
        }
    }

    #[test]
    fn groups_share_exactly_their_system_prompt() {
        let reqs = generate(&cfg(1.0), 1000, None, 7).unwrap();
        assert_eq!(reqs.len(), 20);
        let mut by_group: HashMap<usize, Vec<&BenchRequest>> = HashMap::new();
        for r in &reqs {
            by_group.entry(r.group).or_default().push(r);
        }
        assert_eq!(by_group.len(), 4);
        let prefixes: Vec<&[u32]> = (0..4).map(|g| &by_group[&g][0].input_ids[..100]).collect();
        for (g, members) in &by_group {
            assert_eq!(members.len(), 5);
            for r in members {
                assert_eq!(r.prompt_len(), 120);
                assert_eq!(r.output_len, 8);
                assert_eq!(
                    &r.input_ids[..100],
                    prefixes[*g],
                    "same system prompt in a group"
                );
                assert_eq!(r.routing_key.as_deref(), Some(group_key(*g).as_str()));
            }
        }
        for a in 0..4 {
            for b in a + 1..4 {
                assert_ne!(prefixes[a], prefixes[b], "groups differ");
            }
        }
        assert!(reqs
            .iter()
            .all(|r| r.input_ids.iter().all(|&t| (3..1000).contains(&t))));
        let idx: Vec<usize> = reqs.iter().map(|r| r.index).collect();
        assert_eq!(idx, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn shuffled_not_grouped() {
        let reqs = generate(&cfg(1.0), 1000, None, 7).unwrap();
        let groups: Vec<usize> = reqs.iter().map(|r| r.group).collect();
        let mut sorted = groups.clone();
        sorted.sort();
        assert_ne!(groups, sorted, "requests are shuffled");
    }

    #[test]
    fn lengths_stay_within_the_range_ratio() {
        let reqs = generate(&cfg(0.5), 1000, None, 3).unwrap();
        let mut seen_short = false;
        for r in &reqs {
            assert!(
                (50 + 10..=120).contains(&r.prompt_len()),
                "{}",
                r.prompt_len()
            );
            assert!((4..=8).contains(&r.output_len));
            seen_short |= r.prompt_len() < 120 || r.output_len < 8;
        }
        assert!(seen_short, "ratio 0.5 varies lengths");
        for (len, ratio, lo) in [(10, 1.0, 10), (10, 0.0, 1), (1, 0.5, 1), (7, 0.5, 3)] {
            let mut rng = StdRng::seed_from_u64(1);
            for _ in 0..200 {
                let l = sample_len(&mut rng, len, ratio);
                assert!((lo..=len).contains(&l), "len {len} ratio {ratio}: {l}");
            }
        }
    }

    #[test]
    fn deterministic_by_seed() {
        let a = generate(&cfg(0.7), 500, None, 42).unwrap();
        let b = generate(&cfg(0.7), 500, None, 42).unwrap();
        let c = generate(&cfg(0.7), 500, None, 43).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(arrival_times(10, 2.0, 42), arrival_times(10, 2.0, 42));
    }

    #[test]
    fn num_prompts_truncates_and_keys_are_optional() {
        let mut c = cfg(1.0);
        c.send_routing_key = false;
        let reqs = generate(&c, 1000, Some(3), 1).unwrap();
        assert_eq!(reqs.len(), 3);
        assert!(reqs.iter().all(|r| r.routing_key.is_none()));
        assert!(
            generate(&c, 2, None, 1).is_err(),
            "no ids above the specials"
        );
    }

    #[test]
    fn arrivals_burst_or_poisson() {
        assert_eq!(arrival_times(3, f64::INFINITY, 1), vec![0.0; 3]);
        let t = arrival_times(2000, 10.0, 1);
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
        let mean_gap = t[t.len() - 1] / (t.len() - 1) as f64;
        assert!((0.08..0.12).contains(&mean_gap), "mean gap {mean_gap}");
    }

    #[test]
    fn warmup_shares_no_prefix() {
        let reqs = generate(&cfg(1.0), 1000, None, 9).unwrap();
        let w = warmup_request(1000, 120, 4, 9);
        assert!(reqs.iter().all(|r| r.input_ids[..4] != w.input_ids[..4]));
    }
}
