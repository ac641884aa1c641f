//! What a sweep prints and writes: the table (methods × rates, capacity, ratio to the best
//! peer), `sweep.json`, `sweep.md` (the table and every run) and `sweep.svg` (attainment against
//! the offered rate).

use anyhow::Context;
use serde_json::{json, Value};

use super::points::{capacities, is_peer, MethodSweep, Point, RateUnit, RunPoint};
use crate::bench::args::BenchArgs;
use crate::bench::compare;
use crate::bench::launch::ServerFlags;
use crate::bench::plan::Plan;
use crate::bench::report::{aligned_table, markdown_table, pct};
use crate::bench::sweep_spec::SweepSpec;
use crate::bench::workload::Dataset;

/// The table's rows: a method, its median attainment per rate, its capacity and the ratio.
fn rows(sweeps: &[MethodSweep], target: f64) -> Vec<Vec<String>> {
    sweeps
        .iter()
        .zip(capacities(sweeps, target))
        .map(|(s, (cap, vs_peer))| {
            let mut row = vec![s.method.clone()];
            row.extend(s.points.iter().map(|p| match p.runs.is_empty() {
                // Not run: an earlier rate missed the target.
                true => "—".to_string(),
                false => format!("{:.1}%", p.attainment() * 100.0),
            }));
            row.push(match (cap.rps, cap.lower_bound) {
                (rps, true) => format!(">= {rps:.2}"),
                (0.0, false) => format!("< {:.2}", s.points[0].offered_rps),
                (rps, false) => format!("{rps:.2}"),
            });
            row.push(vs_peer.map_or("—".into(), |x| format!("{x:.2}x")));
            row
        })
        .collect()
}

fn headers(unit: RateUnit, spec: &SweepSpec) -> Vec<String> {
    let mut h = vec!["method".to_string()];
    h.extend(spec.rates.iter().map(|&r| match unit {
        RateUnit::TimeCompression { .. } => {
            format!("{} ({:.2} req/s)", unit.label(r), unit.offered_rps(r))
        }
        RateUnit::RequestRate => unit.label(r),
    }));
    h.push("capacity req/s".into());
    h.push("vs best peer".into());
    h
}

