//! One deployment of separately started actors, as the end-to-end tests of `deploy/`, the
//! operator's path and failover run it: processes logging into one private directory (which
//! also holds their ipc sockets), the `DPSERVE_*` variables every actor gets (what the units'
//! `EnvironmentFile` would say), and an HTTP client for the tokenizer. Every process is stopped
//! when dropped. Each test file adds the requests it makes in an `impl Cluster` of its own.

use std::collections::BTreeSet;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::actors::{self, Actor, Actors};

pub struct Cluster {
    /// First, so the processes stop before their directory goes.
    pub actors: Actors,
    pub dir: tempfile::TempDir,
    /// Given to every actor started with [`Cluster::start`].
    pub env: Vec<(String, String)>,
    /// The tokenizer's `http://host:port`.
    pub base: String,
    pub http: reqwest::blocking::Client,
}

impl Cluster {
    /// A deployment in `dir` whose tokenizer answers at `base`, with `env` for every actor and
    /// `extra` on top (an `extra` variable replaces the same one in `env`).
    pub fn new(
        dir: tempfile::TempDir,
        base: String,
        mut env: Vec<(String, String)>,
        extra: &[(&str, &str)],
    ) -> Cluster {
        for (k, v) in extra {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v.to_string()));
        }
        Cluster {
            actors: Actors::default(),
            dir,
            env,
            base,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("client"),
        }
    }

    /// A private directory under /tmp: ipc socket paths are limited to 107 bytes.
    pub fn short_dir(prefix: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .expect("temp dir")
    }

    /// An ipc endpoint in the deployment's directory.
    pub fn ipc(&self, name: &str) -> String {
        format!("ipc://{}", self.dir.path().join(name).display())
    }

    /// `dpserve <args>` as actor `name`, with the deployment's variables and `env` on top.
    pub fn start(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut cmd = actors::command(&args); // only what the "EnvironmentFile" says
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().copied());
        self.actors.spawn(name, self.dir.path(), cmd);
    }

    /// `dpserve worker --rank R` as actor `name`, as `dpserve-worker@R.service` runs it.
    pub fn start_worker(&mut self, name: &str, rank: u32, env: &[(&str, &str)]) {
        let r = rank.to_string();
        let mut all = vec![("DPSERVE_RANK", r.as_str())];
        all.extend_from_slice(env);
        self.start(name, &["worker", "--rank", &r], &all);
    }

    /// `dpserve controller` on the deployment's ipc sockets (`c.sock`, `w.sock`, `t.sock`),
    /// with `extra` flags.
    pub fn start_ipc_controller(&mut self, extra: &[&str]) {
        let (c, w, t) = (self.ipc("c.sock"), self.ipc("w.sock"), self.ipc("t.sock"));
        let mut args = vec![
            "controller",
            "--controller-addr",
            &c,
            "--worker-addr",
            &w,
            "--tokenizer-addr",
            &t,
        ];
        args.extend_from_slice(extra);
        self.start("controller", &args, &[]);
    }

    /// `dpserve tokenizer` for `dp_size` ranks on the deployment's ipc sockets and a free
    /// port (which becomes [`Cluster::base`]), with `extra` flags.
    pub fn start_ipc_tokenizer(&mut self, dp_size: u32, extra: &[&str]) {
        let port = super::free_port();
        self.base = format!("http://127.0.0.1:{port}");
        let (port, dp) = (port.to_string(), dp_size.to_string());
        let (t, c) = (self.ipc("t.sock"), self.ipc("c.sock"));
        let mut args = vec![
            "tokenizer",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--tokenizer-addr",
            &t,
            "--controller-addr",
            &c,
            "--dp-size",
            &dp,
        ];
        args.extend_from_slice(extra);
        self.start("tokenizer", &args, &[]);
    }

    /// A worker of the tiny built-in model as actor `worker <rank>` (8192 KV slots, one
    /// thread) on the deployment's ipc sockets, with `extra` flags.
    pub fn start_tiny_rank(&mut self, rank: u32, extra: &[&str]) {
        self.start_tiny_rank_with_env(rank, extra, &[]);
    }

    /// [`Cluster::start_tiny_rank`] with extra environment variables.
    pub fn start_tiny_rank_with_env(&mut self, rank: u32, extra: &[&str], env: &[(&str, &str)]) {
        let r = rank.to_string();
        let (w, t) = (self.ipc("w.sock"), self.ipc("t.sock"));
        let mut args = vec![
            "worker",
            "--rank",
            &r,
            "--builtin-size",
            "tiny",
            "--worker-addr",
            &w,
            "--tokenizer-addr",
            &t,
            "--max-total-tokens",
            "8192",
            "--num-threads",
            "1",
        ];
        args.extend_from_slice(extra);
        self.start(&format!("worker {rank}"), &args, env);
    }

    pub fn actor(&mut self, name: &str) -> &mut Actor {
        self.actors.get(name)
    }

    pub fn log(&self, name: &str) -> String {
        self.actors.log(name)
    }

    pub fn all_logs(&self) -> String {
        self.actors.all_logs()
    }

    pub fn assert_running(&mut self, names: &[&str]) {
        self.actors.assert_running(names)
    }

    pub fn sigterm(&mut self, name: &str) {
        self.actors.sigterm(name)
    }

    pub fn kill(&mut self, name: &str) {
        self.actors.kill(name)
    }

    pub fn wait_exit(&mut self, name: &str, within: Duration) -> ExitStatus {
        self.actors.wait_exit(name, within)
    }

    pub fn server_info(&self) -> Option<Value> {
        self.http
            .get(format!("{}/get_server_info", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .ok()?
            .json()
            .ok()
    }

    pub fn live_ranks(&self) -> Option<BTreeSet<u64>> {
        let info = self.server_info()?;
        Some(
            info["live_ranks"]
                .as_array()?
                .iter()
                .filter_map(Value::as_u64)
                .collect(),
        )
    }

    /// Wait until the tokenizer reports exactly `want` live, with `running` all up; returns
    /// how long it took.
    pub fn wait_live(&mut self, want: &[u32], running: &[&str], within: Duration) -> Duration {
        let want: BTreeSet<u64> = want.iter().map(|&r| r.into()).collect();
        let start = Instant::now();
        let mut last = None;
        loop {
            self.assert_running(running);
            last = self.live_ranks().or(last);
            if last.as_ref() == Some(&want) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "live ranks {last:?}, want {want:?} within {within:?}\n{}",
                self.all_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until the log of `name` says `what`.
    pub fn wait_log(&self, name: &str, what: &str, within: Duration) {
        self.poll_until(&format!("{name} logging {what:?}"), within, |c| {
            c.log(name).contains(what).then_some(())
        });
    }

    /// Ask `probe` every 100 ms until it answers `Some`, and return the answer; fails the test
    /// with `what` and every actor's log if none came within `within`.
    pub fn poll_until<T>(
        &self,
        what: &str,
        within: Duration,
        mut probe: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(answer) = probe(self) {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {within:?}\n{}",
                self.all_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `POST /generate` (4 tokens, optionally pinned to `rank`): status, headers' Retry-After,
    /// body. EOS is ignored: the built-in model's sampled output draws it now and then, and
    /// every caller counts on the 4 tokens.
    pub fn generate(&self, rank: Option<u64>) -> (u16, Option<String>, Value) {
        let mut body = json!({"text": "hello world",
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": true}});
        if let Some(r) = rank {
            body["routed_dp_rank"] = json!(r);
        }
        let resp = self
            .http
            .post(format!("{}/generate", self.base))
            .json(&body)
            .send()
            .expect("POST /generate");
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.text().unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, retry_after, json)
    }

    /// A request pinned to `rank` succeeds there; returns the response.
    pub fn assert_serves_on(&self, rank: u64) -> Value {
        let (status, _, resp) = self.generate(Some(rank));
        assert_eq!(status, 200, "rank {rank}: {resp}\n{}", self.all_logs());
        assert_eq!(resp["meta_info"]["dp_rank"], json!(rank), "{resp}");
        resp
    }
}
