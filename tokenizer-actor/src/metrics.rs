//! Prometheus metrics of the tokenizer actor (`GET /metrics`), kept and encoded by the
//! `prometheus` crate in the text exposition format 0.0.4.
//!
//! Three kinds: per-rank gauges read from the latest `ClusterStatus` at scrape time (what the
//! workers report: running and queued requests, token usage, cache hit rate, throughput); the
//! controller's routing-decision counters per (method, branch), also from `ClusterStatus`
//! (the controller counts, cumulatively, since it makes the decisions; this actor only shows
//! them); and counters and histograms this actor records as requests run (tokens, TTFT,
//! inter-token latency, end-to-end latency), labelled with the `dp_rank` that served them,
//! and the refusals this actor makes itself (a count and how long each took), by reason.
//! Every name starts with `dpserve:`; names, labels and buckets are a contract (dashboards,
//! `tests/python`).
//!
//! Format 0.0.4 rather than OpenMetrics: OpenMetrics names a counter's family without its
//! `_total`, which the 0.0.4 parsers scrapers and scripts use read as an untyped metric. As the
//! crate encodes it, a series lists its labels by name and a family with no series yet is left
//! out.

use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use protocol::{ClusterStatus, DisaggStatus, WorkerStatus};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5,
];
const E2E_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0,
];
/// A refusal reads a small body, tokenizes it and asks two actors: tens of microseconds when
/// idle, more in a burst; 1-2-5 steps from 20 µs, so a median under a millisecond still lands
/// between two close bounds.
const REFUSAL_BUCKETS: &[f64] = &[
    0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1.0,
];

/// Why this actor refused a request before sending it on: the `reason` label of
/// `requests_refused_total` and `request_refusal_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// `--max-in-flight-requests` reached: a 429.
    Overloaded,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Overloaded => "overloaded",
        }
    }
}

/// A request that ended, for the counters.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub dp_rank: Option<u32>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    /// `stop`, `length`, `abort`, `error`.
    pub finish_reason: &'static str,
    pub e2e_s: f64,
}

/// What this actor records as requests run, labelled by `dp_rank` ("unknown" when no rank
/// answered).
pub struct Metrics {
    registry: Registry,
    prompt_tokens: IntCounterVec,
    generation_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
    requests: IntCounterVec,
    refused: IntCounterVec,
    refusal_seconds: HistogramVec,
    ttft: HistogramVec,
    itl: HistogramVec,
    e2e: HistogramVec,
}

fn label(rank: Option<u32>) -> String {
    rank.map_or_else(|| "unknown".to_string(), |r| r.to_string())
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntCounterVec::new(opts(name, help), labels))
        };
        let histogram = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            let opts = HistogramOpts::from(opts(name, help)).buckets(buckets.to_vec());
            register(&registry, HistogramVec::new(opts, labels))
        };
        Metrics {
            prompt_tokens: counter(
                "prompt_tokens_total",
                "Prompt tokens of finished requests.",
                &["dp_rank"],
            ),
            generation_tokens: counter(
                "generation_tokens_total",
                "Generated tokens of finished requests.",
                &["dp_rank"],
            ),
            cached_tokens: counter(
                "cached_tokens_total",
                "Prompt tokens served from the prefix cache.",
                &["dp_rank"],
            ),
            requests: counter(
                "requests_total",
                "Finished requests by finish reason.",
                &["dp_rank", "finish_reason"],
            ),
            refused: counter(
                "requests_refused_total",
                "Requests refused before they were sent on, by reason (overloaded: \
                 --max-in-flight-requests reached).",
                &["reason"],
            ),
            refusal_seconds: histogram(
                "request_refusal_seconds",
                "Seconds from the HTTP handler's entry (headers parsed, body not yet read) to \
                 the refusal of a request this tokenizer refused before sending it on (the \
                 error decided, its JSON body not yet written); one observation per count of \
                 requests_refused_total, same reasons.",
                REFUSAL_BUCKETS,
                &["reason"],
            ),
            ttft: histogram(
                "time_to_first_token_seconds",
                "Time to first token.",
                TTFT_BUCKETS,
                &["dp_rank"],
            ),
            itl: histogram(
                "inter_token_latency_seconds",
                "Time between output tokens.",
                ITL_BUCKETS,
                &["dp_rank"],
            ),
            e2e: histogram(
                "e2e_request_latency_seconds",
                "End-to-end request latency.",
                E2E_BUCKETS,
                &["dp_rank"],
            ),
            registry,
        }
    }
}

impl Metrics {
    /// A request refused before it was sent on, `took` after its handler started.
    pub fn refused(&self, reason: RefusalReason, took: Duration) {
        let reason = [reason.as_str()];
        self.refused.with_label_values(&reason).inc();
        self.refusal_seconds
            .with_label_values(&reason)
            .observe(took.as_secs_f64());
    }

