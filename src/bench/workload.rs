//! The benchmark's workloads, as request lists. Prompts are random token ids drawn directly (no
//! tokenizer round trip), so lengths are exact and the workload is the same for every backend
//! and method given the seed.
//!
//! - `generated-shared-prefix` (GSP), SGLang `bench_serving`'s: `num_groups` system prompts,
//!   `prompts_per_group` questions each, every request = system prompt ‖ question, all
//!   shuffled. With `zipf = s`, the same number of requests draw their group from a Zipf law
//!   (group g with weight 1 / (g + 1)^s), so a few prefixes are hot.
//! - `multi-turn`: `num_groups` conversations of `prompts_per_group` turns. Turn 1 is the
//!   conversation's system prompt ‖ a question; turn t + 1 is turn t's prompt ‖ an answer of
//!   turn t's output length ‖ a new question, sent only once turn t has finished (`after`).
//!   The answer is drawn, not the one the server generated, so the prefix a server can reuse is
//!   the previous turn's prompt (a chat client that re-sends the model's own answer would also
//!   reuse that answer's KV). Turns go out round by round, conversations shuffled within one.
//!
//! Lengths follow bench_serving's range ratio: each system prompt, question and output length is
//! drawn uniformly from `[max(1, ⌊len · ratio⌋), len]` (ratio 1.0 = fixed lengths). This module
//! only builds the request list; sending it is `client.rs`'s job, timing it `metrics.rs`'s.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Token ids below this are specials in every built-in and common vocabulary (pad, bos, eos).
pub const FIRST_PLAIN_TOKEN: u32 = 3;

/// Which request list [`generate`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dataset {
    /// SGLang bench_serving's shared system prompts (optionally Zipf-popular).
    GeneratedSharedPrefix,
    /// Conversations whose prompt grows each turn.
    MultiTurn,
    /// A Mooncake-format production trace replayed at its timestamps (`--dataset-path`).
    Mooncake,
    /// A Qwen-Bailian-format trace of sessions (`--dataset-path`): each turn after its parent
    /// turn has finished, siblings together.
    Bailian,
    /// One system prompt for every request (`--gsp-num-groups` × `--gsp-prompts-per-group`
    /// requests, each with its own question): the hot prefix that piles onto one rank.
    HotPrefix,
    /// Groups of identical prompts arriving together (best-of-N, RL rollouts):
    /// `--gsp-prompts-per-group` copies of each group's prompt at one arrival time.
    SiblingBurst,
    /// Nothing shared: every prompt its own random tokens (system + question lengths).
    NoReuse,
}

impl Dataset {
    /// Whether the dataset is a trace file replayed at its timestamps (`--dataset-path`).
    pub fn is_trace(self) -> bool {
        matches!(self, Dataset::Mooncake | Dataset::Bailian)
    }

    pub fn name(self) -> &'static str {
        match self {
            Dataset::GeneratedSharedPrefix => "generated-shared-prefix",
            Dataset::MultiTurn => "multi-turn",
            Dataset::Mooncake => "mooncake",
            Dataset::Bailian => "bailian",
            Dataset::HotPrefix => "hot-prefix",
            Dataset::SiblingBurst => "sibling-burst",
            Dataset::NoReuse => "no-reuse",
        }
    }
}

