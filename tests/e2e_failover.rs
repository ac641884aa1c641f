//! Failover end to end, through real HTTP: a controller, a tokenizer and three workers started as
//! separate processes (the tiny built-in model, `prefix_affinity`, a short `--worker-timeout`,
//! message traces on). Routing keys stick to their HRW rank; a worker SIGKILLed while it streams
//! a long request fails that request with an error (not a hang) once its heartbeats time out; only
//! its keys move, each to its next HRW choice; restarted with the same rank it gets back exactly
//! its keys. Along the way: `/metrics` routing counters move, and `dpserve trace DIR --rid R`
//! tells each request's story from the actors' message traces, and `--svg`/`--chrome` draw it
//! (the request's journey, routing over the run with the victim leaving and coming back).
//!
//! Also here: `dpserve trace DIR`'s errors on its own, `dpserve up` refusing bad
//! `--prefix-affinity-*` values before it starts anything, and a draining worker SIGKILLed,
//! whose running request fails at once, not at its drain timeout.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::free_port;
use common::sse::{self, Sse};
use controller::policy::{hrw, Blake2Hrw};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_dpserve");
const RANKS: [u32; 3] = [0, 1, 2];
/// Heartbeat silence after which the controller drops a rank. Short, so the test is quick, but
/// twelve heartbeat periods (below), so a busy CI machine does not drop a live worker.
const WORKER_TIMEOUT_S: f64 = 3.0;
const HEARTBEAT_MS: u64 = 250;
/// Generous: startup loads a model per worker on a shared 2-core machine.
const STARTUP: Duration = Duration::from_secs(240);

/// The actors of one deployment, each its own process, configured by their flags only;
/// all stopped when dropped.
fn deployment() -> Cluster {
    let env = vec![("DPSERVE_LOG".to_string(), "info".to_string())];
    Cluster::new(Cluster::short_dir("dpsfo"), String::new(), env, &[])
}

/// This file's steps on the harness's `Cluster` (a trait: every end-to-end file is a module of
/// one binary, and others have steps of the same names).
trait Steps {
    fn traces(&self) -> PathBuf;
    fn start_controller(&mut self);
    fn start_tokenizer(&mut self);
    fn start_rank(&mut self, rank: u32);
    fn generate_keyed(&self, key: &str, rid: &str) -> u32;
    fn mapping(&self, keys: &[String], round: &str) -> BTreeMap<String, u32>;
    fn routing_counter(&self, branch: &str) -> u64;
}

impl Steps for Cluster {
    fn traces(&self) -> PathBuf {
        self.dir.path().join("traces")
    }

    fn start_controller(&mut self) {
        let traces = self.traces().display().to_string();
        self.start_ipc_controller(&[
            "--load-balance-method",
            "prefix_affinity",
            // Requests here are sequential, but a rank's speculative load is only settled by its
            // next status: a loose guard keeps every decision on the first HRW choice, so the
            // mapping is exactly HRW and the test can say where each key must go.
            "--prefix-affinity-max-load-skew",
            "1000",
            "--worker-timeout",
            &WORKER_TIMEOUT_S.to_string(),
            "--trace-dir",
            &traces,
            "--trace-file",
            &format!("{traces}/route.jsonl"),
        ]);
    }

    fn start_tokenizer(&mut self) {
        let traces = self.traces().display().to_string();
        self.start_ipc_tokenizer(3, &["--trace-dir", &traces]);
    }

    /// A worker of rank `rank`, as actor `worker <rank>`.
    fn start_rank(&mut self, rank: u32) {
        let traces = self.traces().display().to_string();
        let heartbeat = HEARTBEAT_MS.to_string();
        self.start_tiny_rank(
            rank,
            &[
                "--heartbeat-interval-ms",
                &heartbeat,
                "--trace-dir",
                &traces,
            ],
        );
    }

