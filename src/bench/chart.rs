//! The comparison chart: an SVG with two bar panels, TTFT (mean and p99) and output throughput
//! per load-balance method, drawn with plotters' SVG backend (no fonts or system libraries);
//! and each method's routing over time, drawn from its cluster's routing trace by the same
//! code as `dpserve trace FILE --svg`.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::MethodResult;

const MEAN_COLOR: RGBColor = RGBColor(0x4c, 0x72, 0xb0);
const P99_COLOR: RGBColor = RGBColor(0xdd, 0x84, 0x52);
const TPUT_COLOR: RGBColor = RGBColor(0x55, 0xa8, 0x68);

/// Draws routing over time from the routing trace at `trace` into `out`; returns `out` shown.
pub fn write_routing_svg(trace: &Path, method: &str, out: &Path) -> anyhow::Result<String> {
    use controller::trace::{report, traffic};
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

/// Writes the chart of the methods that ran (skipped ones are left out) to `path`.
pub fn write_svg(results: &[MethodResult], title: &str, path: &Path) -> anyhow::Result<()> {
    let ran: Vec<(&str, f64, f64, f64)> = results
        .iter()
        .filter_map(|r| {
            r.result
                .as_ref()
                .ok()
                .map(|m| (r.method.as_str(), m.ttft.median, m.ttft.p90, m.goodput))
        })
        .collect();
    anyhow::ensure!(!ran.is_empty(), "no method ran; nothing to chart");
    // Wide enough for every method's name under its bars.
    let width = (1100).max(2 * 80 * ran.len() as u32 + 160);
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(plot_err)?;
    let (left, right) = root.split_horizontally(width / 2);
    let n = ran.len() as f64;

    // Left: TTFT, two bars per method.
    let ttft_max = ran
        .iter()
        .map(|r| r.2.max(r.1))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.15;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "TTFT (ms): p50 and p90, lower is better",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n, 0.0..ttft_max)
        .map_err(plot_err)?;
    let labels: Vec<String> = ran.iter().map(|r| r.0.to_string()).collect();
    let label_of = |x: &f64| {
        let i = (*x - 0.5).round();
        if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(ran.len() * 2 + 1)
        .x_label_formatter(&label_of)
        .y_desc("ms")
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(ran.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new([(x + 0.12, 0.0), (x + 0.5, r.1)], MEAN_COLOR.filled())
        }))
        .map_err(plot_err)?
        .label("p50")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], MEAN_COLOR.filled()));
    chart
        .draw_series(ran.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new([(x + 0.5, 0.0), (x + 0.88, r.2)], P99_COLOR.filled())
        }))
        .map_err(plot_err)?
        .label("p90")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], P99_COLOR.filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;

    // Right: goodput, one bar per method.
    let tput_max = ran.iter().map(|r| r.3).fold(0.0, f64::max).max(1.0) * 1.15;
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "Goodput (req/s within the SLO), higher is better",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n, 0.0..tput_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(ran.len() * 2 + 1)
        .x_label_formatter(&label_of)
        .y_desc("req/s")
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(ran.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new([(x + 0.2, 0.0), (x + 0.8, r.3)], TPUT_COLOR.filled())
        }))
        .map_err(plot_err)?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn plot_err<E: std::error::Error + Send + Sync + 'static>(
    e: DrawingAreaErrorKind<E>,
) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
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
