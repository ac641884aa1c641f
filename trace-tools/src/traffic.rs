//! `dpserve trace FILE --svg OUT.svg`: routing over a whole run. Decisions are counted in time
//! bins, per rank (stacked areas: where the traffic went) and per branch (affinity, spill,
//! fallback, explicit, ...: why), and the moments a rank joined or left the live set are marked,
//! so a spill storm or a key move shows at a glance.
//!
//! The input is the routing trace (`--trace-file`), or, in a trace directory without one, the
//! controller's `routed` milestones, which carry the same decision and loads. A rank's joining
//! and leaving is read off the live set each decision saw (its `loads`), so it is as precise as
//! the traffic: a rank that leaves while no request arrives is marked at the next decision.

use std::collections::{BTreeMap, BTreeSet};

use protocol::msg_trace::Milestone;
use protocol::route_record::RouteRecord;
use protocol::trace_event::Branch;

use crate::svg::{nice_step, Anchor, Svg, PALETTE};
use crate::timeline::TraceSet;

/// One routing decision, from either source.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePoint {
    /// Unix seconds.
    pub t: f64,
    /// `None` for a refused request.
    pub rank: Option<u32>,
    pub branch: Option<Branch>,
    /// The live ranks the decision saw (empty when not recorded).
    pub live: Vec<u32>,
    pub method: String,
}

impl RoutePoint {
    pub fn of_record(r: &RouteRecord) -> RoutePoint {
        RoutePoint {
            t: r.time,
            rank: r.rank,
            branch: r.branch,
            live: r.loads.iter().map(|l| l.rank).collect(),
            method: r.method.clone(),
        }
    }
}

/// The decisions in a trace directory: its routing records, else the controller's milestones.
pub fn points_of_set(set: &TraceSet) -> Vec<RoutePoint> {
    if !set.routes.is_empty() {
        return set.routes.iter().map(RoutePoint::of_record).collect();
    }
    set.lines
        .iter()
        .filter(|l| l.actor == "controller")
        .filter_map(|l| match l.milestone()? {
            Milestone::Routed {
                method,
                chosen_rank,
                branch,
                loads,
                ..
            } => Some(RoutePoint {
                t: l.t,
                rank: Some(*chosen_rank),
                branch: Some(*branch),
                live: loads.iter().map(|l| l.rank).collect(),
                method: method.clone(),
            }),
            Milestone::Refused { .. } => Some(RoutePoint {
                t: l.t,
                rank: None,
                branch: None,
                live: Vec::new(),
                method: String::new(),
            }),
            _ => None,
        })
        .collect()
}

/// A rank entering or leaving the live set.
#[derive(Debug, Clone, PartialEq)]
pub struct RankChange {
    pub t: f64,
    pub rank: u32,
    pub joined: bool,
}

/// Decisions counted in equal time bins.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub t0: f64,
    pub bin_s: f64,
    /// rank → decisions per bin.
    pub per_rank: BTreeMap<u32, Vec<u64>>,
    /// branch (`refused` for refused requests) → decisions per bin.
    pub per_branch: BTreeMap<String, Vec<u64>>,
    pub changes: Vec<RankChange>,
    pub decisions: usize,
    pub methods: Vec<String>,
}

impl Traffic {
    pub fn bins(&self) -> usize {
        self.per_rank
            .values()
            .chain(self.per_branch.values())
            .map(Vec::len)
            .max()
            .unwrap_or(0)
    }