/// The table, `sweep.json`, `sweep.md` and `sweep.svg`.
pub(super) fn write_results(
    args: &BenchArgs,
    spec: &SweepSpec,
    unit: RateUnit,
    plan: &Plan,
    server: &ServerFlags,
    simulated: &[&str],
    sweeps: &[MethodSweep],
) -> anyhow::Result<()> {
    let out_dir = &args.output_dir;
    // The plan's own compression is not what ran: each rate is one.
    let swept = |s: String| {
        let compression = plan.trace.time_compression;
        s.replace(
            &format!("time compressed {compression}x"),
            "time compressed at each rate below",
        )
        .replace(&format!("{compression}x time"), "swept time")
    };
    let described = swept(compare::describe(plan, server, simulated));
    let mut caption = format!(
        "capacity at SLO: the highest offered rate with at least {:.0} % of requests within TTFT \
         {} ms and ITL {} ms (median of {} repeats per point; cells: median attainment)",
        spec.attainment * 100.0,
        plan.slo.ttft_ms,
        plan.slo.itl_ms,
        spec.repeats
    );
    if plan.gsp.dataset == Dataset::Bailian {
        caption.push_str(
            "; a session trace's offered rate is nominal: each turn waits for its parent, so \
             what was served (every run's served req/s, below) can be far less",
        );
    }
    let (heads, rows) = (headers(unit, spec), rows(sweeps, spec.attainment));
    println!();
    println!("{described}");
    println!("{caption}");
    print!("{}", aligned_table(&heads, &rows));

    let json_path = out_dir.join("sweep.json");
    let mut summary = sweep_json(args, spec, unit, plan, server, sweeps);
    summary["simulated"] = json!(simulated);
    std::fs::write(&json_path, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = out_dir.join("sweep.md");
    let md = format!(
        "{described}\n\n{caption}\n\n{}\n{}",
        markdown_table(&heads, &rows),
        every_run_markdown(unit, sweeps)
    );
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    let svg_path = out_dir.join("sweep.svg");
    let title = format!(
        "dpserve bench --sweep: {}{}",
        swept(compare::workload_title(plan, server)),
        if simulated.is_empty() {
            ""
        } else {
            ", SIMULATED ranks"
        }
    );
    std::fs::write(&svg_path, attainment_svg(&title, spec, sweeps))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    println!(
        "wrote {}, {}, {}",
        json_path.display(),
        md_path.display(),
        svg_path.display()
    );
    anyhow::ensure!(
        sweeps
            .iter()
            .flat_map(|s| &s.points)
            .flat_map(|p| &p.runs)
            .any(|r| r.skipped.is_none()),
        "no run measured anything"
    );
    Ok(())
}

/// `sweep.json`: the SLO, the workload and server, and per method its capacity and points.
fn sweep_json(
    args: &BenchArgs,
    spec: &SweepSpec,
    unit: RateUnit,
    plan: &Plan,
    server: &ServerFlags,
    sweeps: &[MethodSweep],
) -> Value {
    let caps = capacities(sweeps, spec.attainment);
    let nums = |runs: &[RunPoint], f: fn(&RunPoint) -> f64| -> Vec<Value> {
        runs.iter()
            .map(|r| {
                let v = f(r);
                if v.is_finite() {
                    json!(v)
                } else {
                    Value::Null
                }
            })
            .collect()
    };
    json!({
        "slo": {
            "ttft_ms": plan.slo.ttft_ms,
            "itl_ms": plan.slo.itl_ms,
            "attainment": spec.attainment,
        },
        "rate_unit": unit.name(),
        "repeats": spec.repeats,
        "sim_speed": plan.sim_speed,
        "workload": compare::workload_json(plan),
        "server": compare::server_json(server),
        "preset": args.preset.map(|p| format!("{p:?}")),
        "methods": sweeps.iter().zip(caps).map(|(s, (cap, vs_peer))| json!({
            "method": s.method,
            "peer": is_peer(&s.method),
            "capacity_rps": cap.rps,
            "capacity_rate": cap.rate,
            "capacity_lower_bound": cap.lower_bound,
            "capacity_vs_best_peer": vs_peer,
            "points": s.points.iter().map(|p| json!({
                "rate": p.rate,
                "offered_rps": p.offered_rps,
                "median_attainment": p.attainment(),
                "attainment": nums(&p.runs, |r| r.attainment),
                "achieved_rps": nums(&p.runs, |r| r.achieved_rps),
                "goodput_rps": nums(&p.runs, |r| r.goodput_rps),
                "p50_ttft_ms": nums(&p.runs, |r| r.p50_ttft_ms),
                "p90_ttft_ms": nums(&p.runs, |r| r.p90_ttft_ms),
                "p99_ttft_ms": nums(&p.runs, |r| r.p99_ttft_ms),
                "p50_itl_ms": nums(&p.runs, |r| r.p50_itl_ms),
                "p99_itl_ms": nums(&p.runs, |r| r.p99_itl_ms),
                "cache_hit": nums(&p.runs, |r| r.cache_hit.unwrap_or(f64::NAN)),
                "pooled_lru_ceiling": nums(&p.runs, |r| r.pooled_lru_ceiling.unwrap_or(f64::NAN)),
                "refused": p.runs.iter().map(|r| r.refused).collect::<Vec<_>>(),
                "failed": p.runs.iter().map(|r| r.failed).collect::<Vec<_>>(),
                "skipped": p.runs.iter().map(|r| r.skipped.clone()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Every run, one row each, for sweep.md.
fn every_run_markdown(unit: RateUnit, sweeps: &[MethodSweep]) -> String {
    let heads: Vec<String> = [
        "method",
        "rate",
        "repeat",
        "attainment",
        "served req/s",
        "goodput req/s",
        "p50 TTFT ms",
        "p90 TTFT ms",
        "p99 TTFT ms",
        "p50 ITL ms",
        "p99 ITL ms",
        "cache hit",
        "pooled LRU ceiling",
        "refused",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    for s in sweeps {
        for p in &s.points {
            for (k, r) in p.runs.iter().enumerate() {
                let mut row = vec![s.method.clone(), unit.label(p.rate), (k + 1).to_string()];
                if let Some(reason) = &r.skipped {
                    row.push(format!("skipped: {reason}"));
                    row.resize(heads.len(), String::new());
                } else {
                    row.extend([
                        format!("{:.1}%", r.attainment * 100.0),
                        format!("{:.2}", r.achieved_rps),
                        format!("{:.2}", r.goodput_rps),
                        format!("{:.0}", r.p50_ttft_ms),
                        format!("{:.0}", r.p90_ttft_ms),
                        format!("{:.0}", r.p99_ttft_ms),
                        format!("{:.1}", r.p50_itl_ms),
                        format!("{:.1}", r.p99_itl_ms),
                        pct(r.cache_hit),
                        pct(r.pooled_lru_ceiling),
                        r.refused.to_string(),
                    ]);
                }
                rows.push(row);
            }
        }
    }
    format!("Every run:\n\n{}", markdown_table(&heads, &rows))
}

/// Attainment (median of the repeats) against offered requests/s, a line per method, with the
/// target drawn across.
fn attainment_svg(title: &str, spec: &SweepSpec, sweeps: &[MethodSweep]) -> String {
    use trace_tools::lines::{lines_svg, Line, LinePanel};
    use trace_tools::svg::PALETTE;
    let panel = LinePanel {
        caption: "SLO attainment (share of requests within TTFT and ITL), higher is better".into(),
        x_unit: "offered rate (requests/s)".into(),
        y_unit: "attainment".into(),
        y_max: Some(1.0),
        // From a tenth under the lowest point (or the target), in steps of 0.1.
        y_min: Some({
            let lowest = sweeps
                .iter()
                .flat_map(|s| &s.points)
                .map(Point::attainment)
                .filter(|a| a.is_finite())
                .fold(spec.attainment, f64::min);
            ((lowest - 0.1) * 10.0).floor().max(0.0) / 10.0
        }),
        target: Some((
            spec.attainment,
            format!("target {:.0} %", spec.attainment * 100.0),
        )),
        lines: sweeps
            .iter()
            .enumerate()
            .map(|(i, s)| Line {
                name: s.method.clone(),
                color: PALETTE[i % PALETTE.len()].into(),
                points: s
                    .points
                    .iter()
                    .map(|p| (p.offered_rps, p.attainment()))
                    .collect(),
            })
            .collect(),
    };
    lines_svg(title, &panel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sweep::tests::{point, spec, sweep_of};

    #[test]
    fn the_table_says_the_capacity_and_the_ratio_to_the_best_peer() {
        let sweeps = [
            sweep_of("prefix_affinity", &[1.0, 0.95, 0.5]),
            sweep_of("smg_cache_aware", &[1.0, 0.5, 0.5]),
        ];
        let table = aligned_table(
            &headers(RateUnit::RequestRate, &spec()),
            &rows(&sweeps, 0.9),
        );
        // prefix_affinity: 2.111 × 2 req/s over SMG's 1.2 × 2.
        assert!(table.contains("1.76x") && table.contains("4.22"), "{table}");
        assert!(
            table.contains("1 req/s") && !table.contains("(2.00 req/s)"),
            "{table}"
        );
    }

    #[test]
    fn the_chart_draws_a_line_per_method_and_the_target() {
        let sweeps = [MethodSweep {
            method: "prefix_affinity".into(),
            points: vec![point(1.0, &[0.99]), point(2.0, &[0.5])],
        }];
        let svg = attainment_svg("t", &spec(), &sweeps);
        assert!(svg.contains("data-series=\"prefix_affinity\""));
        assert!(svg.contains("target 90 %"));
    }
}
