//! Bar panels side by side: per category (a load-balance method, say) one bar per series (p50,
//! p90, ...), on a y axis from 0 with round ticks. `dpserve bench` draws its comparison chart with
//! it; the drawing goes through [`crate::svg`] like every other picture, so there is one way to
//! write SVG in the tree.

use crate::svg::{nice_step, tick_label, Anchor, Svg};

/// A series: one bar in every group, with its legend entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// An SVG colour (`#4e79a7`; [`crate::svg::PALETTE`] has ten).
    pub color: String,
}

/// One category's bars: its label and a value per series, in the panel's series order.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub label: String,
    pub values: Vec<f64>,
}

/// One panel of bars.
#[derive(Debug, Clone, PartialEq)]
pub struct BarPanel {
    /// Above the panel: what it shows and which way is better.
    pub caption: String,
    /// The y axis's unit (`ms`, `req/s`).
    pub unit: String,
    /// The legend lists them when there are two or more.
    pub series: Vec<Series>,
    pub groups: Vec<Group>,
}

/// Pixels a group needs, so every label fits under its bars.
const GROUP_W: f64 = 80.0;
const PANEL_MIN_W: f64 = 550.0;
const HEIGHT: f64 = 480.0;
const TOP: f64 = 80.0;
const BOTTOM: f64 = 50.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 16.0;

/// The document: `title` over the panels, left to right.
pub fn bars_svg(title: &str, panels: &[BarPanel]) -> String {
    let widest = panels.iter().map(|p| p.groups.len()).max().unwrap_or(0);
    let panel_w = PANEL_MIN_W.max(GROUP_W * widest as f64 + LEFT + RIGHT);
    let mut svg = Svg::new(panel_w * panels.len().max(1) as f64, HEIGHT);
    svg.text(
        16.0,
        28.0,
        20.0,
        Anchor::Start,
        "font-weight=\"bold\"",
        title,
    );
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut svg, panel, i as f64 * panel_w, panel_w);
    }
    svg.finish()
}

/// A drawable value: NaN, infinite and negative values draw as no bar.
fn height_of(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 {
        v
    } else {
        0.0
    }
}

fn draw_panel(svg: &mut Svg, panel: &BarPanel, x0: f64, width: f64) {
    let (left, right) = (x0 + LEFT, x0 + width - RIGHT);
    let base = HEIGHT - BOTTOM;
    let top_value = panel
        .groups
        .iter()
        .flat_map(|g| g.values.iter().copied().map(height_of))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.15;
    let y = |v: f64| base - v / top_value * (base - TOP);
    svg.group("panel", &[("caption", &panel.caption)]);
    svg.text(
        (left + right) / 2.0,
        TOP - 24.0,
        16.0,
        Anchor::Middle,
        "",
        &panel.caption,
    );
    draw_y_axis(svg, left, right, top_value, &y);
    svg.text(
        x0 + 14.0,
        TOP - 6.0,
        11.0,
        Anchor::Start,
        "fill=\"#444\"",
        &panel.unit,
    );
    let group_w = (right - left) / panel.groups.len().max(1) as f64;
    let bar_w = 0.76 * group_w / panel.series.len().max(1) as f64;
    for (g, group) in panel.groups.iter().enumerate() {
        let gx = left + g as f64 * group_w;
        for (s, series) in panel.series.iter().enumerate() {
            let v = group.values.get(s).copied().unwrap_or(0.0);
            let bx = gx + 0.12 * group_w + s as f64 * bar_w;
            svg.group("bar", &[("group", &group.label), ("series", &series.name)]);
            svg.title(&format!(
                "{} {}: {v:.1} {}",
                group.label, series.name, panel.unit
            ));
            let h = base - y(height_of(v));
            svg.rect(
                bx,
                base - h,
                bar_w,
                h,
                &format!("fill=\"{}\"", series.color),
            );
            svg.end();
        }
        svg.text(
            gx + group_w / 2.0,
            base + 18.0,
            11.0,
            Anchor::Middle,
            "fill=\"#222\"",
            &group.label,
        );
    }
    svg.line(left, base, right, base, "stroke=\"#333\"");
    if panel.series.len() > 1 {
        draw_legend(svg, &panel.series, right);
    }
    svg.end();
}