    pub fn of(points: &[RoutePoint]) -> Traffic {
        let mut points: Vec<&RoutePoint> = points.iter().collect();
        points.sort_by(|a, b| a.t.total_cmp(&b.t));
        let t0 = points.first().map_or(0.0, |p| p.t);
        let span = points.last().map_or(0.0, |p| p.t) - t0;
        // About two decisions per bin on average, between 1 and 60 bins.
        let bins = (points.len() / 2).clamp(1, 60);
        let bin_s = if span > 0.0 { span / bins as f64 } else { 1.0 };
        let bin = |t: f64| (((t - t0) / bin_s) as usize).min(bins - 1);
        let mut per_rank: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let mut per_branch: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut changes = Vec::new();
        let mut live: Option<BTreeSet<u32>> = None;
        let mut methods = BTreeSet::new();
        for p in &points {
            let b = bin(p.t);
            if let Some(r) = p.rank {
                per_rank.entry(r).or_insert_with(|| vec![0; bins])[b] += 1;
            }
            let branch = p.branch.map_or("refused", Branch::as_str).to_string();
            per_branch.entry(branch).or_insert_with(|| vec![0; bins])[b] += 1;
            if !p.method.is_empty() {
                methods.insert(p.method.clone());
            }
            if p.live.is_empty() {
                continue;
            }
            let now: BTreeSet<u32> = p.live.iter().copied().collect();
            if let Some(before) = &live {
                for &rank in now.difference(before) {
                    changes.push(RankChange {
                        t: p.t,
                        rank,
                        joined: true,
                    });
                }
                for &rank in before.difference(&now) {
                    changes.push(RankChange {
                        t: p.t,
                        rank,
                        joined: false,
                    });
                }
            }
            live = Some(now);
        }
        // Ranks that were live but never chosen still get a (flat) band and a colour.
        for p in &points {
            for &r in &p.live {
                per_rank.entry(r).or_insert_with(|| vec![0; bins]);
            }
        }
        Traffic {
            t0,
            bin_s,
            per_rank,
            per_branch,
            changes,
            decisions: points.len(),
            methods: methods.into_iter().collect(),
        }
    }
}

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const PANEL: f64 = 200.0;
const TOP: f64 = 84.0;
const GAP: f64 = 60.0;

/// Branch colours fixed by name, so pictures of different runs compare.
fn branch_color(b: &str) -> &'static str {
    match b {
        "affinity" => PALETTE[0],
        "spill" => PALETTE[1],
        "fallback" => PALETTE[6],
        "explicit" => PALETTE[2],
        "rotate" => PALETTE[4],
        "least_loaded" => PALETTE[5],
        "room" => PALETTE[8],
        _ => PALETTE[3],
    }
}

fn rank_color(rank: u32) -> &'static str {
    PALETTE[rank as usize % PALETTE.len()]
}

/// One stacked band: its name, colour and decisions per bin.
struct Band<'a> {
    name: String,
    color: &'static str,
    counts: &'a [u64],
}

/// The plot's scale, shared by both panels.
struct Frame {
    bins: usize,
    bin_s: f64,
    span: f64,
    /// Decisions per second at the top of a panel.
    y_max: f64,
}

impl Frame {
    fn of(tr: &Traffic) -> Frame {
        let bins = tr.bins().max(1);
        fn most<K>(series: &BTreeMap<K, Vec<u64>>, bins: usize) -> u64 {
            (0..bins)
                .map(|b| series.values().map(|v| v[b]).sum::<u64>())
                .max()
                .unwrap_or(0)
        }
        let top = most(&tr.per_rank, bins)
            .max(most(&tr.per_branch, bins))
            .max(1);
        Frame {
            bins,
            bin_s: tr.bin_s,
            span: tr.bin_s * bins as f64,
            y_max: top as f64 / tr.bin_s,
        }
    }

    fn x(&self, t_rel: f64) -> f64 {
        LEFT + t_rel / self.span * (WIDTH - LEFT - RIGHT)
    }
}