/// Shape of a workload (bench_serving's `--gsp-*` flags; for `multi-turn` a group is a
/// conversation and its prompts are the turns).
#[derive(Debug, Clone, PartialEq)]
pub struct GspConfig {
    pub dataset: Dataset,
    pub num_groups: usize,
    pub prompts_per_group: usize,
    pub system_prompt_len: usize,
    pub question_len: usize,
    pub output_len: usize,
    pub range_ratio: f64,
    /// Send one routing key per group (`x-smg-routing-key`).
    pub send_routing_key: bool,
    /// GSP only: draw each request's group from a Zipf law with this exponent instead of
    /// `prompts_per_group` each.
    pub zipf: Option<f64>,
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
    /// Index of the request that must finish before this one is sent (the previous turn).
    pub after: Option<usize>,
    /// Seconds to wait after `after` finished (a trace's gap between turns: the user's or the
    /// tool's time); 0 without `after`.
    pub after_gap_s: f64,
    /// Send time in seconds after the start, when the workload fixes it (a trace's timestamp,
    /// a burst's arrival); `None`: the `--request-rate` arrival process decides.
    pub at: Option<f64>,
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

/// Builds the workload in send order; `num_prompts` (when set) keeps the first that many.
/// Same `seed` and arguments → the same requests in the same order.
pub fn generate(
    cfg: &GspConfig,
    vocab_size: u32,
    num_prompts: Option<usize>,
    seed: u64,
) -> anyhow::Result<Vec<BenchRequest>> {
    check(cfg, vocab_size)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let system_prompts: Vec<Vec<u32>> = (0..cfg.num_groups)
        .map(|_| {
            let len = sample_len(&mut rng, cfg.system_prompt_len, cfg.range_ratio);
            random_ids(&mut rng, len, vocab_size)
        })
        .collect();
    let mut requests = match cfg.dataset {
        Dataset::GeneratedSharedPrefix => shared_prefix(cfg, &system_prompts, vocab_size, &mut rng),
        Dataset::MultiTurn => multi_turn(cfg, &system_prompts, vocab_size, &mut rng),
        Dataset::HotPrefix => {
            let one = GspConfig {
                num_groups: 1,
                prompts_per_group: cfg.num_groups * cfg.prompts_per_group,
                zipf: None,
                ..cfg.clone()
            };
            shared_prefix(&one, &system_prompts[..1], vocab_size, &mut rng)
        }
        Dataset::SiblingBurst => sibling_burst(cfg, &system_prompts, vocab_size, &mut rng),
        Dataset::NoReuse => no_reuse(cfg, vocab_size, &mut rng),
        Dataset::Mooncake | Dataset::Bailian => {
            anyhow::bail!("a trace is read by bench::mooncake or bench::bailian")
        }
    };
    if let Some(n) = num_prompts {
        requests.truncate(n);
    }
    for (i, r) in requests.iter_mut().enumerate() {
        r.index = i;
    }
    Ok(requests)
}

fn check(cfg: &GspConfig, vocab_size: u32) -> anyhow::Result<()> {
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
    if let Some(s) = cfg.zipf {
        anyhow::ensure!(
            s.is_finite() && s >= 0.0,
            "--gsp-zipf must be a finite exponent ≥ 0, got {s}"
        );
        anyhow::ensure!(
            cfg.dataset == Dataset::GeneratedSharedPrefix,
            "--gsp-zipf applies to --dataset-name generated-shared-prefix only"
        );
    }
    Ok(())
}

/// One question (or, for the requests' own output, a length) per request of group `group`.
fn question(
    cfg: &GspConfig,
    group: usize,
    prompt: Vec<u32>,
    vocab_size: u32,
    rng: &mut StdRng,
) -> BenchRequest {
    let qlen = sample_len(rng, cfg.question_len, cfg.range_ratio).max(1);
    let mut input_ids = prompt;
    input_ids.extend(random_ids(rng, qlen, vocab_size));
    BenchRequest {
        index: 0,
        group,
        input_ids,
        output_len: sample_len(rng, cfg.output_len, cfg.range_ratio),
        routing_key: cfg.send_routing_key.then(|| group_key(group)),
        after: None,
        after_gap_s: 0.0,
        at: None,
    }
}

/// GSP: `prompts_per_group` requests per group (or as many in all, groups drawn by Zipf),
/// shuffled.
fn shared_prefix(
    cfg: &GspConfig,
    system_prompts: &[Vec<u32>],
    vocab_size: u32,
    rng: &mut StdRng,
) -> Vec<BenchRequest> {
    let total = cfg.num_groups * cfg.prompts_per_group;
    let groups: Vec<usize> = match cfg.zipf {
        None => (0..total).map(|i| i / cfg.prompts_per_group).collect(),
        Some(s) => {
            let zipf = Zipf::new(cfg.num_groups, s);
            (0..total).map(|_| zipf.sample(rng)).collect()
        }
    };
    let mut requests: Vec<BenchRequest> = groups
        .into_iter()
        .map(|g| question(cfg, g, system_prompts[g].clone(), vocab_size, rng))
        .collect();
    requests.shuffle(rng);
    requests
}

/// Sibling bursts: each group's prompt (system prompt ‖ one question) `prompts_per_group` times,
/// the copies of a group next to each other and sent together (`burst` marks them; the caller
/// gives a group one arrival time). Groups are shuffled.
fn sibling_burst(
    cfg: &GspConfig,
    system_prompts: &[Vec<u32>],
    vocab_size: u32,
    rng: &mut StdRng,
) -> Vec<BenchRequest> {
    let mut order: Vec<usize> = (0..cfg.num_groups).collect();
    order.shuffle(rng);
    let mut requests = Vec::with_capacity(cfg.num_groups * cfg.prompts_per_group);
    for g in order {
        let one = question(cfg, g, system_prompts[g].clone(), vocab_size, rng);
        requests.extend(std::iter::repeat_n(one, cfg.prompts_per_group));
    }
    requests
}

/// No reuse: every request its own random prompt of system + question length.
fn no_reuse(cfg: &GspConfig, vocab_size: u32, rng: &mut StdRng) -> Vec<BenchRequest> {
    (0..cfg.num_groups * cfg.prompts_per_group)
        .map(|i| {
            let len = sample_len(rng, cfg.system_prompt_len, cfg.range_ratio);
            let prompt = random_ids(rng, len, vocab_size);
            question(cfg, i, prompt, vocab_size, rng)
        })
        .collect()
}

/// Multi-turn: round t holds every conversation's turn t (shuffled), each after its turn t − 1.
fn multi_turn(
    cfg: &GspConfig,
    system_prompts: &[Vec<u32>],
    vocab_size: u32,
    rng: &mut StdRng,
) -> Vec<BenchRequest> {
    // Per conversation: its last turn's prompt, output length and position in the list.
    let mut last: Vec<Option<(Vec<u32>, usize, usize)>> = vec![None; cfg.num_groups];
    let mut requests = Vec::with_capacity(cfg.num_groups * cfg.prompts_per_group);
    for _turn in 0..cfg.prompts_per_group {
        let mut order: Vec<usize> = (0..cfg.num_groups).collect();
        order.shuffle(rng);
        for c in order {
            let (prompt, after) = match last[c].take() {
                None => (system_prompts[c].clone(), None),
                Some((mut prompt, output_len, at)) => {
                    prompt.extend(random_ids(rng, output_len, vocab_size));
                    (prompt, Some(at))
                }
            };
            let mut r = question(cfg, c, prompt, vocab_size, rng);
            r.after = after;
            last[c] = Some((r.input_ids.clone(), r.output_len, requests.len()));
            requests.push(r);
        }
    }
    requests
}

/// A Zipf law over `0..n`: P(k) ∝ 1 / (k + 1)^s, sampled by inverting its CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|k| {
                acc += 1.0 / ((k + 1) as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.gen();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
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
        after: None,
        after_gap_s: 0.0,
        at: None,
    }
}

