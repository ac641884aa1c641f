//! A chaos soak (issue 13, issue 26): mixed traffic — `/generate` and OpenAI completions,
//! streamed and not, clients that vanish mid-stream, `/abort_request`, bad bodies — while
//! faults are injected on a schedule, on two deployments:
//!
//! - two unified ranks: a worker killed (SIGKILL) and started again, a worker stopped (SIGSTOP)
//!   past the controller's worker timeout and resumed, the controller killed (SIGKILL and
//!   SIGTERM in turn) and started again (`DPSERVE_SOAK_CONTROLLER_RESTARTS=0` leaves it alone);
//! - one prefill and one decode rank, the decode worker's request rows few enough that
//!   requests queue for them (`--max-running-requests 2 --decode-prealloc-size 1`): the prefill
//!   or the decode worker killed or stopped while a prompt's KV is on its way, and the
//!   controller killed while requests wait in the decode worker's pre-allocation queue.
//!
//! Then the invariants: every request got exactly one final answer within its deadline, the
//! ledger checks (`WorkerStatus.invariant_violations`, `RankInfo.invariant_violations`, polled
//! throughout: the soak fails on the first line) stayed silent, every rank's pool is whole
//! again and nothing is left in flight, the actors' memory and file descriptors did not grow
//! past a bound.
//!
//! CI runs each for 30 s (in parallel); `DPSERVE_SOAK_SECS=3600 cargo test --release --test
//! e2e e2e_soak:: -- --nocapture` runs an hour each and prints the same summaries.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use serde_json::{json, Value};

const WORKER_TIMEOUT_S: &str = "1.5";
const HEARTBEAT_MS: &str = "250";
/// A client gives up on a request after this: an answer later than it is a violation.
const DEADLINE: Duration = Duration::from_secs(30);
/// The disaggregated workers' bootstrap and waiting timeouts (seconds): a request a fault left
/// waiting for its KV or its row fails well within [`DEADLINE`].
const DISAGG_TIMEOUT_S: &str = "5";
/// Growth of an actor's resident memory from warm-up to the end that passes.
const RSS_BOUND_KB: u64 = 64 * 1024;
/// Growth of an actor's open file descriptors that passes.
const FD_BOUND: usize = 16;
/// How often the ledger checks' reports are read while the soak runs.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Controller restarts are on unless `DPSERVE_SOAK_CONTROLLER_RESTARTS=0`. A request the old
/// controller took in and never passed on is failed by the new one once the workers rejoined
/// (the tokenizer's `Reconcile`), so restarts lose nothing.
fn controller_restarts() -> bool {
    std::env::var("DPSERVE_SOAK_CONTROLLER_RESTARTS").map_or(true, |v| v != "0")
}

