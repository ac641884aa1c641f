//! Benchmark metrics with SGLang `bench_serving`'s names and definitions, from per-request
//! outcomes:
//! - TTFT: send → first streamed chunk that carries a token (text or not).
//! - ITL: gaps between token-carrying chunks; a chunk with k tokens contributes k gaps of
//!   gap / k (bench_serving's adjusted ITL), pooled over all requests.
//! - TPOT: per request, (E2E − TTFT) / (output tokens − 1), for requests with > 1 output token.
//! - E2E: send → end of stream.
//! - Throughputs: totals over completed requests divided by the benchmark duration.
//! - Percentiles interpolate linearly between order statistics (numpy's default); std is the
//!   population standard deviation (numpy's default).
//!
//! - Goodput (vLLM's `--goodput`, Dynamo's recipes): completed requests whose TTFT and whose
//!   own mean ITL (its TPOT; a one-token request has none) are both within the SLO, per second
//!   of the run and as a share of every request sent (failed ones are not good).
//!
//! Plus dpserve-specific ones: the server-side cache hit rate (Σ cached_tokens / Σ
//! prompt_tokens as the server reported them), the share of requests and the prompt tokens per
//! DP rank (max / mean over the ranks), and refusals (HTTP 429 or 503: the server's load
//! shedding, not a fault).

use std::collections::BTreeMap;

use serde::Serialize;

/// What one request did, as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct RequestOutcome {
    pub success: bool,
    pub error: Option<String>,
    /// Prompt tokens sent.
    pub prompt_len: usize,
    /// Output tokens received.
    pub output_len: usize,
    pub ttft_s: f64,
    pub latency_s: f64,
    pub itl_s: Vec<f64>,
    /// Server-reported prompt and cached tokens (`meta_info` or `usage`).
    pub server_prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub dp_rank: Option<u32>,
    /// When it was sent and when its answer ended (or it failed), in seconds after the run's
    /// start.
    pub sent_s: f64,
    pub ended_s: f64,
}

impl RequestOutcome {
    /// Every time in it multiplied by `k` (`--sim-speed`: wall time back to modelled time).
    pub fn scale_time(&mut self, k: f64) {
        self.ttft_s *= k;
        self.latency_s *= k;
        self.sent_s *= k;
        self.ended_s *= k;
        for itl in &mut self.itl_s {
            *itl *= k;
        }
    }
}

/// Per request, in the workload's order (`--output-details`, bench_serving's flag): what was
/// sent and received, and when.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Details {
    pub input_lens: Vec<usize>,
    pub output_lens: Vec<usize>,
    pub ttfts_ms: Vec<f64>,
    pub sent_s: Vec<f64>,
    pub ended_s: Vec<f64>,
    pub dp_ranks: Vec<Option<u32>>,
    pub errors: Vec<Option<String>>,
}

impl Details {
    pub fn of(outcomes: &[RequestOutcome]) -> Details {
        Details {
            input_lens: outcomes.iter().map(|o| o.prompt_len).collect(),
            output_lens: outcomes.iter().map(|o| o.output_len).collect(),
            ttfts_ms: outcomes.iter().map(|o| o.ttft_s * 1000.0).collect(),
            sent_s: outcomes.iter().map(|o| o.sent_s).collect(),
            ended_s: outcomes.iter().map(|o| o.ended_s).collect(),
            dp_ranks: outcomes.iter().map(|o| o.dp_rank).collect(),
            errors: outcomes.iter().map(|o| o.error.clone()).collect(),
        }
    }
}

/// Mean, median, std and percentiles of one latency metric, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Dist {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Dist {
    /// From values in seconds; all zeros when empty (as bench_serving).
    pub fn from_secs(values: &[f64]) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        let mut v: Vec<f64> = values.iter().map(|s| s * 1000.0).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        Dist {
            mean,
            median: percentile(&v, 50.0),
            std: var.sqrt(),
            p90: percentile(&v, 90.0),
            p95: percentile(&v, 95.0),
            p99: percentile(&v, 99.0),
        }
    }
}

/// Percentile `p` (0–100) of sorted values, linear interpolation (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// TPOT of one request in seconds, if it produced more than one token.
pub fn tpot_s(o: &RequestOutcome) -> Option<f64> {
    (o.output_len > 1).then(|| (o.latency_s - o.ttft_s) / (o.output_len - 1) as f64)
}

/// ITL entries for a chunk that arrived `gap_s` after the previous one and carried `tokens`.
pub fn chunk_itl(gap_s: f64, tokens: usize) -> impl Iterator<Item = f64> {
    let per = if tokens == 0 {
        0.0
    } else {
        gap_s / tokens as f64
    };
    std::iter::repeat_n(per, tokens)
}