    pub fn observe_ttft(&self, rank: Option<u32>, secs: f64) {
        self.ttft.with_label_values(&[&label(rank)]).observe(secs);
    }

    /// `secs` between two outputs that carried `tokens` new tokens: one observation per token.
    pub fn observe_itl(&self, rank: Option<u32>, secs: f64, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let per = secs / tokens as f64;
        let itl = self.itl.with_label_values(&[&label(rank)]);
        (0..tokens).for_each(|_| itl.observe(per));
    }

    pub fn finished(&self, f: Finished) {
        let rank = label(f.dp_rank);
        let by_rank = [rank.as_str()];
        self.prompt_tokens
            .with_label_values(&by_rank)
            .inc_by(f.prompt_tokens);
        self.generation_tokens
            .with_label_values(&by_rank)
            .inc_by(f.completion_tokens);
        self.cached_tokens
            .with_label_values(&by_rank)
            .inc_by(f.cached_tokens);
        self.requests
            .with_label_values(&[rank.as_str(), f.finish_reason])
            .inc();
        self.e2e.with_label_values(&by_rank).observe(f.e2e_s);
    }

    /// The whole exposition: gauges and routing counters from `cluster` (if fresh), then what
    /// was recorded here.
    pub fn render(
        &self,
        cluster: Option<&ClusterStatus>,
        in_flight: usize,
    ) -> prometheus::Result<String> {
        let mut families = cluster_metrics(cluster, in_flight)?.gather();
        families.extend(self.registry.gather());
        TextEncoder::new().encode_to_string(&families)
    }
}

/// A gauge read from one rank's status.
type RankGauge = (&'static str, &'static str, fn(&WorkerStatus) -> f64);

const RANK_GAUGES: [RankGauge; 6] = [
    ("num_running_reqs", "Running requests per rank.", |s| {
        f64::from(s.num_running_reqs)
    }),
    (
        "num_queue_reqs",
        "Queued (waiting) requests per rank.",
        |s| f64::from(s.num_waiting_reqs),
    ),
    ("num_used_tokens", "KV slots in use per rank.", |s| {
        s.num_used_tokens as f64
    }),
    (
        "token_usage",
        "Fraction of the KV pool in use per rank.",
        |s| {
            if s.max_total_tokens > 0 {
                s.num_used_tokens as f64 / s.max_total_tokens as f64
            } else {
                0.0
            }
        },
    ),
    ("cache_hit_rate", "Prefix-cache hit rate per rank.", |s| {
        s.cache_hit_rate
    }),
    (
        "gen_throughput",
        "Generation throughput per rank (tokens/s).",
        |s| s.gen_throughput,
    ),
];

/// A value read from a disaggregated rank's status: (name, help, value, a counter?).
type DisaggSeries = (&'static str, &'static str, fn(&DisaggStatus) -> f64, bool);

const DISAGG_SERIES: [DisaggSeries; 9] = [
    (
        "num_bootstrap_reqs",
        "Disaggregation: requests waiting for their decode worker (prefill rank) or for a row and \
         KV slots (decode rank: the pre-allocation queue).",
        |d| f64::from(d.num_bootstrap_reqs),
        false,
    ),
    (
        "num_transfer_reqs",
        "Disaggregation: requests whose KV is on its way.",
        |d| f64::from(d.num_transfer_reqs),
        false,
    ),
    (
        "rows_beyond_running",
        "Disaggregation (decode rank): request rows in use beyond max_running_requests.",
        |d| f64::from(d.rows_beyond_running),
        false,
    ),
    (
        "peak_rows_beyond_running",
        "Disaggregation (decode rank): the most rows_beyond_running has been since start.",
        |d| f64::from(d.peak_rows_beyond_running),
        false,
    ),
    (
        "kv_transfers_total",
        "Disaggregation: KV transfers completed.",
        |d| d.transfers as f64,
        true,
    ),
    (
        "kv_transfer_bytes_total",
        "Disaggregation: KV bytes of the completed transfers.",
        |d| d.transfer_bytes as f64,
        true,
    ),
    (
        "kv_transfer_seconds_total",
        "Disaggregation (decode rank): seconds from KvReady to KvDone, summed over transfers.",
        |d| d.transfer_seconds,
        true,
    ),
    (
        "kv_transfers_failed_total",
        "Disaggregation: transfers that ended without their KV (abort, timeout, peer gone).",
        |d| d.transfers_failed as f64,
        true,
    ),
    (
        "kv_frames_dropped_total",
        "Disaggregation: KV frames dropped (unknown room, wrong size, out of order).",
        |d| d.frames_dropped as f64,
        true,
    ),
];

