//! What a sweep measures: what a rate means for the workload (`RateUnit`), one run's numbers
//! (`RunPoint`), a rate's repeats (`Point`), a method's points (`MethodSweep`), and the capacity
//! read from them, with its ratio to the best peer's.

use anyhow::Context;
use clap::ValueEnum;

use crate::bench::metrics::{percentile, BenchMetrics};
use crate::bench::plan::Plan;
use crate::bench::workload::Dataset;
use crate::bench::{bailian, mooncake};

use crate::bench::sweep_spec::SweepSpec;

/// What a rate means for this workload, and requests/s offered at rate 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RateUnit {
    /// A trace's time compression; `base_rps` is the window's own rate.
    TimeCompression { base_rps: f64 },
    /// Poisson arrivals at this many requests/s.
    RequestRate,
}

impl RateUnit {
    pub(super) fn of(plan: &Plan) -> anyhow::Result<RateUnit> {
        if !plan.gsp.dataset.is_trace() {
            return Ok(RateUnit::RequestRate);
        }
        let t = &plan.trace;
        let path = t
            .path
            .as_deref()
            .context("a trace needs --dataset-path FILE")?;
        let window = match plan.gsp.dataset {
            Dataset::Bailian => bailian::read(path, t.start_ms, plan.num_prompts)?.entries,
            _ => mooncake::read(path, t.start_ms, plan.num_prompts)?,
        };
        Ok(RateUnit::TimeCompression {
            base_rps: mooncake::window_rate(&window, path)?,
        })
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            RateUnit::TimeCompression { .. } => "time_compression",
            RateUnit::RequestRate => "request_rate",
        }
    }

    /// Requests/s offered at `rate`.
    pub(super) fn offered_rps(self, rate: f64) -> f64 {
        match self {
            RateUnit::TimeCompression { base_rps } => base_rps * rate,
            RateUnit::RequestRate => rate,
        }
    }

    /// The plan of one run at `rate`.
    pub(super) fn apply(self, plan: &Plan, rate: f64, repeat: usize) -> Plan {
        let mut plan = plan.clone();
        match self {
            RateUnit::TimeCompression { .. } => plan.trace.time_compression = rate,
            RateUnit::RequestRate => plan.request_rate = rate,
        }
        plan.seed = plan.seed.wrapping_add(repeat as u64);
        plan.progress = false;
        plan
    }

    /// A rate as the table heads it: `2x` (a compression) or `4 req/s`.
    pub(super) fn label(self, rate: f64) -> String {
        match self {
            RateUnit::TimeCompression { .. } => format!("{rate}x"),
            RateUnit::RequestRate => format!("{rate} req/s"),
        }
    }
}

/// One run of one method at one rate.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPoint {
    pub attainment: f64,
    /// Requests completed per second of the run: what was served, which for a trace of
    /// sessions (each turn after its parent) can be well under the offered rate.
    pub achieved_rps: f64,
    pub goodput_rps: f64,
    pub p50_ttft_ms: f64,
    pub p90_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub p50_itl_ms: f64,
    pub p99_itl_ms: f64,
    pub cache_hit: Option<f64>,
    pub pooled_lru_ceiling: Option<f64>,
    pub refused: usize,
    pub failed: usize,
    /// Why the run gave no metrics (its cluster did not start, nothing completed): attainment 0.
    pub skipped: Option<String>,
}

impl RunPoint {
    pub(super) fn of(m: &BenchMetrics) -> RunPoint {
        RunPoint {
            attainment: m.goodput_share,
            achieved_rps: m.request_throughput,
            goodput_rps: m.goodput,
            p50_ttft_ms: m.ttft.median,
            p90_ttft_ms: m.ttft.p90,
            p99_ttft_ms: m.ttft.p99,
            p50_itl_ms: m.itl.median,
            p99_itl_ms: m.itl.p99,
            cache_hit: m.cache_hit_rate,
            pooled_lru_ceiling: m.ceilings.and_then(|c| c.pooled_lru),
            refused: m.refused,
            failed: m.failed,
            skipped: None,
        }
    }

