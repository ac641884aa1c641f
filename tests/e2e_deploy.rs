//! End to end for `deploy/`: the systemd units verify, the example environment file names every
//! flag, and the actors started one process each, the way the units start them (configured by
//! `DPSERVE_*` variables, talking `tcp://` on loopback), form a cluster that grows and shrinks
//! while it serves and refuses a worker serving another model.
//!
//! Not a test of systemd itself: nothing here needs root or a running systemd.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::stories_dir;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_dpserve");
/// Where the units expect the binary; the tests rewrite it to the one cargo built.
const UNIT_BIN: &str = "/usr/local/bin/dpserve";
const UNITS: &[&str] = &[
    "dpserve.target",
    "dpserve-controller.service",
    "dpserve-tokenizer.service",
    "dpserve-worker@.service",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Units and configuration
// ---------------------------------------------------------------------------------------------

/// deploy/README.md's "Files here" names every file under deploy/ (but itself).
#[test]
fn every_file_in_deploy_is_named_in_its_readme() {
    let readme = read(&repo().join("deploy/README.md"));
    let listed = readme
        .split("Files here:")
        .nth(1)
        .and_then(|rest| rest.split("```").nth(1))
        .expect("a \"Files here:\" block in deploy/README.md");
    let mut dirs = vec![repo().join("deploy")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path
                .strip_prefix(repo())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if name != "deploy/README.md" {
                let named = listed
                    .lines()
                    .any(|l| l.split_whitespace().next() == Some(&name));
                assert!(named, "{name} is not in deploy/README.md's \"Files here\"");
            }
        }
    }
}

#[test]
fn systemd_units_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!(
            "skipping: systemd-analyze not found (Debian/Ubuntu: apt-get install -y --no-install-recommends systemd)"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    for unit in UNITS {
        let text = read(&repo().join("deploy/systemd").join(unit));
        if unit.ends_with(".service") {
            assert!(text.contains(UNIT_BIN), "{unit} does not run {UNIT_BIN}");
        }
        // `verify` checks that ExecStart's binary exists: point it at the one cargo built.
        fs::write(dir.path().join(unit), text.replace(UNIT_BIN, BIN)).expect("write unit");
    }
    // The HTTPS drop-in, where an operator installs it (its `LoadCredential=` and `%d` are
    // checked with the unit they extend).
    let drop_in = dir.path().join("dpserve-tokenizer.service.d");
    fs::create_dir(&drop_in).expect("drop-in dir");
    fs::copy(
        repo().join("deploy/systemd/dpserve-tokenizer-https.conf"),
        drop_in.join("https.conf"),
    )
    .expect("copy the HTTPS drop-in");
    // The CURVE drop-in, on every unit (its `LoadCredential=` and `%d` likewise).
    for unit in UNITS.iter().filter(|u| u.ends_with(".service")) {
        let drop_in = dir.path().join(format!("{unit}.d"));
        fs::create_dir_all(&drop_in).expect("drop-in dir");
        fs::copy(
            repo().join("deploy/systemd/dpserve-curve.conf"),
            drop_in.join("curve.conf"),
        )
        .expect("copy the CURVE drop-in");
    }
    // The template is verified through an instance, which is what `systemctl start` loads.
    let mut targets: Vec<PathBuf> = UNITS
        .iter()
        .filter(|u| !u.contains('@'))
        .map(|u| dir.path().join(u))
        .collect();
    targets.push(dir.path().join("dpserve-worker@0.service"));
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .args(&targets)
        // Our directory first, then the system's (a trailing `:` appends the defaults), so
        // the target's Wants= and the units' After= resolve.
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.path().display()))
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Unknown keys and bad values are only warnings (exit 0), so any line about our units,
    // or the binary they run, is a failure too. Lines about the host's own units are not ours.
    let ours: Vec<&str> = stderr
        .lines()
        .chain(stdout.lines())
        .filter(|l| l.contains("dpserve") || l.contains(BIN))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    if !stderr.trim().is_empty() {
        eprintln!("systemd-analyze (not about dpserve units, ignored):\n{stderr}");
    }
}