/// What the cluster status says now, as a registry of its own built for one scrape: a rank
/// that left has no series, and the routing counters are the controller's cumulative counts.
fn cluster_metrics(
    cluster: Option<&ClusterStatus>,
    in_flight: usize,
) -> prometheus::Result<Registry> {
    let registry = Registry::new();
    let live = IntGauge::with_opts(opts("live_ranks", "Ranks the controller reports live."))?;
    live.set(cluster.map_or(0, |c| c.live_ranks.len() as i64));
    registry.register(Box::new(live))?;
    let waiting = IntGauge::with_opts(opts(
        "requests_in_flight",
        "Requests this tokenizer is waiting on.",
    ))?;
    waiting.set(i64::try_from(in_flight).unwrap_or(i64::MAX));
    registry.register(Box::new(waiting))?;
    for (name, help, get) in RANK_GAUGES {
        let gauge = GaugeVec::new(opts(name, help), &["dp_rank"])?;
        for r in cluster.iter().flat_map(|c| &c.live_ranks) {
            if let Some(status) = &r.status {
                gauge
                    .with_label_values(&[&r.rank.to_string()])
                    .set(get(status));
            }
        }
        registry.register(Box::new(gauge))?;
    }
    let disagg = || {
        cluster.iter().flat_map(|c| &c.live_ranks).filter_map(|r| {
            let d = r.status.as_ref()?.disagg.as_ref()?;
            Some((r.rank.to_string(), d))
        })
    };
    if disagg().next().is_some() {
        for (name, help, get, counter) in DISAGG_SERIES {
            if counter {
                let series = CounterVec::new(opts(name, help), &["dp_rank"])?;
                for (rank, d) in disagg() {
                    series.with_label_values(&[&rank]).inc_by(get(d));
                }
                registry.register(Box::new(series))?;
            } else {
                let series = GaugeVec::new(opts(name, help), &["dp_rank"])?;
                for (rank, d) in disagg() {
                    series.with_label_values(&[&rank]).set(get(d));
                }
                registry.register(Box::new(series))?;
            }
        }
    }
    route_counter(
        &registry,
        opts(
            "routing_decisions_total",
            "Routing decisions of the controller by load-balance method and branch \
             (refused: not routable).",
        ),
        "branch",
        cluster.iter().flat_map(|c| &c.routing),
    )?;
    route_counter(
        &registry,
        opts(
            "routing_regret_total",
            "Requests sent away from the rank that held the longest prefix of their prompt, by \
             load-balance method and the branch that decided (methods that read the KV index).",
        ),
        "reason",
        cluster.iter().flat_map(|c| &c.regret),
    )?;
    Ok(registry)
}

/// A counter of the controller's [`protocol::RouteCount`]s, labelled by method and by
/// `second` (what the count's `branch` means for this series).
fn route_counter<'a>(
    registry: &Registry,
    opts: Opts,
    second: &str,
    counts: impl Iterator<Item = &'a protocol::RouteCount>,
) -> prometheus::Result<()> {
    let series = IntCounterVec::new(opts, &["method", second])?;
    for c in counts {
        series
            .with_label_values(&[c.method.as_str(), c.branch.as_str()])
            .inc_by(c.count);
    }
    registry.register(Box::new(series))
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(format!("dpserve:{name}"), help)
}