fn soak_secs() -> u64 {
    std::env::var("DPSERVE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// The deployment a soak runs on: ranks 0 and 1 either way.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    Unified,
    /// Rank 0 computes prompts, rank 1 decodes them.
    Disaggregated,
}

/// This file's steps on the harness's `Cluster` (a trait: every end-to-end file is a module of
/// one binary, and others have steps of the same names).
trait Steps {
    fn start_controller(&mut self);
    fn start_rank(&mut self, shape: Shape, rank: u32);
    fn clock_file(&self) -> std::path::PathBuf;
    fn pid(&mut self, name: &str) -> u32;
    fn rank_views(&self) -> Vec<Value>;
    fn pools_whole(&self) -> bool;
    fn first_violation(&self) -> Option<String>;
    fn watch(&self, ms: u64);
    fn wait_decode(&self, ms: u64, what: impl Fn(&Value) -> bool) -> bool;
}

impl Steps for Cluster {
    fn start_controller(&mut self) {
        self.start_ipc_controller(&["--worker-timeout", WORKER_TIMEOUT_S]);
    }

    fn start_rank(&mut self, shape: Shape, rank: u32) {
        let mut args = vec!["--heartbeat-interval-ms", HEARTBEAT_MS];
        let kv = self.ipc("kv-0.sock");
        if shape == Shape::Disaggregated {
            args.extend([
                "--disaggregation-bootstrap-timeout",
                DISAGG_TIMEOUT_S,
                "--disaggregation-waiting-timeout",
                DISAGG_TIMEOUT_S,
            ]);
            if rank == 0 {
                args.extend(["--disaggregation-mode", "prefill"]);
                args.extend(["--disaggregation-kv-addr", kv.as_str()]);
            } else {
                // Three request rows: four clients keep requests queued for one.
                args.extend(["--disaggregation-mode", "decode"]);
                args.extend(["--max-running-requests", "2", "--decode-prealloc-size", "1"]);
            }
        }
        // Worker 0's wall clock is the one the soak steps (unified ranks).
        let clock = self.clock_file();
        let clock = clock.to_str().unwrap();
        let env = [("DPSERVE_TEST_CLOCK_OFFSET_FILE", clock)];
        let env: &[(&str, &str)] = if rank == 0 { &env } else { &[] };
        self.start_tiny_rank_with_env(rank, &args, env);
    }

    /// The file whose seconds worker 0 adds to its wall clock.
    fn clock_file(&self) -> std::path::PathBuf {
        self.dir.path().join("clock-offset-0")
    }

    fn pid(&mut self, name: &str) -> u32 {
        self.actor(name).child.id()
    }

    /// The ranks `/get_server_info` lists.
    fn rank_views(&self) -> Vec<Value> {
        self.server_info()
            .and_then(|info| info["ranks"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Every live rank's pool is whole: nothing held, nothing queued, no transfer, nothing
    /// the controller counts in flight.
    fn pools_whole(&self) -> bool {
        let ranks = self.rank_views();
        ranks.len() == 2
            && ranks.iter().all(|r| {
                let s = &r["status"];
                let free = s["num_free_tokens"].as_u64().unwrap_or(0)
                    + s["num_evictable_tokens"].as_u64().unwrap_or(0);
                let d = &s["disagg"];
                let zero = |v: &Value| v.as_u64().unwrap_or(0) == 0;
                s["num_used_tokens"] == 0
                    && s["num_running_reqs"] == 0
                    && s["num_waiting_reqs"] == 0
                    && Some(free) == s["max_total_tokens"].as_u64()
                    && zero(&d["num_bootstrap_reqs"])
                    && zero(&d["num_transfer_reqs"])
                    && zero(&d["rows_beyond_running"])
                    && r["num_inflight"] == 0
            })
    }

    /// The first line of any side's ledger check, with the rank and the side.
    fn first_violation(&self) -> Option<String> {
        let tokenizer = self.server_info().and_then(|info| {
            let line = info["invariant_violations"].as_array()?.first()?.clone();
            Some(format!("tokenizer: {}", line.as_str().unwrap_or("")))
        });
        tokenizer.or_else(|| {
            self.rank_views().iter().find_map(|r| {
                let line = |v: &Value, side: &str| {
                    v.as_array()?.first().map(|l| {
                        format!("rank {} ({side}): {}", r["rank"], l.as_str().unwrap_or(""))
                    })
                };
                line(&r["invariant_violations"], "controller")
                    .or_else(|| line(&r["status"]["invariant_violations"], "worker"))
            })
        })
    }

    /// Waits `ms`, reading the ledger checks' reports meanwhile; fails on the first line.
    fn watch(&self, ms: u64) {
        let end = Instant::now() + Duration::from_millis(ms);
        loop {
            if let Some(v) = self.first_violation() {
                panic!("ledger check failed: {v}\n{}", self.all_logs());
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(WATCH_EVERY));
        }
    }

    /// Waits up to `ms` until the decode rank's status satisfies `what` (its `disagg` map);
    /// whether it did.
    fn wait_decode(&self, ms: u64, what: impl Fn(&Value) -> bool) -> bool {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            let ranks = self.rank_views();
            let decode = ranks.iter().find(|r| r["rank"] == 1);
            if decode.is_some_and(|r| what(&r["status"]["disagg"])) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// (VmRSS in kB, open fds) of a process.
fn usage(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (rss, fds)
}

fn signal(pid: u32, sig: &str) {
    std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
}

/// What one client request came to.
fn one_request(http: &reqwest::blocking::Client, base: &str, i: u64) -> String {
    let body = |stream: bool| {
        json!({"rid": format!("soak-{i}"), "text": format!("request {i} once upon a time"),
               "stream": stream, "sampling_params": {"max_new_tokens": 8 + i % 24}})
    };
    let sent = Instant::now();
    let outcome = match i % 6 {
        0 => http
            .post(format!("{base}/generate"))
            .json(&body(false))
            .send(),
        1 => http
            .post(format!("{base}/generate"))
            .json(&body(true))
            .send(),
        2 => http
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "m", "prompt": format!("request {i}"), "max_tokens": 8}))
            .send(),
        3 => {
            // A client that vanishes after the response starts.
            return match http
                .post(format!("{base}/generate"))
                .json(&body(true))
                .send()
            {
                Ok(resp) => format!("vanished {}", resp.status().as_u16()),
                Err(e) => classify(&e, sent),
            };
        }
        4 => http
            .post(format!("{base}/generate"))
            .header("content-type", "application/json")
            .body("{not json")
            .send(),
        _ => {
            // Aborted while it runs (the abort may also come before or after it: all fine).
            let rid = format!("soak-{i}");
            let (h, b) = (http.clone(), base.to_string());
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let _ = h
                    .post(format!("{b}/abort_request"))
                    .json(&json!({"rid": rid}))
                    .send();
            });
            let r = http
                .post(format!("{base}/generate"))
                .json(&body(false))
                .send();
            aborter.join().ok();
            r
        }
    };
    match outcome {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let streamed = i % 6 == 1;
            match resp.text() {
                Ok(text) if streamed && status == 200 && !text.contains("[DONE]") => {
                    "stream without [DONE]".into()
                }
                Ok(_) if sent.elapsed() > DEADLINE => "late".into(),
                Ok(_) => format!("http {status}"),
                Err(e) => classify(&e, sent),
            }
        }
        Err(e) => classify(&e, sent),
    }
}