/// `DPSERVE_*` variables named in one `--help` text, with the default clap shows, if any.
fn help_vars(sub: &str) -> Vec<(String, Option<String>)> {
    let mut cmd = Command::new(BIN);
    cmd.args([sub, "--help"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("DPSERVE_") {
            cmd.env_remove(k); // a set variable would show its value instead of nothing
        }
    }
    let out = cmd.output().expect("run --help");
    assert!(out.status.success(), "dpserve {sub} --help failed");
    // clap wraps long lines; `[env: X=] [default: D]` reads the same once whitespace is joined.
    let text = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut vars = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("[env: DPSERVE_") {
        rest = &rest[at + "[env: ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let after = &rest[name.len()..];
        let default = after
            .find(']')
            .map(|end| after[end + 1..].trim_start())
            .and_then(|tail| tail.strip_prefix("[default: "))
            .and_then(|tail| tail.split(']').next())
            .map(str::to_string);
        vars.push((name, default));
    }
    vars
}

/// `(variable, example value, comment block above it)` for each `#DPSERVE_X=value` line.
fn example_vars() -> Vec<(String, String, String)> {
    let text = read(&repo().join("deploy/dpserve.env.example"));
    let mut vars = Vec::new();
    let mut comment = String::new();
    for line in text.lines() {
        let bare = line.trim_start_matches('#').trim();
        if let Some((name, value)) = bare.split_once('=') {
            if name.starts_with("DPSERVE_") && !name.contains(' ') {
                vars.push((
                    name.to_string(),
                    value.to_string(),
                    std::mem::take(&mut comment),
                ));
                continue;
            }
        }
        if line.trim().is_empty() {
            comment.clear();
        } else {
            comment.push_str(bare);
            comment.push('\n');
        }
    }
    vars
}

#[test]
fn env_example_names_every_flag_with_its_default() {
    let example = example_vars();
    let named: BTreeSet<&str> = example.iter().map(|(n, _, _)| n.as_str()).collect();
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut defaults: Vec<(String, String)> = Vec::new();
    let mut missing = Vec::new();
    for sub in ["tokenizer", "controller", "worker", "up"] {
        for (var, default) in help_vars(sub) {
            // Every actor a unit runs must be configurable from the file; `up`'s own flags
            // are listed for completeness but not required.
            if sub != "up" && !named.contains(var.as_str()) {
                missing.push(format!("{var} (dpserve {sub})"));
            }
            if let Some(d) = default {
                defaults.push((var.clone(), d));
            }
            known.insert(var);
        }
    }
    assert!(
        missing.is_empty(),
        "deploy/dpserve.env.example lacks: {missing:?}"
    );
    for (name, value, comment) in &example {
        if name == "DPSERVE_LOG" {
            continue; // the log filter, read by main, not a flag
        }
        if comment.contains("[coming]") {
            if known.contains(name) {
                eprintln!("note: {name} exists now; drop its [coming] mark in dpserve.env.example");
            }
            continue;
        }
        assert!(
            known.contains(name),
            "dpserve.env.example names {name}, which no actor reads (typo, or a flag that is gone?)"
        );
        // The value shown must be the default, where the binary has one. Addresses are the
        // units' /run/dpserve values by design, not the binary's per-user default.
        let ds: Vec<&String> = defaults
            .iter()
            .filter(|(v, _)| v == name)
            .map(|(_, d)| d)
            .collect();
        if !name.ends_with("_ADDR") && !ds.is_empty() {
            assert!(
                ds.contains(&value),
                "dpserve.env.example shows {name}={value}, but the default is {ds:?}"
            );
        }
    }
}

#[test]
fn units_share_the_runtime_directory_and_user() {
    for unit in UNITS.iter().filter(|u| u.ends_with(".service")) {
        let text = read(&repo().join("deploy/systemd").join(unit));
        let has = |line: &str| text.lines().any(|l| l.trim() == line);
        for line in [
            "User=dpserve",
            "Group=dpserve",
            "RuntimeDirectory=dpserve",
            "RuntimeDirectoryMode=0700",
            "RuntimeDirectoryPreserve=yes",
            "EnvironmentFile=/etc/dpserve/dpserve.env",
            "Restart=on-failure",
            "KillSignal=SIGTERM",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "PrivateTmp=yes",
        ] {
            assert!(has(line), "{unit} lacks `{line}`");
        }
        // Every ipc address a unit sets lives in the shared runtime directory.
        for l in text.lines().filter(|l| l.contains("ipc://")) {
            assert!(l.contains("ipc:///run/dpserve/"), "{unit}: {l}");
        }
        assert!(
            !has("Type=notify"),
            "{unit}: the binary does not call sd_notify"
        );
    }
}

/// `Environment=` pairs and the `ExecStart=` argv (binary dropped) of the worker template, for
/// instance `instance`.
fn worker_unit(instance: &str) -> (Vec<(String, String)>, Vec<String>) {
    let text = read(&repo().join("deploy/systemd/dpserve-worker@.service"));
    let text = text.replace("%i", instance);
    let env = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Environment="))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let exec = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ExecStart="))
        .expect("the worker unit has ExecStart=");
    let argv = exec.split_whitespace().skip(1).map(String::from).collect();
    (env, argv)
}

