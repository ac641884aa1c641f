//! One panel of lines: a series per category (a load-balance method, say) through its points,
//! on x and y axes with round ticks, with an optional horizontal target line. `dpserve bench
//! --sweep` draws SLO attainment against the offered rate with it; the drawing goes through
//! [`crate::svg`] like every other picture.

use crate::svg::{nice_step, tick_label, Anchor, Svg};

/// A series: its name (in the legend), colour and points `(x, y)` in x order.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    /// An SVG colour (`#4e79a7`; [`crate::svg::PALETTE`] has ten).
    pub color: String,
    pub points: Vec<(f64, f64)>,
}

/// The panel: what it shows, its axes, its lines, and a target drawn across it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePanel {
    pub caption: String,
    pub x_unit: String,
    pub y_unit: String,
    /// The y axis's top (`None`: the largest value plus a margin).
    pub y_max: Option<f64>,
    /// The y axis's bottom (`None`: 0). The x axis spans the points' x values, with a margin.
    pub y_min: Option<f64>,
    /// A dashed horizontal line at this value, with its label.
    pub target: Option<(f64, String)>,
    pub lines: Vec<Line>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 500.0;
const TOP: f64 = 80.0;
const BOTTOM: f64 = 56.0;
const LEFT: f64 = 70.0;
/// Room for the legend right of the plot.
const RIGHT: f64 = 190.0;

/// A drawable value: finite and not negative.
fn drawable(&(x, y): &(f64, f64)) -> bool {
    x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0
}

/// The document: `title` over the panel.
pub fn lines_svg(title: &str, panel: &LinePanel) -> String {
    let mut svg = Svg::new(WIDTH, HEIGHT);
    svg.text(
        16.0,
        28.0,
        15.0,
        Anchor::Start,
        "font-weight=\"bold\"",
        title,
    );
    let (left, right, base) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM);
    let (x_lo, x_hi) = x_span(panel);
    let (y_lo, y_top) = y_span(panel);
    let x = |v: f64| left + (v - x_lo) / (x_hi - x_lo) * (right - left);
    let y = |v: f64| base - (v.clamp(y_lo, y_top) - y_lo) / (y_top - y_lo) * (base - TOP);
    svg.text(
        WIDTH / 2.0 - RIGHT / 2.0,
        TOP - 24.0,
        16.0,
        Anchor::Middle,
        "",
        &panel.caption,
    );
    axes(
        &mut svg,
        (left, right, base),
        (x_lo, x_hi),
        (y_lo, y_top),
        &x,
        &y,
    );
    svg.text(
        left - 56.0,
        TOP - 8.0,
        11.0,
        Anchor::Start,
        "fill=\"#444\"",
        &panel.y_unit,
    );
    svg.text(
        (left + right) / 2.0,
        HEIGHT - 12.0,
        12.0,
        Anchor::Middle,
        "fill=\"#444\"",
        &panel.x_unit,
    );
    if let Some((value, label)) = &panel.target {
        target(&mut svg, (*value, label), (left, right), &y);
    }
    for line in &panel.lines {
        series(&mut svg, line, &x, &y);
    }
    legend(&mut svg, &panel.lines, right + 16.0);
    svg.finish()
}

/// The drawable points of all the panel's lines.
fn points(panel: &LinePanel) -> impl Iterator<Item = &(f64, f64)> {
    panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter().filter(|p| drawable(p)))
}

/// The x axis's span: the points', widened by 5 % each side (a single x gets ±1).
fn x_span(panel: &LinePanel) -> (f64, f64) {
    let (lo, hi) = points(panel).fold((f64::INFINITY, 0.0_f64), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    let lo = if lo.is_finite() { lo } else { 0.0 };
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 1.0 };
    ((lo - pad).max(0.0), hi + pad)
}

/// The y axis's bottom and top, as the panel sets them or from its points and target.
fn y_span(panel: &LinePanel) -> (f64, f64) {
    let y_lo = panel.y_min.unwrap_or(0.0);
    let y_top = panel.y_max.unwrap_or_else(|| {
        let target = panel.target.as_ref().map_or(0.0, |t| t.0);
        points(panel).map(|p| p.1).fold(target, f64::max).max(1e-3) * 1.1
    });
    (y_lo, y_top.max(y_lo + 1e-3))
}

/// The dashed target line across the plot, with its label.
fn target(
    svg: &mut Svg,
    (value, label): (f64, &str),
    (left, right): (f64, f64),
    y: &dyn Fn(f64) -> f64,
) {
    svg.group("target", &[("value", &value.to_string())]);
    svg.line(
        left,
        y(value),
        right,
        y(value),
        "stroke=\"#c00\" stroke-dasharray=\"6 4\"",
    );
    svg.text(
        right - 4.0,
        y(value) - 6.0,
        11.0,
        Anchor::End,
        "fill=\"#c00\"",
        label,
    );
    svg.end();
}

