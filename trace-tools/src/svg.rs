//! A few lines of SVG writing for every picture dpserve draws (the trace pictures and the bench
//! chart): escaped text, shapes, groups. Hand-written on purpose: the pictures are lanes, arrows,
//! areas and bars, which need no chart library, and plain markup keeps them small, diffable and
//! easy to check in tests.

use std::fmt::Write as _;

/// `&`, `<`, `>`, `"` and `'` escaped, control characters dropped: any rid, error message or
/// method name can go in text or an attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// An SVG document being written.
pub struct Svg {
    body: String,
    width: f64,
    height: f64,
}

/// Text anchoring.
#[derive(Clone, Copy)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

impl Svg {
    pub fn new(width: f64, height: f64) -> Svg {
        Svg {
            body: String::new(),
            width,
            height,
        }
    }

    /// Raw markup (already escaped).
    pub fn raw(&mut self, s: &str) {
        self.body.push_str(s);
        self.body.push('\n');
    }

    /// `<g class=… data-…>`; close with [`Svg::end`].
    pub fn group(&mut self, class: &str, data: &[(&str, &str)]) {
        let mut s = format!("<g class=\"{}\"", esc(class));
        for (k, v) in data {
            let _ = write!(s, " data-{k}=\"{}\"", esc(v));
        }
        s.push('>');
        self.raw(&s);
    }

    pub fn end(&mut self) {
        self.raw("</g>");
    }

    /// A tooltip for the enclosing group.
    pub fn title(&mut self, text: &str) {
        self.raw(&format!("<title>{}</title>", esc(text)));
    }

    /// Text with a white halo, so it stays readable over lines it crosses.
    pub fn text(&mut self, x: f64, y: f64, size: f64, anchor: Anchor, style: &str, text: &str) {
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        self.raw(&format!(
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\" \
             class=\"halo\" {style}>{}</text>",
            esc(text)
        ));
    }

    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, style: &str) {
        self.raw(&format!(
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" {style}/>"
        ));
    }

    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, style: &str) {
        self.raw(&format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" {style}/>",
            w.max(0.0),
            h.max(0.0)
        ));
    }

    pub fn circle(&mut self, x: f64, y: f64, r: f64, style: &str) {
        self.raw(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{r}\" {style}/>"
        ));
    }

    pub fn polygon(&mut self, points: &[(f64, f64)], style: &str) {
        self.raw(&format!(
            "<polygon points=\"{}\" {style}/>",
            points_attr(points)
        ));
    }

    /// An open path through `points` (no fill unless `style` gives one).
    pub fn polyline(&mut self, points: &[(f64, f64)], style: &str) {
        self.raw(&format!(
            "<polyline points=\"{}\" fill=\"none\" {style}/>",
            points_attr(points)
        ));
    }

    /// The whole document.
    pub fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" \
             viewBox=\"0 0 {w:.0} {h:.0}\" font-family=\"sans-serif\">\n\
             <style>.halo{{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}}</style>\n\
             <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" \
             markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" \
             fill=\"#444\"/></marker></defs>\n\
             <rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n{}</svg>\n",
            self.body,
            w = self.width,
            h = self.height
        )
    }
}

/// `x,y x,y …` with one decimal.
fn points_attr(points: &[(f64, f64)]) -> String {
    let pts: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    pts.join(" ")
}

/// The round axis step (1, 2 or 5 times a power of ten) at or above `raw`, at least 0.001.
pub fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-3);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// As many decimals as the step needs: `250`, `0.5`, `0.02`.
pub fn tick_label(v: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// A categorical palette (Tableau 10): rank r and branch b keep their colour across pictures.
pub const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("a<b & \"c\"'\u{7}"), "a&lt;b &amp; &quot;c&quot;&#39;");
        let mut s = Svg::new(10.0, 10.0);
        s.text(1.0, 2.0, 10.0, Anchor::Start, "", "</svg><script>");
        let doc = s.finish();
        assert!(doc.contains("&lt;/svg&gt;&lt;script&gt;"));
        assert_eq!(doc.matches("</svg>").count(), 1);
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(31.0), 50.0);
        assert_eq!(nice_step(0.0), 0.001);
    }
}