/// Send times (seconds after start) of `requests` as `cfg` built them: the workload's own where
/// it fixes them (a trace), one time per burst of siblings (the `--request-rate` arrival
/// process over bursts, at `rate / prompts_per_group` so the request rate stays `rate`), else
/// the arrival process over requests.
pub fn send_times(cfg: &GspConfig, requests: &[BenchRequest], rate: f64, seed: u64) -> Vec<f64> {
    if let Some(at) = requests.iter().map(|r| r.at).collect::<Option<Vec<f64>>>() {
        return at;
    }
    if cfg.dataset == Dataset::SiblingBurst {
        let per = cfg.prompts_per_group.max(1);
        let bursts = arrival_times(requests.len().div_ceil(per), rate / per as f64, seed);
        return (0..requests.len()).map(|i| bursts[i / per]).collect();
    }
    arrival_times(requests.len(), rate, seed)
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
            dataset: Dataset::GeneratedSharedPrefix,
            num_groups: 4,
            prompts_per_group: 5,
            system_prompt_len: 100,
            question_len: 20,
            output_len: 8,
            range_ratio: ratio,
            send_routing_key: true,
            zipf: None,
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

    #[test]
    fn zipf_makes_group_zero_hot_and_keeps_the_request_count() {
        let mut c = cfg(1.0);
        c.num_groups = 8;
        c.prompts_per_group = 100;
        c.zipf = Some(1.2);
        let reqs = generate(&c, 1000, None, 5).unwrap();
        assert_eq!(reqs.len(), 800);
        let mut per_group = [0usize; 8];
        for r in &reqs {
            per_group[r.group] += 1;
            assert_eq!(
                r.input_ids[..100],
                reqs.iter().find(|x| x.group == r.group).unwrap().input_ids[..100]
            );
        }
        // P(0) = 1 / H(8, 1.2) ≈ 0.39: far above the uniform 1/8, and decreasing overall.
        assert!((250..380).contains(&per_group[0]), "{per_group:?}");
        assert!(
            per_group[0] > per_group[1] && per_group[1] > per_group[7],
            "{per_group:?}"
        );
        c.zipf = Some(0.0);
        let flat = generate(&c, 1000, None, 5).unwrap();
        let g0 = flat.iter().filter(|r| r.group == 0).count();
        assert!((60..140).contains(&g0), "s = 0 is uniform: {g0}");
        c.zipf = Some(f64::NAN);
        assert!(generate(&c, 1000, None, 5).is_err());
    }

    #[test]
    fn hot_prefix_shares_one_system_prompt_and_no_reuse_shares_nothing() {
        let mut c = cfg(1.0);
        c.dataset = Dataset::HotPrefix;
        let hot = generate(&c, 1000, None, 3).unwrap();
        assert_eq!(hot.len(), 20, "groups × prompts requests");
        assert!(hot
            .iter()
            .all(|r| r.input_ids[..100] == hot[0].input_ids[..100]));
        assert!(hot.iter().all(|r| r.prompt_len() == 120 && r.group == 0));
        assert_ne!(
            hot[0].input_ids[100..],
            hot[1].input_ids[100..],
            "own questions"
        );
        c.dataset = Dataset::NoReuse;
        let none = generate(&c, 1000, None, 3).unwrap();
        assert_eq!(none.len(), 20);
        for a in 0..none.len() {
            assert_eq!(none[a].prompt_len(), 120);
            for b in a + 1..none.len() {
                assert_ne!(none[a].input_ids[..8], none[b].input_ids[..8]);
            }
        }
        c.dataset = Dataset::Mooncake;
        assert!(
            generate(&c, 1000, None, 3).is_err(),
            "read by bench::mooncake"
        );
    }

    #[test]
    fn siblings_are_identical_and_arrive_together() {
        let mut c = cfg(1.0);
        c.dataset = Dataset::SiblingBurst;
        let reqs = generate(&c, 1000, None, 4).unwrap();
        assert_eq!(reqs.len(), 20);
        for burst in reqs.chunks(5) {
            assert!(burst.iter().all(|r| r.input_ids == burst[0].input_ids));
            assert!(burst.iter().all(|r| r.group == burst[0].group));
        }
        assert_ne!(reqs[0].input_ids, reqs[5].input_ids, "groups differ");
        let t = send_times(&c, &reqs, 10.0, 4);
        assert_eq!(t.len(), 20);
        for (i, b) in t.chunks(5).enumerate() {
            assert!(b.iter().all(|&x| x == b[0]), "burst {i}: {b:?}");
        }
        assert!(t[5] > t[0], "bursts spread by the arrival process");
        // Without a burst or a trace, the per-request arrival process.
        assert_eq!(
            send_times(&cfg(1.0), &reqs, 2.0, 4),
            arrival_times(20, 2.0, 4)
        );
        let mut timed = reqs.clone();
        for (i, r) in timed.iter_mut().enumerate() {
            r.at = Some(i as f64);
        }
        assert_eq!(
            send_times(&c, &timed, 10.0, 4)[3],
            3.0,
            "a trace's own times"
        );
    }

    #[test]
    fn multi_turn_prompts_extend_the_previous_turn_which_comes_first() {
        let mut c = cfg(1.0);
        c.dataset = Dataset::MultiTurn;
        c.num_groups = 3;
        c.prompts_per_group = 4;
        let reqs = generate(&c, 1000, None, 11).unwrap();
        assert_eq!(reqs.len(), 12);
        for (i, r) in reqs.iter().enumerate() {
            let turn = i / 3;
            // system 100 + turn × (question 20 + answer 8) + question 20
            assert_eq!(r.prompt_len(), 100 + turn * 28 + 20, "request {i}");
            assert_eq!(r.routing_key.as_deref(), Some(group_key(r.group).as_str()));
            match r.after {
                None => assert_eq!(turn, 0),
                Some(j) => {
                    assert!(j < i);
                    let prev = &reqs[j];
                    assert_eq!(prev.group, r.group);
                    assert_eq!(prev.index / 3 + 1, turn);
                    assert_eq!(r.input_ids[..prev.prompt_len()], prev.input_ids[..]);
                }
            }
        }
        let firsts: Vec<usize> = reqs[..3].iter().map(|r| r.group).collect();
        assert!(firsts.contains(&0) && firsts.contains(&1) && firsts.contains(&2));
        // Truncation keeps every prerequisite.
        let some = generate(&c, 1000, Some(5), 11).unwrap();
        assert!(some.iter().all(|r| !matches!(r.after, Some(j) if j >= 5)));
        c.zipf = Some(1.0);
        assert!(generate(&c, 1000, None, 11).is_err(), "zipf is GSP only");
    }
}