    /// A short request with routing key `key`; returns the rank that served it.
    fn generate_keyed(&self, key: &str, rid: &str) -> u32 {
        let resp = self
            .http
            .post(format!("{}/generate", self.base))
            .header("x-smg-routing-key", key)
            .json(&json!({"rid": rid, "text": "hello world",
                          "sampling_params": {"max_new_tokens": 2}}))
            .send()
            .expect("POST /generate");
        let status = resp.status().as_u16();
        let body: Value = resp.json().unwrap_or(Value::Null);
        assert_eq!(status, 200, "key {key}: {body}\n{}", self.all_logs());
        body["meta_info"]["dp_rank"]
            .as_u64()
            .unwrap_or_else(|| panic!("no dp_rank: {body}")) as u32
    }

    /// The rank each key lands on now.
    fn mapping(&self, keys: &[String], round: &str) -> BTreeMap<String, u32> {
        keys.iter()
            .map(|k| (k.clone(), self.generate_keyed(k, &format!("{k}-{round}"))))
            .collect()
    }

    /// `dpserve:routing_decisions_total` for method `prefix_affinity` and branch `branch` (0 when
    /// absent).
    fn routing_counter(&self, branch: &str) -> u64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .and_then(|r| r.text())
            .expect("GET /metrics");
        // The exposition lists a series' labels in any order (the encoder: by name).
        let branch = format!("branch=\"{branch}\"");
        let want = BTreeSet::from(["method=\"prefix_affinity\"", branch.as_str()]);
        text.lines()
            .filter_map(|l| l.strip_prefix("dpserve:routing_decisions_total{"))
            .filter_map(|l| l.split_once("} "))
            .find(|(labels, _)| labels.split(',').collect::<BTreeSet<_>>() == want)
            .map_or(0, |(_, v)| v.trim().parse().expect("counter value"))
    }
}

/// Where HRW sends `key` among `live`: its first choice.
fn hrw_rank(key: &str, live: &[u32]) -> u32 {
    hrw::order(&Blake2Hrw, key.as_bytes(), live)[0]
}

/// Start a streaming request with routing key `key`; its events arrive on the channel.
fn stream(base: &str, key: &str, body: Value) -> mpsc::Receiver<Sse> {
    sse::stream(base, &[("x-smg-routing-key", key)], body)
}

fn dpserve_trace(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("trace")
        .args(args)
        .env_remove("DPSERVE_LOG")
        .output()
        .expect("run dpserve trace")
}

