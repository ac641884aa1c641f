//! Token sampling from one row of logits: penalties, temperature, top-k, top-p, min-p, then a
//! draw from the request's seeded generator; and the log-probabilities reported with the
//! choice. Stop conditions live in the scheduler.
//!
//! Order (as vLLM/SGLang): repetition penalty over prompt ∪ output tokens (divide positive
//! logits, multiply negative ones), frequency and presence penalties over output tokens, then
//! `logit_bias` (added, as OpenAI; it applies to greedy too), then temperature, then the
//! truncations on the sorted distribution. Greedy (temperature ≤ 0 or top_k == 1) is argmax
//! with ties to the lowest index, and draws nothing from the generator.
//!
//! Reported log-probabilities (the chosen token's and the top-k alternatives) all come from one
//! distribution: the log-softmax of the penalised logits at temperature 1 for greedy, at the
//! request's temperature (before truncation) otherwise. So with greedy the chosen token is
//! always the first alternative, with the very same number.

use protocol::SamplingParams;
use rand::rngs::StdRng;
use rand::Rng;

/// The chosen token and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleResult {
    pub token: u32,
    /// Log-probability of the chosen token in the reported distribution (see the module doc);
    /// NaN where [`sample_reporting`] was told it is not wanted and greedy needed no weights.
    pub logprob: f32,
    /// The `top_logprobs_num` most likely `(token, logprob)` of the same distribution, most
    /// likely first, ties to the lower id. Empty (and never allocated) when none were asked.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Applies the penalties in place to `logits`.
fn apply_penalties(logits: &mut [f32], p: &SamplingParams, prompt_ids: &[u32], output_ids: &[u32]) {
    let rep = p.repetition_penalty;
    if rep > 0.0 && rep != 1.0 {
        let mut seen = vec![false; logits.len()];
        for &t in prompt_ids.iter().chain(output_ids) {
            let t = t as usize;
            if t < logits.len() && !seen[t] {
                seen[t] = true;
                let l = &mut logits[t];
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        let mut counts = std::collections::HashMap::<usize, u32>::new();
        for &t in output_ids {
            if (t as usize) < logits.len() {
                *counts.entry(t as usize).or_default() += 1;
            }
        }
        for (t, c) in counts {
            logits[t] -= p.frequency_penalty * c as f32 + p.presence_penalty;
        }
    }
    // Ids out of range were refused by the tokenizer; a peer that sends one anyway loses it
    // here rather than crashing the worker.
    for &(t, bias) in &p.logit_bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += bias;
        }
    }
}

/// `log_softmax(logits / temp)` of one row, evaluated lazily: the softmax weights are computed
/// once (vectorized, [`kernels::softmax_weights`]), their sum accumulated in f64, and each
/// log-probability costs O(1), so the chosen token and its alternatives share one pass over the
/// vocabulary and agree to the bit. Sampling draws from the same weights.
struct LogSoftmax<'a> {
    logits: &'a [f32],
    /// `exp((logit - max) / temp)`: the most likely token's weight is exactly 1.
    weights: Vec<f32>,
    max: f32,
    inv_temp: f32,
    ln_z: f64,
}

impl<'a> LogSoftmax<'a> {
    /// `logits` must hold no NaN, and `max` is their maximum, above -inf.
    fn new(logits: &'a [f32], max: f32, temp: f32) -> Self {
        let inv_temp = 1.0 / temp;
        let mut weights = vec![0f32; logits.len()];
        let z = kernels::softmax_weights(logits, max, inv_temp, &mut weights);
        LogSoftmax {
            logits,
            weights,
            max,
            inv_temp,
            ln_z: z.ln(),
        }
    }

    fn at(&self, idx: usize) -> f32 {
        (((self.logits[idx] - self.max) * self.inv_temp) as f64 - self.ln_z) as f32
    }

    /// The `k` most likely ids with their log-probabilities, most likely first, ties to the
    /// lower id (as greedy's argmax). O(V·log k) worst case, O(V) for ordinary rows: a small
    /// sorted buffer that most logits fail to enter.
    fn top(&self, k: usize) -> Vec<(u32, f32)> {
        let k = k.min(self.logits.len());
        if k == 0 {
            return Vec::new();
        }
        // Descending logit, ascending id: the buffer's order is the answer's order.
        let mut best: Vec<(usize, f32)> = Vec::with_capacity(k + 1);
        for (i, &l) in self.logits.iter().enumerate() {
            if best.len() == k && l <= best[k - 1].1 {
                continue; // not better than the worst kept (an equal one has a higher id)
            }
            // First position whose logit is lower than `l`: equal logits keep id order.
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i, l));
            best.truncate(k);
        }
        best.into_iter()
            .map(|(i, _)| (i as u32, self.at(i)))
            .collect()
    }
}

