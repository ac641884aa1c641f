//! `--sweep`: capacity at SLO, the number an operator buys GPUs by (DistServe, OSDI '24: the
//! highest request rate at which a set share of requests meets the TTFT and ITL targets).
//!
//! Every `--compare` method runs at every rate of `--sweep`, `--sweep-repeats` times, each run
//! on a fresh cluster (repeat k uses seed `--seed` + k; runs go repeat by repeat, rate by rate,
//! method by method, so a slow minute of the machine falls on every method alike). Then at up
//! to `--sweep-extend` more rates: 1.5 times the highest while some method still meets the
//! target there, the lowest over 1.5 while every method misses it there (4 by default for a
//! preset's rates, so a trace lighter or heavier than the preset's gets its capacities measured
//! rather than bounded). A rate is
//! the trace's time compression for a replayed trace and `--request-rate` for a generated
//! workload; each point also states the offered rate in requests/s.
//!
//! ```text
//! attainment(run)  = requests within --slo-ttft-ms and --slo-itl-ms / requests sent
//!                    (a refused, failed or shed request is a miss: no method wins by shedding)
//! point            = the median attainment of a rate's repeats
//! capacity         = h + (a_h − target) / (a_h − a_n) · (n − h), where h is the highest rate
//!                    whose point meets --slo-attainment and n the next rate (which misses);
//!                    0 if no rate meets it; the top rate, flagged a lower bound, if it does
//! capacity_rps     = the same interpolation over the points' offered requests/s
//! ```
//!
//! Writes `sweep.json`, `sweep.md` and `sweep.svg` (attainment against offered rate, a line per
//! method) into `--output-dir`, and prints the table: methods × rates, capacity last, with its
//! ratio to the best peer method's (SGLang's, vLLM's, SMG's, Dynamo's and llm-d's rules).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

mod points;
mod report;

use super::sweep_spec::{self as spec, SweepSpec};
use points::{MethodSweep, Point, RateUnit, RunPoint};

use super::args::BenchArgs;
use super::compare;
use super::launch::{self, ServerFlags};
use super::plan::Plan;
use super::report::append_jsonl;
use super::runner::run_once;

