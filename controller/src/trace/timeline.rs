//! Reading message traces back (`--trace-dir DIR`): every actor's lines (and the routing trace,
//! when its file is in the same directory) merged into one time-ordered timeline of a request,
//! with a one-sentence summary, or an overview of the whole directory. Pure functions over
//! parsed lines, so `dpserve trace DIR` only does the I/O.
//!
//! Milestones the summary reads, most client-facing first: the tokenizer's `first_token` and
//! `finished` events, then the worker's, then the controller's `routed` / `refused` / `failed`
//! events and the routing record. Times are each actor's wall clock (Unix seconds), so across
//! hosts the order is only as good as their clock sync.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::io::BufRead;

use protocol::msg_trace::TraceLine;

use super::RouteRecord;

/// Everything read from a trace directory.
#[derive(Debug, Default, Clone)]
pub struct TraceSet {
    pub lines: Vec<TraceLine>,
    pub routes: Vec<RouteRecord>,
    /// Lines that are neither (a file cut short by a crash ends in half a line).
    pub malformed: usize,
    pub files: usize,
}

impl TraceSet {
    /// Add one file: message-trace lines and routing records are told apart by their fields.
    pub fn add(&mut self, reader: impl BufRead) -> std::io::Result<()> {
        self.files += 1;
        // By bytes: a line cut mid-character by a crash is malformed, not a reason to stop.
        for line in reader.split(b'\n') {
            let line = String::from_utf8_lossy(&line?).into_owned();
            if line.trim().is_empty() {
                continue;
            }
            if let Ok(l) = serde_json::from_str::<TraceLine>(&line) {
                self.lines.push(l);
            } else if let Ok(r) = serde_json::from_str::<RouteRecord>(&line) {
                self.routes.push(r);
            } else {
                self.malformed += 1;
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.routes.is_empty()
    }

    /// Every rid that appears, sorted.
    pub fn rids(&self) -> Vec<&str> {
        let mut rids: Vec<&str> = self
            .lines
            .iter()
            .filter_map(|l| l.rid.as_deref())
            .chain(self.routes.iter().map(|r| r.rid.as_str()))
            .collect();
        rids.sort_unstable();
        rids.dedup();
        rids
    }
}

/// `worker[1]`, `controller`: an actor and its rank.
pub fn actor_label(line: &TraceLine) -> String {
    match line.rank {
        Some(r) => format!("{}[{r}]", line.actor),
        None => line.actor.clone(),
    }
}

/// One row of a timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Unix seconds.
    pub t: f64,
    pub actor: String,
    /// `send`, `recv`, `event`, or `route` (a routing-trace record).
    pub dir: String,
    pub kind: String,
    pub peer: Option<String>,
    pub bytes: Option<usize>,
    pub detail: Option<String>,
}

/// How one request went, as far as the traces tell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub rank: Option<u32>,
    pub branch: Option<String>,
    /// Why it was not routed, when it was not.
    pub refused: Option<String>,
    /// Milliseconds from the request's first trace line.
    pub first_token_ms: Option<f64>,
    pub finished_ms: Option<f64>,
    /// `stop`, `length`, `abort`, `error`, ...
    pub reason: Option<String>,
    /// The error message of a failed request.
    pub error: Option<String>,
}

/// One request's merged timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub rid: String,
    pub rows: Vec<Row>,
    pub outcome: Outcome,
}

/// The timeline of `rid`, or `None` when no line names it.
pub fn timeline(set: &TraceSet, rid: &str) -> Option<Timeline> {
    let lines: Vec<&TraceLine> = set
        .lines
        .iter()
        .filter(|l| l.rid.as_deref() == Some(rid))
        .collect();
    let routes: Vec<&RouteRecord> = set.routes.iter().filter(|r| r.rid == rid).collect();
    if lines.is_empty() && routes.is_empty() {
        return None;
    }
    let mut rows: Vec<Row> = lines
        .iter()
        .map(|l| Row {
            t: l.t,
            actor: actor_label(l),
            dir: l.dir.clone(),
            kind: l.kind.clone(),
            peer: l.peer.clone(),
            bytes: l.bytes,
            detail: l.detail.clone(),
        })
        .chain(routes.iter().map(|r| route_row(r)))
        .collect();
    // Stable: lines of one actor written in the same microsecond keep their file order.
    rows.sort_by(|a, b| a.t.total_cmp(&b.t));
    let outcome = outcome(&lines, &routes, rows[0].t);
    Some(Timeline {
        rid: rid.to_string(),
        rows,
        outcome,
    })
}