/// The latency bounds a request must meet to count towards goodput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: f64,
    pub itl_ms: f64,
}

impl Default for Slo {
    /// Dynamo's Qwen3-32B recipe (and vLLM's examples): TTFT 2 s, ITL 25 ms.
    fn default() -> Self {
        Slo {
            ttft_ms: 2000.0,
            itl_ms: 25.0,
        }
    }
}

impl Slo {
    /// Whether a completed request met both bounds.
    pub fn met(&self, o: &RequestOutcome) -> bool {
        o.success
            && o.ttft_s * 1000.0 <= self.ttft_ms
            && !matches!(tpot_s(o), Some(t) if t * 1000.0 > self.itl_ms)
    }
}

/// Whether an error is the server refusing load (429 Too Many Requests, 503 Unavailable).
pub fn is_refusal(error: &str) -> bool {
    error.starts_with("HTTP 429") || error.starts_with("HTTP 503")
}

/// The aggregated result of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchMetrics {
    pub completed: usize,
    pub failed: usize,
    pub duration: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    pub total_throughput: f64,
    /// Σ E2E latency / duration: how many requests were in flight on average.
    pub concurrency: f64,
    pub ttft: Dist,
    pub tpot: Dist,
    pub itl: Dist,
    pub e2e: Dist,
    /// Σ cached_tokens / Σ prompt_tokens (server-reported), over completed requests.
    pub cache_hit_rate: Option<f64>,
    /// Requests completed per DP rank.
    pub requests_per_rank: BTreeMap<u32, usize>,
    /// Share of completed requests per DP rank.
    pub rank_share: BTreeMap<u32, f64>,
    /// Prompt tokens of completed requests per DP rank (ranks that got none: 0, once
    /// [`BenchMetrics::with_ranks`] names them).
    pub prompt_tokens_per_rank: BTreeMap<u32, u64>,
    /// Max over mean of `prompt_tokens_per_rank` (1.0 = even; `None` without ranks).
    pub prompt_load_max_over_mean: Option<f64>,
    pub slo: Slo,
    /// Requests meeting the SLO, per second.
    pub goodput: f64,
    /// Requests meeting the SLO over all requests sent.
    pub goodput_share: f64,
    /// Requests the server refused (HTTP 429 / 503).
    pub refused: usize,
    /// The workload's own hit-rate ceilings (set by the run, which knows the KV capacity).
    pub ceilings: Option<super::ceiling::Ceilings>,
    /// The first few distinct errors, for the report.
    pub errors: Vec<String>,
    /// Every request's own numbers (with `--output-details`).
    pub details: Option<Details>,
}

impl BenchMetrics {
    /// Why the run measured nothing ("no request completed: <first error>"), if it did not.
    pub fn none_completed(&self) -> Option<String> {
        (self.completed == 0).then(|| {
            format!(
                "no request completed: {}",
                self.errors.first().map_or("", String::as_str)
            )
        })
    }