/// Candidates sorted by descending weight, ties to the lower id: deterministic truncation.
fn by_weight(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The shortest prefix of the candidates, in [`by_weight`] order, whose weights reach `target`
/// (all of them if none does). Sorts only as much as it needs: the top 64, then 8× more while
/// the mass falls short, so a top-p over a large vocabulary costs O(V) plus a small sort.
fn nucleus(cand: &mut Vec<(u32, f32)>, target: f64) {
    let n = cand.len();
    let mut m = n.min(64);
    loop {
        if m < n {
            cand.select_nth_unstable_by(m - 1, by_weight);
        }
        cand[..m].sort_unstable_by(by_weight);
        let mut cum = 0.0;
        if let Some(i) = cand[..m].iter().position(|c| {
            cum += c.1 as f64;
            cum >= target
        }) {
            cand.truncate(i + 1);
            return;
        }
        if m == n {
            return;
        }
        m = (m * 8).min(n);
    }
}

/// What a caller wants reported beside the token.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    /// The chosen token's log-probability.
    pub logprob: bool,
    /// How many most likely alternatives (0: none).
    pub top: usize,
}

/// Samples one token from `logits` (modified in place by the penalties) under `params`, with
/// what `report` asks: its log-probability, the most likely alternatives (none: at no cost).
/// Greedy with nothing to report takes the argmax and skips the softmax over the vocabulary
/// (the same token; `logprob` is NaN).
pub fn sample_reporting(
    logits: &mut [f32],
    params: &SamplingParams,
    rng: &mut StdRng,
    prompt_ids: &[u32],
    output_ids: &[u32],
    report: Report,
) -> SampleResult {
    let top_logprobs_num = report.top;
    if logits.is_empty() {
        return SampleResult {
            token: 0,
            logprob: 0.0,
            top_logprobs: Vec::new(),
        };
    }
    apply_penalties(logits, params, prompt_ids, output_ids);
    // NaN logits (a broken model) must not poison the choice; treat them as impossible. +inf
    // is clamped so the weights stay finite (it is then simply the most likely).
    for l in logits.iter_mut() {
        // A select, not a branch: this pass runs over the whole vocabulary for every token.
        *l = if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            l.min(f32::MAX)
        };
    }
    // The most likely token (ties to the lowest id): greedy's choice, and the softmax's shift.
    let best = kernels::argmax(logits);
    if logits[best] == f32::NEG_INFINITY {
        // Nothing is possible (e.g. every token banned): the lowest id, as greedy's argmax.
        return SampleResult {
            token: 0,
            logprob: f32::NEG_INFINITY,
            top_logprobs: Vec::new(),
        };
    }
    let greedy = params.is_greedy();
    if greedy && !report.logprob && top_logprobs_num == 0 {
        return SampleResult {
            token: best as u32,
            logprob: f32::NAN,
            top_logprobs: Vec::new(),
        };
    }
    let temp = if greedy { 1.0 } else { params.temperature };
    let dist = LogSoftmax::new(logits, logits[best], temp);
    let token = if greedy {
        best
    } else {
        draw(logits, &dist.weights, params, rng)
    };
    SampleResult {
        token: token as u32,
        logprob: dist.at(token),
        top_logprobs: dist.top(top_logprobs_num),
    }
}

