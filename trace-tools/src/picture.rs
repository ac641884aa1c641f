//! `dpserve trace DIR --rid R --svg OUT.svg`: one request as a swimlane picture. A lane per
//! actor, each message an arrow from sender to receiver labelled with its type and size, each
//! milestone a dot, the phases between them (queued, prefill, decode, ...) as bars with their
//! durations, and the routing decision written on the controller lane.
//!
//! Time runs left to right, but not at one scale: a request's routing takes microseconds and its
//! decode milliseconds, so on a linear axis the first half-dozen arrows would fall on one pixel.
//! Gaps between consecutive traced moments are drawn in proportion, except that none is drawn
//! narrower than [`MIN_GAP`]; the phase bars and the axis ticks carry the real durations.

use crate::journey::{ms_text, Arrow, Journey, Mark};
use crate::svg::{nice_step, Anchor, Svg};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 120.0;
const RIGHT: f64 = 60.0;
const HEADER: f64 = 70.0;
const LANE: f64 = 120.0;
/// Where a lane's track runs, from the lane's top.
const TRACK: f64 = 58.0;
const ROUTE_LINE: f64 = 15.0;
/// The narrowest gap between two traced moments, in pixels.
pub const MIN_GAP: f64 = 14.0;

/// Unix time → x, piecewise linear through every traced moment.
struct TimeAxis {
    ts: Vec<f64>,
    xs: Vec<f64>,
}

impl TimeAxis {
    fn new(mut ts: Vec<f64>, x0: f64, width: f64) -> TimeAxis {
        ts.sort_by(f64::total_cmp);
        ts.dedup_by(|a, b| (*a - *b).abs() < 1e-7);
        if ts.len() < 2 {
            let xs = vec![x0; ts.len()];
            return TimeAxis { ts, xs };
        }
        let gaps: Vec<f64> = ts.windows(2).map(|w| w[1] - w[0]).collect();
        let min_gap = MIN_GAP.min(width / gaps.len() as f64);
        // The scale at which proportional gaps, none under min_gap, fill the width.
        let fill = |s: f64| gaps.iter().map(|g| (g * s).max(min_gap)).sum::<f64>();
        let (mut lo, mut hi) = (0.0, width / gaps.iter().sum::<f64>().max(1e-12));
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if fill(mid) > width {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let mut xs = vec![x0];
        for g in &gaps {
            let last = *xs.last().unwrap_or(&x0);
            xs.push(last + (g * lo).max(min_gap));
        }
        TimeAxis { ts, xs }
    }

    fn x(&self, t: f64) -> f64 {
        let Some(&first) = self.xs.first() else {
            return LEFT;
        };
        match self.ts.binary_search_by(|p| p.total_cmp(&t)) {
            Ok(i) => self.xs[i],
            Err(0) => first,
            Err(i) if i >= self.ts.len() => self.xs[self.ts.len() - 1],
            Err(i) => {
                let (t0, t1) = (self.ts[i - 1], self.ts[i]);
                let f = (t - t0) / (t1 - t0);
                self.xs[i - 1] + f * (self.xs[i] - self.xs[i - 1])
            }
        }
    }
}

fn msg_color(ty: &str) -> &'static str {
    match ty {
        "GenerateReq" | "EmbedReq" => "#4e79a7",
        "TokenOut" => "#59a14f",
        "Abort" => "#e15759",
        _ => "#7f7f7f",
    }
}

fn mark_color(name: &str) -> &'static str {
    match name {
        "routed" => "#b07aa1",
        "admitted" => "#f28e2b",
        "first_token" => "#59a14f",
        "finished" => "#333333",
        _ => "#e15759",
    }
}

fn phase_color(name: &str) -> &'static str {
    match name {
        "queued" | "waiting for first token" | "waiting" => "#fbe3c5",
        "prefill" => "#f9c78f",
        "decode" | "streaming" => "#cfe8c9",
        _ => "#e3d4e8",
    }
}

/// Lane tops and heights: the controller lane is taller by the routing decision's lines.
fn lane_geometry(j: &Journey) -> Vec<(f64, f64)> {
    let mut y = HEADER;
    j.lanes
        .iter()
        .map(|l| {
            let extra = if l == "controller" && !j.route.is_empty() {
                j.route.len() as f64 * ROUTE_LINE + 6.0
            } else {
                0.0
            };
            let g = (y, LANE + extra);
            y += LANE + extra;
            g
        })
        .collect()
}