/// `--launch --sweep`: every method at every rate, repeated; the capacities and their table,
/// `sweep.json`, `sweep.md` and `sweep.svg`.
pub fn run_sweep(
    args: &BenchArgs,
    spec: &SweepSpec,
    plan: &Plan,
    server: &ServerFlags,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let methods = compare::compare_methods(args)?;
    let unit = RateUnit::of(plan)?;
    let out_dir = &args.output_dir;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let runtime_root = std::env::temp_dir().join(format!("dpserve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&runtime_root)
        .with_context(|| format!("creating {}", runtime_root.display()))?;
    let server = &compare::with_sim_config(server, out_dir)?;
    let mut sweeps: Vec<MethodSweep> = methods
        .iter()
        .map(|m| MethodSweep {
            method: m.clone(),
            points: Vec::new(),
        })
        .collect();
    let mut spec = spec.clone();
    let mut simulated = std::collections::BTreeSet::new();
    let ctx = RunContext {
        args,
        plan,
        server,
        runtime_root: &runtime_root,
        rt,
        unit,
    };
    // Rate by rate; at each, every repeat of every method still running, so a slow minute of
    // the machine falls on every method alike.
    for r in 0..spec.rates.len() {
        simulated.extend(run_rate(&ctx, &spec, r, &mut sweeps)?);
    }
    // Past the rates asked for, while the capacities are not yet measured.
    while spec.extend > 0 {
        let Some((r, rate, why)) = extension(&spec, &sweeps) else {
            break;
        };
        eprintln!("== {why}: adding {}", unit.label(rate));
        spec.rates.insert(r, rate);
        spec.extend -= 1;
        simulated.extend(run_rate(&ctx, &spec, r, &mut sweeps)?);
    }
    std::fs::remove_dir_all(&runtime_root).ok();
    let simulated: Vec<&str> = simulated.iter().map(String::as_str).collect();
    report::write_results(args, &spec, unit, plan, server, &simulated, &sweeps)
}

/// The rate to add, where, and why: 1.5 times the highest while some method still meets the
/// target there (its capacity is only bounded below), else the lowest over 1.5 while every
/// method misses it there (every capacity would read 0); `None` once neither holds.
fn extension(spec: &SweepSpec, sweeps: &[MethodSweep]) -> Option<(usize, f64, &'static str)> {
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let meets = |s: &MethodSweep, r: usize| s.points[r].attainment() >= spec.attainment;
    let (top, low) = (spec.rates.len() - 1, spec.rates[0]);
    if sweeps.iter().any(|s| meets(s, top)) {
        let rate = round(spec.rates[top] * spec::EXTEND_FACTOR);
        return Some((
            top + 1,
            rate,
            "some method still meets the target at the highest rate",
        ));
    }
    let lower = round(low / spec::EXTEND_FACTOR);
    let all_miss = sweeps.iter().all(|s| !meets(s, 0));
    (all_miss && lower > 0.0 && lower < low).then_some((
        0,
        lower,
        "every method misses the target at the lowest rate",
    ))
}

/// What every run of a sweep shares.
struct RunContext<'a> {
    args: &'a BenchArgs,
    plan: &'a Plan,
    server: &'a ServerFlags,
    runtime_root: &'a Path,
    rt: &'a tokio::runtime::Runtime,
    unit: RateUnit,
}

/// Every repeat of every method still running at rate `r` of `spec`: its point in each sweep;
/// the simulated profiles the runs used.
fn run_rate(
    ctx: &RunContext<'_>,
    spec: &SweepSpec,
    r: usize,
    sweeps: &mut [MethodSweep],
) -> anyhow::Result<Vec<String>> {
    let (rate, unit) = (spec.rates[r], ctx.unit);
    for sweep in sweeps.iter_mut() {
        sweep.points.insert(
            r,
            Point {
                rate,
                offered_rps: unit.offered_rps(rate),
                runs: Vec::new(),
            },
        );
    }
    let mut simulated = Vec::new();
    for repeat in 0..spec.repeats {
        let plan = unit.apply(ctx.plan, rate, repeat);
        for sweep in sweeps
            .iter_mut()
            .filter(|s| spec.all_rates || !s.stopped(r, spec))
        {
            let method = &sweep.method;
            let (run, profiles) = run_point(
                method,
                ctx.args,
                &plan,
                ctx.server,
                ctx.runtime_root,
                ctx.rt,
            )?;
            simulated.extend(profiles);
            eprintln!(
                "== {method} at {} (repeat {}/{}): {}",
                unit.label(rate),
                repeat + 1,
                spec.repeats,
                describe_run(&run)
            );
            sweep.points[r].runs.push(run);
        }
    }
    Ok(simulated)
}

/// One run on a fresh cluster: its point, or a skipped one saying why.
fn run_point(
    method: &str,
    args: &BenchArgs,
    plan: &Plan,
    server: &ServerFlags,
    runtime_root: &Path,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(RunPoint, Vec<String>)> {
    let mut cluster = match launch::start(method, server, runtime_root, &args.output_dir) {
        Ok(cluster) => cluster,
        Err(reason) => return Ok((RunPoint::skipped(reason), Vec::new())),
    };
    let run = rt.block_on(run_once(&cluster.base_url, plan));
    cluster.stop(Duration::from_secs(15));
    let (mut info, m) = match run {
        Ok(run) => run,
        Err(e) => return Ok((RunPoint::skipped(format!("{e:#}")), Vec::new())),
    };
    info.load_balance_method = Some(method.to_string());
    let profiles = info.sim_profiles.clone();
    if let Some(path) = &args.output_file {
        append_jsonl(path, &super::report::result_json(&info, &m))?;
    }
    match m.none_completed() {
        Some(reason) => Ok((RunPoint::skipped(reason), profiles)),
        None => Ok((RunPoint::of(&m), profiles)),
    }
}

fn describe_run(run: &RunPoint) -> String {
    match &run.skipped {
        Some(reason) => format!("skipped (a miss for every request): {reason}"),
        None => format!(
            "attainment {:.1} %, goodput {:.2} req/s, p90 TTFT {:.0} ms, p50 ITL {:.1} ms, \
             cache hit {}, refused {}",
            run.attainment * 100.0,
            run.goodput_rps,
            run.p90_ttft_ms,
            run.p50_itl_ms,
            run.cache_hit
                .map_or("unknown".into(), |h| format!("{:.1} %", h * 100.0)),
            run.refused
        ),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::points::{capacities, capacity, is_peer, Capacity};
    use super::*;

    pub(crate) fn point(rate: f64, attainments: &[f64]) -> Point {
        Point {
            rate,
            offered_rps: 2.0 * rate,
            runs: attainments
                .iter()
                .map(|&a| RunPoint {
                    attainment: a,
                    ..RunPoint::skipped(String::new())
                })
                .collect(),
        }
    }

    #[test]
    fn capacity_interpolates_between_the_last_rate_that_meets_the_target_and_the_next() {
        // Medians: 0.99, 0.95, 0.85, 0.6.
        let points = [
            point(1.0, &[0.99, 0.98, 1.0]),
            point(2.0, &[0.95, 0.90, 0.97]),
            point(3.0, &[0.85, 0.80, 0.91]),
            point(4.0, &[0.6, 0.6, 0.6]),
        ];
        let c = capacity(&points, 0.9);
        // 2 + (0.95 − 0.9) / (0.95 − 0.85) · 1 = 2.5; offered: twice that.
        assert!((c.rate - 2.5).abs() < 1e-12, "{c:?}");
        assert!((c.rps - 5.0).abs() < 1e-12, "{c:?}");
        assert!(!c.lower_bound);
        // Exactly at the target: that rate.
        let c = capacity(&points, 0.95);
        assert!((c.rate - 2.0).abs() < 1e-12, "{c:?}");
    }

    #[test]
    fn capacity_is_zero_when_no_rate_meets_and_a_lower_bound_when_all_do() {
        let none = [point(1.0, &[0.5]), point(2.0, &[0.4])];
        assert_eq!(
            capacity(&none, 0.9),
            Capacity {
                rate: 0.0,
                rps: 0.0,
                lower_bound: false
            }
        );
        let all = [point(1.0, &[0.99]), point(2.0, &[0.95])];
        assert_eq!(
            capacity(&all, 0.9),
            Capacity {
                rate: 2.0,
                rps: 4.0,
                lower_bound: true
            }
        );
        // A noisy dip below the target and back: the highest rate that meets it counts.
        let dip = [
            point(1.0, &[0.95]),
            point(2.0, &[0.85]),
            point(3.0, &[0.92]),
        ];
        assert!(capacity(&dip, 0.9).lower_bound);
    }

    #[test]
    fn a_skipped_run_is_a_miss_not_a_gap() {
        // Two of three repeats measured 1.0; the third's cluster did not start: median 1.0.
        // Two skipped of three: median 0.
        assert_eq!(point(1.0, &[1.0, 1.0, 0.0]).attainment(), 1.0);
        let p = Point {
            rate: 1.0,
            offered_rps: 1.0,
            runs: vec![
                RunPoint::skipped("x".into()),
                RunPoint::skipped("y".into()),
                RunPoint {
                    attainment: 1.0,
                    ..RunPoint::skipped(String::new())
                },
            ],
        };
        assert_eq!(p.attainment(), 0.0);
    }

    #[test]
    fn the_ratio_is_to_the_best_peer_and_dpserve_methods_are_not_peers() {
        assert!(is_peer("smg_cache_aware") && is_peer("llmd_prefix@1p1d"));
        assert!(is_peer("round_robin") && is_peer("vllm_dp") && is_peer("dynamo_kv"));
        assert!(!is_peer("prefix_affinity") && !is_peer("cache_aware") && !is_peer("nope"));
        let sweeps = [
            sweep_of("prefix_affinity", &[1.0, 0.95, 0.5]),
            sweep_of("smg_cache_aware", &[1.0, 0.5, 0.5]),
            sweep_of("llmd_prefix", &[0.95, 0.4, 0.4]),
        ];
        let caps = capacities(&sweeps, 0.9);
        // prefix_affinity: 2 + 0.05/0.45 = 2.111 → 4.222 req/s; smg: 1 + 0.1/0.5 = 1.2 → 2.4;
        // llm-d: 1 + 0.05/0.55 → 2.18. Best peer: smg.
        let ratio = caps[0].1.unwrap();
        assert!((ratio - (2.0 + 0.05 / 0.45) / 1.2).abs() < 1e-9, "{ratio}");
        assert!((caps[1].1.unwrap() - 1.0).abs() < 1e-12);
    }

    /// `method` at rates 1, 2, 3, … with one run each of these attainments.
    pub(crate) fn sweep_of(method: &str, attainments: &[f64]) -> MethodSweep {
        MethodSweep {
            method: method.into(),
            points: attainments
                .iter()
                .enumerate()
                .map(|(i, &a)| point(i as f64 + 1.0, &[a]))
                .collect(),
        }
    }

    pub(crate) fn spec() -> SweepSpec {
        SweepSpec::new(&[3.0, 1.0, 2.0, 2.0], None, 3, 0.9).unwrap()
    }

    #[test]
    fn the_spec_is_sorted_and_checked() {
        assert_eq!(spec().rates, [1.0, 2.0, 3.0]);
        assert_eq!(
            SweepSpec::new(&[], Some(&[2.0, 1.0]), 1, 0.9)
                .unwrap()
                .rates,
            [1.0, 2.0]
        );
        for (rates, repeats, target) in [
            (&[][..], 3, 0.9),
            (&[0.0][..], 3, 0.9),
            (&[f64::INFINITY][..], 3, 0.9),
            (&[1.0][..], 0, 0.9),
            (&[1.0][..], 3, 0.0),
            (&[1.0][..], 3, 1.5),
        ] {
            assert!(SweepSpec::new(rates, None, repeats, target).is_err());
        }
    }
}