/// A draw from the softmax weights after top-k, top-p and min-p. Tokens whose logit is -inf
/// (banned, or NaN) are never drawn (`exp_fixed` would give them a tiny weight, not 0).
fn draw(logits: &[f32], weights: &[f32], params: &SamplingParams, rng: &mut StdRng) -> usize {
    let mut cand: Vec<(u32, f32)> = weights
        .iter()
        .zip(logits)
        .enumerate()
        .filter(|&(_, (_, &l))| l > f32::NEG_INFINITY)
        .map(|(i, (&w, _))| (i as u32, w))
        .collect();
    if params.top_k > 0 && (params.top_k as usize) < cand.len() {
        let k = params.top_k as usize;
        cand.select_nth_unstable_by(k - 1, by_weight);
        cand.truncate(k);
    }
    if params.top_p < 1.0 {
        let mass: f64 = cand.iter().map(|c| c.1 as f64).sum();
        nucleus(&mut cand, params.top_p.max(0.0) as f64 * mass);
    }
    if params.min_p > 0.0 {
        // The most likely token's weight is exactly 1, and it is always kept (top-k and
        // top-p keep the heaviest first), so min_p relative to it is min_p itself.
        // (At most 1, so that token stays whatever a peer sends.)
        let floor = params.min_p.min(1.0);
        cand.retain(|c| c.1 >= floor);
    }
    let kept: f64 = cand.iter().map(|c| c.1 as f64).sum();
    let mut u = rng.gen::<f64>() * kept;
    for &(i, w) in &cand {
        if u < w as f64 {
            return i as usize;
        }
        u -= w as f64;
    }
    cand.last().map_or(0, |c| c.0 as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A token with its log-probability and `top_logprobs_num` alternatives.
    pub(super) fn sample(
        logits: &mut [f32],
        params: &SamplingParams,
        rng: &mut StdRng,
        prompt_ids: &[u32],
        output_ids: &[u32],
        top_logprobs_num: usize,
    ) -> SampleResult {
        let report = Report {
            logprob: true,
            top: top_logprobs_num,
        };
        sample_reporting(logits, params, rng, prompt_ids, output_ids, report)
    }

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    fn logits() -> Vec<f32> {
        vec![0.5, 2.0, 1.9, -1.0, 2.0, 0.0, 1.0, 0.3]
    }

    #[test]
    fn nucleus_equals_the_prefix_of_a_full_sort_on_a_large_vocabulary() {
        let mut rng = StdRng::seed_from_u64(7);
        // 50k weights with many ties and a long tail, as a real vocabulary's.
        let weights: Vec<(u32, f32)> = (0..50_000u32)
            .map(|i| (i, (rng.gen_range(0..400) as f32 * 0.05 - 20.0).exp()))
            .collect();
        let mass: f64 = weights.iter().map(|c| c.1 as f64).sum();
        let mut sorted = weights.clone();
        sorted.sort_unstable_by(by_weight);
        for top_p in [0.0, 1e-9, 0.1, 0.5, 0.9, 0.999, 1.0] {
            let target = top_p * mass;
            let mut cum = 0.0;
            let keep = sorted
                .iter()
                .position(|c| {
                    cum += c.1 as f64;
                    cum >= target
                })
                .map_or(sorted.len(), |i| i + 1);
            let mut cand = weights.clone();
            nucleus(&mut cand, target);
            assert_eq!(cand, sorted[..keep], "top_p {top_p}");
        }
    }

    #[test]
    fn min_p_keeps_tokens_within_its_share_of_the_most_likely() {
        // Weights at temperature 1 relative to the top (2.0): 1.9 -> 0.905, 1.0 -> 0.37.
        let p = SamplingParams {
            min_p: 0.5,
            ..params(1.0)
        };
        let drawn = draw(&p, 3, 300);
        assert!(drawn.iter().all(|t| [1, 2, 4].contains(t)), "{drawn:?}");
        assert!([1, 2, 4].iter().all(|t| drawn.contains(t)));
    }

    #[test]
    fn banned_tokens_are_never_drawn_and_all_banned_is_token_zero() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut l = vec![f32::NEG_INFINITY, 5.0, f32::NAN, f32::NEG_INFINITY];
        for _ in 0..200 {
            let r = sample(&mut l.clone(), &params(100.0), &mut rng, &[], &[], 0);
            assert_eq!(r.token, 1);
            assert_eq!(r.logprob, 0.0);
        }
        l[1] = f32::NEG_INFINITY;
        let r = sample(&mut l, &params(1.0), &mut rng, &[], &[], 2);
        assert_eq!((r.token, r.logprob), (0, f32::NEG_INFINITY));
        let mut inf = vec![0.0, f32::INFINITY, 1.0];
        assert_eq!(
            sample(&mut inf, &params(0.0), &mut rng, &[], &[], 0).token,
            1
        );
    }

    fn draw(p: &SamplingParams, seed: u64, n: usize) -> Vec<u32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| sample(&mut logits(), p, &mut rng, &[], &[], 0).token)
            .collect()
    }

    #[test]
    fn greedy_is_argmax_with_low_tie_and_logprob() {
        let mut rng = StdRng::seed_from_u64(0);
        let r = sample(&mut logits(), &params(0.0), &mut rng, &[], &[], 0);
        assert_eq!(r.token, 1);
        let l = logits();
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        assert!((r.logprob as f64 - (2.0 - z.ln())).abs() < 1e-5);
    }

    #[test]
    fn not_reporting_the_logprob_picks_the_same_tokens() {
        let quiet = Report {
            logprob: false,
            top: 0,
        };
        for temp in [0.0, 0.7, 1.0] {
            let (mut a, mut b) = (StdRng::seed_from_u64(9), StdRng::seed_from_u64(9));
            for _ in 0..50 {
                let full = sample(&mut logits(), &params(temp), &mut a, &[], &[], 0);
                let r = sample_reporting(&mut logits(), &params(temp), &mut b, &[], &[], quiet);
                assert_eq!(r.token, full.token, "temperature {temp}");
                assert_eq!(r.logprob.is_nan(), temp == 0.0, "greedy alone skips it");
            }
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_varied() {
        let p = params(1.0);
        let a = draw(&p, 42, 200);
        assert_eq!(a, draw(&p, 42, 200));
        assert_ne!(a, draw(&p, 43, 200));
        assert!(a.iter().any(|&t| t != a[0]));
    }

    #[test]
    fn top_k_one_and_tiny_top_p_equal_greedy() {
        let k1 = SamplingParams {
            top_k: 1,
            ..params(1.0)
        };
        assert!(draw(&k1, 5, 50).iter().all(|&t| t == 1));
        let p0 = SamplingParams {
            top_p: 1e-6,
            ..params(1.0)
        };
        assert!(draw(&p0, 5, 50).iter().all(|&t| t == 1));
        let k2 = SamplingParams {
            top_k: 2,
            ..params(1.0)
        };
        assert!(draw(&k2, 5, 100).iter().all(|&t| t == 1 || t == 4));
        let mp = SamplingParams {
            min_p: 0.95,
            ..params(1.0)
        };
        assert!(draw(&mp, 5, 100).iter().all(|&t| t == 1 || t == 4));
    }

    #[test]
    fn penalties_move_the_distribution() {
        let mut rng = StdRng::seed_from_u64(0);
        let rep = SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0)
        };
        // Tokens 1 and 4 seen in the prompt: 2.0 / 2 = 1.0 < 1.9, so 2 wins.
        assert_eq!(
            sample(&mut logits(), &rep, &mut rng, &[1, 4], &[], 0).token,
            2
        );
        let freq = SamplingParams {
            frequency_penalty: 0.5,
            ..params(0.0)
        };
        let mut l = logits();
        assert_eq!(sample(&mut l, &freq, &mut rng, &[], &[1, 4, 4], 0).token, 2);
        assert_eq!((l[1], l[4]), (1.5, 1.0));
        let pres = SamplingParams {
            presence_penalty: 3.0,
            ..params(0.0)
        };
        assert_eq!(
            sample(&mut logits(), &pres, &mut rng, &[1], &[1, 4, 2], 0).token,
            6
        );
        let neg = SamplingParams {
            repetition_penalty: 2.0,
            ..params(0.0)
        };
        let mut l = logits();
        sample(&mut l, &neg, &mut rng, &[3], &[], 0);
        assert_eq!(l[3], -2.0);
    }

    #[test]
    fn logit_bias_adds_to_logits_and_ignores_bad_ids() {
        let mut rng = StdRng::seed_from_u64(0);
        let bias = SamplingParams {
            logit_bias: vec![(1, -100.0), (4, -100.0), (7, 5.0), (99, 100.0)],
            ..params(0.0)
        };
        let mut l = logits();
        assert_eq!(sample(&mut l, &bias, &mut rng, &[], &[], 0).token, 7);
        assert_eq!((l[1], l[7]), (-98.0, 5.3));
        // A -100 bias bans a token under sampling as well.
        let ban = SamplingParams {
            logit_bias: vec![(1, -100.0), (4, -100.0)],
            ..params(1.0)
        };
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let t = sample(&mut logits(), &ban, &mut rng, &[], &[], 0).token;
            assert!(t != 1 && t != 4);
        }
    }

    /// Checks the invariants of a top-k list against the distribution it came from.
    fn assert_top_logprobs(r: &SampleResult, k: usize, vocab: usize) {
        let top = &r.top_logprobs;
        assert_eq!(top.len(), k.min(vocab), "{top:?}");
        for w in top.windows(2) {
            assert!(
                w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0),
                "not sorted: {top:?}"
            );
        }
        let mass: f64 = top.iter().map(|&(_, lp)| (lp as f64).exp()).sum();
        assert!(mass <= 1.0 + 1e-6, "probability mass {mass} > 1: {top:?}");
        assert!(top
            .iter()
            .all(|&(id, lp)| (id as usize) < vocab && lp <= 0.0));
    }

    #[test]
    fn top_logprobs_are_sorted_hold_the_greedy_token_and_cost_nothing_unasked() {
        let mut rng = StdRng::seed_from_u64(0);
        for k in [1, 2, 3, 8, 20] {
            let r = sample(&mut logits(), &params(0.0), &mut rng, &[], &[], k);
            assert_top_logprobs(&r, k, 8);
            // Greedy: the chosen token is the first alternative, with the same number.
            assert_eq!(r.top_logprobs[0], (r.token, r.logprob));
        }
        // Ties keep id order (1 and 4 share the top logit), as argmax does.
        let r = sample(&mut logits(), &params(0.0), &mut rng, &[], &[], 3);
        assert_eq!(
            r.top_logprobs.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![1, 4, 2]
        );
        // All of them: a whole distribution, mass 1.
        let all = sample(&mut logits(), &params(0.0), &mut rng, &[], &[], 8);
        let mass: f64 = all.top_logprobs.iter().map(|p| (p.1 as f64).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-5, "{mass}");
        assert!(sample(&mut logits(), &params(0.0), &mut rng, &[], &[], 0)
            .top_logprobs
            .is_empty());
    }

    #[test]
    fn top_logprobs_follow_the_reported_distribution_when_sampling() {
        // Sampled at temperature 0.5 with penalties and a bias: the alternatives come from the
        // same (penalised, tempered, untruncated) distribution as the chosen token's logprob.
        let p = SamplingParams {
            temperature: 0.5,
            top_k: 3,
            presence_penalty: 1.0,
            logit_bias: vec![(6, 3.0)],
            ..params(0.5)
        };
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..50 {
            let r = sample(&mut logits(), &p, &mut rng, &[], &[1], 5);
            assert_top_logprobs(&r, 5, 8);
            // Token 6 (1.0 + 3.0) leads; 1 lost its place to the penalty.
            assert_eq!(r.top_logprobs[0].0, 6);
            if let Some(&(_, lp)) = r.top_logprobs.iter().find(|t| t.0 == r.token) {
                assert_eq!(lp, r.logprob);
            }
            let mut l = logits();
            l[1] -= 1.0;
            l[6] += 3.0;
            let z: f64 = l.iter().map(|&x| ((x as f64 - 4.0) / 0.5).exp()).sum();
            let want = (0.0 - z.ln()) as f32;
            assert!((r.top_logprobs[0].1 - want).abs() < 1e-6);
        }
        // A huge k is capped at the vocabulary.
        let r = sample(&mut logits(), &p, &mut rng, &[], &[], 1000);
        assert_top_logprobs(&r, 1000, 8);
    }
}

