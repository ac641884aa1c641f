//! Prometheus metrics of the tokenizer actor, in the text exposition format (`GET /metrics`).
//!
//! Three kinds: per-rank gauges read from the latest `ClusterStatus` at scrape time (what the
//! workers report: running and queued requests, token usage, cache hit rate, throughput); the
//! controller's routing-decision counters per (method, branch), also from `ClusterStatus`
//! (the controller counts, cumulatively, since it makes the decisions; this actor only shows
//! them); and counters and histograms this actor records as requests run (tokens, TTFT,
//! inter-token latency, end-to-end latency), labelled with the `dp_rank` that served them.
//! Every name starts with `dpserve:`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use protocol::ClusterStatus;

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

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
}

/// What one rank's requests added up to, as seen from here.
#[derive(Debug, Clone)]
struct RankSeries {
    prompt_tokens: u64,
    generation_tokens: u64,
    cached_tokens: u64,
    requests: BTreeMap<&'static str, u64>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
}

impl Default for RankSeries {
    fn default() -> Self {
        RankSeries {
            prompt_tokens: 0,
            generation_tokens: 0,
            cached_tokens: 0,
            requests: BTreeMap::new(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
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

#[derive(Default)]
pub struct Metrics {
    /// Keyed by the `dp_rank` label value ("unknown" when no rank answered).
    ranks: Mutex<BTreeMap<String, RankSeries>>,
}

fn label(rank: Option<u32>) -> String {
    rank.map_or_else(|| "unknown".to_string(), |r| r.to_string())
}

impl Metrics {
    fn with(&self, rank: Option<u32>, f: impl FnOnce(&mut RankSeries)) {
        let mut ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
        f(ranks.entry(label(rank)).or_default());
    }

    pub fn observe_ttft(&self, rank: Option<u32>, secs: f64) {
        self.with(rank, |s| s.ttft.observe(secs));
    }

    /// `secs` between two outputs that carried `tokens` new tokens: one observation per token.
    pub fn observe_itl(&self, rank: Option<u32>, secs: f64, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let per = secs / tokens as f64;
        self.with(rank, |s| (0..tokens).for_each(|_| s.itl.observe(per)));
    }

    pub fn finished(&self, f: Finished) {
        self.with(f.dp_rank, |s| {
            s.prompt_tokens += f.prompt_tokens;
            s.generation_tokens += f.completion_tokens;
            s.cached_tokens += f.cached_tokens;
            *s.requests.entry(f.finish_reason).or_default() += 1;
            s.e2e.observe(f.e2e_s);
        });
    }

    /// The whole exposition: gauges from `cluster` (if fresh), then what was recorded here.
    pub fn render(&self, cluster: Option<&ClusterStatus>, in_flight: usize) -> String {
        let mut out = String::new();
        let live = cluster.map_or(0, |c| c.live_ranks.len());
        gauge_header(&mut out, "live_ranks", "Ranks the controller reports live.");
        let _ = writeln!(out, "dpserve:live_ranks {live}");
        gauge_header(
            &mut out,
            "requests_in_flight",
            "Requests this tokenizer is waiting on.",
        );
        let _ = writeln!(out, "dpserve:requests_in_flight {in_flight}");

        type Field = fn(&protocol::WorkerStatus) -> f64;
        let gauges: [(&str, &str, Field); 6] = [
            ("num_running_reqs", "Running requests per rank.", |s| {
                s.num_running_reqs as f64
            }),
            (
                "num_queue_reqs",
                "Queued (waiting) requests per rank.",
                |s| s.num_waiting_reqs as f64,
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
        for (name, help, get) in gauges {
            gauge_header(&mut out, name, help);
            for r in cluster.iter().flat_map(|c| &c.live_ranks) {
                if let Some(status) = &r.status {
                    let _ = writeln!(
                        out,
                        "dpserve:{name}{{dp_rank=\"{}\"}} {}",
                        r.rank,
                        get(status)
                    );
                }
            }
        }

        let _ = writeln!(
            out,
            "# HELP dpserve:routing_decisions_total Routing decisions of the controller by \
             load-balance method and branch (refused: not routable).\n\
             # TYPE dpserve:routing_decisions_total counter"
        );
        for c in cluster.iter().flat_map(|c| &c.routing) {
            let _ = writeln!(
                out,
                "dpserve:routing_decisions_total{{method=\"{}\",branch=\"{}\"}} {}",
                label_value(&c.method),
                label_value(&c.branch),
                c.count
            );
        }

        let ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let counters: [Series<u64>; 3] = [
            (
                "prompt_tokens_total",
                "Prompt tokens of finished requests.",
                |s| s.prompt_tokens,
            ),
            (
                "generation_tokens_total",
                "Generated tokens of finished requests.",
                |s| s.generation_tokens,
            ),
            (
                "cached_tokens_total",
                "Prompt tokens served from the prefix cache.",
                |s| s.cached_tokens,
            ),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(
                out,
                "# HELP dpserve:{name} {help}\n# TYPE dpserve:{name} counter"
            );
            for (rank, s) in &ranks {
                let _ = writeln!(out, "dpserve:{name}{{dp_rank=\"{rank}\"}} {}", get(s));
            }
        }
        let _ = writeln!(
            out,
            "# HELP dpserve:requests_total Finished requests by finish reason.\n\
             # TYPE dpserve:requests_total counter"
        );
        for (rank, s) in &ranks {
            for (reason, n) in &s.requests {
                let _ = writeln!(
                    out,
                    "dpserve:requests_total{{dp_rank=\"{rank}\",finish_reason=\"{reason}\"}} {n}"
                );
            }
        }
        let hists: [HistogramSeries; 3] = [
            ("time_to_first_token_seconds", "Time to first token.", |s| {
                &s.ttft
            }),
            (
                "inter_token_latency_seconds",
                "Time between output tokens.",
                |s| &s.itl,
            ),
            (
                "e2e_request_latency_seconds",
                "End-to-end request latency.",
                |s| &s.e2e,
            ),
        ];
        for (name, help, get) in hists {
            let _ = writeln!(
                out,
                "# HELP dpserve:{name} {help}\n# TYPE dpserve:{name} histogram"
            );
            for (rank, s) in &ranks {
                write_histogram(&mut out, name, rank, get(s));
            }
        }
        out
    }
}

/// A metric name, its help text, and how to read it from a rank's series.
type Series<T> = (&'static str, &'static str, fn(&RankSeries) -> T);
type HistogramSeries = (&'static str, &'static str, fn(&RankSeries) -> &Histogram);

/// A label value escaped as the exposition format wants (`\\`, `\"`, newline): the
/// controller is another process, so its strings are not trusted to be plain.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn gauge_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP dpserve:{name} {help}\n# TYPE dpserve:{name} gauge"
    );
}

fn write_histogram(out: &mut String, name: &str, rank: &str, h: &Histogram) {
    let mut cum = 0;
    for (i, b) in h.bounds.iter().enumerate() {
        cum += h.counts[i];
        let _ = writeln!(
            out,
            "dpserve:{name}_bucket{{dp_rank=\"{rank}\",le=\"{b}\"}} {cum}"
        );
    }
    let _ = writeln!(
        out,
        "dpserve:{name}_bucket{{dp_rank=\"{rank}\",le=\"+Inf\"}} {}",
        h.count
    );
    let _ = writeln!(out, "dpserve:{name}_sum{{dp_rank=\"{rank}\"}} {}", h.sum);
    let _ = writeln!(
        out,
        "dpserve:{name}_count{{dp_rank=\"{rank}\"}} {}",
        h.count
    );
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
        let text = m.render(None, 0);
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

    fn cluster(routing: Vec<protocol::RouteCount>) -> ClusterStatus {
        ClusterStatus {
            timestamp: 0.0,
            load_balance_method: "prefix_affinity".into(),
            live_ranks: Vec::new(),
            routing,
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
        let text = m.render(Some(&status), 0);
        assert!(
            text.contains("# TYPE dpserve:routing_decisions_total counter"),
            "{text}"
        );
        for want in [
            "dpserve:routing_decisions_total{method=\"prefix_affinity\",branch=\"affinity\"} 41",
            "dpserve:routing_decisions_total{method=\"prefix_affinity\",branch=\"spill\"} 2",
            "dpserve:routing_decisions_total{method=\"prefix_affinity\",branch=\"refused\"} 1",
            "dpserve:routing_decisions_total{method=\"odd\\\"name\\\\\",branch=\"x\"} 3",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Without a (fresh) cluster status the counter is declared but has no samples.
        let text = m.render(None, 0);
        assert!(text.contains("# TYPE dpserve:routing_decisions_total counter"));
        assert!(!text.contains("dpserve:routing_decisions_total{"), "{text}");
    }
}