/// The swimlane picture of one request.
pub fn request_svg(j: &Journey) -> String {
    let lanes = lane_geometry(j);
    let bottom = lanes.last().map_or(HEADER, |(y, h)| y + h);
    let height = bottom + 64.0;
    let mut svg = Svg::new(WIDTH, height);
    let track = |lane: usize| {
        let (y, h) = lanes[lane];
        y + h - LANE + TRACK
    };
    let axis = time_axis(j);

    svg.text(
        16.0,
        26.0,
        17.0,
        Anchor::Start,
        "font-weight=\"bold\"",
        &format!("request {}", j.rid),
    );
    svg.text(16.0, 48.0, 12.0, Anchor::Start, "fill=\"#333\"", &j.summary);
    draw_lanes(&mut svg, j, &lanes, &track);
    draw_phases(&mut svg, j, &axis, &track);
    draw_route(&mut svg, j, &axis, &lanes);
    draw_messages(&mut svg, j, &axis, &track);
    draw_marks(&mut svg, j, &axis, &track);
    draw_ticks(&mut svg, j, &axis, bottom);
    svg.finish()
}

/// The axis through every moment the picture shows: start and end, each send and receipt,
/// each milestone and each phase's ends.
fn time_axis(j: &Journey) -> TimeAxis {
    let mut times: Vec<f64> = vec![j.t0, j.t_end];
    times.extend(
        j.messages
            .iter()
            .flat_map(|a| a.sent.into_iter().chain(a.received)),
    );
    times.extend(j.marks.iter().map(|m| m.t));
    times.extend(j.phases.iter().flat_map(|p| [p.start, p.end]));
    TimeAxis::new(times, LEFT + 10.0, WIDTH - LEFT - RIGHT - 10.0)
}

/// Each lane's band (shaded every other one), its name and its track line.
fn draw_lanes(svg: &mut Svg, j: &Journey, lanes: &[(f64, f64)], track: &dyn Fn(usize) -> f64) {
    for (i, label) in j.lanes.iter().enumerate() {
        let (y, h) = lanes[i];
        svg.group("lane", &[("lane", label)]);
        let fill = if i % 2 == 0 { "#f6f6f6" } else { "#ffffff" };
        svg.rect(0.0, y, WIDTH, h, &format!("fill=\"{fill}\""));
        svg.text(
            16.0,
            track(i) + 4.0,
            13.0,
            Anchor::Start,
            "font-weight=\"bold\"",
            label,
        );
        svg.line(
            LEFT,
            track(i),
            WIDTH - RIGHT + 20.0,
            track(i),
            "stroke=\"#999\"",
        );
        svg.end();
    }
}

/// The routing decision's lines, at the top of the controller lane (when there is one).
fn draw_route(svg: &mut Svg, j: &Journey, axis: &TimeAxis, lanes: &[(f64, f64)]) {
    let Some(ctl) = j.lanes.iter().position(|l| l == "controller") else {
        return;
    };
    if j.route.is_empty() {
        return;
    }
    svg.group("route", &[]);
    svg.title("the routing decision");
    let top = lanes[ctl].0 + 16.0;
    let x = route_text_x(j, axis, ctl);
    for (n, line) in j.route.iter().enumerate() {
        let style = if n == 0 {
            "font-weight=\"bold\" fill=\"#6b3d7a\""
        } else {
            "fill=\"#6b3d7a\""
        };
        svg.text(
            x,
            top + n as f64 * ROUTE_LINE,
            12.0,
            Anchor::Start,
            style,
            line,
        );
    }
    svg.end();
}

/// Where the routing decision's text starts: right of the arrows that bring the request to the
/// controller and take it on (their labels sit at the height of the text), and never so far
/// right that the text runs off the picture.
fn route_text_x(j: &Journey, axis: &TimeAxis, ctl: usize) -> f64 {
    let last_hop = j
        .messages
        .iter()
        .filter(|a| a.from == ctl || a.to == ctl)
        .filter(|a| matches!(a.msg_type.as_str(), "GenerateReq" | "EmbedReq"))
        .filter_map(|a| a.sent.or(a.received))
        .map(|t| axis.x(t))
        .next_back()
        .unwrap_or(LEFT);
    let widest = j.route.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64 * 6.8;
    (last_hop + 130.0)
        .min(WIDTH - 12.0 - widest)
        .max(LEFT + 8.0)
}