/// Gridlines and their values, from 0 to the top of the panel.
fn draw_y_axis(svg: &mut Svg, left: f64, right: f64, top_value: f64, y: &dyn Fn(f64) -> f64) {
    let step = nice_step(top_value / 6.0);
    let mut v = 0.0;
    while v <= top_value + 1e-9 {
        let yy = y(v);
        svg.line(left, yy, right, yy, "stroke=\"#e4e4e4\"");
        svg.text(
            left - 6.0,
            yy + 4.0,
            10.0,
            Anchor::End,
            "fill=\"#555\"",
            &tick_label(v, step),
        );
        v += step;
    }
    svg.line(left, TOP, left, y(0.0), "stroke=\"#333\"");
}

/// The series' colours and names, in the panel's top right corner.
fn draw_legend(svg: &mut Svg, series: &[Series], right: f64) {
    let x = right - 90.0;
    svg.rect(
        x - 8.0,
        TOP + 4.0,
        96.0,
        8.0 + 18.0 * series.len() as f64,
        "fill=\"#fff\" fill-opacity=\"0.8\" stroke=\"#333\"",
    );
    for (i, s) in series.iter().enumerate() {
        let ly = TOP + 22.0 + 18.0 * i as f64;
        svg.rect(x, ly - 9.0, 10.0, 10.0, &format!("fill=\"{}\"", s.color));
        svg.text(x + 16.0, ly, 11.0, Anchor::Start, "", &s.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::svg::PALETTE;

    fn panel(groups: &[(&str, &[f64])]) -> BarPanel {
        BarPanel {
            caption: "TTFT (ms) <lower is better>".into(),
            unit: "ms".into(),
            series: ["p50", "p90"]
                .iter()
                .zip(PALETTE)
                .map(|(n, c)| Series {
                    name: n.to_string(),
                    color: c.into(),
                })
                .collect(),
            groups: groups
                .iter()
                .map(|(l, v)| Group {
                    label: l.to_string(),
                    values: v.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn every_group_has_a_bar_per_series_taller_for_the_larger_value() {
        let doc = bars_svg(
            "chart",
            &[panel(&[("a", &[100.0, 300.0]), ("b", &[50.0, f64::NAN])])],
        );
        assert!(doc.starts_with("<svg"));
        assert!(doc.contains("TTFT (ms) &lt;lower is better&gt;"));
        for (g, s) in [("a", "p50"), ("a", "p90"), ("b", "p50"), ("b", "p90")] {
            let bar = format!("class=\"bar\" data-group=\"{g}\" data-series=\"{s}\"");
            assert!(doc.contains(&bar), "{bar}");
        }
        let height = |g: &str, s: &str| -> f64 {
            let at = doc
                .find(&format!("data-group=\"{g}\" data-series=\"{s}\""))
                .unwrap();
            let rest = &doc[at..];
            let h = &rest[rest.find("height=\"").unwrap() + 8..];
            h[..h.find('"').unwrap()].parse().unwrap()
        };
        assert!(height("a", "p90") > 2.9 * height("a", "p50"));
        assert!(height("a", "p50") > 1.9 * height("b", "p50"));
        assert_eq!(height("b", "p90"), 0.0, "NaN draws no bar");
    }

    #[test]
    fn panels_sit_side_by_side_and_widen_for_many_groups() {
        let few = bars_svg("x", &[panel(&[("a", &[1.0, 2.0])]), panel(&[])]);
        assert!(
            few.contains("width=\"1100\""),
            "two panels of the least width"
        );
        let names: Vec<String> = (0..12).map(|i| format!("method{i}")).collect();
        let many: Vec<(&str, &[f64])> = names.iter().map(|n| (n.as_str(), &[1.0][..])).collect();
        let wide = bars_svg("x", &[panel(&many)]);
        assert!(wide.contains(&format!("width=\"{:.0}\"", 12.0 * GROUP_W + LEFT + RIGHT)));
    }

    #[test]
    fn ticks_show_the_decimals_their_step_needs() {
        assert_eq!(tick_label(250.0, 50.0), "250");
        assert_eq!(tick_label(0.5, 0.5), "0.5");
        assert_eq!(tick_label(0.04, 0.02), "0.04");
    }
}
