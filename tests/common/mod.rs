//! Test harness: start a real `dpserve up` on a free port in a private runtime directory, wait
//! for its ready line, and stop it (SIGTERM, then SIGKILL) when dropped.

#![allow(dead_code)]

pub mod actors;
pub mod cluster;
pub mod generate;
pub mod sse;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The dpserve under test: the one cargo built, or `DPSERVE_TEST_BIN` (scripts/gpu-check.sh
/// runs these test executables on a machine without the build tree).
pub fn dpserve_bin() -> PathBuf {
    std::env::var_os("DPSERVE_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_dpserve")))
}

/// The stories260k model beside the checkout (or under `DPSERVE_TEST_SHARED`), if present.
pub fn stories_dir() -> Option<PathBuf> {
    let shared = std::env::var_os("DPSERVE_TEST_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let dir = shared.join("models/stories260k");
    if dir.join("model.safetensors").exists() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: ../shared/models/stories260k not found beside the checkout ({})",
            dir.display()
        );
        None
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

pub struct Server {
    child: Child,
    /// The line `up` printed when ready (`dpserve is ready: URL (N ranks live)`).
    pub ready: String,
    pub port: u16,
    pub runtime_dir: tempfile::TempDir,
    pub base: String,
}

impl Server {
    /// `dpserve up` with `args`, ready to serve.
    pub fn up(args: &[&str]) -> Server {
        Self::up_with_env(args, &[])
    }

    /// Two ranks of the tiny built-in model with 4096-token pools, and `extra` flags.
    pub fn tiny(extra: &[&str]) -> Server {
        Self::tiny_with_env(extra, &[])
    }

    /// [`Server::tiny`] with extra environment variables.
    pub fn tiny_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut args = vec![
            "--builtin-size",
            "tiny",
            "--dp-size",
            "2",
            "--max-total-tokens",
            "4096",
        ];
        args.extend_from_slice(extra);
        Self::up_with_env(&args, env)
    }

    /// `dpserve up` with `args` and extra environment variables, ready to serve.
    pub fn up_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        // Short path: ipc socket paths are limited to 107 bytes.
        let runtime_dir = tempfile::Builder::new()
            .prefix("dps")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let mut child = Command::new(dpserve_bin())
            .arg("up")
            .args(["--port", &port.to_string()])
            .arg("--runtime-dir")
            .arg(runtime_dir.path())
            .args(args)
            .env("DPSERVE_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn dpserve up");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(240);
        let ready = loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.contains("dpserve is ready") => break line,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!("dpserve up exited before ready: {status}");
                    }
                    assert!(Instant::now() < deadline, "dpserve up not ready in time");
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait();
                    panic!("dpserve up closed stdout before ready: {status:?}");
                }
            }
        };
        Server {
            child,
            ready,
            port,
            runtime_dir,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn client() -> reqwest::blocking::Client {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("client")
    }

    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let resp = Self::client()
            .post(self.url(path))
            .json(body)
            .send()
            .expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().expect("body");
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"));
        (status, json)
    }

    pub fn post_raw(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let resp = Self::client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().expect("body");
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"));
        (status, json)
    }

    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = Self::client().get(self.url(path)).send().expect("request");
        let status = resp.status().as_u16();
        let json = resp.json().unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    /// POST with `stream: true`; returns the parsed `data:` chunks before `[DONE]`.
    pub fn stream(&self, path: &str, body: &serde_json::Value) -> Vec<serde_json::Value> {
        let resp = Self::client()
            .post(self.url(path))
            .json(body)
            .send()
            .expect("request");
        assert_eq!(resp.status().as_u16(), 200, "stream status");
        let text = resp.text().expect("body");
        let mut chunks = Vec::new();
        let mut done = false;
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            assert!(!done, "data after [DONE]");
            if data == "[DONE]" {
                done = true;
                continue;
            }
            chunks.push(serde_json::from_str(data).expect("chunk JSON"));
        }
        assert!(done, "stream did not end with [DONE]: {text}");
        chunks
    }

    /// POSTs every body to `path` at once, each from its own thread (released together), and
    /// returns the threads: join one for its [`Reply`].
    pub fn post_concurrently(
        &self,
        path: &str,
        bodies: Vec<serde_json::Value>,
    ) -> Vec<std::thread::JoinHandle<Reply>> {
        let start = std::sync::Arc::new(std::sync::Barrier::new(bodies.len()));
        bodies
            .into_iter()
            .map(|body| {
                let (url, start) = (self.url(path), start.clone());
                std::thread::spawn(move || {
                    let client = Self::client();
                    start.wait();
                    let sent = Instant::now();
                    let resp = client.post(url).json(&body).send().expect("request");
                    let status = resp.status().as_u16();
                    let retry_after = resp
                        .headers()
                        .get("retry-after")
                        .map(|v| v.to_str().unwrap_or_default().to_string());
                    let body = resp.json().unwrap_or_default();
                    Reply {
                        status,
                        retry_after,
                        body,
                        took: sent.elapsed(),
                    }
                })
            })
            .collect()
    }

    /// The value of one series of `/metrics` (e.g. `dpserve:x_total{dp_rank="1"}`); panics,
    /// showing the exposition, when it is not there.
    pub fn metric(&self, series: &str) -> f64 {
        let text = Self::client()
            .get(self.url("/metrics"))
            .send()
            .and_then(|r| r.text())
            .expect("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} not in /metrics:\n{text}"))
    }

    /// Stop with SIGTERM and wait; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        self.stop_within(Duration::from_secs(20))
    }

    /// [`Server::stop`], waiting up to `within` (a worker drains what it holds for up to its
    /// `--drain-timeout`, 30 s by default); false when killed at the deadline or not clean.
    pub fn stop_within(&mut self, within: Duration) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    self.child.kill().ok();
                    self.child.wait().ok();
                    return false;
                }
            }
        }
    }
}

