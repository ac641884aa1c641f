//! What an operator hits following `deploy/README.md` (issue 16), end to end: actors started one
//! process each, configured by `DPSERVE_*` variables as the systemd units configure them, on the
//! units' kind of endpoints (ipc sockets in one private directory), stopped and killed with real
//! signals.
//!
//! - empty variables (uncommented `DPSERVE_X=` lines of the example file) mean "unset";
//! - a second worker claiming a live rank is refused, and the first keeps its rank;
//! - with the controller down, requests get a 503 with `Retry-After` at once and `/health`
//!   says so; a worker that dies after a controller restart fails its requests at once;
//! - a second controller on the same ipc path is refused, a stale socket is reclaimed;
//! - logs that say what happened (one rejoin line per restart, an honest drain line, a worker
//!   that cannot reach its controller says so, no stray `kill` error from `up`), and a stopping
//!   tokenizer ends its streams;
//! - `dp_size` counts the live ranks, the default KV pool is sized for the requests, and one
//!   unreadable file does not stop `dpserve trace`.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::actors;
use common::cluster::Cluster;
use common::free_port;
use common::sse::{self, Sse};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_dpserve");
/// Model loading on a shared 2-core machine.
const STARTUP: Duration = Duration::from_secs(180);
/// Short, so a dead rank is noticed quickly, but eight heartbeats (250 ms) long.
const WORKER_TIMEOUT_S: u64 = 2;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One deployment on this host: the units' `Environment=` (ipc sockets in one directory) plus
/// what its `dpserve.env` says (`extra`).
fn deployment(extra: &[(&str, &str)]) -> Cluster {
    let dir = Cluster::short_dir("dpsop");
    let port = free_port();
    let ipc = |name: &str| format!("ipc://{}", dir.path().join(name).display());
    let env: Vec<(String, String)> = vec![
        ("DPSERVE_CONTROLLER_ADDR".into(), ipc("controller.sock")),
        ("DPSERVE_WORKER_ADDR".into(), ipc("worker.sock")),
        ("DPSERVE_TOKENIZER_ADDR".into(), ipc("tokenizer.sock")),
        ("DPSERVE_HOST".into(), "127.0.0.1".into()),
        ("DPSERVE_PORT".into(), port.to_string()),
        ("DPSERVE_BUILTIN_SIZE".into(), "tiny".into()),
        ("DPSERVE_MAX_TOTAL_TOKENS".into(), "8192".into()),
        ("DPSERVE_NUM_THREADS".into(), "1".into()),
        ("DPSERVE_HEARTBEAT_INTERVAL_MS".into(), "250".into()),
        (
            "DPSERVE_WORKER_TIMEOUT".into(),
            WORKER_TIMEOUT_S.to_string(),
        ),
        // Long: only the failures under test may end a request.
        ("DPSERVE_REQUEST_TIMEOUT_S".into(), "600".into()),
        ("DPSERVE_LOG".into(), "info".into()),
    ];
    Cluster::new(dir, format!("http://127.0.0.1:{port}"), env, extra)
}

/// This file's steps on the harness's `Cluster` (a trait: every end-to-end file is a module of
/// one binary, and others have steps of the same names).
trait Steps {
    fn start_rank_0_deployment(&mut self);
    fn start_controller(&mut self, name: &str);
    fn start_tokenizer(&mut self);
    fn assert_rank_0_stays_live(&mut self, names: &[&str]);
    fn health(&self) -> u16;
}

/// The actors of [`Steps::start_rank_0_deployment`].
const RANK_0: [&str; 3] = ["tokenizer", "controller", "worker 0"];

impl Steps for Cluster {
    /// A tokenizer, a controller and the worker of rank 0, each its own process as under
    /// systemd; returns once rank 0 is live.
    fn start_rank_0_deployment(&mut self) {
        self.start_tokenizer();
        self.start_controller("controller");
        self.start_worker("worker 0", 0, &[]);
        self.wait_live(&[0], &RANK_0, STARTUP);
    }

    fn start_controller(&mut self, name: &str) {
        self.start(name, &["controller"], &[]);
    }

    fn start_tokenizer(&mut self) {
        self.start("tokenizer", &["tokenizer"], &[]);
    }