/// One line through its drawable points, each point marked and titled with its values.
fn series(svg: &mut Svg, line: &Line, x: &dyn Fn(f64) -> f64, y: &dyn Fn(f64) -> f64) {
    let pts: Vec<(f64, f64)> = line
        .points
        .iter()
        .filter(|p| drawable(p))
        .map(|&(px, py)| (x(px), y(py)))
        .collect();
    svg.group("line", &[("series", &line.name)]);
    let stroke = format!("stroke=\"{}\" stroke-width=\"2\"", line.color);
    svg.polyline(&pts, &stroke);
    for (&(px, py), &(vx, vy)) in pts.iter().zip(line.points.iter().filter(|p| drawable(p))) {
        svg.circle(px, py, 3.5, &format!("fill=\"{}\"", line.color));
        svg.title(&format!("{}: {vx} → {vy:.3}", line.name));
    }
    svg.end();
}

/// Gridlines and tick values on both axes, from 0.
fn axes(
    svg: &mut Svg,
    (left, right, base): (f64, f64, f64),
    (x_lo, x_hi): (f64, f64),
    (y_lo, y_top): (f64, f64),
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) {
    let step = nice_step((y_top - y_lo) / 6.0);
    for v in ticks(y_lo, y_top, step) {
        svg.line(left, y(v), right, y(v), "stroke=\"#e4e4e4\"");
        svg.text(
            left - 6.0,
            y(v) + 4.0,
            10.0,
            Anchor::End,
            "fill=\"#555\"",
            &tick_label(v, step),
        );
    }
    let step = nice_step((x_hi - x_lo) / 8.0);
    for v in ticks(x_lo, x_hi, step) {
        svg.line(x(v), base, x(v), base + 4.0, "stroke=\"#333\"");
        svg.text(
            x(v),
            base + 18.0,
            10.0,
            Anchor::Middle,
            "fill=\"#555\"",
            &tick_label(v, step),
        );
    }
    svg.line(left, TOP, left, base, "stroke=\"#333\"");
    svg.line(left, base, right, base, "stroke=\"#333\"");
}

/// The multiples of `step` from `lo` (rounded up to one) to `hi`.
fn ticks(lo: f64, hi: f64, step: f64) -> impl Iterator<Item = f64> {
    let first = (lo / step - 1e-9).ceil();
    (0..)
        .map(move |i| (first + i as f64) * step)
        .take_while(move |v| *v <= hi + 1e-9)
}

/// Each line's colour and name, beside the plot.
fn legend(svg: &mut Svg, lines: &[Line], x: f64) {
    for (i, l) in lines.iter().enumerate() {
        let ly = TOP + 12.0 + 18.0 * i as f64;
        svg.line(
            x,
            ly - 4.0,
            x + 18.0,
            ly - 4.0,
            &format!("stroke=\"{}\" stroke-width=\"2\"", l.color),
        );
        svg.text(x + 24.0, ly, 11.0, Anchor::Start, "", &l.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::svg::PALETTE;

    fn panel() -> LinePanel {
        LinePanel {
            caption: "SLO attainment <higher is better>".into(),
            x_unit: "offered rate (req/s)".into(),
            y_unit: "share".into(),
            y_max: Some(1.0),
            y_min: Some(0.4),
            target: Some((0.9, "90 % target".into())),
            lines: vec![
                Line {
                    name: "a".into(),
                    color: PALETTE[0].into(),
                    points: vec![(1.0, 0.99), (2.0, 0.95), (3.0, 0.7)],
                },
                Line {
                    name: "b".into(),
                    color: PALETTE[1].into(),
                    points: vec![(1.0, 0.97), (2.0, f64::NAN), (3.0, 0.5)],
                },
            ],
        }
    }

    #[test]
    fn every_line_has_a_mark_per_drawable_point_and_higher_values_draw_higher() {
        let doc = lines_svg("sweep", &panel());
        assert!(doc.starts_with("<svg"));
        assert!(doc.contains("SLO attainment &lt;higher is better&gt;"));
        assert!(doc.contains("class=\"target\" data-value=\"0.9\""));
        let series = |name: &str| {
            let start = doc.find(&format!("data-series=\"{name}\"")).unwrap();
            let end = start + doc[start..].find("</g>").unwrap();
            doc[start..end].to_string()
        };
        let (a, b) = (series("a"), series("b"));
        assert_eq!(a.matches("<circle").count(), 3);
        assert_eq!(b.matches("<circle").count(), 2, "the NaN point is left out");
        // The y of a's points: SVG's y grows downwards, so 0.99 is above 0.7.
        let ys: Vec<f64> = a
            .match_indices("cy=\"")
            .map(|(i, _)| {
                let v = &a[i + 4..];
                v[..v.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert!(ys[0] < ys[1] && ys[1] < ys[2], "{ys:?}");
        // The axes span the data: the first x (1.0) sits near the left edge, not a third of
        // the way in as on an axis from 0; the y ticks start at the floor.
        let cx: f64 = {
            let i = a.find("cx=\"").unwrap() + 4;
            a[i..i + a[i..].find('"').unwrap()].parse().unwrap()
        };
        assert!(cx < LEFT + 0.1 * (WIDTH - RIGHT - LEFT), "{cx}");
        assert!(
            doc.contains(">0.4<") && !doc.contains(">0.2<"),
            "y ticks from 0.4"
        );
    }
}