/// The routing picture: two stacked-area panels sharing a time axis.
pub fn traffic_svg(tr: &Traffic, title: &str) -> String {
    let mut svg = Svg::new(WIDTH, TOP + 2.0 * PANEL + GAP + 36.0);
    let f = Frame::of(tr);
    svg.text(
        16.0,
        26.0,
        17.0,
        Anchor::Start,
        "font-weight=\"bold\"",
        title,
    );
    let methods = if tr.methods.is_empty() {
        String::new()
    } else {
        format!(" ({})", tr.methods.join(", "))
    };
    let subtitle = format!(
        "{} routing decisions over {:.2} s{methods}, in bins of {:.3} s",
        tr.decisions, f.span, tr.bin_s
    );
    svg.text(16.0, 46.0, 12.0, Anchor::Start, "fill=\"#333\"", &subtitle);
    let by_rank: Vec<Band<'_>> = tr
        .per_rank
        .iter()
        .map(|(r, v)| Band {
            name: r.to_string(),
            color: rank_color(*r),
            counts: v,
        })
        .collect();
    let by_branch: Vec<Band<'_>> = tr
        .per_branch
        .iter()
        .map(|(b, v)| Band {
            name: b.clone(),
            color: branch_color(b),
            counts: v,
        })
        .collect();
    draw_panel(
        &mut svg,
        &f,
        TOP,
        "rank",
        "requests per second, by rank",
        &by_rank,
    );
    let second = TOP + PANEL + GAP;
    draw_panel(
        &mut svg,
        &f,
        second,
        "branch",
        "requests per second, by branch",
        &by_branch,
    );
    draw_axis(&mut svg, &f, second + PANEL);
    for c in &tr.changes {
        let cx = f.x(c.t - tr.t0);
        let what = if c.joined { "joined" } else { "left" };
        svg.group(
            "rank-event",
            &[("what", what), ("rank", &c.rank.to_string())],
        );
        svg.title(&format!("rank {} {what} at {:.3} s", c.rank, c.t - tr.t0));
        let style = "stroke=\"#d62728\" stroke-dasharray=\"5 3\" stroke-width=\"1.5\"";
        svg.line(cx, TOP, cx, second + PANEL, style);
        let label = format!("rank {} {what}", c.rank);
        svg.text(
            cx + 3.0,
            TOP + 12.0,
            11.0,
            Anchor::Start,
            "fill=\"#d62728\"",
            &label,
        );
        svg.end();
    }
    svg.finish()
}