    /// For longer than two heartbeat timeouts, every actor in `names` keeps running and only
    /// rank 0 is live.
    fn assert_rank_0_stays_live(&mut self, names: &[&str]) {
        let watch = Instant::now() + Duration::from_secs(2 * WORKER_TIMEOUT_S + 1);
        while Instant::now() < watch {
            self.actors.assert_running(names);
            assert_eq!(
                self.live_ranks(),
                Some(BTreeSet::from([0])),
                "rank 0 left the live set\n{}",
                self.all_logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn health(&self) -> u16 {
        self.http
            .get(format!("{}/health", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    }
}

/// A long streaming request on rank `rank`; its events arrive on the returned channel.
fn long_stream(base: &str, rid: &str, rank: u64) -> mpsc::Receiver<Sse> {
    let body = json!({"rid": rid, "text": "hello", "stream": true, "routed_dp_rank": rank,
                      "sampling_params": {"max_new_tokens": 7000, "ignore_eos": true}});
    sse::stream(base, &[], body)
}

/// Wait for the stream's first chunk of tokens.
fn first_chunk(c: &Cluster, events: &mpsc::Receiver<Sse>) {
    match events.recv_timeout(Duration::from_secs(120)) {
        Ok(Sse::Data(chunk)) => assert!(chunk.get("error").is_none(), "{chunk}"),
        other => panic!("no first chunk: {other:?}\n{}", c.all_logs()),
    }
}

/// Read the stream to its end within `within`: the error event it must end with, then
/// `[DONE]`.
fn stream_error(c: &Cluster, events: &mpsc::Receiver<Sse>, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    let mut error = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Sse::Data(chunk)) if chunk.get("error").is_some() => {
                assert!(error.is_none(), "a second error: {chunk}");
                error = Some(chunk);
            }
            Ok(Sse::Data(chunk)) => assert!(error.is_none(), "data after the error: {chunk}"),
            Ok(Sse::Done) => break,
            Ok(Sse::Closed(why)) => panic!("stream ended without [DONE]: {why}\n{}", c.all_logs()),
            Err(_) => panic!("the stream did not end within {within:?}\n{}", c.all_logs()),
        }
    }
    error.expect("an error event before [DONE]")
}

// ---------------------------------------------------------------------------------------------
// 1 and 6: empty variables, dp_size, the default KV pool
// ---------------------------------------------------------------------------------------------

/// The `#DPSERVE_X=` lines of `deploy/dpserve.env.example` that have no value.
fn empty_example_vars() -> Vec<String> {
    let text = fs::read_to_string(repo().join("deploy/dpserve.env.example")).expect("example");
    text.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter_map(|l| l.strip_suffix('='))
        .filter(|name| name.starts_with("DPSERVE_") && !name.contains(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn uncommented_empty_lines_of_the_env_example_mean_unset() {
    let empty = empty_example_vars();
    for risky in [
        "DPSERVE_API_KEY",
        "DPSERVE_MODEL_ID",
        "DPSERVE_MAX_TOTAL_TOKENS",
        "DPSERVE_NUM_THREADS",
        "DPSERVE_CONTEXT_LENGTH",
        "DPSERVE_CHAT_TEMPLATE",
    ] {
        assert!(
            empty.iter().any(|v| v == risky),
            "{risky}= is no longer in the example: {empty:?}"
        );
    }
    // Every empty line uncommented, as an operator would, and DPSERVE_DP_SIZE left out.
    let mut c = deployment(&[]);
    c.env
        .retain(|(k, _)| !empty.contains(k) && k != "DPSERVE_DP_SIZE");
    c.env
        .extend(empty.iter().map(|k| (k.clone(), String::new())));
    c.start_tokenizer();
    c.start_controller("controller");
    c.start_worker("worker 0", 0, &[]);
    // Given a memory share, the pool takes what it allows rather than the default cap.
    c.start_worker("worker 1", 1, &[("DPSERVE_MEM_FRACTION", "0.5")]);
    let all = ["tokenizer", "controller", "worker 0", "worker 1"];
    c.wait_live(&[0, 1], &all, STARTUP);

    // No API key: no Authorization header needed. The default chat template works.
    c.assert_serves_on(0);
    c.assert_serves_on(1);
    let resp = c
        .http
        .post(format!("{}/v1/chat/completions", c.base))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        .send()
        .expect("POST /v1/chat/completions");
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text());

    let info = c.server_info().expect("server info");
    assert_eq!(info["api_key_required"], json!(false), "{info}");
    // dp_size counts the live ranks (DPSERVE_DP_SIZE is unset, so the flag says 1).
    assert_eq!(info["dp_size"], json!(2), "{info}");
    // The default pool: 2048 slots per running request (64), not a share of the host; with
    // DPSERVE_MEM_FRACTION set, a full context (8192) per request.
    let pool = |rank: u64| {
        info["ranks"]
            .as_array()
            .and_then(|ranks| ranks.iter().find(|r| r["rank"] == json!(rank)))
            .map(|r| r["capacity"]["max_total_tokens"].clone())
    };
    assert_eq!(pool(0), Some(json!(64 * 2048)), "{info}");
    assert_eq!(pool(1), Some(json!(64 * 8192)), "{info}");
}

// ---------------------------------------------------------------------------------------------
// 2: a duplicate rank
// ---------------------------------------------------------------------------------------------

#[test]
fn a_second_worker_claiming_a_live_rank_is_refused_and_the_first_keeps_it() {
    let mut c = deployment(&[]);
    c.start_rank_0_deployment();

    c.start_worker("duplicate 0", 0, &[]);
    let status = c.wait_exit("duplicate 0", STARTUP);
    assert_eq!(
        status.code(),
        Some(78),
        "a refused worker exits EX_CONFIG, so its unit is not restarted\n{}",
        c.all_logs()
    );
    let dup = c.log("duplicate 0");
    assert!(
        dup.contains("refused by the controller") && dup.contains("already held by a live worker"),
        "the duplicate's log should say why it was refused:\n{dup}"
    );
    let pid = c.actors.get("worker 0").child.id();
    let ctl = c.log("controller");
    assert!(
        ctl.contains("refusing worker")
            && ctl.contains("already held by a live worker")
            && ctl.contains(&format!("pid {pid}")),
        "the controller's log should say whom it refused and who holds the rank:\n{ctl}"
    );

    // The first worker keeps its rank for longer than a heartbeat timeout after the duplicate
    // left (its Shutdown and silence are not the rank's), and serves.
    c.assert_rank_0_stays_live(&RANK_0);
    c.assert_serves_on(0);
}

// ---------------------------------------------------------------------------------------------
// 3 and 4: the controller down, restarted, duplicated
// ---------------------------------------------------------------------------------------------

#[test]
fn with_the_controller_down_requests_get_503_and_retry_after_at_once() {
    let mut c = deployment(&[]);
    c.start_rank_0_deployment();
    assert_eq!(c.health(), 200);

    c.actors.kill("controller");
    let killed = Instant::now();
    while c.health() != 503 {
        // Stale after 1.5 s without a cluster status (was 5 s).
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "/health still not 503 {:?} after the controller died",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("/health said 503 {:?} after SIGKILL", killed.elapsed());
    // Well past the old 5 s stale window too: every request is answered, quickly.
    for round in 0..3 {
        let asked = Instant::now();
        let (status, retry_after, body) = c.generate(None);
        assert_eq!(status, 503, "round {round}: {body}");
        assert!(retry_after.is_some(), "round {round}: no Retry-After");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("controller")),
            "{body}"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        std::thread::sleep(Duration::from_secs(2));
    }

    // Back: the stale socket of the killed controller is reclaimed, the worker rejoins, and
    // requests are served again (after at most a few more 503s, while the tokenizer's
    // connection to the new controller comes up).
    c.start_controller("controller");
    c.wait_live(&[0], &RANK_0, STARTUP);
    let body = c.poll_until("200 again", Duration::from_secs(10), |c| {
        let (status, retry_after, body) = c.generate(Some(0));
        assert!(
            status == 200 || (status == 503 && retry_after.is_some()),
            "{status}: {body}"
        );
        (status == 200).then_some(body)
    });
    assert_eq!(body["meta_info"]["dp_rank"], json!(0), "{body}");
}

/// The tokenizer restarted alone (its unit restarts, the controller stays): the new process
/// numbers its requests from 1 again, below what the controller took from the old one, and
/// still reads the controller's statuses as its word and serves.
#[test]
fn a_restarted_tokenizer_serves_again_beside_the_same_controller() {
    let mut c = deployment(&[]);
    c.start_rank_0_deployment();
    for _ in 0..5 {
        let (status, _, body) = c.generate(None);
        assert_eq!(status, 200, "{body}");
    }
    c.actors.kill("tokenizer");
    c.start_tokenizer();
    let within = Duration::from_secs(30);
    c.poll_until("listening tokenizer", within, |c| {
        (c.health() != 0).then_some(())
    });
    c.poll_until("200 from the restarted tokenizer", within, |c| {
        (c.generate(None).0 == 200).then_some(())
    });
    // And keeps serving past its staleness bound (1.5 s without a status it accepts).
    std::thread::sleep(Duration::from_secs(2));
    for _ in 0..3 {
        let (status, _, body) = c.generate(None);
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn a_worker_that_dies_after_a_controller_restart_fails_its_requests_at_once() {
    let mut c = deployment(&[]);
    c.start_tokenizer();
    c.start_controller("controller");
    c.start_worker("worker 0", 0, &[]);
    c.start_worker("worker 1", 1, &[]);
    let all = ["tokenizer", "controller", "worker 0", "worker 1"];
    c.wait_live(&[0, 1], &all, STARTUP);

    let events = long_stream(&c.base, "held-across-restart", 0);
    first_chunk(&c, &events);
    c.actors.kill("controller");
    c.start_controller("controller");
    // The tokenizer's view may still be the old controller's: wait for the new one's word
    // that both ranks registered again.
    c.wait_log("controller", "Hello again", STARTUP);
    c.wait_live(&[0, 1], &all, STARTUP);

    // The new controller adopted what rank 0 holds: its death fails the request at once
    // (heartbeat timeout), not at the 600 s request timeout.
    c.actors.kill("worker 0");
    let error = stream_error(&c, &events, Duration::from_secs(WORKER_TIMEOUT_S + 30));
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rank 0") && message.contains("stopped responding"),
        "{error}"
    );

    // One line about the workers asked to rejoin, not one per heartbeat or status.
    let ctl = c.log("controller");
    let asked = ctl.lines().filter(|l| l.contains("Hello again")).count();
    let joined = ctl.lines().filter(|l| l.contains("rank joined")).count();
    assert_eq!(asked, 1, "new controller's log:\n{ctl}");
    assert_eq!(joined, 0, "rejoining ranks are in the summary line:\n{ctl}");
    assert!(ctl.contains("rejoined={0, 1}"), "{ctl}");
}

#[test]
fn a_second_controller_on_the_same_ipc_path_is_refused() {
    let mut c = deployment(&[]);
    c.start_rank_0_deployment();

    c.start_controller("second controller");
    let status = c.wait_exit("second controller", Duration::from_secs(60));
    assert!(!status.success(), "the second controller ran");
    let log = c.log("second controller");
    assert!(
        log.contains("already served by a running process")
            && !log.contains("controller listening"),
        "{log}"
    );
    // The first one still owns every path and serves; its worker is still heard.
    c.assert_rank_0_stays_live(&RANK_0);
    c.assert_serves_on(0);
}

// ---------------------------------------------------------------------------------------------
// 5: what the logs say, and a stopping tokenizer
// ---------------------------------------------------------------------------------------------

#[test]
fn a_stopping_tokenizer_ends_open_streams_with_an_error_and_done() {
    let mut c = deployment(&[]);
    c.start_rank_0_deployment();

    let events = long_stream(&c.base, "cut-by-stop", 0);
    first_chunk(&c, &events);
    c.actors.sigterm("tokenizer");
    let error = stream_error(&c, &events, Duration::from_secs(4));
    assert_eq!(error["error"]["code"], json!(503), "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tokenizer is stopping")),
        "{error}"
    );
    let status = c.wait_exit("tokenizer", Duration::from_secs(30));
    assert!(status.success(), "tokenizer exited with {status}");
}

#[test]
fn a_finished_drain_is_logged_as_such_and_a_lost_worker_says_it_is_lost() {
    let mut c = deployment(&[("DPSERVE_DRAIN_TIMEOUT", "120")]);
    c.start_tokenizer();
    c.start_controller("controller");
    c.start_worker("worker 0", 0, &[]);
    // Pointed at a socket nobody binds: it must say so while it waits.
    let nowhere = format!("ipc://{}", c.dir.path().join("nowhere.sock").display());
    c.start_worker(
        "lost worker",
        5,
        &[("DPSERVE_WORKER_ADDR", nowhere.as_str())],
    );
    c.wait_live(&[0], &RANK_0, STARTUP);

    // A request that ends on its own while its rank drains.
    let url = format!("{}/generate", c.base);
    let request = std::thread::spawn(move || {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .expect("client")
            .post(url)
            .json(&json!({"text": "hello", "routed_dp_rank": 0,
                          "sampling_params": {"max_new_tokens": 4000, "ignore_eos": true}}))
            .send()
            .map(|r| r.status().as_u16())
    });
    c.poll_until("running request", Duration::from_secs(60), |c| {
        c.server_info()
            .and_then(|i| i["ranks"][0]["status"]["num_running_reqs"].as_u64())
            .filter(|&n| n > 0)
    });
    c.actors.sigterm("worker 0");
    assert_eq!(request.join().expect("request thread").ok(), Some(200));
    let status = c.wait_exit("worker 0", Duration::from_secs(60));
    assert!(status.success(), "worker 0 exited with {status}");
    c.wait_log("controller", "rank left", Duration::from_secs(10));
    let ctl = c.log("controller");
    assert!(ctl.contains("drained: its requests finished in"), "{ctl}");
    assert!(!ctl.contains("ran out"), "{ctl}");

    c.wait_log(
        "lost worker",
        "no answer from a controller",
        Duration::from_secs(60),
    );
    let log = c.log("lost worker");
    let warning = log
        .lines()
        .find(|l| l.contains("no answer from a controller"))
        .unwrap_or_default();
    assert!(
        warning.contains("WARN") && warning.contains("nowhere.sock"),
        "{log}"
    );
}

/// The children of process `pid`, by command line.
fn children(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let list = fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in list
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let cmdline = fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            out.push((child, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    out
}

#[test]
fn up_stopping_after_a_child_died_prints_no_stray_kill_errors() {
    let dir = tempfile::Builder::new()
        .prefix("dpsup")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let stderr = dir.path().join("up.stderr");
    let port = free_port().to_string();
    let args: Vec<String> = [
        "up",
        "--port",
        &port,
        "--dp-size",
        "1",
        "--builtin-size",
        "tiny",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([
        "--runtime-dir".to_string(),
        dir.path().join("rt").display().to_string(),
    ])
    .collect();
    let mut up = actors::command(&args)
        .env("DPSERVE_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("spawn dpserve up");
    // Kept open to the end: up may still print.
    let mut stdout = BufReader::new(up.stdout.take().expect("stdout")).lines();
    let ready = stdout
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("dpserve is ready"));
    assert!(
        ready,
        "up never got ready:\n{}",
        fs::read_to_string(&stderr).unwrap_or_default()
    );
    // The controller dies: up stops the deployment, and must not try to signal the dead one.
    let (controller, _) = children(up.id())
        .into_iter()
        .find(|(_, cmd)| cmd.contains(" controller"))
        .expect("up's controller child");
    Command::new("kill")
        .args(["-KILL", &controller.to_string()])
        .status()
        .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = up.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            up.kill().ok();
            panic!("up did not stop after its controller died");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = fs::read_to_string(&stderr).unwrap_or_default();
    assert!(!status.success(), "{log}");
    assert!(log.contains("controller exited"), "{log}");
    assert!(!log.contains("No such process"), "{log}");
    drop(stdout);
}

// ---------------------------------------------------------------------------------------------
// 6: dpserve trace with an unreadable file
// ---------------------------------------------------------------------------------------------

#[test]
fn trace_merge_skips_an_unreadable_file_with_a_warning() {
    let dir = tempfile::tempdir().expect("temp dir");
    let line = json!({"t": 5.0, "actor": "tokenizer", "dir": "send", "type": "GenerateReq",
                      "rid": "r1", "peer": "controller", "bytes": 40});
    let done = json!({"t": 5.5, "actor": "tokenizer", "dir": "event", "type": "finished",
                      "rid": "r1", "detail": "reason=stop completion_tokens=1"});
    fs::write(
        dir.path().join("tokenizer.jsonl"),
        format!("{line}\n{done}\n"),
    )
    .expect("write");
    // A file that opens but cannot be read (EIO at offset 0), even for root.
    let bad = dir.path().join("worker-0.jsonl");
    std::os::unix::fs::symlink(Path::new("/proc/self/mem"), &bad).expect("symlink");
    let out = Command::new(BIN)
        .args(["trace", dir.path().to_str().expect("utf-8"), "--rid", "r1"])
        .env_remove("DPSERVE_LOG")
        .output()
        .expect("run dpserve trace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: skipped") && stderr.contains("worker-0.jsonl"),
        "{stderr}"
    );
    assert!(
        stdout.contains("finished after 500.0 ms (reason: stop)"),
        "{stdout}"
    );
}

#[test]
fn an_api_key_file_that_cannot_be_used_stops_the_start_with_one_line_and_78() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("keys");
    fs::write(&empty, "# no key yet\n\n").unwrap();
    let missing = dir.path().join("absent");
    for (what, args) in [
        (
            "up, missing file",
            vec!["up", "--api-key-file", missing.to_str().unwrap()],
        ),
        (
            "up, no key in it",
            vec!["up", "--api-key-file", empty.to_str().unwrap()],
        ),
        (
            "up, none beside health",
            vec!["up", "--api-key", "k", "--open-endpoints", "none,health"],
        ),
        (
            "tokenizer, missing file",
            vec!["tokenizer", "--api-key-file", missing.to_str().unwrap()],
        ),
    ] {
        let want = if what.contains("none") {
            "--open-endpoints"
        } else {
            "--api-key-file"
        };
        // `up` checks it before starting any actor.
        common::assert_refused_at_start(what, &args, want);
    }
}