fn classify(e: &reqwest::Error, sent: Instant) -> String {
    if e.is_timeout() || sent.elapsed() > DEADLINE {
        "late".into()
    } else {
        // The tokenizer never goes down here, so a refused connection would be a fault.
        format!("transport error: {e}")
    }
}

/// The unified cycle: a worker killed, a worker stopped, the controller restarted.
fn unified_faults(c: &mut Cluster, faults: &mut BTreeMap<String, u64>) {
    c.watch(3000);
    c.kill("worker 1");
    c.start_rank(Shape::Unified, 1);
    *faults.entry("worker SIGKILL + restart".into()).or_default() += 1;
    c.watch(3000);
    stop_past_the_timeout(c, "worker 0");
    *faults
        .entry("worker SIGSTOP past the timeout + SIGCONT".into())
        .or_default() += 1;
    c.watch(3000);
    step_the_clock(c, -3600.0);
    *faults
        .entry("worker clock stepped back an hour".into())
        .or_default() += 1;
    c.watch(3000);
    step_the_clock(c, 0.0);
    *faults
        .entry("worker clock stepped forward an hour".into())
        .or_default() += 1;
    if controller_restarts() {
        c.watch(3000);
        restart_controller(c, faults, "");
    }
}

/// Sets worker 0's wall clock `offset` seconds from the host's and waits (watching the ledger
/// checks) until the controller reports a status worker 0 stamped with it: a status ordered by
/// the worker's clock would be dropped as stale after a step back, and the rank's load would
/// freeze at its last value (the end's whole-pool check would then fail too).
fn step_the_clock(c: &mut Cluster, offset: f64) {
    std::fs::write(c.clock_file(), format!("{offset}\n")).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let stamped = c.rank_views().iter().any(|r| {
            r["rank"] == 0
                && r["status"]["timestamp"]
                    .as_f64()
                    .is_some_and(|t| (t - (now + offset)).abs() < 60.0)
        });
        if stamped {
            return;
        }
        assert!(
            Instant::now() < end,
            "no status of worker 0 with its clock {offset} s off reached the controller: {}",
            c.server_info().unwrap_or_default()
        );
        c.watch(50);
    }
}

/// The disaggregated cycle: each worker killed and stopped with a transfer under way (when one
/// is under way within a second: the name says which), and the controller killed while
/// requests wait in the decode worker's pre-allocation queue.
fn disaggregated_faults(c: &mut Cluster, faults: &mut BTreeMap<String, u64>) {
    let transfer = |v: &Value| v["num_transfer_reqs"].as_u64().unwrap_or(0) > 0;
    let queued = |v: &Value| v["num_bootstrap_reqs"].as_u64().unwrap_or(0) > 0;
    let during = |hit: bool| if hit { " mid-transfer" } else { "" };
    for (rank, role) in [(0, "prefill"), (1, "decode")] {
        let name = format!("worker {rank}");
        c.watch(2000);
        let hit = c.wait_decode(1000, transfer);
        c.kill(&name);
        c.start_rank(Shape::Disaggregated, rank);
        let fault = format!("{role} SIGKILL{} + restart", during(hit));
        *faults.entry(fault).or_default() += 1;
        c.watch(2000);
        let hit = c.wait_decode(1000, transfer);
        stop_past_the_timeout(c, &name);
        let fault = format!("{role} SIGSTOP{} past the timeout + SIGCONT", during(hit));
        *faults.entry(fault).or_default() += 1;
    }
    if controller_restarts() {
        c.watch(2000);
        let hit = c.wait_decode(2000, queued);
        let how = if hit {
            " with requests in pre-allocation"
        } else {
            ""
        };
        restart_controller(c, faults, how);
    }
}

fn stop_past_the_timeout(c: &mut Cluster, name: &str) {
    let pid = c.pid(name);
    signal(pid, "-STOP");
    std::thread::sleep(Duration::from_millis(2500)); // past the 1.5 s worker timeout
    signal(pid, "-CONT");
}