    pub fn compute(outcomes: &[RequestOutcome], duration_s: f64, slo: Slo) -> BenchMetrics {
        let ok: Vec<&RequestOutcome> = outcomes.iter().filter(|o| o.success).collect();
        let duration = duration_s.max(f64::MIN_POSITIVE);
        let total_input_tokens: usize = ok.iter().map(|o| o.prompt_len).sum();
        let total_output_tokens: usize = ok.iter().map(|o| o.output_len).sum();
        let ttfts: Vec<f64> = ok.iter().map(|o| o.ttft_s).collect();
        let tpots: Vec<f64> = ok.iter().filter_map(|o| tpot_s(o)).collect();
        let itls: Vec<f64> = ok.iter().flat_map(|o| o.itl_s.iter().copied()).collect();
        let e2es: Vec<f64> = ok.iter().map(|o| o.latency_s).collect();

        let (mut prompt, mut cached, mut reported) = (0u64, 0u64, false);
        for o in &ok {
            if let Some(c) = o.cached_tokens {
                reported = true;
                cached += c;
                prompt += o.server_prompt_tokens.unwrap_or(o.prompt_len as u64);
            }
        }
        let cache_hit_rate = (reported && prompt > 0).then(|| cached as f64 / prompt as f64);

        let mut requests_per_rank = BTreeMap::new();
        let mut prompt_tokens_per_rank = BTreeMap::new();
        for o in &ok {
            if let Some(rank) = o.dp_rank {
                *requests_per_rank.entry(rank).or_insert(0) += 1;
                *prompt_tokens_per_rank.entry(rank).or_insert(0) += o.prompt_len as u64;
            }
        }
        let good = ok.iter().filter(|o| slo.met(o)).count();
        let refused = outcomes
            .iter()
            .filter(|o| o.error.as_deref().is_some_and(is_refusal))
            .count();
        let ranked: usize = requests_per_rank.values().sum();
        let rank_share = requests_per_rank
            .iter()
            .map(|(&r, &n)| (r, n as f64 / ranked.max(1) as f64))
            .collect();

        let mut errors: Vec<String> = Vec::new();
        for e in outcomes.iter().filter_map(|o| o.error.as_ref()) {
            if errors.len() < 5 && !errors.contains(e) {
                errors.push(e.clone());
            }
        }

        BenchMetrics {
            completed: ok.len(),
            failed: outcomes.len() - ok.len(),
            duration: duration_s,
            total_input_tokens,
            total_output_tokens,
            request_throughput: ok.len() as f64 / duration,
            input_throughput: total_input_tokens as f64 / duration,
            output_throughput: total_output_tokens as f64 / duration,
            total_throughput: (total_input_tokens + total_output_tokens) as f64 / duration,
            concurrency: e2es.iter().sum::<f64>() / duration,
            ttft: Dist::from_secs(&ttfts),
            tpot: Dist::from_secs(&tpots),
            itl: Dist::from_secs(&itls),
            e2e: Dist::from_secs(&e2es),
            cache_hit_rate,
            requests_per_rank,
            rank_share,
            prompt_load_max_over_mean: max_over_mean(&prompt_tokens_per_rank),
            prompt_tokens_per_rank,
            slo,
            goodput: good as f64 / duration,
            goodput_share: good as f64 / outcomes.len().max(1) as f64,
            refused,
            ceilings: None,
            errors,
            details: None,
        }
    }

    /// The same metrics with every rank of `0..dp_size` in the per-rank loads (a rank that
    /// got nothing counts as 0 in max / mean, which is the point of the measure).
    pub fn with_ranks(mut self, dp_size: u32) -> BenchMetrics {
        for r in 0..dp_size {
            self.prompt_tokens_per_rank.entry(r).or_insert(0);
        }
        self.prompt_load_max_over_mean = max_over_mean(&self.prompt_tokens_per_rank);
        self
    }
}

