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

use protocol::msg_trace::{Milestone, TraceLine};
use protocol::route_record::RouteRecord;
use protocol::trace_event::{Branch, MessageSeen, TraceEvent};
use protocol::FinishReason;

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
            if let Some(l) = TraceLine::parse(&line) {
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

/// One row of a timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Unix seconds.
    pub t: f64,
    /// `worker[1]`, `controller`: the actor and its rank.
    pub actor: String,
    pub what: RowKind,
}

/// What a row says.
#[derive(Debug, Clone, PartialEq)]
pub enum RowKind {
    /// A message the actor sent (`outgoing`) or received.
    Message {
        outgoing: bool,
        seen: MessageSeen,
    },
    Milestone(Milestone),
    /// A routing-trace record (`--trace-file` in the same directory).
    Route(Box<RouteRecord>),
}

impl Row {
    fn of_line(l: &TraceLine) -> Row {
        Row {
            t: l.t,
            actor: l.actor_label(),
            what: match &l.event {
                TraceEvent::Send(seen) => RowKind::Message {
                    outgoing: true,
                    seen: seen.clone(),
                },
                TraceEvent::Recv(seen) => RowKind::Message {
                    outgoing: false,
                    seen: seen.clone(),
                },
                TraceEvent::Event(m) => RowKind::Milestone(m.clone()),
            },
        }
    }

    /// `send`, `recv`, `event` or `route`.
    pub fn dir(&self) -> &'static str {
        match &self.what {
            RowKind::Message { outgoing: true, .. } => "send",
            RowKind::Message { .. } => "recv",
            RowKind::Milestone(_) => "event",
            RowKind::Route(_) => "route",
        }
    }

    /// The message type, the milestone's name, or the routing method.
    pub fn kind(&self) -> &str {
        match &self.what {
            RowKind::Message { seen, .. } => &seen.msg_type,
            RowKind::Milestone(m) => m.name(),
            RowKind::Route(r) => &r.method,
        }
    }

    /// `send GenerateReq`, `event admitted`: what the overview counts.
    pub fn dir_and_kind(&self) -> String {
        format!("{} {}", self.dir(), self.kind())
    }

    pub fn milestone(&self) -> Option<&Milestone> {
        match &self.what {
            RowKind::Milestone(m) => Some(m),
            _ => None,
        }
    }
}

/// How one request went, as far as the traces tell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub rank: Option<u32>,
    pub branch: Option<Branch>,
    /// Why it was not routed, when it was not.
    pub refused: Option<String>,
    /// Milliseconds from the request's first trace line.
    pub first_token_ms: Option<f64>,
    pub finished_ms: Option<f64>,
    pub reason: Option<FinishReason>,
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
        .map(|l| Row::of_line(l))
        .chain(routes.iter().map(|r| Row {
            t: r.time,
            actor: "controller".into(),
            what: RowKind::Route(Box::new((*r).clone())),
        }))
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

/// What the text timeline prints after a routing record.
pub fn route_detail(r: &RouteRecord) -> String {
    match (r.rank, r.branch, &r.error) {
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
    }
}

