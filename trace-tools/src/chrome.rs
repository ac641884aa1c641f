//! `--chrome OUT.json`: the same pictures in the Chrome trace-event format
//! (`{"traceEvents": [{"name", "ph", "ts", "pid", "tid", ...}]}`, `ts` in microseconds), which
//! Perfetto (ui.perfetto.dev) and chrome://tracing open, for zooming into a request or a run.
//!
//! One request: a process per actor (named by `M` metadata events), phases as complete (`X`)
//! slices on thread 1, each message as an `X` slice from its send to its receive on the sender's
//! thread 2 with a flow arrow (`s`/`f`) to a slice on the receiver's thread 2, milestones as
//! instant (`i`) events with their fields as `args`. A run: counters (`C`) of decisions per
//! second per rank and per branch, and global instants where a rank joined or left.
//! Times count from the first traced moment, so the numbers stay small and exact.

use serde_json::{json, Value};

use crate::journey::Journey;
use crate::traffic::Traffic;

fn us(t: f64, t0: f64) -> f64 {
    ((t - t0) * 1e6 * 1000.0).round() / 1000.0
}

fn document(events: Vec<Value>) -> Value {
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

/// One request's journey.
pub fn request_json(j: &Journey) -> Value {
    let pid = |lane: usize| lane as u64 + 1;
    let mut ev = Vec::new();
    for (i, lane) in j.lanes.iter().enumerate() {
        ev.push(
            json!({"name": "process_name", "ph": "M", "ts": 0, "pid": pid(i), "tid": 0,
                       "args": {"name": lane}}),
        );
        ev.push(
            json!({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": pid(i), "tid": 0,
                       "args": {"sort_index": i}}),
        );
        ev.push(
            json!({"name": "thread_name", "ph": "M", "ts": 0, "pid": pid(i), "tid": 1,
                       "args": {"name": "phases and milestones"}}),
        );
        ev.push(
            json!({"name": "thread_name", "ph": "M", "ts": 0, "pid": pid(i), "tid": 2,
                       "args": {"name": "messages"}}),
        );
    }
    for p in &j.phases {
        ev.push(
            json!({"name": p.name, "cat": "phase", "ph": "X", "ts": us(p.start, j.t0),
                       "dur": us(p.end, p.start), "pid": pid(p.lane), "tid": 1}),
        );
    }
    for m in &j.marks {
        let mut args = serde_json::to_value(&m.milestone).unwrap_or(Value::Null);
        if m.milestone.name() == "routed" && !j.route.is_empty() {
            args["decision"] = json!(j.route);
        }
        ev.push(
            json!({"name": m.milestone.name(), "cat": "milestone", "ph": "i", "s": "p",
                       "ts": us(m.t, j.t0), "pid": pid(m.lane), "tid": 1, "args": args}),
        );
    }
    for (id, a) in j.messages.iter().enumerate() {
        let args = json!({"bytes": a.bytes, "from": j.lanes[a.from], "to": j.lanes[a.to]});
        let name = a.msg_type.as_str();
        match (a.sent, a.received) {
            (Some(s), Some(r)) => {
                let (ts, tr) = (us(s, j.t0), us(r, j.t0));
                ev.push(json!({"name": name, "cat": "message", "ph": "X", "ts": ts,
                               "dur": (tr - ts).max(0.0), "pid": pid(a.from), "tid": 2, "args": args}));
                ev.push(
                    json!({"name": name, "cat": "message", "ph": "X", "ts": tr, "dur": 0.001,
                               "pid": pid(a.to), "tid": 2, "args": args}),
                );
                ev.push(
                    json!({"name": name, "cat": "message", "ph": "s", "id": id, "ts": ts,
                               "pid": pid(a.from), "tid": 2}),
                );
                ev.push(
                    json!({"name": name, "cat": "message", "ph": "f", "bp": "e", "id": id,
                               "ts": tr, "pid": pid(a.to), "tid": 2}),
                );
            }
            (Some(t), None) | (None, Some(t)) => {
                let lane = if a.sent.is_some() { a.from } else { a.to };
                let what = if a.sent.is_some() {
                    "sent, receive not traced"
                } else {
                    "received, send not traced"
                };
                ev.push(json!({"name": name, "cat": "message", "ph": "i", "s": "t",
                               "ts": us(t, j.t0), "pid": pid(lane), "tid": 2,
                               "args": {"bytes": a.bytes, "from": j.lanes[a.from],
                                        "to": j.lanes[a.to], "note": what}}));
            }
            (None, None) => {}
        }
    }
    document(ev)
}

/// Routing over a run.
pub fn traffic_json(tr: &Traffic) -> Value {
    let mut ev = vec![
        json!({"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0,
                             "args": {"name": "routing"}}),
    ];
    for b in 0..=tr.bins() {
        let ts = b as f64 * tr.bin_s * 1e6;
        // The last sample closes the final bin at zero.
        let rate = |v: &Vec<u64>| v.get(b).map_or(0.0, |&n| n as f64 / tr.bin_s);
        let ranks: serde_json::Map<String, Value> = tr
            .per_rank
            .iter()
            .map(|(r, v)| (format!("rank {r}"), json!(rate(v))))
            .collect();
        let branches: serde_json::Map<String, Value> = tr
            .per_branch
            .iter()
            .map(|(name, v)| (name.clone(), json!(rate(v))))
            .collect();
        ev.push(
            json!({"name": "requests/s by rank", "ph": "C", "ts": ts, "pid": 1, "tid": 0,
                       "args": ranks}),
        );
        ev.push(
            json!({"name": "requests/s by branch", "ph": "C", "ts": ts, "pid": 1, "tid": 0,
                       "args": branches}),
        );
    }
    for c in &tr.changes {
        let what = if c.joined { "joined" } else { "left" };
        ev.push(
            json!({"name": format!("rank {} {what}", c.rank), "ph": "i", "s": "g",
                       "ts": us(c.t, tr.t0), "pid": 1, "tid": 0}),
        );
    }
    document(ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::traces;
    use crate::timeline::timeline;
    use crate::traffic::RoutePoint;

    /// What Perfetto's JSON importer needs of every event.
    pub fn assert_valid(doc: &Value) {
        let text = serde_json::to_string(doc).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        let events = back["traceEvents"].as_array().expect("traceEvents array");
        assert!(!events.is_empty());
        for e in events {
            assert!(e["ph"].is_string(), "{e}");
            assert!(e["ts"].is_number(), "{e}");
            assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
            assert!(e["name"].is_string(), "{e}");
            if e["ph"] == "X" {
                assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
            }
        }
    }

    #[test]
    fn a_request_is_valid_trace_event_json_with_every_part() {
        let j = Journey::of(&timeline(&traces(), "r1").unwrap());
        let doc = request_json(&j);
        assert_valid(&doc);
        let events = doc["traceEvents"].as_array().unwrap();
        let count = |ph: &str, cat: &str| {
            events
                .iter()
                .filter(|e| e["ph"] == ph && (cat.is_empty() || e["cat"] == cat))
                .count()
        };
        assert_eq!(count("M", "") / 4, 3);
        assert_eq!(count("s", ""), 4);
        assert_eq!(count("f", ""), 4);
        assert_eq!(count("i", "milestone"), j.marks.len());
        assert_eq!(count("X", "phase"), j.phases.len());
        let routed = events.iter().find(|e| e["name"] == "routed").unwrap();
        assert_eq!(routed["args"]["chosen_rank"], 1);
        assert!(routed["args"]["decision"][0]
            .as_str()
            .unwrap()
            .contains("branch affinity"));
    }

    #[test]
    fn a_run_is_valid_trace_event_json_with_counters() {
        let set = traces();
        let points: Vec<RoutePoint> = set.routes.iter().map(RoutePoint::of_record).collect();
        let doc = traffic_json(&Traffic::of(&points));
        assert_valid(&doc);
        assert!(doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["ph"] == "C" && e["args"]["rank 1"].is_number()));
    }
}