fn route_row(r: &RouteRecord) -> Row {
    let detail = match (r.rank, r.branch, &r.error) {
        (_, _, Some(err)) => format!("refused: {err}"),
        (Some(rank), Some(branch), _) => {
            let mut d = format!("rank={rank} branch={branch} key_source={}", r.key_source);
            if let Some(k) = &r.key_digest {
                let _ = write!(d, " key={k}");
            }
            if !r.hrw_order.is_empty() {
                let _ = write!(d, " hrw={:?}", r.hrw_order);
            }
            if let Some(fb) = &r.fallback {
                let _ = write!(d, " fallback={fb}");
            }
            d
        }
        _ => "incomplete record".to_string(),
    };
    Row {
        t: r.time,
        actor: "controller".into(),
        dir: "route".into(),
        kind: r.method.clone(),
        peer: None,
        bytes: None,
        detail: Some(detail),
    }
}

/// The value of `key=` in an event detail: up to the next space, except `message=`, which is
/// last and runs to the end (error messages have spaces).
fn detail_field<'a>(detail: &'a str, key: &str) -> Option<&'a str> {
    let at = if detail.starts_with(&format!("{key}=")) {
        0
    } else {
        detail.find(&format!(" {key}="))? + 1
    };
    let value = &detail[at + key.len() + 1..];
    if key == "message" {
        Some(value)
    } else {
        Some(value.split(' ').next().unwrap_or(value))
    }
}

fn outcome(lines: &[&TraceLine], routes: &[&RouteRecord], t0: f64) -> Outcome {
    let ms = |t: f64| (t - t0) * 1e3;
    let event = |actor: &str, name: &str| {
        lines
            .iter()
            .find(|l| l.dir == "event" && l.actor == actor && l.kind == name)
            .copied()
    };
    let mut o = Outcome::default();

    // Where it went: the routing record (the last, if a rid was routed twice), else the
    // controller's event, else the worker that received it.
    if let Some(r) = routes.last() {
        o.rank = r.rank;
        o.branch = r.branch.map(|b| b.to_string());
        o.refused = r.error.clone();
    } else if let Some(e) = lines
        .iter()
        .rev()
        .find(|l| l.actor == "controller" && l.dir == "event" && l.kind == "routed")
    {
        let d = e.detail.as_deref().unwrap_or("");
        o.rank = detail_field(d, "rank").and_then(|r| r.parse().ok());
        o.branch = detail_field(d, "branch").map(str::to_string);
    } else if let Some(e) = event("controller", "refused") {
        o.refused = Some(e.detail.clone().unwrap_or_default());
    }
    if o.rank.is_none() && o.refused.is_none() {
        o.rank = lines
            .iter()
            .find(|l| l.actor == "worker" && l.kind == "GenerateReq")
            .and_then(|l| l.rank);
    }

    let first = event("tokenizer", "first_token").or_else(|| event("worker", "first_token"));
    o.first_token_ms = first.map(|l| ms(l.t));

    let finished = event("tokenizer", "finished").or_else(|| event("worker", "finished"));
    if let Some(f) = finished {
        o.finished_ms = Some(ms(f.t));
        let d = f.detail.as_deref().unwrap_or("");
        o.reason = detail_field(d, "reason").map(str::to_string);
        o.error = detail_field(d, "message").map(str::to_string);
    } else if let Some(f) = event("controller", "failed") {
        // The rank died and the tokenizer did not trace: the controller's word is the end.
        o.finished_ms = Some(ms(f.t));
        o.reason = Some("error".into());
        o.error = f.detail.clone();
    }
    if o.error.is_none() && o.reason.as_deref() == Some("error") {
        o.error = event("controller", "failed").and_then(|l| l.detail.clone());
    }
    if o.refused.is_some() && o.reason.is_none() {
        o.reason = Some("error".into());
    }
    o
}