fn outcome(lines: &[&TraceLine], routes: &[&RouteRecord], t0: f64) -> Outcome {
    let ms = |t: f64| (t - t0) * 1e3;
    // The first `name` milestone `actor` wrote.
    let event = |actor: &str, name: &str| {
        lines
            .iter()
            .find(|l| l.actor == actor && l.milestone().is_some_and(|m| m.name() == name))
            .and_then(|l| Some((l.t, l.milestone()?)))
    };
    let mut o = Outcome::default();

    // Where it went: the routing record (the last, if a rid was routed twice), else the
    // controller's milestone, else the worker that received it.
    let routed = lines.iter().rev().find_map(|l| match l.milestone() {
        Some(Milestone::Routed {
            chosen_rank,
            branch,
            ..
        }) if l.actor == "controller" => Some((*chosen_rank, *branch)),
        _ => None,
    });
    if let Some(r) = routes.last() {
        o.rank = r.rank;
        o.branch = r.branch;
        o.refused = r.error.clone();
    } else if let Some((rank, branch)) = routed {
        o.rank = Some(rank);
        o.branch = Some(branch);
    } else if let Some((_, Milestone::Refused { error })) = event("controller", "refused") {
        o.refused = Some(error.clone());
    }
    if o.rank.is_none() && o.refused.is_none() {
        o.rank = lines
            .iter()
            .find(|l| {
                l.actor == "worker"
                    && l.message()
                        .is_some_and(|(out, m)| !out && m.msg_type == "GenerateReq")
            })
            .and_then(|l| l.rank);
    }

    let first = event("tokenizer", "first_token").or_else(|| event("worker", "first_token"));
    o.first_token_ms = first.map(|(t, _)| ms(t));

    let failed = event("controller", "failed").and_then(|(t, m)| match m {
        Milestone::Failed { error } => Some((t, error.clone())),
        _ => None,
    });
    let finished = event("tokenizer", "finished").or_else(|| event("worker", "finished"));
    if let Some((t, Milestone::Finished { reason, error, .. })) = finished {
        o.finished_ms = Some(ms(t));
        o.reason = Some(*reason);
        o.error = error.as_ref().map(|e| e.message.clone());
    } else if let Some((t, error)) = &failed {
        // The rank died and the tokenizer did not trace: the controller's word is the end.
        o.finished_ms = Some(ms(*t));
        o.reason = Some(FinishReason::Error);
        o.error = Some(error.clone());
    }
    if o.error.is_none() && o.reason == Some(FinishReason::Error) {
        o.error = failed.map(|(_, e)| e);
    }
    if o.refused.is_some() && o.reason.is_none() {
        o.reason = Some(FinishReason::Error);
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
                let _ = write!(s, ", finished after {t:.1} ms (reason: {}", reason.as_str());
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
            let what = match &r.what {
                RowKind::Message {
                    outgoing: true,
                    seen,
                } => format!("→ {}", seen.peer),
                RowKind::Message { seen, .. } => format!("← {}", seen.peer),
                _ => String::new(),
            };
            let mut line = format!(
                "{:>11.3} ms  {:<12} {:<5} {:<14} {:<13}",
                (r.t - t0) * 1e3,
                r.actor,
                r.dir(),
                r.kind(),
                what
            );
            match &r.what {
                RowKind::Message { seen, .. } => {
                    let _ = write!(line, " {:>7} B", seen.bytes);
                }
                RowKind::Milestone(m) => {
                    let _ = write!(line, "  {m}");
                }
                RowKind::Route(rec) => {
                    let _ = write!(line, "  {}", route_detail(rec));
                }
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
            .entry(l.actor_label())
            .or_default()
            .entry(Row::of_line(l).dir_and_kind())
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
                (None, Some(r), Some(t)) => format!("{} after {t:.1} ms", r.as_str()),
                (None, Some(r), None) => r.as_str().to_string(),
                (None, None, _) => "unfinished".to_string(),
            };
            writeln!(
                f,
                "  {rid:<34} rank {rank:>4}  {:<13} {end}",
                o.branch.map_or("-", Branch::as_str)
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
    use controller::policy::{Method, RankSet};
    use controller::trace::route_record;

    use super::*;
    use crate::fixtures::{event, line, send, traces};

    #[test]
    fn merges_every_actor_in_time_order_and_summarises() {
        let set = traces();
        assert_eq!((set.files, set.malformed, set.routes.len()), (4, 1, 1));
        let tl = timeline(&set, "r1").unwrap();
        assert_eq!(tl.rows.len(), 17);
        assert!(tl.rows.windows(2).all(|w| w[0].t <= w[1].t));
        assert_eq!(tl.rows[0].actor, "tokenizer");
        assert!(tl.rows.iter().any(|r| r.actor == "worker[1]"));
        assert!(tl.rows.iter().any(|r| r.dir() == "route"));
        let o = &tl.outcome;
        assert_eq!((o.rank, o.branch), (Some(1), Some(Branch::Affinity)));
        assert!((o.first_token_ms.unwrap() - 20.0).abs() < 1e-6, "{o:?}");
        assert!((o.finished_ms.unwrap() - 50.0).abs() < 1e-6, "{o:?}");
        assert_eq!(o.reason, Some(FinishReason::Length));
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
        assert!(
            text.contains("event routed") && text.contains("rank=1 branch=affinity"),
            "{text}"
        );
        assert!(
            text.contains("prefix_hit_tokens=0 prompt_tokens=12"),
            "{text}"
        );
        assert!(timeline(&set, "nope").is_none());
    }

    #[test]
    fn a_failed_request_names_its_error_without_a_routing_trace() {
        let mut decision = crate::fixtures::decision();
        decision.rank = 2;
        decision.branch = Branch::Spill;
        let ranks = RankSet::idle(&[0, 1, 2]);
        let why = "data parallel rank 2 stopped responding";
        let text = [
            line(1.0, "tokenizer", None, send("GenerateReq", "controller")),
            line(
                1.0,
                "controller",
                None,
                event(decision.milestone(Method::PrefixAffinity, &ranks)),
            ),
            line(
                4.0,
                "controller",
                None,
                event(Milestone::Failed {
                    error: format!("{why} (no heartbeat for 2.0s)"),
                }),
            ),
            line(
                4.001,
                "tokenizer",
                None,
                event(Milestone::Finished {
                    reason: FinishReason::Error,
                    completion_tokens: 0,
                    cached_tokens: 0,
                    error: Some(protocol::ReqError {
                        status: 503,
                        message: why.into(),
                    }),
                }),
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
        let route = route_record(
            "r1",
            1.0,
            Method::PrefixAffinity,
            &RankSet::idle(&[0]),
            &Err(controller::router::RouteError::NoLiveRank),
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
        assert_eq!(o.requests[0].1.reason, Some(FinishReason::Length));
        let text = o.to_string();
        assert!(text.contains("requests seen: 1 (length 1)"), "{text}");
        assert!(text.contains("controller (3 lines):"), "{text}");
    }
}