fn max_over_mean(per_rank: &BTreeMap<u32, u64>) -> Option<f64> {
    let max = *per_rank.values().max()?;
    let mean = per_rank.values().sum::<u64>() as f64 / per_rank.len() as f64;
    (mean > 0.0).then(|| max as f64 / mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(prompt: usize, out: usize, ttft: f64, lat: f64) -> RequestOutcome {
        RequestOutcome {
            success: true,
            prompt_len: prompt,
            output_len: out,
            ttft_s: ttft,
            latency_s: lat,
            ..Default::default()
        }
    }

    #[test]
    fn percentiles_match_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.percentile([1,2,3,4], q) for q = 0, 50, 99, 100, 25
        for (q, want) in [
            (0.0, 1.0),
            (50.0, 2.5),
            (99.0, 3.97),
            (100.0, 4.0),
            (25.0, 1.75),
        ] {
            assert!((percentile(&v, q) - want).abs() < 1e-12, "p{q}");
        }
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        let d = Dist::from_secs(&[0.004, 0.001, 0.003, 0.002]);
        assert!((d.mean - 2.5).abs() < 1e-9 && (d.median - 2.5).abs() < 1e-9);
        assert!((d.std - 1.25f64.sqrt()).abs() < 1e-9, "population std");
        assert!((d.p99 - 3.97).abs() < 1e-9);
    }

    #[test]
    fn tpot_excludes_the_first_token_and_single_token_requests() {
        let o = outcome(10, 5, 0.2, 1.0);
        assert!((tpot_s(&o).unwrap() - 0.2).abs() < 1e-12, "(1.0 - 0.2) / 4");
        assert_eq!(tpot_s(&outcome(10, 1, 0.2, 0.2)), None);
        let m = BenchMetrics::compute(&[o, outcome(10, 1, 0.2, 0.2)], 2.0, Slo::default());
        assert!(
            (m.tpot.mean - 200.0).abs() < 1e-9,
            "only the multi-token request"
        );
    }

    #[test]
    fn itl_splits_multi_token_chunks() {
        let v: Vec<f64> = chunk_itl(0.3, 3).collect();
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|x| (x - 0.1).abs() < 1e-12));
        assert_eq!(chunk_itl(0.3, 0).count(), 0);
    }

    #[test]
    fn totals_throughputs_cache_and_ranks() {
        let mut a = outcome(100, 10, 0.1, 1.0);
        a.cached_tokens = Some(0);
        a.server_prompt_tokens = Some(100);
        a.dp_rank = Some(0);
        a.itl_s = vec![0.1; 9];
        let mut b = outcome(100, 10, 0.3, 2.0);
        b.cached_tokens = Some(80);
        b.server_prompt_tokens = Some(100);
        b.dp_rank = Some(1);
        let mut c = outcome(100, 10, 0.5, 2.0);
        c.cached_tokens = Some(100);
        c.server_prompt_tokens = Some(100);
        c.dp_rank = Some(1);
        let failed = RequestOutcome {
            error: Some("boom".into()),
            prompt_len: 100,
            ..Default::default()
        };
        let m = BenchMetrics::compute(&[a, b, c, failed], 4.0, Slo::default());
        assert_eq!((m.completed, m.failed), (3, 1));
        assert_eq!((m.total_input_tokens, m.total_output_tokens), (300, 30));
        assert!((m.request_throughput - 0.75).abs() < 1e-12);
        assert!((m.input_throughput - 75.0).abs() < 1e-12);
        assert!((m.output_throughput - 7.5).abs() < 1e-12);
        assert!((m.total_throughput - 82.5).abs() < 1e-12);
        assert!((m.concurrency - 1.25).abs() < 1e-12);
        assert!((m.ttft.mean - 300.0).abs() < 1e-9);
        assert!((m.ttft.median - 300.0).abs() < 1e-9);
        assert!((m.cache_hit_rate.unwrap() - 0.6).abs() < 1e-12);
        assert_eq!(m.requests_per_rank, BTreeMap::from([(0, 1), (1, 2)]));
        assert!((m.rank_share[&1] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(m.itl.mean, 100.0);
        assert_eq!(m.errors, vec!["boom".to_string()]);
    }

    #[test]
    fn goodput_counts_requests_within_both_bounds_over_all_sent() {
        let slo = Slo {
            ttft_ms: 500.0,
            itl_ms: 50.0,
        };
        let fast = outcome(10, 11, 0.1, 0.5); // TTFT 100 ms, TPOT 40 ms
        let slow_start = outcome(10, 11, 0.6, 1.0); // TTFT 600 ms
        let slow_tokens = outcome(10, 11, 0.1, 1.1); // TPOT 100 ms
        let one_token = outcome(10, 1, 0.2, 0.2); // no ITL to judge
        let refused = RequestOutcome {
            error: Some("HTTP 429 Too Many Requests: busy".into()),
            ..Default::default()
        };
        let broken = RequestOutcome {
            error: Some("sending: connection reset".into()),
            ..Default::default()
        };
        let all = [fast, slow_start, slow_tokens, one_token, refused, broken];
        let m = BenchMetrics::compute(&all, 2.0, slo);
        assert!(
            (m.goodput - 1.0).abs() < 1e-12,
            "2 good in 2 s: {}",
            m.goodput
        );
        assert!((m.goodput_share - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(m.refused, 1, "only the 429");
        assert!(is_refusal("HTTP 503 Service Unavailable: draining"));
        assert_eq!(Slo::default().ttft_ms, 2000.0);
    }

    #[test]
    fn prompt_load_per_rank_counts_idle_ranks() {
        let mut a = outcome(300, 1, 0.1, 0.1);
        a.dp_rank = Some(0);
        let mut b = outcome(100, 1, 0.1, 0.1);
        b.dp_rank = Some(1);
        let m = BenchMetrics::compute(&[a, b], 1.0, Slo::default());
        assert_eq!(
            m.prompt_tokens_per_rank,
            BTreeMap::from([(0, 300), (1, 100)])
        );
        assert!((m.prompt_load_max_over_mean.unwrap() - 1.5).abs() < 1e-12);
        // Four ranks, two idle: mean 100, max 300.
        let m = m.with_ranks(4);
        assert_eq!(m.prompt_tokens_per_rank.len(), 4);
        assert!((m.prompt_load_max_over_mean.unwrap() - 3.0).abs() < 1e-12);
    }

    #[test]
    fn no_cache_report_means_no_rate() {
        let m = BenchMetrics::compute(&[outcome(10, 2, 0.1, 0.2)], 1.0, Slo::default());
        assert_eq!(m.cache_hit_rate, None);
        assert!(m.rank_share.is_empty());
    }
}