/// Register a metric of [`Metrics`]: its names and labels are constants here, so a failure
/// is a bug in this file, caught by its tests.
fn register<C: Collector + Clone + 'static>(registry: &Registry, made: prometheus::Result<C>) -> C {
    let metric = made.expect("metric options are valid");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_counters_add_up() {
        let m = Metrics::default();
        m.observe_ttft(Some(1), 0.03);
        m.observe_ttft(Some(1), 500.0);
        m.observe_itl(Some(1), 0.03, 3);
        m.finished(Finished {
            dp_rank: Some(1),
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 2,
            finish_reason: "length",
            e2e_s: 0.2,
        });
        let text = m.render(None, 0).unwrap();
        for want in [
            "dpserve:time_to_first_token_seconds_bucket{dp_rank=\"1\",le=\"0.02\"} 0",
            "dpserve:time_to_first_token_seconds_bucket{dp_rank=\"1\",le=\"0.04\"} 1",
            "dpserve:time_to_first_token_seconds_bucket{dp_rank=\"1\",le=\"160\"} 1",
            "dpserve:time_to_first_token_seconds_bucket{dp_rank=\"1\",le=\"+Inf\"} 2",
            "dpserve:time_to_first_token_seconds_count{dp_rank=\"1\"} 2",
            "dpserve:inter_token_latency_seconds_count{dp_rank=\"1\"} 3",
            "dpserve:prompt_tokens_total{dp_rank=\"1\"} 5",
            "dpserve:cached_tokens_total{dp_rank=\"1\"} 2",
            "dpserve:requests_total{dp_rank=\"1\",finish_reason=\"length\"} 1",
            "dpserve:live_ranks 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Every sample line is `name{labels} value` with a parseable value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(name.starts_with("dpserve:"), "{line}");
            value.parse::<f64>().unwrap();
        }
    }

    #[test]
    fn a_refusal_is_counted_and_timed_under_its_reason() {
        let m = Metrics::default();
        let text = m.render(None, 0).unwrap();
        // No refusal yet: the family has no series, so the encoder leaves it out.
        assert!(!text.contains("request_refusal_seconds"), "{text}");
        m.refused(RefusalReason::Overloaded, Duration::from_micros(70));
        m.refused(RefusalReason::Overloaded, Duration::from_micros(1500));
        let text = m.render(None, 0).unwrap();
        assert!(
            text.contains("# TYPE dpserve:request_refusal_seconds histogram"),
            "{text}"
        );
        for want in [
            "dpserve:requests_refused_total{reason=\"overloaded\"} 2",
            // Sub-millisecond values land in their own buckets.
            "dpserve:request_refusal_seconds_bucket{reason=\"overloaded\",le=\"0.00005\"} 0",
            "dpserve:request_refusal_seconds_bucket{reason=\"overloaded\",le=\"0.0001\"} 1",
            "dpserve:request_refusal_seconds_bucket{reason=\"overloaded\",le=\"0.001\"} 1",
            "dpserve:request_refusal_seconds_bucket{reason=\"overloaded\",le=\"0.002\"} 2",
            "dpserve:request_refusal_seconds_bucket{reason=\"overloaded\",le=\"+Inf\"} 2",
            "dpserve:request_refusal_seconds_count{reason=\"overloaded\"} 2",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn refusal_buckets_rise_from_tens_of_microseconds_to_a_second() {
        assert!(REFUSAL_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(REFUSAL_BUCKETS[0] <= 50e-6, "{}", REFUSAL_BUCKETS[0]);
        assert_eq!(REFUSAL_BUCKETS.last(), Some(&1.0));
    }

    fn cluster(routing: Vec<protocol::RouteCount>) -> ClusterStatus {
        ClusterStatus {
            timestamp: 0.0,
            load_balance_method: "prefix_affinity".into(),
            live_ranks: Vec::new(),
            routing,
            controller_id: None,
            regret: Vec::new(),
            num_inflight: None,
            taken_submission_seq: None,
        }
    }

    fn count(method: &str, branch: &str, count: u64) -> protocol::RouteCount {
        protocol::RouteCount {
            method: method.into(),
            branch: branch.into(),
            count,
        }
    }

    #[test]
    fn routing_decisions_are_a_counter_per_method_and_branch() {
        let m = Metrics::default();
        let status = cluster(vec![
            count("prefix_affinity", "affinity", 41),
            count("prefix_affinity", "spill", 2),
            count("prefix_affinity", "refused", 1),
            count("odd\"name\\", "x", 3),
        ]);
        let text = m.render(Some(&status), 0).unwrap();
        assert!(
            text.contains("# TYPE dpserve:routing_decisions_total counter"),
            "{text}"
        );
        // The encoder lists a series' labels by name.
        for want in [
            "dpserve:routing_decisions_total{branch=\"affinity\",method=\"prefix_affinity\"} 41",
            "dpserve:routing_decisions_total{branch=\"spill\",method=\"prefix_affinity\"} 2",
            "dpserve:routing_decisions_total{branch=\"refused\",method=\"prefix_affinity\"} 1",
            "dpserve:routing_decisions_total{branch=\"x\",method=\"odd\\\"name\\\\\"} 3",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Without a (fresh) cluster status the counter has no samples.
        let text = m.render(None, 0).unwrap();
        assert!(!text.contains("dpserve:routing_decisions_total{"), "{text}");
    }

    #[test]
    fn routing_regret_is_a_counter_per_method_and_reason() {
        let m = Metrics::default();
        let mut status = cluster(Vec::new());
        status.regret = vec![
            count("cache_aware", "spill", 7),
            count("cache_aware", "cached", 2),
        ];
        let text = m.render(Some(&status), 0).unwrap();
        for want in [
            "# TYPE dpserve:routing_regret_total counter",
            "dpserve:routing_regret_total{method=\"cache_aware\",reason=\"spill\"} 7",
            "dpserve:routing_regret_total{method=\"cache_aware\",reason=\"cached\"} 2",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
