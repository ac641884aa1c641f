//! The comparison chart: an SVG with two bar panels, TTFT (p50 and p90) and goodput per
//! load-balance method; and each method's routing over time, drawn from its cluster's routing
//! trace by the same code as `dpserve trace FILE --svg`. Both are drawn by `trace-tools`, whose
//! SVG writer draws every picture dpserve makes.

use std::path::Path;

use anyhow::Context;
use trace_tools::bars::{bars_svg, BarPanel, Group, Series};
use trace_tools::svg::PALETTE;
use trace_tools::{report, traffic};

use super::report::MethodResult;

/// Draws routing over time from the routing trace at `trace` into `out`; returns `out` shown.
pub fn write_routing_svg(trace: &Path, method: &str, out: &Path) -> anyhow::Result<String> {
    let file =
        std::fs::File::open(trace).with_context(|| format!("opening {}", trace.display()))?;
    let (records, _) = report::parse(std::io::BufReader::new(file))
        .with_context(|| format!("reading {}", trace.display()))?;
    anyhow::ensure!(
        !records.is_empty(),
        "{} holds no routing decision",
        trace.display()
    );
    let points: Vec<_> = records.iter().map(traffic::RoutePoint::of_record).collect();
    let svg = traffic::traffic_svg(
        &traffic::Traffic::of(&points),
        &format!("routing over time: {method}"),
    );
    std::fs::write(out, svg).with_context(|| format!("writing {}", out.display()))?;
    Ok(out.display().to_string())
}

/// A method that ran, as the chart shows it.
struct Ran<'a> {
    method: &'a str,
    ttft_p50_ms: f64,
    ttft_p90_ms: f64,
    goodput: f64,
}

/// Writes the chart of the methods that ran (skipped ones are left out) to `path`.
pub fn write_svg(results: &[MethodResult], title: &str, path: &Path) -> anyhow::Result<()> {
    let ran: Vec<Ran<'_>> = results
        .iter()
        .filter_map(|r| {
            let m = r.result.as_ref().ok()?;
            Some(Ran {
                method: &r.method,
                ttft_p50_ms: m.ttft.median,
                ttft_p90_ms: m.ttft.p90,
                goodput: m.goodput,
            })
        })
        .collect();
    anyhow::ensure!(!ran.is_empty(), "no method ran; nothing to chart");
    let panels = [
        panel(
            "TTFT (ms): p50 and p90, lower is better",
            "ms",
            &[("p50", PALETTE[0]), ("p90", PALETTE[1])],
            &ran,
            |r| vec![r.ttft_p50_ms, r.ttft_p90_ms],
        ),
        panel(
            "Goodput (req/s within the SLO), higher is better",
            "req/s",
            &[("goodput", PALETTE[2])],
            &ran,
            |r| vec![r.goodput],
        ),
    ];
    std::fs::write(path, bars_svg(title, &panels))
        .with_context(|| format!("writing {}", path.display()))
}

/// A panel with a group per method and a bar per `(name, colour)` of `series`.
fn panel(
    caption: &str,
    unit: &str,
    series: &[(&str, &str)],
    ran: &[Ran<'_>],
    values: impl Fn(&Ran<'_>) -> Vec<f64>,
) -> BarPanel {
    BarPanel {
        caption: caption.into(),
        unit: unit.into(),
        series: series
            .iter()
            .map(|&(name, color)| Series {
                name: name.into(),
                color: color.into(),
            })
            .collect(),
        groups: ran
            .iter()
            .map(|r| Group {
                label: r.method.into(),
                values: values(r),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::metrics::{BenchMetrics, Dist};

    #[test]
    fn writes_an_svg_with_every_method_that_ran() {
        let m = |t: f64, g: f64| BenchMetrics {
            goodput: g,
            ttft: Dist {
                median: t,
                p90: 2.0 * t,
                ..Dist::default()
            },
            ..BenchMetrics::default()
        };
        let results = vec![
            MethodResult {
                method: "round_robin".into(),
                result: Ok(m(300.0, 90.0)),
            },
            MethodResult {
                method: "prefix_affinity".into(),
                result: Ok(m(100.0, 120.0)),
            },
            MethodResult {
                method: "nope".into(),
                result: Err("skipped".into()),
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.svg");
        write_svg(&results, "test", &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("round_robin") && svg.contains("prefix_affinity"));
        assert!(!svg.contains("nope"));
    }
}