impl Outcome {
    /// One sentence: where the request went, its first token, its end.
    pub fn sentence(&self, rid: &str) -> String {
        let mut s = format!("Request {rid}");
        match (&self.refused, self.rank) {
            (Some(why), _) => {
                let _ = write!(s, " was not routed ({why})");
            }
            (None, Some(rank)) => {
                let _ = write!(s, " was routed to rank {rank}");
                match &self.branch {
                    Some(b) => {
                        let _ = write!(s, " via branch {b}");
                    }
                    None => s.push_str(" (branch not traced)"),
                }
            }
            (None, None) => s.push_str(" has no routing decision in the traces"),
        }
        match self.first_token_ms {
            Some(t) => {
                let _ = write!(s, ", first token after {t:.1} ms");
            }
            None if self.refused.is_none() => s.push_str(", no token traced"),
            None => {}
        }
        match (self.finished_ms, &self.reason) {
            (Some(t), Some(reason)) => {
                let _ = write!(s, ", finished after {t:.1} ms (reason: {reason}");
                if let Some(e) = &self.error {
                    let _ = write!(s, ": {e}");
                }
                s.push(')');
            }
            (Some(t), None) => {
                let _ = write!(s, ", finished after {t:.1} ms");
            }
            (None, _) if self.refused.is_some() => {}
            (None, _) => s.push_str(", and did not finish within the traces"),
        }
        s.push('.');
        s
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t0 = self.rows.first().map_or(0.0, |r| r.t);
        let mut actors: Vec<&str> = self.rows.iter().map(|r| r.actor.as_str()).collect();
        actors.sort_unstable();
        actors.dedup();
        writeln!(
            f,
            "request {}: {} events across {}, from Unix time {t0:.6}",
            self.rid,
            self.rows.len(),
            actors.join(", ")
        )?;
        for r in &self.rows {
            let what = match (r.dir.as_str(), &r.peer) {
                ("send", Some(p)) => format!("→ {p}"),
                ("recv", Some(p)) => format!("← {p}"),
                _ => String::new(),
            };
            let mut line = format!(
                "{:>11.3} ms  {:<12} {:<5} {:<14} {:<13}",
                (r.t - t0) * 1e3,
                r.actor,
                r.dir,
                r.kind,
                what
            );
            if let Some(b) = r.bytes {
                let _ = write!(line, " {b:>7} B");
            }
            if let Some(d) = &r.detail {
                let _ = write!(line, "  {d}");
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        writeln!(f, "{}", self.outcome.sentence(&self.rid))
    }
}

/// What `dpserve trace DIR` prints without `--rid`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overview {
    pub files: usize,
    pub lines: usize,
    pub malformed: usize,
    pub route_records: usize,
    pub first_time: Option<f64>,
    pub last_time: Option<f64>,
    /// actor label → "dir type" → count.
    pub per_actor: BTreeMap<String, BTreeMap<String, u64>>,
    /// Every request seen, with how it went.
    pub requests: Vec<(String, Outcome)>,
}

pub fn overview(set: &TraceSet) -> Overview {
    let mut o = Overview {
        files: set.files,
        lines: set.lines.len(),
        malformed: set.malformed,
        route_records: set.routes.len(),
        ..Overview::default()
    };
    let times = set
        .lines
        .iter()
        .map(|l| l.t)
        .chain(set.routes.iter().map(|r| r.time));
    for t in times {
        o.first_time = Some(o.first_time.map_or(t, |x: f64| x.min(t)));
        o.last_time = Some(o.last_time.map_or(t, |x: f64| x.max(t)));
    }
    let mut by_rid: BTreeMap<&str, (Vec<&TraceLine>, Vec<&RouteRecord>)> = BTreeMap::new();
    for l in &set.lines {
        *o.per_actor
            .entry(actor_label(l))
            .or_default()
            .entry(format!("{} {}", l.dir, l.kind))
            .or_default() += 1;
        if let Some(rid) = &l.rid {
            by_rid.entry(rid).or_default().0.push(l);
        }
    }
    for r in &set.routes {
        by_rid.entry(&r.rid).or_default().1.push(r);
    }
    // Requests in the order they started.
    let mut requests: Vec<(f64, String, Outcome)> = by_rid
        .into_iter()
        .map(|(rid, (lines, routes))| {
            let t0 = lines
                .iter()
                .map(|l| l.t)
                .chain(routes.iter().map(|r| r.time))
                .fold(f64::INFINITY, f64::min);
            (t0, rid.to_string(), outcome(&lines, &routes, t0))
        })
        .collect();
    requests.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    o.requests = requests.into_iter().map(|(_, rid, o)| (rid, o)).collect();
    o
}

/// How many requests the overview lists.
pub const REQUESTS_SHOWN: usize = 20;

impl fmt::Display for Overview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message traces: {} file(s), {} line(s)",
            self.files, self.lines
        )?;
        if self.route_records > 0 {
            write!(f, ", {} routing decision(s)", self.route_records)?;
        }
        if let (Some(a), Some(b)) = (self.first_time, self.last_time) {
            write!(f, " over {:.3} s", b - a)?;
        }
        writeln!(f)?;
        for (actor, counts) in &self.per_actor {
            let total: u64 = counts.values().sum();
            writeln!(f, "{actor} ({total} lines):")?;
            for (kind, n) in counts {
                writeln!(f, "  {kind:<28} {n:>8}")?;
            }
        }
        let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
        for (_, o) in &self.requests {
            let r = match (&o.refused, &o.reason) {
                (Some(_), _) => "refused",
                (None, Some(r)) => r.as_str(),
                (None, None) => "unfinished",
            };
            *reasons.entry(r).or_default() += 1;
        }
        let reasons: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
        writeln!(
            f,
            "requests seen: {} ({})",
            self.requests.len(),
            reasons.join(", ")
        )?;
        for (rid, o) in self.requests.iter().take(REQUESTS_SHOWN) {
            let rank = o.rank.map_or("-".into(), |r| r.to_string());
            let end = match (&o.refused, &o.reason, o.finished_ms) {
                (Some(_), _, _) => "refused".to_string(),
                (None, Some(r), Some(t)) => format!("{r} after {t:.1} ms"),
                (None, Some(r), None) => r.clone(),
                (None, None, _) => "unfinished".to_string(),
            };
            writeln!(
                f,
                "  {rid:<34} rank {rank:>4}  {:<13} {end}",
                o.branch.as_deref().unwrap_or("-")
            )?;
        }
        if self.requests.len() > REQUESTS_SHOWN {
            writeln!(
                f,
                "  … and {} more (dpserve trace DIR --rid R for one)",
                self.requests.len() - REQUESTS_SHOWN
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Branch, KeySource, Method, RankSet, RouteDecision};

    fn line(
        t: f64,
        actor: &str,
        rank: Option<u32>,
        dir: &str,
        kind: &str,
        peer: Option<&str>,
        detail: Option<&str>,
    ) -> String {
        serde_json::to_string(&TraceLine {
            t,
            actor: actor.into(),
            rank,
            dir: dir.into(),
            kind: kind.into(),
            rid: Some("r1".into()),
            peer: peer.map(str::to_string),
            bytes: peer.map(|_| 100),
            detail: detail.map(str::to_string),
        })
        .unwrap()
    }

    /// Three actors' files and a routing trace, as `dpserve trace DIR` would read them.
    fn traces() -> TraceSet {
        let tokenizer = [
            line(
                10.000,
                "tokenizer",
                None,
                "send",
                "GenerateReq",
                Some("controller"),
                None,
            ),
            line(
                10.020,
                "tokenizer",
                None,
                "recv",
                "TokenOut",
                Some("worker-1"),
                None,
            ),
            line(
                10.020,
                "tokenizer",
                None,
                "event",
                "first_token",
                None,
                None,
            ),
            line(
                10.050,
                "tokenizer",
                None,
                "recv",
                "TokenOut",
                Some("worker-1"),
                None,
            ),
            line(
                10.050,
                "tokenizer",
                None,
                "event",
                "finished",
                None,
                Some("reason=length completion_tokens=2"),
            ),
        ]
        .join("\n");
        let controller = [
            line(
                10.001,
                "controller",
                None,
                "recv",
                "GenerateReq",
                Some("tokenizer"),
                None,
            ),
            line(
                10.001,
                "controller",
                None,
                "event",
                "routed",
                None,
                Some("rank=1 branch=affinity key_source=routing_key"),
            ),
            line(
                10.002,
                "controller",
                None,
                "send",
                "GenerateReq",
                Some("worker-1"),
                None,
            ),
        ]
        .join("\n");
        // The worker's file ends in half a line (killed mid-write).
        let worker = [
            line(
                10.003,
                "worker",
                Some(1),
                "recv",
                "GenerateReq",
                Some("controller"),
                None,
            ),
            line(
                10.019,
                "worker",
                Some(1),
                "event",
                "first_token",
                None,
                None,
            ),
            "{\"t\": 10.0".to_string(),
        ]
        .join("\n");
        let d = RouteDecision {
            rank: 1,
            branch: Branch::Affinity,
            key_source: KeySource::RoutingKey,
            key_digest: Some(0xab),
            hrw_order: vec![1, 0],
            threshold: Some(1.5),
            fallback: None,
        };
        let route = RouteRecord::new(
            "r1",
            10.0015,
            Method::PrefixAffinity,
            &RankSet::idle(&[0, 1]),
            &Ok(d),
        );
        let mut set = TraceSet::default();
        for text in [
            tokenizer,
            controller,
            worker,
            serde_json::to_string(&route).unwrap(),
        ] {
            set.add(text.as_bytes()).unwrap();
        }
        set
    }

    #[test]
    fn merges_every_actor_in_time_order_and_summarises() {
        let set = traces();
        assert_eq!((set.files, set.malformed, set.routes.len()), (4, 1, 1));
        let tl = timeline(&set, "r1").unwrap();
        assert_eq!(tl.rows.len(), 11);
        assert!(tl.rows.windows(2).all(|w| w[0].t <= w[1].t));
        assert_eq!(tl.rows[0].actor, "tokenizer");
        assert!(tl.rows.iter().any(|r| r.actor == "worker[1]"));
        assert!(tl.rows.iter().any(|r| r.dir == "route"));
        let o = &tl.outcome;
        assert_eq!((o.rank, o.branch.as_deref()), (Some(1), Some("affinity")));
        assert!((o.first_token_ms.unwrap() - 20.0).abs() < 1e-6, "{o:?}");
        assert!((o.finished_ms.unwrap() - 50.0).abs() < 1e-6, "{o:?}");
        assert_eq!(o.reason.as_deref(), Some("length"));
        let text = tl.to_string();
        assert!(
            text.contains(
                "routed to rank 1 via branch affinity, first token after 20.0 ms, \
                 finished after 50.0 ms (reason: length)."
            ),
            "{text}"
        );
        assert!(
            text.contains("→ worker-1") && text.contains("← tokenizer"),
            "{text}"
        );
        assert!(timeline(&set, "nope").is_none());
    }

    #[test]
    fn a_failed_request_names_its_error_without_a_routing_trace() {
        let text = [
            line(
                1.0,
                "tokenizer",
                None,
                "send",
                "GenerateReq",
                Some("controller"),
                None,
            ),
            line(
                1.0,
                "controller",
                None,
                "event",
                "routed",
                None,
                Some("rank=2 branch=spill key_source=routing_key"),
            ),
            line(
                4.0,
                "controller",
                None,
                "event",
                "failed",
                None,
                Some("data parallel rank 2 stopped responding (no heartbeat for 2.0s)"),
            ),
            line(
                4.001,
                "tokenizer",
                None,
                "event",
                "finished",
                None,
                Some("reason=error status=503 message=data parallel rank 2 stopped responding"),
            ),
        ]
        .join("\n");
        let mut set = TraceSet::default();
        set.add(text.as_bytes()).unwrap();
        let tl = timeline(&set, "r1").unwrap();
        let s = tl.outcome.sentence("r1");
        assert_eq!(
            s,
            "Request r1 was routed to rank 2 via branch spill, no token traced, finished after \
             3001.0 ms (reason: error: data parallel rank 2 stopped responding)."
        );
    }

    #[test]
    fn a_refused_request_says_why() {
        let route = RouteRecord::new(
            "r1",
            1.0,
            Method::PrefixAffinity,
            &RankSet::idle(&[0]),
            &Err(crate::router::RouteError::NoLiveRank),
        );
        let mut set = TraceSet::default();
        set.add(serde_json::to_string(&route).unwrap().as_bytes())
            .unwrap();
        let tl = timeline(&set, "r1").unwrap();
        assert_eq!(
            tl.outcome.sentence("r1"),
            "Request r1 was not routed (no live data parallel rank)."
        );
    }

    #[test]
    fn overview_counts_messages_per_actor_and_lists_requests() {
        let set = traces();
        let o = overview(&set);
        assert_eq!(o.per_actor["tokenizer"]["recv TokenOut"], 2);
        assert_eq!(o.per_actor["worker[1]"]["recv GenerateReq"], 1);
        assert_eq!(o.requests.len(), 1);
        assert_eq!(o.requests[0].1.reason.as_deref(), Some("length"));
        let text = o.to_string();
        assert!(text.contains("requests seen: 1 (length 1)"), "{text}");
        assert!(text.contains("controller (3 lines):"), "{text}");
    }

    #[test]
    fn detail_fields() {
        let d = "reason=error status=503 message=rank 1 is gone";
        assert_eq!(detail_field(d, "reason"), Some("error"));
        assert_eq!(detail_field(d, "status"), Some("503"));
        assert_eq!(detail_field(d, "message"), Some("rank 1 is gone"));
        assert_eq!(detail_field(d, "son"), None);
    }
}