/// A crash and an orderly stop of the controller, in turn, and a fresh one started.
fn restart_controller(c: &mut Cluster, faults: &mut BTreeMap<String, u64>, how: &str) {
    let crashes: u64 = faults
        .iter()
        .filter(|(k, _)| k.starts_with("controller SIGKILL"))
        .map(|(_, n)| n)
        .sum();
    let stops: u64 = faults
        .iter()
        .filter(|(k, _)| k.starts_with("controller SIGTERM"))
        .map(|(_, n)| n)
        .sum();
    let crash = crashes <= stops;
    if crash {
        c.kill("controller");
    } else {
        c.sigterm("controller");
    }
    c.wait_exit("controller", Duration::from_secs(20));
    c.start_controller();
    let sig = if crash { "SIGKILL" } else { "SIGTERM" };
    *faults
        .entry(format!("controller {sig}{how} + restart"))
        .or_default() += 1;
}

fn soak(shape: Shape, dir_prefix: &str) {
    let env = vec![("DPSERVE_LOG".to_string(), "warn".to_string())];
    let mut c = Cluster::new(Cluster::short_dir(dir_prefix), String::new(), env, &[]);
    c.start_ipc_tokenizer(2, &[]);
    c.start_controller();
    c.start_rank(shape, 0);
    c.start_rank(shape, 1);
    c.wait_live(
        &[0, 1],
        &["tokenizer", "controller"],
        Duration::from_secs(240),
    );
    let http = reqwest::blocking::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    // Warm-up, then the baseline of every long-lived actor.
    for i in 0..12 {
        one_request(&http, &c.base, 1_000_000 + i);
    }
    // The actors that run the whole soak (in the disaggregated one every worker is killed).
    let watched: &[&str] = match shape {
        Shape::Unified => &["tokenizer", "worker 0"],
        Shape::Disaggregated => &["tokenizer"],
    };
    let before: Vec<(u64, usize)> = watched.iter().map(|n| usage(c.pid(n))).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let clients: Vec<_> = (0..4u64)
        .map(|t| {
            let (stop, outcomes, http, base) =
                (stop.clone(), outcomes.clone(), http.clone(), c.base.clone());
            std::thread::spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let o = one_request(&http, &base, i);
                    *outcomes.lock().unwrap().entry(o).or_default() += 1;
                    i += 4;
                }
            })
        })
        .collect();

    // Faults, in a cycle, until the soak time is up.
    let end = Instant::now() + Duration::from_secs(soak_secs());
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    while Instant::now() < end {
        match shape {
            Shape::Unified => unified_faults(&mut c, &mut faults),
            Shape::Disaggregated => disaggregated_faults(&mut c, &mut faults),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().unwrap();
    }
    c.wait_live(
        &[0, 1],
        &["tokenizer", "controller"],
        Duration::from_secs(60),
    );
    let settle = Instant::now() + Duration::from_secs(30);
    while !c.pools_whole() {
        assert!(
            Instant::now() < settle,
            "pools not whole after the soak: {}",
            c.server_info().unwrap_or_default()
        );
        c.watch(200);
    }
    c.watch(0);
    let after: Vec<(u64, usize)> = watched.iter().map(|n| usage(c.pid(n))).collect();

    let outcomes = outcomes.lock().unwrap().clone();
    let total: u64 = outcomes.values().sum();
    println!(
        "soak ({shape:?}): {}s, {total} requests, faults {faults:?}",
        soak_secs()
    );
    println!("outcomes: {outcomes:?}");
    for ((name, b), a) in watched.iter().zip(&before).zip(&after) {
        println!("{name}: RSS {} -> {} kB, fds {} -> {}", b.0, a.0, b.1, a.1);
    }
    let violations: Vec<(&String, &u64)> = outcomes
        .iter()
        .filter(|(o, _)| {
            o.starts_with("late") || o.starts_with("stream without") || o.starts_with("transport")
        })
        .collect();
    assert!(violations.is_empty(), "broken promises: {violations:?}");
    assert!(total > 0 && !faults.is_empty(), "the soak ran: {faults:?}");
    for ((name, b), a) in watched.iter().zip(&before).zip(&after) {
        assert!(
            a.0 < b.0 + RSS_BOUND_KB,
            "{name}'s RSS grew from {} to {} kB",
            b.0,
            a.0
        );
        assert!(
            a.1 <= b.1 + FD_BOUND,
            "{name}'s open fds grew from {} to {}",
            b.1,
            a.1
        );
    }
}

#[test]
fn a_soak_with_faults_keeps_every_promise() {
    soak(Shape::Unified, "dpssoak");
}

#[test]
fn a_disaggregated_soak_with_faults_keeps_every_promise() {
    soak(Shape::Disaggregated, "dpspd");
}