/// One panel: step-shaped bands (flat over each bin) stacked in order, and their legend.
fn draw_panel(svg: &mut Svg, f: &Frame, top: f64, kind: &str, label: &str, bands: &[Band<'_>]) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let base = top + PANEL;
    let y = |rate: f64| base - rate / f.y_max * (PANEL - 10.0);
    svg.group("panel", &[("by", kind)]);
    svg.rect(LEFT, top, plot_w, PANEL, "fill=\"#fafafa\" stroke=\"#ccc\"");
    svg.text(
        LEFT,
        top - 6.0,
        12.0,
        Anchor::Start,
        "font-weight=\"bold\"",
        label,
    );
    for frac in [0.5, 1.0] {
        let yy = y(f.y_max * frac);
        svg.line(LEFT, yy, LEFT + plot_w, yy, "stroke=\"#e4e4e4\"");
        let tick = format!("{:.1}", f.y_max * frac);
        svg.text(
            LEFT - 6.0,
            yy + 4.0,
            10.0,
            Anchor::End,
            "fill=\"#555\"",
            &tick,
        );
    }
    let mut below = vec![0u64; f.bins];
    let all: u64 = bands.iter().map(|b| b.counts.iter().sum::<u64>()).sum();
    for (i, band) in bands.iter().enumerate() {
        let mut upper = Vec::with_capacity(f.bins * 2);
        let mut lower = Vec::with_capacity(f.bins * 2);
        for (b, under) in below.iter_mut().enumerate() {
            let (x0, x1) = (f.x(b as f64 * f.bin_s), f.x((b + 1) as f64 * f.bin_s));
            let n = band.counts.get(b).copied().unwrap_or(0);
            let (lo, hi) = (*under as f64 / f.bin_s, (*under + n) as f64 / f.bin_s);
            upper.extend([(x0, y(hi)), (x1, y(hi))]);
            lower.extend([(x0, y(lo)), (x1, y(lo))]);
            *under += n;
        }
        lower.reverse();
        upper.extend(lower);
        let total: u64 = band.counts.iter().sum();
        svg.group("area", &[(kind, &band.name)]);
        svg.title(&format!("{kind} {}: {total} decisions", band.name));
        let c = band.color;
        svg.polygon(
            &upper,
            &format!("fill=\"{c}\" fill-opacity=\"0.85\" stroke=\"{c}\""),
        );
        let ly = top + 14.0 + i as f64 * 16.0;
        svg.rect(
            LEFT + plot_w + 14.0,
            ly - 9.0,
            10.0,
            10.0,
            &format!("fill=\"{c}\""),
        );
        let share = if all > 0 {
            100.0 * total as f64 / all as f64
        } else {
            0.0
        };
        let who = if kind == "rank" {
            format!("rank {}", band.name)
        } else {
            band.name.clone()
        };
        let legend = format!("{who}: {total} ({share:.0}%)");
        svg.text(LEFT + plot_w + 30.0, ly, 11.0, Anchor::Start, "", &legend);
        svg.end();
    }
    svg.end();
}

/// Seconds since the first decision, under the lower panel.
fn draw_axis(svg: &mut Svg, f: &Frame, y: f64) {
    let step = nice_step(f.span / 8.0);
    let mut t = 0.0;
    while t <= f.span + 1e-9 {
        svg.line(f.x(t), y, f.x(t), y + 5.0, "stroke=\"#666\"");
        let label = format!("{t:.2} s");
        svg.text(
            f.x(t),
            y + 17.0,
            10.0,
            Anchor::Middle,
            "fill=\"#444\"",
            &label,
        );
        t += step;
    }
}

#[cfg(test)]
mod tests {
    use controller::policy::{KeySource, Method, RankLoad, RankSet, RouteDecision};
    use controller::trace::route_record;

    use super::*;

    fn record(t: f64, rank: u32, branch: Branch, live: &[u32]) -> RouteRecord {
        let ranks = RankSet::new(
            live.iter()
                .map(|&rank| RankLoad {
                    rank,
                    active_requests: 0,
                    active_tokens: 0,
                })
                .collect(),
        );
        let mut d = RouteDecision::plain(rank, branch);
        d.key_source = KeySource::RoutingKey;
        route_record("r", t, Method::PrefixAffinity, &ranks, &Ok(d))
    }

    /// Rank 2 leaves at t=5 and comes back at t=8; spills in the middle.
    fn run() -> Vec<RoutePoint> {
        let mut v = Vec::new();
        for i in 0..100 {
            let t = 100.0 + i as f64 * 0.1;
            let live: &[u32] = if (5.0..8.0).contains(&(t - 100.0)) {
                &[0, 1]
            } else {
                &[0, 1, 2]
            };
            let rank = live[i % live.len()];
            let branch = if i % 7 == 0 {
                Branch::Spill
            } else {
                Branch::Affinity
            };
            v.push(RoutePoint::of_record(&record(t, rank, branch, live)));
        }
        v
    }

    #[test]
    fn decisions_are_counted_per_rank_and_branch_and_rank_moves_found() {
        let tr = Traffic::of(&run());
        assert_eq!(tr.decisions, 100);
        assert_eq!(tr.bins(), 50);
        let total: u64 = tr.per_rank.values().flatten().sum();
        assert_eq!(total, 100);
        assert_eq!(
            tr.per_branch.keys().collect::<Vec<_>>(),
            ["affinity", "spill"]
        );
        let moves: Vec<(u32, bool)> = tr.changes.iter().map(|c| (c.rank, c.joined)).collect();
        assert_eq!(moves, [(2, false), (2, true)]);
        assert!((tr.changes[0].t - 105.0).abs() < 0.11, "{:?}", tr.changes);
    }

    #[test]
    fn the_picture_has_a_band_per_rank_and_branch_and_the_rank_moves() {
        let svg = traffic_svg(&Traffic::of(&run()), "routing <test>");
        for r in 0..3 {
            assert!(
                svg.contains(&format!("class=\"area\" data-rank=\"{r}\"")),
                "{r}"
            );
        }
        for b in ["affinity", "spill"] {
            assert!(
                svg.contains(&format!("class=\"area\" data-branch=\"{b}\"")),
                "{b}"
            );
        }
        assert!(svg.contains("class=\"rank-event\" data-what=\"left\" data-rank=\"2\""));
        assert!(svg.contains("class=\"rank-event\" data-what=\"joined\" data-rank=\"2\""));
        assert!(svg.contains("routing &lt;test&gt;"));
        assert!(svg.contains("100 routing decisions"));
    }

    #[test]
    fn one_decision_is_one_bin() {
        let tr = Traffic::of(&run()[..1]);
        assert_eq!((tr.bins(), tr.decisions), (1, 1));
        assert!(traffic_svg(&tr, "x").contains("class=\"area\""));
    }
}
