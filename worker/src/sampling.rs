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
    /// Log-probability of the chosen token in the reported distribution (see the module doc).
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

/// `log_softmax(logits / temp)` of one row, evaluated lazily: the normaliser is computed once
/// (in f64, for stability) and each log-probability costs O(1), so the chosen token and its
/// alternatives share one pass over the vocabulary and agree to the bit.
struct LogSoftmax<'a> {
    logits: &'a [f32],
    max: f64,
    temp: f64,
    ln_z: f64,
}

impl<'a> LogSoftmax<'a> {
    fn new(logits: &'a [f32], temp: f32) -> Self {
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let temp = temp as f64;
        let z: f64 = logits
            .iter()
            .map(|&l| ((l as f64 - max) / temp).exp())
            .sum();
        LogSoftmax {
            logits,
            max,
            temp,
            ln_z: z.ln(),
        }
    }

    fn at(&self, idx: usize) -> f32 {
        ((self.logits[idx] as f64 - self.max) / self.temp - self.ln_z) as f32
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

/// Samples one token from `logits` (modified in place by the penalties) under `params`, with
/// the `top_logprobs_num` most likely alternatives (0: none, at no cost).
pub fn sample(
    logits: &mut [f32],
    params: &SamplingParams,
    rng: &mut StdRng,
    prompt_ids: &[u32],
    output_ids: &[u32],
    top_logprobs_num: usize,
) -> SampleResult {
    if logits.is_empty() {
        return SampleResult {
            token: 0,
            logprob: 0.0,
            top_logprobs: Vec::new(),
        };
    }
    apply_penalties(logits, params, prompt_ids, output_ids);
    // NaN logits (a broken model) must not poison the choice; treat them as impossible.
    for l in logits.iter_mut() {
        if l.is_nan() {
            *l = f32::NEG_INFINITY;
        }
    }
    let report = |logits: &[f32], temp: f32, token: usize| {
        let dist = LogSoftmax::new(logits, temp);
        SampleResult {
            token: token as u32,
            logprob: dist.at(token),
            top_logprobs: dist.top(top_logprobs_num),
        }
    };
    if params.is_greedy() {
        let token = kernels::argmax(logits);
        return report(logits, 1.0, token);
    }
    let temp = params.temperature;
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let mut probs: Vec<(usize, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i, ((l as f64 - max) / temp as f64).exp()))
        .collect();
    // Descending probability, ties to the lower index, so truncation is deterministic.
    let by_prob = |a: &(usize, f64), b: &(usize, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if params.top_k > 0 && (params.top_k as usize) < probs.len() {
        let k = params.top_k as usize;
        probs.select_nth_unstable_by(k - 1, by_prob);
        probs.truncate(k);
    }
    probs.sort_unstable_by(by_prob);
    let total: f64 = probs.iter().map(|p| p.1).sum();
    if params.top_p < 1.0 {
        let target = params.top_p.max(0.0) as f64 * total;
        let mut cum = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            cum += p.1;
            if cum >= target {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep.max(1));
    }
    if params.min_p > 0.0 {
        // probs[0] is the most likely token; min_p is relative to it.
        let floor = params.min_p as f64 * probs[0].1;
        let keep = probs.iter().take_while(|p| p.1 >= floor).count();
        probs.truncate(keep.max(1));
    }
    let kept: f64 = probs.iter().map(|p| p.1).sum();
    let mut u = rng.gen::<f64>() * kept;
    let mut token = probs[probs.len() - 1].0;
    for &(i, p) in &probs {
        if u < p {
            token = i;
            break;
        }
        u -= p;
    }
    report(logits, temp, token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    fn logits() -> Vec<f32> {
        vec![0.5, 2.0, 1.9, -1.0, 2.0, 0.0, 1.0, 0.3]
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