fn draw_phases(svg: &mut Svg, j: &Journey, axis: &TimeAxis, track: &dyn Fn(usize) -> f64) {
    let mut last_label_end: Vec<(f64, u32)> = vec![(f64::NEG_INFINITY, 0); j.lanes.len()];
    for p in &j.phases {
        let (x0, x1) = (axis.x(p.start), axis.x(p.end));
        let y = track(p.lane) + 8.0;
        svg.group("phase", &[("phase", p.name)]);
        svg.title(&p.label());
        svg.rect(
            x0,
            y,
            (x1 - x0).max(2.0),
            12.0,
            &format!("fill=\"{}\" stroke=\"#bbb\"", phase_color(p.name)),
        );
        let label = p.label();
        let approx_w = label.len() as f64 * 6.0;
        let (last_end, level) = last_label_end[p.lane];
        let level = if x0 < last_end + 6.0 {
            (level + 1) % 3
        } else {
            0
        };
        svg.text(
            x0 + 2.0,
            y + 24.0 + level as f64 * 12.0,
            10.5,
            Anchor::Start,
            "fill=\"#555\"",
            &label,
        );
        last_label_end[p.lane] = (x0 + approx_w, level);
        svg.end();
    }
}

fn draw_messages(svg: &mut Svg, j: &Journey, axis: &TimeAxis, track: &dyn Fn(usize) -> f64) {
    // Label an arrow only where there is room; every arrow has its label as a tooltip.
    let mut last_label: std::collections::BTreeMap<(usize, usize), f64> = Default::default();
    for a in &j.messages {
        let (y0, y1) = (track(a.from), track(a.to));
        let (x0, x1, open) = match (a.sent, a.received) {
            (Some(s), Some(r)) => (axis.x(s), axis.x(r), false),
            (Some(s), None) => (axis.x(s), axis.x(s) + MIN_GAP, true),
            (None, Some(r)) => (axis.x(r) - MIN_GAP, axis.x(r), true),
            (None, None) => continue,
        };
        let color = msg_color(&a.msg_type);
        svg.group(
            "msg",
            &[
                ("type", &a.msg_type),
                ("from", &j.lanes[a.from]),
                ("to", &j.lanes[a.to]),
            ],
        );
        svg.title(&arrow_title(j, a));
        let dash = if open {
            " stroke-dasharray=\"4 3\""
        } else {
            ""
        };
        // Stop short of the track so the head is not hidden by a mark.
        let dir = if y1 > y0 { 1.0 } else { -1.0 };
        svg.line(
            x0,
            y0 + dir * 3.0,
            x1,
            y1 - dir * 6.0,
            &format!("stroke=\"{color}\" stroke-width=\"1.4\" marker-end=\"url(#arrow)\"{dash}"),
        );
        let key = (a.from.min(a.to), a.from.max(a.to));
        let mid_x = (x0 + x1) / 2.0;
        if mid_x - last_label.get(&key).copied().unwrap_or(f64::NEG_INFINITY) >= 120.0 {
            let mid_y = (y0 + y1) / 2.0;
            svg.text(
                mid_x + 5.0,
                mid_y + 4.0,
                10.5,
                Anchor::Start,
                &format!("fill=\"{color}\""),
                &a.label(),
            );
            last_label.insert(key, mid_x);
        }
        svg.end();
    }
}

fn arrow_title(j: &Journey, a: &Arrow) -> String {
    let at = |t: Option<f64>| t.map_or("not traced".to_string(), |t| ms_text((t - j.t0) * 1e3));
    format!(
        "{} {} → {}: sent {}, received {}",
        a.label(),
        j.lanes[a.from],
        j.lanes[a.to],
        at(a.sent),
        at(a.received)
    )
}