/// Run `dpserve trace DIR --rid R` until its output has every `want` (the actors flush their
/// trace files every 200 ms, so the last lines may lag the HTTP response a little).
fn trace_until(dir: &Path, rid: &str, want: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = dpserve_trace(&[dir.to_str().expect("utf-8 path"), "--rid", rid]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && want.iter().all(|w| text.contains(w)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "dpserve trace --rid {rid} never showed {want:?}: {}\nstdout:\n{text}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn killed_worker_fails_its_request_moves_only_its_keys_and_gets_them_back() {
    let mut c = deployment();
    c.start_controller();
    c.start_tokenizer();
    for rank in RANKS {
        c.start_rank(rank);
    }
    let everyone = [
        "controller",
        "tokenizer",
        "worker 0",
        "worker 1",
        "worker 2",
    ];
    c.wait_live(&RANKS, &everyone, STARTUP);

    // Every key lands on its HRW rank, and stays there.
    let keys: Vec<String> = (0..12).map(|i| format!("tenant-{i}")).collect();
    let affinity_before = c.routing_counter("affinity");
    let before = c.mapping(&keys, "a");
    for (key, &rank) in &before {
        assert_eq!(rank, hrw_rank(key, &RANKS), "{key} is not on its HRW rank");
    }
    assert_eq!(
        c.mapping(&keys, "b"),
        before,
        "keys moved with nothing changed"
    );
    let owners: BTreeSet<u32> = before.values().copied().collect();
    assert_eq!(
        owners,
        RANKS.into_iter().collect(),
        "these keys no longer cover every rank; pick others: {before:?}"
    );

    // The controller's routing counters reach /metrics (via ClusterStatus, every ~500 ms).
    let want = affinity_before + 2 * keys.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.routing_counter("affinity") < want {
        assert!(
            Instant::now() < deadline,
            "routing_decisions_total{{branch=\"affinity\"}} stayed at {} (want >= {want})",
            c.routing_counter("affinity")
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A long streaming request on the first key's rank; kill that rank once tokens flow.
    let long_key = &keys[0];
    let victim = before[long_key];
    let events = stream(
        &c.base,
        long_key,
        json!({"rid": "failover-long", "text": "hello", "stream": true,
               "sampling_params": {"max_new_tokens": 7000, "ignore_eos": true}}),
    );
    match events.recv_timeout(Duration::from_secs(120)) {
        Ok(Sse::Data(chunk)) => {
            assert_eq!(chunk["meta_info"]["dp_rank"], json!(victim), "{chunk}");
            assert!(chunk.get("error").is_none(), "{chunk}");
        }
        Ok(Sse::Done) => panic!("the long request ended before its first chunk"),
        Ok(Sse::Closed(why)) => panic!("the long request failed at once: {why}"),
        Err(e) => panic!("no first chunk of the long request: {e}\n{}", c.all_logs()),
    }
    let victim_name = format!("worker {victim}");
    c.kill(&victim_name);

    // The request ends with exactly one error, then [DONE]: no hang, no success.
    let deadline = Instant::now() + Duration::from_secs_f64(WORKER_TIMEOUT_S + 60.0);
    let mut error = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Sse::Data(chunk)) if chunk.get("error").is_some() => {
                assert!(error.is_none(), "a second error: {chunk}");
                error = Some(chunk);
            }
            Ok(Sse::Data(chunk)) => {
                assert!(error.is_none(), "data after the error: {chunk}");
                assert_ne!(
                    chunk["meta_info"]["finish_reason"]["type"],
                    json!("length"),
                    "the killed rank's request cannot have finished: {chunk}"
                );
            }
            Ok(Sse::Done) => break,
            Ok(Sse::Closed(why)) => panic!("stream ended without [DONE]: {why}"),
            Err(_) => panic!(
                "the killed rank's request hung: no error within {WORKER_TIMEOUT_S} s + 60 s\n{}",
                c.all_logs()
            ),
        }
    }
    let error = error.expect("an error event before [DONE]");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("rank {victim}")) && message.contains("stopped responding"),
        "{error}"
    );

    // The rank left; only its keys moved, each to its next HRW choice among the live ranks.
    let survivors: Vec<u32> = RANKS.into_iter().filter(|&r| r != victim).collect();
    let running: Vec<String> = ["controller", "tokenizer"]
        .into_iter()
        .map(String::from)
        .chain(survivors.iter().map(|r| format!("worker {r}")))
        .collect();
    let running: Vec<&str> = running.iter().map(String::as_str).collect();
    c.wait_live(&survivors, &running, Duration::from_secs(30));
    let during = c.mapping(&keys, "c");
    for key in &keys {
        if before[key] == victim {
            assert_eq!(
                during[key],
                hrw_rank(key, &survivors),
                "{key} left rank {victim} for the wrong rank"
            );
            assert_ne!(during[key], victim);
        } else {
            assert_eq!(
                during[key], before[key],
                "{key} moved, but its rank is alive"
            );
        }
    }

    // The same rank comes back and gets exactly its keys back.
    c.start_rank(victim);
    c.wait_live(&RANKS, &everyone, STARTUP);
    assert_eq!(
        c.mapping(&keys, "d"),
        before,
        "the restarted rank did not get its keys back"
    );

    // The message traces tell both stories.
    let traces = c.traces();
    let short_rid = format!("{}-a", keys[1]);
    let short = trace_until(
        &traces,
        &short_rid,
        &[
            "tokenizer",
            "controller",
            &format!("worker[{}]", before[&keys[1]]),
            &format!(
                "was routed to rank {} via branch affinity, first token after",
                before[&keys[1]]
            ),
            "(reason: length)",
        ],
    );
    for kind in [
        "GenerateReq",
        "TokenOut",
        "routed",
        "first_token",
        "finished",
    ] {
        assert!(short.contains(kind), "no {kind} in the timeline:\n{short}");
    }
    trace_until(
        &traces,
        "failover-long",
        &[
            &format!("was routed to rank {victim} via branch affinity"),
            "failed",
            "reason: error",
            "stopped responding",
        ],
    );
    let out = dpserve_trace(&[traces.to_str().expect("utf-8 path")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "tokenizer (",
        "controller (",
        "worker[0] (",
        "requests seen: ",
    ] {
        assert!(text.contains(want), "{want:?} not in the overview:\n{text}");
    }
    let out = dpserve_trace(&[traces.to_str().expect("utf-8 path"), "--rid", "no-such"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no events for rid \"no-such\""));

    // The same traces as pictures.
    check_request_picture(&traces, &short_rid, before[&keys[1]]);
    check_routing_picture(&traces, victim);
}