/// What one of [`Server::post_concurrently`]'s requests came back with.
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: serde_json::Value,
    /// From sending to the whole body received.
    pub took: Duration,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// `dpserve args…` (on a free port) is refused at start as a configuration error: exit status
/// 78, one error line, `dpserve: error: …` naming `want`, and nothing started.
pub fn assert_refused_at_start(what: &str, args: &[&str], want: &str) {
    let out = Command::new(dpserve_bin())
        .args(args)
        .env("DPSERVE_PORT", free_port().to_string())
        .output()
        .expect("run dpserve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{what}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{what}: one line saying why:\n{stderr}");
    assert!(
        errors[0].starts_with("dpserve: error: ") && errors[0].contains(want),
        "{what}: {stderr}"
    );
    assert!(
        !stderr.contains("started"),
        "{what}: nothing starts:\n{stderr}"
    );
}

/// The tokenizer unit's `ExecStartPost=` readiness check, as `/bin/sh` would run it.
pub fn tokenizer_readiness_command() -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/dpserve-tokenizer.service");
    let unit = std::fs::read_to_string(&path).expect("read the tokenizer unit");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStartPost="))
        .expect("the tokenizer unit has an ExecStartPost= readiness check");
    // systemd turns `$$` into `$` before the shell sees the line.
    line.replace("$$", "$")
}

/// Runs `python3 args…` in the checkout against the built binary (`DPSERVE_BIN`), so a Python
/// suite under `tests/python` is part of `cargo test`. Skips with a message when `module` (the
/// pinned package the suite drives, named `what`) cannot be imported.
pub fn run_python_suite(what: &str, module: &str, args: &[&str]) {
    run_python_suite_with_env(what, module, args, &[]);
}

/// [`run_python_suite`] with extra environment variables.
pub fn run_python_suite_with_env(what: &str, module: &str, args: &[&str], env: &[(&str, &str)]) {
    let probe = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output();
    if !matches!(&probe, Ok(out) if out.status.success()) {
        eprintln!(
            "skipping: the {what} Python package is not installed \
             (pip install -r tests/python/requirements.txt)"
        );
        return;
    }
    let out = Command::new("python3")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("DPSERVE_BIN", env!("CARGO_BIN_EXE_dpserve"))
        .envs(env.iter().copied())
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} tests failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{stderr}");
}