fn draw_marks(svg: &mut Svg, j: &Journey, axis: &TimeAxis, track: &dyn Fn(usize) -> f64) {
    let mut last: Vec<(f64, u32)> = vec![(f64::NEG_INFINITY, 0); j.lanes.len()];
    for m in &j.marks {
        let x = axis.x(m.t);
        let y = track(m.lane);
        let name = m.milestone.name();
        svg.group("mark", &[("name", name), ("lane", &j.lanes[m.lane])]);
        svg.title(&mark_title(j, m));
        svg.circle(
            x,
            y,
            5.0,
            &format!(
                "fill=\"{}\" stroke=\"#fff\" stroke-width=\"1.5\"",
                mark_color(name)
            ),
        );
        let label = m.label();
        let (last_end, level) = last[m.lane];
        let level = if x < last_end + 8.0 {
            (level + 1) % 3
        } else {
            0
        };
        let ly = y - 10.0 - level as f64 * 13.0;
        let w = label.chars().count() as f64 * 6.2;
        let (anchor, end) = if x + w > WIDTH - 8.0 {
            (Anchor::End, x)
        } else {
            (Anchor::Start, x + w)
        };
        let lx = if matches!(anchor, Anchor::End) {
            x - 4.0
        } else {
            x + 4.0
        };
        svg.text(
            lx,
            ly,
            11.0,
            anchor,
            &format!("fill=\"{}\"", mark_color(name)),
            &label,
        );
        last[m.lane] = (end, level);
        svg.end();
    }
}

fn mark_title(j: &Journey, m: &Mark) -> String {
    format!(
        "{} at {}: {}",
        m.milestone.name(),
        ms_text((m.t - j.t0) * 1e3),
        m.milestone
    )
}

fn draw_ticks(svg: &mut Svg, j: &Journey, axis: &TimeAxis, bottom: f64) {
    let total_ms = (j.t_end - j.t0) * 1e3;
    let y = bottom + 4.0;
    svg.group("axis", &[]);
    svg.line(LEFT, y, WIDTH - RIGHT + 20.0, y, "stroke=\"#666\"");
    // Milliseconds: at least 1 µs.
    let step = nice_step(total_ms / 8.0);
    let mut last_x = f64::NEG_INFINITY;
    let mut t = 0.0;
    while t <= total_ms + 1e-9 {
        let x = axis.x(j.t0 + t / 1e3);
        svg.line(x, y, x, y + 5.0, "stroke=\"#666\"");
        if x - last_x >= 64.0 {
            svg.text(
                x,
                y + 17.0,
                10.5,
                Anchor::Middle,
                "fill=\"#444\"",
                &ms_text(t),
            );
            last_x = x;
        }
        t += step;
    }
    svg.text(
        LEFT,
        y + 40.0,
        11.0,
        Anchor::Start,
        "fill=\"#777\"",
        &format!(
            "time since the request's first trace line; gaps under {MIN_GAP:.0} px are widened so \
             every event shows (read durations from the labels). Hover an arrow or a dot for details."
        ),
    );
    svg.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::traces;
    use crate::timeline::timeline;

    #[test]
    fn the_picture_has_every_lane_arrow_mark_and_the_routing_decision() {
        let j = Journey::of(&timeline(&traces(), "r1").unwrap());
        let svg = request_svg(&j);
        for lane in ["tokenizer", "controller", "worker[1]"] {
            assert!(
                svg.contains(&format!("class=\"lane\" data-lane=\"{lane}\"")),
                "{lane}"
            );
        }
        assert_eq!(svg.matches("class=\"msg\"").count(), 4);
        assert_eq!(
            svg.matches("class=\"msg\" data-type=\"TokenOut\"").count(),
            2
        );
        for name in ["routed", "admitted", "first_token", "finished"] {
            assert!(
                svg.contains(&format!("class=\"mark\" data-name=\"{name}\"")),
                "{name}"
            );
        }
        assert_eq!(svg.matches("class=\"mark\"").count(), j.marks.len());
        assert!(svg.contains("class=\"route\""));
        assert!(svg.contains("prefix_affinity → rank 1, branch affinity"));
        assert!(svg.contains("HRW order 1 &gt; 0"));
        assert!(svg.contains("prefill 15.0 ms"), "{svg}");
        assert!(svg.contains("GenerateReq 100 B"));
    }

    #[test]
    fn the_axis_keeps_order_and_widens_short_gaps() {
        let a = TimeAxis::new(vec![0.0, 0.000_001, 0.000_002, 1.0], 100.0, 1000.0);
        let xs: Vec<f64> = [0.0, 0.000_001, 0.000_002, 1.0]
            .iter()
            .map(|&t| a.x(t))
            .collect();
        assert!(
            xs.windows(2).all(|w| w[1] - w[0] >= MIN_GAP - 1e-6),
            "{xs:?}"
        );
        assert!((xs[3] - 1100.0).abs() < 1.0, "{xs:?}");
        assert!(a.x(0.5) > xs[2] && a.x(0.5) < xs[3]);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(7.0), 10.0);
    }
}