    /// A run that measured nothing counts as missing every request.
    pub(super) fn skipped(reason: String) -> RunPoint {
        RunPoint {
            attainment: 0.0,
            achieved_rps: 0.0,
            goodput_rps: 0.0,
            p50_ttft_ms: f64::NAN,
            p90_ttft_ms: f64::NAN,
            p99_ttft_ms: f64::NAN,
            p50_itl_ms: f64::NAN,
            p99_itl_ms: f64::NAN,
            cache_hit: None,
            pooled_lru_ceiling: None,
            refused: 0,
            failed: 0,
            skipped: Some(reason),
        }
    }
}

/// A method at one rate: every repeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub rate: f64,
    pub offered_rps: f64,
    pub runs: Vec<RunPoint>,
}

impl Point {
    /// The median of the repeats' attainment.
    pub fn attainment(&self) -> f64 {
        median(self.runs.iter().map(|r| r.attainment))
    }
}

/// The median of finite values (NaN when there is none).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

/// A method's capacity at SLO.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// In the sweep's unit (a time compression, or requests/s).
    pub rate: f64,
    /// In requests/s offered.
    pub rps: f64,
    /// Every rate met the target: the capacity is at least this.
    pub lower_bound: bool,
}

/// The capacity of `points` (ascending rates) at `target` attainment (see the module's
/// formula).
pub fn capacity(points: &[Point], target: f64) -> Capacity {
    let met = points.iter().rposition(|p| p.attainment() >= target);
    let Some(h) = met else {
        return Capacity {
            rate: 0.0,
            rps: 0.0,
            lower_bound: false,
        };
    };
    let Some(n) = points.get(h + 1) else {
        return Capacity {
            rate: points[h].rate,
            rps: points[h].offered_rps,
            lower_bound: true,
        };
    };
    let (a_h, a_n) = (points[h].attainment(), n.attainment());
    // a_n < target <= a_h, so the share lies in [0, 1).
    let share = (a_h - target) / (a_h - a_n);
    let lerp = |lo: f64, hi: f64| lo + share * (hi - lo);
    Capacity {
        rate: lerp(points[h].rate, n.rate),
        rps: lerp(points[h].offered_rps, n.offered_rps),
        lower_bound: false,
    }
}

/// One method's sweep.
#[derive(Debug, Clone)]
pub struct MethodSweep {
    pub method: String,
    pub points: Vec<Point>,
}

impl MethodSweep {
    /// Whether the method is done before rate `r`: an earlier rate's median missed the target
    /// (so `r` and above would too, but for noise; `--sweep-all-rates` runs them anyway).
    pub(super) fn stopped(&self, r: usize, spec: &SweepSpec) -> bool {
        self.points[..r]
            .iter()
            .any(|p| !p.runs.is_empty() && p.attainment() < spec.attainment)
    }
}

/// Whether a method is one of the peers' rules (SGLang's own three, vLLM's, SMG's, Dynamo's,
/// llm-d's) rather than dpserve's; a deployment suffix (`@1p1d`) is ignored.
pub fn is_peer(method: &str) -> bool {
    let name = method.split('@').next().unwrap_or(method);
    controller::policy::Method::from_str(name, false).is_ok_and(|m| m.is_peer())
}

/// Each method's capacity and its ratio to the best peer's (`None` when no peer was swept or
/// the best peer's is 0).
pub fn capacities(sweeps: &[MethodSweep], target: f64) -> Vec<(Capacity, Option<f64>)> {
    let caps: Vec<Capacity> = sweeps.iter().map(|s| capacity(&s.points, target)).collect();
    let best_peer = sweeps
        .iter()
        .zip(&caps)
        .filter(|(s, _)| is_peer(&s.method))
        .map(|(_, c)| c.rps)
        .fold(None, |best: Option<f64>, c| {
            Some(best.map_or(c, |b| b.max(c)))
        });
    caps.iter()
        .map(|c| (*c, best_peer.filter(|b| *b > 0.0).map(|b| c.rps / b)))
        .collect()
}