/// `DPSERVE_DEVICE=cuda`: the instance number is the GPU. The unit leaves the worker only GPU
/// %i visible (`CUDA_VISIBLE_DEVICES=%i`) and passes no `--device` of its own, so the
/// environment file's `cpu`, `sim` or `cuda` decides, and `cuda` is GPU 0 of what the worker
/// sees: GPU %i. Run as the unit runs it, on a GPU no host has (97), the worker names `cuda:0`
/// and exits 78 with the probe's reason.
#[test]
fn worker_unit_puts_a_cuda_rank_on_the_gpu_of_its_instance_number() {
    let (env, argv) = worker_unit("97");
    assert!(
        env.contains(&("CUDA_VISIBLE_DEVICES".into(), "97".into())),
        "{env:?}"
    );
    assert!(
        !argv.iter().any(|a| a.starts_with("--device")),
        "the unit must not pass --device (it would beat DPSERVE_DEVICE): {argv:?}"
    );
    let mut cmd = Command::new(BIN);
    cmd.args(&argv);
    for (k, _) in std::env::vars() {
        if k.starts_with("DPSERVE_") || k == "CUDA_VISIBLE_DEVICES" {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .envs(env)
        .env("DPSERVE_DEVICE", "cuda")
        .output()
        .expect("run the worker as the unit does");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    let line = stderr.trim();
    assert!(
        line.starts_with("dpserve: error: --device cuda:0: "),
        "one line naming cuda:0: {stderr}"
    );
    assert!(
        line.contains("no CUDA driver") || line.contains("CUDA_VISIBLE_DEVICES=97"),
        "{line}"
    );
}

// ---------------------------------------------------------------------------------------------
// A cluster of separately started actors over TCP
// ---------------------------------------------------------------------------------------------

/// `n` distinct free loopback ports (all held open until every one is chosen).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// Actors started like the units start them: `dpserve <sub>` with a shared set of `DPSERVE_*`
/// variables (the EnvironmentFile, here the configuration a multi-host `dpserve.env` would
/// hold, on loopback) plus per-unit ones.
fn deployment(extra: &[(&str, &str)]) -> Cluster {
    let p = free_ports(4);
    let env: Vec<(String, String)> = [
        (
            "DPSERVE_CONTROLLER_ADDR",
            format!("tcp://127.0.0.1:{}", p[0]),
        ),
        ("DPSERVE_WORKER_ADDR", format!("tcp://127.0.0.1:{}", p[1])),
        (
            "DPSERVE_TOKENIZER_ADDR",
            format!("tcp://127.0.0.1:{}", p[2]),
        ),
        ("DPSERVE_HOST", "127.0.0.1".to_string()),
        ("DPSERVE_PORT", p[3].to_string()),
        ("DPSERVE_DP_SIZE", "2".to_string()),
        ("DPSERVE_BUILTIN_SIZE", "tiny".to_string()),
        ("DPSERVE_MAX_TOTAL_TOKENS", "4096".to_string()),
        ("DPSERVE_NUM_THREADS", "1".to_string()),
        ("DPSERVE_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let dir = tempfile::Builder::new()
        .prefix("dpsdeploy")
        .tempdir()
        .expect("temp dir");
    let base = format!("http://127.0.0.1:{}", p[3]);
    Cluster::new(dir, base, env, extra)
}

impl Cluster {
    /// A request pinned to `rank` succeeds there, with all 4 tokens.
    fn assert_serves_4_tokens_on(&self, rank: u64) {
        let resp = self.assert_serves_on(rank);
        assert_eq!(resp["meta_info"]["completion_tokens"], json!(4), "{resp}");
    }
}

/// Start the tokenizer and the controller (the two units of host A).
fn start_host_a(c: &mut Cluster) {
    c.start("tokenizer", &["tokenizer"], &[]);
    c.start("controller", &["controller"], &[]);
    // The tokenizer unit's own readiness check, run for real where curl exists.
    if Command::new("curl").arg("--version").output().is_ok() {
        let port = c.env_var("DPSERVE_PORT");
        let started = Instant::now();
        let status = Command::new("/bin/sh")
            .arg("-c")
            .arg(common::tokenizer_readiness_command())
            .env("DPSERVE_HOST", "127.0.0.1")
            .env("DPSERVE_PORT", &port)
            .status()
            .expect("run the readiness check");
        assert!(
            status.success(),
            "tokenizer readiness check failed after {:?}\n{}",
            started.elapsed(),
            c.all_logs()
        );
    } else {
        eprintln!("note: curl not found; the tokenizer unit's readiness check is not exercised");
    }
}

#[test]
fn tcp_cluster_of_separate_actors_grows_and_shrinks_while_serving() {
    // A long worker timeout: a rank that leaves within seconds left by its Shutdown.
    let mut c = deployment(&[
        ("DPSERVE_WORKER_TIMEOUT", "60"),
        ("DPSERVE_LOAD_BALANCE_METHOD", "round_robin"),
    ]);
    start_host_a(&mut c);
    c.start_worker("worker 0", 0, &[]);
    c.start_worker("worker 1", 1, &[]);
    let host_a = ["tokenizer", "controller"];
    c.wait_live(
        &[0, 1],
        &["tokenizer", "controller", "worker 0", "worker 1"],
        Duration::from_secs(180),
    );
    let info = c.server_info().expect("server info");
    assert_eq!(info["dp_size"], json!(2), "{info}");
    for rank in [0, 1] {
        c.assert_serves_4_tokens_on(rank);
    }

    // Scale up: a third worker process joins and takes traffic; nothing else restarts.
    let pids: Vec<u32> = c.actors.list.iter().map(|a| a.child.id()).collect();
    c.start_worker("worker 2", 2, &[]);
    c.wait_live(
        &[0, 1, 2],
        &["tokenizer", "controller", "worker 2"],
        Duration::from_secs(180),
    );
    c.assert_serves_4_tokens_on(2);
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let (status, _, resp) = c.generate(None);
        assert_eq!(status, 200, "{resp}");
        seen.insert(resp["meta_info"]["dp_rank"].as_u64().expect("dp_rank"));
    }
    assert!(
        seen.contains(&2),
        "round robin never chose the new rank: {seen:?}"
    );
    c.assert_running(&["tokenizer", "controller", "worker 0", "worker 1"]);
    let pids_after: Vec<u32> = c
        .actors
        .list
        .iter()
        .take(pids.len())
        .map(|a| a.child.id())
        .collect();
    assert_eq!(pids, pids_after);

    // Scale down: SIGTERM (systemctl stop dpserve-worker@1) makes rank 1 leave at once, well
    // before its heartbeats could time out (60 s above), and it exits cleanly.
    c.sigterm("worker 1");
    let took = c.wait_live(&[0, 2], &host_a, Duration::from_secs(20));
    eprintln!("rank 1 left the live set {took:?} after SIGTERM");
    let status = c.wait_exit("worker 1", Duration::from_secs(60));
    assert!(
        status.success(),
        "worker 1 exited with {status}\n{}",
        c.log("worker 1")
    );
    let (status, _, resp) = c.generate(Some(1));
    assert_eq!(
        status, 400,
        "a rank that left is a 400, never a reroute: {resp}"
    );
    for _ in 0..4 {
        let (status, _, resp) = c.generate(None);
        assert_eq!(status, 200, "{resp}\n{}", c.all_logs());
        let rank = resp["meta_info"]["dp_rank"].as_u64().expect("dp_rank");
        assert!(rank == 0 || rank == 2, "routed to {rank}: {resp}");
    }
    c.assert_serves_4_tokens_on(0);
    c.assert_serves_4_tokens_on(2);
    c.assert_running(&["tokenizer", "controller", "worker 0", "worker 2"]);
}

#[test]
fn worker_with_another_model_is_refused_and_the_cluster_keeps_serving() {
    let Some(stories) = stories_dir() else {
        return;
    };
    let mut c = deployment(&[("DPSERVE_DP_SIZE", "1")]);
    start_host_a(&mut c);
    c.start_worker("worker 0", 0, &[]);
    c.wait_live(
        &[0],
        &["tokenizer", "controller", "worker 0"],
        Duration::from_secs(180),
    );

    // Same deployment, another model: a rank that would give different answers.
    let path = stories.to_string_lossy().into_owned();
    c.start_worker("worker 1", 1, &[("DPSERVE_MODEL_PATH", path.as_str())]);
    let status = c.wait_exit("worker 1", Duration::from_secs(120));
    assert_eq!(
        status.code(),
        Some(78),
        "a refused worker exits EX_CONFIG so its unit is not restarted"
    );
    let worker_log = c.log("worker 1");
    assert!(
        worker_log.contains("refused by the controller") && worker_log.contains("stories260k"),
        "the worker's log should say it was refused and why:\n{worker_log}"
    );
    let controller_log = c.log("controller");
    assert!(
        controller_log.contains("refusing worker") && controller_log.contains("stories260k"),
        "the controller's log should say whom it refused and why:\n{controller_log}"
    );

    c.assert_running(&["tokenizer", "controller", "worker 0"]);
    assert_eq!(c.live_ranks(), Some(BTreeSet::from([0])));
    c.assert_serves_4_tokens_on(0);
    let (status, _, resp) = c.generate(Some(1));
    assert_eq!(status, 400, "the refused rank never joined: {resp}");
}

/// Graceful stop (issue 7): SIGTERM makes a worker stop taking requests at once and finish the
/// ones it runs within `--drain-timeout`: the controller routes nothing new to the draining rank
/// but lets the request it holds finish.
#[test]
fn sigterm_drains_running_requests_and_stops_routing_at_once() {
    let mut c = deployment(&[
        ("DPSERVE_WORKER_TIMEOUT", "60"),
        ("DPSERVE_DRAIN_TIMEOUT", "120"),
        ("DPSERVE_MAX_TOTAL_TOKENS", "8192"),
    ]);
    start_host_a(&mut c);
    c.start_worker("worker 0", 0, &[]);
    c.start_worker("worker 1", 1, &[]);
    c.wait_live(
        &[0, 1],
        &["tokenizer", "controller", "worker 0", "worker 1"],
        Duration::from_secs(180),
    );

    // A long request on rank 1, still running when SIGTERM lands.
    let max_new = 6000u64;
    let url = format!("{}/generate", c.base);
    let long = std::thread::spawn(move || {
        let resp = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .expect("client")
            .post(url)
            .json(&json!({"text": "hello", "routed_dp_rank": 1,
                          "sampling_params": {"max_new_tokens": max_new, "ignore_eos": true}}))
            .send()
            .expect("POST /generate");
        let status = resp.status().as_u16();
        (status, resp.json::<Value>().unwrap_or(Value::Null))
    });
    c.poll_until("running request on rank 1", Duration::from_secs(60), |c| {
        let info = c.server_info()?;
        let rank_1 = info["ranks"]
            .as_array()?
            .iter()
            .find(|r| r["rank"] == json!(1))?;
        rank_1["status"]["num_running_reqs"]
            .as_u64()
            .filter(|&n| n > 0)
    });
    c.sigterm("worker 1");
    c.wait_live(
        &[0],
        &["tokenizer", "controller", "worker 0"],
        Duration::from_secs(10),
    );
    if long.is_finished() {
        let (status, resp) = long.join().expect("request thread");
        panic!(
            "the running request ended ({status}) before its rank had drained: {resp}\n{}",
            c.all_logs()
        );
    }
    c.assert_serves_4_tokens_on(0);
    let (status, resp) = long.join().expect("request thread");
    assert_eq!(
        status, 200,
        "a running request must survive the drain: {resp}"
    );
    assert_eq!(
        resp["meta_info"]["completion_tokens"],
        json!(max_new),
        "{resp}"
    );
    let status = c.wait_exit("worker 1", Duration::from_secs(60));
    assert!(status.success(), "worker 1 exited with {status}");
}

// ---------------------------------------------------------------------------------------------
// CURVE between hosts: keys, the allow-list, rogue peers
// ---------------------------------------------------------------------------------------------

/// `dpserve keygen DIR/NAME`, as an operator runs it.
fn keygen(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let stem = dir.join(name);
    let out = Command::new(BIN)
        .arg("keygen")
        .arg(&stem)
        .output()
        .expect("dpserve keygen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (stem.with_extension("key"), stem.with_extension("pub"))
}

/// A deployment whose every TCP endpoint is CURVE: host A (tokenizer, controller) holds the
/// `head` keypair and admits the keys in `allow/`; each worker holds its own keypair and
/// host A's public key.
fn curve_deployment(keys: &Path) -> Cluster {
    let (head_key, _) = keygen(keys, "head");
    let allow = keys.join("allow");
    fs::create_dir(&allow).expect("allow dir");
    let head_key = head_key.to_string_lossy().into_owned();
    let allow = allow.to_string_lossy().into_owned();
    deployment(&[
        ("DPSERVE_CURVE_SECRET_KEY", head_key.as_str()),
        ("DPSERVE_CURVE_ALLOW_DIR", allow.as_str()),
        ("DPSERVE_DP_SIZE", "1"),
        ("DPSERVE_WORKER_TIMEOUT", "60"),
    ])
}

impl Cluster {
    /// Start worker `rank` with keypair `key` (none: a plain ZeroMQ worker).
    fn start_keyed_worker(&mut self, name: &str, rank: u32, key: Option<&Path>, keys: &Path) {
        let head_pub = keys.join("head.pub").to_string_lossy().into_owned();
        let key = key.map_or_else(String::new, |k| k.to_string_lossy().into_owned());
        // Empty is unset: a worker without keys has neither.
        let server = if key.is_empty() {
            ""
        } else {
            head_pub.as_str()
        };
        let env = [
            ("DPSERVE_CURVE_ALLOW_DIR", ""),
            ("DPSERVE_CURVE_SERVER_KEY", server),
            ("DPSERVE_CURVE_SECRET_KEY", key.as_str()),
        ];
        self.start_worker(name, rank, &env);
    }

    fn env_var(&self, key: &str) -> String {
        self.env
            .iter()
            .find_map(|(k, v)| (k == key).then(|| v.clone()))
            .unwrap_or_else(|| panic!("{key} not set"))
    }
}

/// Every TCP endpoint under CURVE: a worker whose key is listed joins and serves; a worker with
/// an unlisted key and one without CURVE never join and get no request: each says why and
/// exits 78, and the controller logs the unlisted key; a `TokenOut` forged by a peer without a
/// listed key reaches no client while the real request runs; a key added to the allow-list
/// admits its worker without a restart of host A. The deployment serves throughout.
#[test]
fn curve_admits_listed_keys_only_and_rogue_peers_reach_nothing() {
    let keys = tempfile::tempdir().expect("keys dir");
    let mut c = curve_deployment(keys.path());
    let (w0_key, w0_pub) = keygen(keys.path(), "worker0");
    fs::copy(&w0_pub, keys.path().join("allow/worker0.pub")).expect("list worker0");
    let (rogue_key, rogue_pub) = keygen(keys.path(), "rogue");
    start_host_a(&mut c);
    c.start_keyed_worker("worker 0", 0, Some(&w0_key), keys.path());
    c.wait_live(
        &[0],
        &["tokenizer", "controller", "worker 0"],
        Duration::from_secs(180),
    );
    let info = c.server_info().expect("server info");
    assert_eq!(info["zmq_security"], json!("curve"), "{info}");
    c.assert_serves_4_tokens_on(0);

    // An unlisted key: refused during the handshake; the controller names the key, and the
    // worker says so and exits EX_CONFIG (libzmq would not retry; systemd must not either).
    c.start_keyed_worker("rogue 1", 1, Some(&rogue_key), keys.path());
    let rogue = protocol::curve::PublicKey::load(&rogue_pub).expect("rogue key");
    c.wait_log(
        "controller",
        &format!("key={rogue}"),
        Duration::from_secs(60),
    );
    let status = c.wait_exit("rogue 1", Duration::from_secs(120));
    assert_eq!(status.code(), Some(78), "{}", c.log("rogue 1"));
    let log = c.log("rogue 1");
    assert!(
        log.contains(&format!("refused this process's CURVE key {rogue}")),
        "{log}"
    );
    // The refusal names the actor whose socket refused, beside that actor's own address (it
    // said "refused by the controller" for the tokenizer's socket too).
    let named = |actor: &str, var: &str| {
        let addr = c.env_var(var);
        log.contains(&format!(
            "refused by the {actor}: {addr} refused this process's"
        ))
    };
    assert!(
        named("controller", "DPSERVE_WORKER_ADDR") || named("tokenizer", "DPSERVE_TOKENIZER_ADDR"),
        "{log}"
    );
    // A worker without CURVE: its handshake fails before any key is asked for.
    c.start_keyed_worker("plain 2", 2, None, keys.path());
    let status = c.wait_exit("plain 2", Duration::from_secs(120));
    assert_eq!(status.code(), Some(78), "{}", c.log("plain 2"));
    let log = c.log("plain 2");
    assert!(
        log.contains("one side uses CURVE and the other does not"),
        "{log}"
    );

    // A forged final TokenOut for a running request, from a process with an unlisted key and
    // from one without CURVE, over and over while the request runs.
    let tokenizer_addr: protocol::Endpoint = c
        .env_var("DPSERVE_TOKENIZER_ADDR")
        .parse()
        .expect("tokenizer addr");
    let rogue_pair = protocol::curve::Keypair::load(&rogue_key).expect("rogue keypair");
    let head = protocol::curve::PublicKey::load(&keys.path().join("head.pub")).expect("head");
    let forgers = [zmq::Context::new(), zmq::Context::new()];
    let keyed = protocol::Transport::curve(
        rogue_pair,
        head,
        protocol::curve::AllowList::new(None, vec![]).expect("allow list"),
    );
    let sockets = [
        keyed
            .connect(&forgers[0], zmq::PUSH, &tokenizer_addr, None)
            .expect("forger"),
        protocol::Transport::insecure()
            .connect(&forgers[1], zmq::PUSH, &tokenizer_addr, None)
            .expect("plain forger"),
    ];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forging = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let forged = protocol::encode(&protocol::Message::TokenOut(protocol::TokenOut::error(
                "victim", 500, "FORGED",
            )))
            .expect("encode");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Without waiting: a refused socket has no peer to queue for.
                for s in &sockets {
                    let _ = s.send(&forged[..], zmq::DONTWAIT);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let resp: Value = c
        .http
        .post(format!("{}/generate", c.base))
        .json(&json!({"rid": "victim", "text": "once upon a time",
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": true}}))
        .send()
        .expect("POST /generate")
        .json()
        .expect("json");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    forging.join().expect("forger");
    assert_eq!(resp["meta_info"]["completion_tokens"], json!(400), "{resp}");
    assert!(!resp.to_string().contains("FORGED"), "{resp}");

    // Neither rogue worker ever joined, and a request for their ranks is refused.
    assert_eq!(c.live_ranks(), Some(BTreeSet::from([0])));
    for rank in [1, 2] {
        let (status, _, resp) = c.generate(Some(rank));
        assert_eq!(status, 400, "rank {rank} must not be live: {resp}");
    }
    c.assert_running(&["tokenizer", "controller", "worker 0"]);

    // The operator lists the key and starts that worker again: host A needs no restart.
    fs::copy(&rogue_pub, keys.path().join("allow/rogue.pub")).expect("list rogue");
    c.start_keyed_worker("rogue 1", 1, Some(&rogue_key), keys.path());
    c.wait_live(
        &[0, 1],
        &["tokenizer", "controller", "worker 0", "rogue 1"],
        Duration::from_secs(120),
    );
    c.assert_serves_4_tokens_on(1);
}

/// Safe by default: an actor told to use TCP beyond loopback without keys refuses to start
/// with one line that says how to set keys (exit 78); a secret key others can read, or a
/// missing one, is refused the same way.
#[test]
fn tcp_beyond_loopback_without_keys_or_with_a_bad_key_file_is_refused_at_start() {
    let keys = tempfile::tempdir().expect("keys dir");
    let (key, public) = keygen(keys.path(), "node");
    use std::os::unix::fs::PermissionsExt;
    let open = keys.path().join("open.key");
    fs::copy(&key, &open).expect("copy");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).expect("chmod");
    let open = open.to_string_lossy().into_owned();
    let public = public.to_string_lossy().into_owned();
    let missing = keys
        .path()
        .join("missing.key")
        .to_string_lossy()
        .into_owned();
    let cases: [(&[&str], &str); 6] = [
        (
            &["controller", "--worker-addr", "tcp://0.0.0.0:7"],
            "--curve-secret-key",
        ),
        (
            &["worker", "--rank", "0", "--worker-addr", "tcp://10.0.0.1:7"],
            "--insecure-tcp",
        ),
        (
            &["tokenizer", "--tokenizer-addr", "tcp://*:7"],
            "dpserve keygen",
        ),
        (
            &["controller", "--curve-secret-key", &open],
            "readable by others",
        ),
        (
            &["controller", "--curve-secret-key", &public],
            "no `secret-key",
        ),
        (
            &["controller", "--curve-secret-key", &missing],
            "missing.key",
        ),
    ];
    for (args, says) in cases {
        common::assert_refused_at_start(&format!("{args:?}"), args, says);
    }
}

/// The KV link under CURVE too: a prefill worker binds its TCP KV socket as a CURVE server
/// (admitting the decode worker's listed key) and announces its public key in its `Hello`; the
/// decode worker connects naming that key, from the pairing the controller sends. A request
/// served by the pair completes.
#[test]
fn curve_covers_the_kv_link_between_prefill_and_decode_workers() {
    let keys = tempfile::tempdir().expect("keys dir");
    let mut c = curve_deployment(keys.path());
    let (prefill_key, prefill_pub) = keygen(keys.path(), "prefill");
    let (decode_key, decode_pub) = keygen(keys.path(), "decode");
    for public in [&prefill_pub, &decode_pub] {
        let name = public.file_name().expect("name");
        fs::copy(public, keys.path().join("allow").join(name)).expect("list");
    }
    start_host_a(&mut c);
    let kv_addr = format!("tcp://127.0.0.1:{}", free_ports(1)[0]);
    let head_pub = keys.path().join("head.pub").to_string_lossy().into_owned();
    let allow = c.env_var("DPSERVE_CURVE_ALLOW_DIR");
    let prefill_key = prefill_key.to_string_lossy().into_owned();
    let decode_key = decode_key.to_string_lossy().into_owned();
    c.start_worker(
        "prefill 0",
        0,
        &[
            ("DPSERVE_DISAGGREGATION_MODE", "prefill"),
            ("DPSERVE_DISAGGREGATION_KV_ADDR", kv_addr.as_str()),
            ("DPSERVE_CURVE_SECRET_KEY", prefill_key.as_str()),
            ("DPSERVE_CURVE_SERVER_KEY", head_pub.as_str()),
            ("DPSERVE_CURVE_ALLOW_DIR", allow.as_str()),
        ],
    );
    c.start_worker(
        "decode 1",
        1,
        &[
            ("DPSERVE_DISAGGREGATION_MODE", "decode"),
            ("DPSERVE_CURVE_SECRET_KEY", decode_key.as_str()),
            ("DPSERVE_CURVE_SERVER_KEY", head_pub.as_str()),
            ("DPSERVE_CURVE_ALLOW_DIR", ""),
        ],
    );
    c.wait_live(
        &[0, 1],
        &["tokenizer", "controller", "prefill 0", "decode 1"],
        Duration::from_secs(180),
    );
    for _ in 0..3 {
        let (status, _, resp) = c.generate(None);
        assert_eq!(status, 200, "{resp}\n{}", c.all_logs());
        assert_eq!(resp["meta_info"]["completion_tokens"], json!(4), "{resp}");
    }
}