/// `(dir, type)` of every line about `rid` in the actors' message traces.
fn traced_lines(dir: &Path, rid: &str) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for entry in fs::read_dir(dir).expect("trace dir") {
        let path = entry.expect("entry").path();
        if path.file_name().is_some_and(|n| n == "route.jsonl") {
            continue;
        }
        for line in fs::read_to_string(&path).expect("trace file").lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if v["rid"] == rid {
                let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
                lines.push((s("dir"), s("type")));
            }
        }
    }
    lines
}

/// Perfetto's JSON importer needs `traceEvents`, each with `ph`, `ts`, `pid` and `tid`.
fn check_chrome(path: &Path) -> Vec<Value> {
    let doc: Value = serde_json::from_str(&fs::read_to_string(path).expect("chrome json"))
        .expect("chrome trace is JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents").clone();
    assert!(!events.is_empty());
    for e in &events {
        assert!(e["ph"].is_string() && e["ts"].is_number(), "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
    }
    events
}

/// Runs `dpserve trace TRACES EXTRA.. --svg --chrome`: the SVG, and the Chrome trace's events
/// (checked by [`check_chrome`]).
fn draw(traces: &Path, extra: &[&str]) -> (String, Vec<Value>) {
    let out_dir = tempfile::tempdir().expect("temp dir");
    let (svg_path, json_path) = (
        out_dir.path().join("picture.svg"),
        out_dir.path().join("trace.json"),
    );
    let mut args = vec![traces.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    args.extend([
        "--svg",
        svg_path.to_str().expect("utf-8 path"),
        "--chrome",
        json_path.to_str().expect("utf-8 path"),
    ]);
    let out = dpserve_trace(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = fs::read_to_string(&svg_path).expect("svg written");
    (svg, check_chrome(&json_path))
}

/// `dpserve trace DIR --rid R --svg --chrome` on a request recorded by the real run: a lane per
/// actor it crossed, one arrow per traced message, a mark per traced milestone, the decision.
fn check_request_picture(traces: &Path, rid: &str, rank: u32) {
    let (svg, events) = draw(traces, &["--rid", rid]);
    for lane in [
        "tokenizer".to_string(),
        "controller".into(),
        format!("worker[{rank}]"),
    ] {
        assert!(
            svg.contains(&format!("class=\"lane\" data-lane=\"{lane}\"")),
            "no lane {lane}"
        );
    }
    let lines = traced_lines(traces, rid);
    let count = |dir: &str| lines.iter().filter(|(d, _)| d == dir).count();
    // Every actor traced: each message has both ends, and is one arrow.
    assert_eq!(count("send"), count("recv"), "{lines:?}");
    assert_eq!(
        svg.matches("class=\"msg\"").count(),
        count("send"),
        "{lines:?}"
    );
    assert_eq!(
        svg.matches("class=\"mark\"").count(),
        count("event"),
        "{lines:?}"
    );
    for (dir, kind) in &lines {
        if dir == "event" {
            assert!(
                svg.contains(&format!("class=\"mark\" data-name=\"{kind}\"")),
                "{kind}"
            );
        }
    }
    assert!(svg.contains("class=\"route\""));
    assert!(svg.contains(&format!("prefix_affinity → rank {rank}, branch affinity")));
    let flows = events.iter().filter(|e| e["ph"] == "s").count();
    assert_eq!(flows, count("send"));
}

/// `dpserve trace DIR --svg --chrome` over the whole run: a band per rank, the victim's leaving
/// and coming back marked.
fn check_routing_picture(traces: &Path, victim: u32) {
    let (svg, events) = draw(traces, &[]);
    for r in RANKS {
        assert!(
            svg.contains(&format!("class=\"area\" data-rank=\"{r}\"")),
            "rank {r}"
        );
    }
    assert!(svg.contains("class=\"area\" data-branch=\"affinity\""));
    for what in ["left", "joined"] {
        assert!(
            svg.contains(&format!(
                "class=\"rank-event\" data-what=\"{what}\" data-rank=\"{victim}\""
            )),
            "rank {victim} {what} not marked"
        );
    }
    assert!(events.iter().any(|e| e["ph"] == "C"));
}

#[test]
fn trace_dir_errors_are_clear_and_malformed_lines_are_skipped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_str().expect("utf-8 path");
    let out = dpserve_trace(&[path]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no trace files (*.jsonl)"), "{stderr}");

    let line = json!({"t": 5.0, "actor": "tokenizer", "dir": "send", "type": "GenerateReq",
                      "rid": "r1", "peer": "controller", "bytes": 40});
    let done = json!({"t": 5.5, "actor": "tokenizer", "dir": "event", "type": "finished",
                      "rid": "r1", "detail": "reason=stop completion_tokens=1"});
    fs::write(
        dir.path().join("tokenizer.jsonl"),
        format!("{line}\nnot json at all\n{done}\n{{\"t\": 6"),
    )
    .expect("write trace");
    let out = dpserve_trace(&[path, "--rid", "r1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("skipped 2 line(s)"), "{stderr}");
    assert!(
        stdout.contains("finished after 500.0 ms (reason: stop)"),
        "{stdout}"
    );
    let out = dpserve_trace(&[path, "--rid", "r2"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no events for rid \"r2\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn up_refuses_bad_prefix_affinity_values_before_starting_anything() {
    let runtime = tempfile::Builder::new()
        .prefix("dpsup")
        .tempdir_in("/tmp")
        .expect("temp dir");
    for (flag, value) in [
        ("--prefix-affinity-max-load-skew", "0.5"),
        ("--prefix-affinity-hash-tokens", "0"),
        ("--prefix-affinity-fallback", "prefix_affinity"),
    ] {
        let port = free_port();
        let out = Command::new(BIN)
            .args(["up", "--port", &port.to_string(), "--runtime-dir"])
            .arg(runtime.path())
            .args([flag, value])
            // `up` logs each child it starts at info.
            .env("DPSERVE_LOG", "info")
            .stdin(Stdio::null())
            .output()
            .expect("run dpserve up");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: {stderr}");
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        // Nothing was started: no actor logged, nothing listens on the port.
        assert!(
            !stderr.contains("started"),
            "{flag} {value}: children were started:\n{stderr}"
        );
        assert!(TcpListener::bind(("127.0.0.1", port)).is_ok());
    }
}

/// A controller that restarts (a crash, an upgrade) gets its running workers back without
/// restarting them: their next heartbeat reaches a controller that does not know them, it
/// answers `Rejoin`, and they say `Hello` again.
#[test]
fn restarted_controller_gets_its_running_workers_back() {
    let mut c = deployment();
    c.start_controller();
    c.start_tokenizer();
    c.start_rank(0);
    c.start_rank(1);
    let all = ["controller", "tokenizer", "worker 0", "worker 1"];
    c.wait_live(&[0, 1], &all, Duration::from_secs(120));
    let pids: Vec<u32> = ["worker 0", "worker 1"]
        .map(|w| c.actor(w).child.id())
        .to_vec();

    c.kill("controller");
    // The tokenizer's last cluster view goes stale: nothing is live without a controller.
    c.wait_live(
        &[],
        &["tokenizer", "worker 0", "worker 1"],
        Duration::from_secs(60),
    );
    c.start_controller();
    c.wait_live(&[0, 1], &all, Duration::from_secs(60));
    assert_eq!(
        ["worker 0", "worker 1"]
            .map(|w| c.actor(w).child.id())
            .to_vec(),
        pids,
        "the same worker processes rejoined"
    );
    for rank in [0u32, 1] {
        let resp = c
            .http
            .post(format!("{}/generate", c.base))
            .json(&json!({"text": "hello world", "routed_dp_rank": rank,
                          "sampling_params": {"max_new_tokens": 2}}))
            .send()
            .expect("POST /generate");
        let status = resp.status().as_u16();
        let body: Value = resp.json().unwrap_or(Value::Null);
        assert_eq!(status, 200, "rank {rank}: {body}\n{}", c.all_logs());
        assert_eq!(body["meta_info"]["dp_rank"], json!(rank), "{body}");
    }
    let log = fs::read_to_string(&c.actor("worker 0").log).unwrap_or_default();
    assert!(log.contains("registering again"), "worker 0 log:\n{log}");
}

/// Reads `events` until the request ends; returns its one error message: an error event then
/// `[DONE]` for a stream that had started, or the 503 response of one that had not (panics on
/// a second error, on data after it, on a normal finish, or on nothing within `within`).
fn expect_one_error(c: &Cluster, events: &mpsc::Receiver<Sse>, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut error = None;
    let mut started = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Sse::Data(chunk)) if chunk.get("error").is_some() => {
                assert!(error.is_none(), "a second error: {chunk}");
                error = Some(
                    chunk["error"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
            Ok(Sse::Data(chunk)) => {
                assert!(error.is_none(), "data after the error: {chunk}");
                assert!(
                    chunk["meta_info"]["finish_reason"].is_null(),
                    "the request finished instead of failing: {chunk}"
                );
                started = true;
            }
            Ok(Sse::Done) => return error.expect("an error event before [DONE]"),
            Ok(Sse::Closed(why)) if !started && why.starts_with("status 503") => return why,
            Ok(Sse::Closed(why)) => panic!("stream ended without [DONE]: {why}"),
            Err(_) => panic!(
                "no error within {within:?} (the request hung)\n{}",
                c.all_logs()
            ),
        }
    }
}

/// Requests in flight while the controller restarts end exactly once, soon: one whose worker
/// died while no controller ran is failed once the restarted controller has heard from the
/// workers that are left (the tokenizer lists its open requests to a controller it has not
/// seen; none holds this one), and one whose worker rejoined is adopted from that worker's
/// `Hello`, so when that worker dies afterwards it fails at the heartbeat timeout, not at the
/// tokenizer's request timeout.
#[test]
fn requests_in_flight_through_a_controller_restart_end_once_and_soon() {
    let mut c = deployment();
    c.start_controller();
    c.start_tokenizer();
    // Rank 0 runs one request at a time, so the adopted one waits queued behind another.
    let heartbeat = HEARTBEAT_MS.to_string();
    c.start_tiny_rank(
        0,
        &[
            "--heartbeat-interval-ms",
            &heartbeat,
            "--max-running-requests",
            "1",
        ],
    );
    c.start_tiny_rank(1, &["--heartbeat-interval-ms", &heartbeat]);
    let all = ["controller", "tokenizer", "worker 0", "worker 1"];
    c.wait_live(&[0, 1], &all, STARTUP);

    let long = |rid: &str, rank: u32| {
        json!({"rid": rid, "text": "hello", "stream": true, "routed_dp_rank": rank,
               "sampling_params": {"max_new_tokens": 7000, "ignore_eos": true}})
    };
    let first_chunk = |events: &mpsc::Receiver<Sse>, what: &str| match events
        .recv_timeout(Duration::from_secs(120))
    {
        Ok(Sse::Data(chunk)) => assert!(chunk.get("error").is_none(), "{what}: {chunk}"),
        other => panic!("{what}: no first chunk: {other:?}"),
    };
    let orphan = sse::stream(&c.base, &[], long("restart-orphan", 1));
    first_chunk(&orphan, "orphan");
    let running = sse::stream(&c.base, &[], long("restart-running", 0));
    first_chunk(&running, "running");
    let queued = sse::stream(&c.base, &[], long("restart-queued", 0));
    // Worker 0 holds the queued request once it has taken it in (its next status says so).
    let waiting_on_0 = |c: &Cluster| {
        let info = c.server_info()?;
        let ranks = info["ranks"].as_array()?;
        let rank0 = ranks.iter().find(|r| r["rank"] == json!(0))?;
        rank0["status"]["num_waiting_reqs"].as_u64()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiting_on_0(&c) != Some(1) {
        assert!(Instant::now() < deadline, "rank 0 never queued the request");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The controller dies; while none runs, worker 1 dies too, taking the orphan with it.
    c.kill("controller");
    c.kill("worker 1");
    c.wait_exit("worker 1", Duration::from_secs(10));
    c.start_controller();
    let restarted = Instant::now();
    let error = expect_one_error(&c, &orphan, Duration::from_secs(20));
    assert!(
        error.contains("lost when the controller restarted"),
        "{error}"
    );
    eprintln!(
        "orphan failed {:.1} s after the controller restarted",
        restarted.elapsed().as_secs_f64()
    );
    c.wait_live(
        &[0],
        &["controller", "tokenizer", "worker 0"],
        Duration::from_secs(30),
    );

    // Worker 0 rejoined with both of its requests; it dies: both fail as soon as the
    // controller finds its connection closed, before the heartbeat timeout (the running one
    // may have finished meanwhile; the queued one cannot have).
    c.kill("worker 0");
    let killed = Instant::now();
    let within = Duration::from_secs_f64(WORKER_TIMEOUT_S + 5.0);
    let error = expect_one_error(&c, &queued, within);
    assert!(
        error.contains("rank 0") && error.contains("stopped responding (its process exited)"),
        "{error}"
    );
    eprintln!(
        "queued request failed {:.1} s after its worker died (--worker-timeout {WORKER_TIMEOUT_S})",
        killed.elapsed().as_secs_f64()
    );
    drop(running);
}

/// A draining worker that dies is found out by the same connection probe as a live one: its
/// running request fails with the 503 "(its process exited)" within about the probe's 200 ms,
/// not when its `--drain-timeout` (plus the heartbeat timeout) runs out.
#[test]
fn a_draining_worker_killed_fails_its_requests_at_once_not_at_its_drain_timeout() {
    const DRAIN_TIMEOUT_S: f64 = 30.0;
    let mut c = deployment();
    c.start_controller();
    c.start_tokenizer();
    let heartbeat = HEARTBEAT_MS.to_string();
    let drain_timeout = DRAIN_TIMEOUT_S.to_string();
    c.start_tiny_rank(
        0,
        &[
            "--heartbeat-interval-ms",
            &heartbeat,
            "--drain-timeout",
            &drain_timeout,
        ],
    );
    c.wait_live(&[0], &["controller", "tokenizer", "worker 0"], STARTUP);

    // A long request, running when SIGTERM starts the drain.
    let events = sse::stream(
        &c.base,
        &[],
        json!({"rid": "drain-killed", "text": "hello", "stream": true, "routed_dp_rank": 0,
               "sampling_params": {"max_new_tokens": 7000, "ignore_eos": true}}),
    );
    match events.recv_timeout(Duration::from_secs(120)) {
        Ok(Sse::Data(chunk)) => assert!(chunk.get("error").is_none(), "{chunk}"),
        other => panic!("no first chunk: {other:?}\n{}", c.all_logs()),
    }
    c.sigterm("worker 0");
    c.wait_log("controller", "rank draining", Duration::from_secs(30));
    c.assert_running(&["worker 0"]);

    let killed = Instant::now();
    c.kill("worker 0");
    let error = expect_one_error(&c, &events, Duration::from_secs_f64(DRAIN_TIMEOUT_S + 30.0));
    let after = killed.elapsed();
    assert!(
        error.contains("rank 0") && error.contains("stopped responding (its process exited)"),
        "{error}"
    );
    eprintln!(
        "the draining worker's request failed {:.2} s after its SIGKILL (--drain-timeout \
         {DRAIN_TIMEOUT_S}, --worker-timeout {WORKER_TIMEOUT_S})",
        after.as_secs_f64()
    );
    // The probe runs every 200 ms; the slack is for a busy machine, far below the 33 s the
    // drain deadline would have taken.
    assert!(
        after < Duration::from_secs(3),
        "failed {after:?} after the kill: the drain deadline, not the probe\n{}",
        c.all_logs()
    );
    let log = c.log("controller");
    assert!(
        log.contains("rank removed: its connection closed"),
        "controller log:\n{log}"
    );
}