#[cfg(test)]
mod speed {
    use super::tests::sample;
    use super::*;
    use rand::SeedableRng;

    /// `cargo test --release -p worker sampling_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn sampling_speed() {
        let v = 32_000;
        let mut rng = StdRng::seed_from_u64(1);
        let logits: Vec<f32> = (0..v).map(|_| rng.gen_range(-8.0f32..8.0)).collect();
        let cases = [
            (
                "greedy",
                SamplingParams {
                    temperature: 0.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "temp 0.8",
                SamplingParams {
                    temperature: 0.8,
                    ..SamplingParams::default()
                },
            ),
            (
                "temp 0.8 top_p 0.9",
                SamplingParams {
                    temperature: 0.8,
                    top_p: 0.9,
                    ..SamplingParams::default()
                },
            ),
            (
                "temp 0.8 top_k 50",
                SamplingParams {
                    temperature: 0.8,
                    top_k: 50,
                    ..SamplingParams::default()
                },
            ),
        ];
        for (name, p) in cases {
            let reps = 200;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                std::hint::black_box(sample(&mut logits.clone(), &p, &mut rng, &[], &[], 0));
            }
            println!(
                "vocab {v}, {name}: {:.1} us/token",
                t.elapsed().as_secs_f64() / reps as f64 * 1e6
            );
        }
    }
}
