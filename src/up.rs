//! `dpserve up`: a whole deployment on one host. It starts the tokenizer, the controller and
//! `--dp-size` workers as child processes of this binary (so each actor shows in `ps` and can be
//! run alone the same way), waits until every rank is live, prints the URL, and stops all
//! children on Ctrl-C or SIGTERM. A child that dies during start fails `up` with its name.
//!
//! The actors' flags are not declared here: `up` flattens their own groups (the tokenizer's
//! [`HttpArgs`], the controller's [`RoutingArgs`], the worker's [`ModelArgs`], [`ServeArgs`] and
//! [`DeviceArgs`]) through [`Given`], and passes on only the flags the user set, so each actor's
//! own default stays the one source of truth. Values clap cannot check alone (the controller's
//! `--prefix-affinity-*`, `--worker-timeout`) are checked by the controller's own `resolve`
//! before any child starts: a bad value is a startup error of `up`, not a child that dies later.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use controller::RoutingArgs;
use protocol::{DisaggMode, RuntimeDir};
use tokenizer_actor::HttpArgs;
use worker::{DeviceArgs, ModelArgs, ServeArgs};

use crate::forwarded::Given;

/// `up --dp-size` when not given (the tokenizer alone expects 1 rank; `up` starts 2).
pub const DEFAULT_DP_SIZE: u32 = 2;
/// `--startup-timeout` (seconds) of `up`, and of each cluster `bench --launch` starts.
pub const DEFAULT_STARTUP_TIMEOUT_S: f64 = 300.0;
/// How long children get to stop beyond the workers' drain timeout.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub http: Given<HttpArgs>,
    #[command(flatten)]
    pub routing: Given<RoutingArgs>,
    #[command(flatten)]
    pub device: Given<DeviceArgs>,
    /// Message traces: every actor (tokenizer, controller, workers) appends one JSON line per
    /// message and request milestone to its file here (`dpserve trace DIR [--rid R]`).
    #[arg(long, env = "DPSERVE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// A message-trace file past this many MiB rotates (each actor's; see `dpserve worker
    /// --help`). Passed on only when set.
    #[arg(long, env = "DPSERVE_TRACE_MAX_MB")]
    pub trace_max_mb: Option<u64>,
    /// Directory for the ipc sockets (default: a fresh one per deployment, mode 0700).
    #[arg(long, env = "DPSERVE_RUNTIME_DIR")]
    pub runtime_dir: Option<PathBuf>,
}

/// The flags that shape the cluster: `up`'s, and `bench --launch`'s (which reads them from
/// `DPSERVE_BENCH_<FLAG>` and passes the set ones on to `up`).
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Number of data-parallel workers to start.
    #[arg(long, env = "DPSERVE_DP_SIZE", default_value_t = DEFAULT_DP_SIZE)]
    pub dp_size: u32,
    /// Prefill/decode disaggregation: start this many prefill workers (ranks 0..P) and
    /// `--decode-dp-size` decode workers (the ranks after them) instead of `--dp-size` unified
    /// ones. Both or neither.
    #[arg(long, env = "DPSERVE_PREFILL_DP_SIZE", requires = "decode_dp_size")]
    pub prefill_dp_size: Option<u32>,
    /// Decode workers of a disaggregated deployment (with `--prefill-dp-size`).
    #[arg(long, env = "DPSERVE_DECODE_DP_SIZE", requires = "prefill_dp_size")]
    pub decode_dp_size: Option<u32>,
    #[command(flatten)]
    pub model: Given<ModelArgs>,
    #[command(flatten)]
    pub serve: Given<ServeArgs>,
    /// Seconds to wait for every rank to become live.
    #[arg(long, env = "DPSERVE_STARTUP_TIMEOUT", default_value_t = DEFAULT_STARTUP_TIMEOUT_S)]
    pub startup_timeout: f64,
}

impl ClusterArgs {
    /// The role of each rank, in rank order.
    pub fn roles(&self) -> anyhow::Result<Vec<DisaggMode>> {
        match (self.prefill_dp_size, self.decode_dp_size) {
            (Some(p), Some(d)) => {
                if p == 0 || d == 0 {
                    bail!("--prefill-dp-size and --decode-dp-size must each be at least 1");
                }
                let prefill = std::iter::repeat_n(DisaggMode::Prefill, p as usize);
                Ok(prefill
                    .chain(std::iter::repeat_n(DisaggMode::Decode, d as usize))
                    .collect())
            }
            (None, None) => Ok(vec![DisaggMode::Null; self.dp_size as usize]),
            _ => bail!("--prefill-dp-size and --decode-dp-size go together"),
        }
    }

    /// Ranks this cluster starts.
    pub fn num_ranks(&self) -> u32 {
        match (self.prefill_dp_size, self.decode_dp_size) {
            (Some(p), Some(d)) => p + d,
            _ => self.dp_size,
        }
    }
}

/// A child actor process.
struct Actor {
    name: String,
    child: Child,
}

/// The children of this deployment; dropping it stops them.
struct Deployment {
    actors: Vec<Actor>,
    runtime_dir: Option<PathBuf>,
}

impl Deployment {
    fn spawn(&mut self, name: &str, args: Vec<OsString>) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("locating the dpserve binary")?;
        let child = Command::new(&exe)
            .args(&args)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        tracing::info!(actor = name, pid = child.id(), "started");
        self.actors.push(Actor {
            name: name.to_string(),
            child,
        });
        Ok(())
    }

    /// The first child that has exited, with its status.
    fn exited(&mut self) -> Option<(String, String)> {
        for actor in &mut self.actors {
            if let Ok(Some(status)) = actor.child.try_wait() {
                return Some((actor.name.clone(), status.to_string()));
            }
        }
        None
    }

    /// SIGTERM every child, give them `grace` to exit, then SIGKILL the rest.
    fn stop(&mut self, grace: Duration) {
        for actor in &mut self.actors {
            // A child already reaped (it exited, which is often why we stop) has no pid left
            // to signal; `kill` would only complain on the terminal.
            if let Ok(None) = actor.child.try_wait() {
                terminate(actor.child.id());
            }
        }
        let deadline = Instant::now() + grace;
        for actor in &mut self.actors {
            loop {
                match actor.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        tracing::warn!(actor = %actor.name, "did not stop in time; killing");
                        actor.child.kill().ok();
                        actor.child.wait().ok();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        self.actors.clear();
        if let Some(dir) = self.runtime_dir.take() {
            std::fs::remove_dir_all(dir).ok();
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.stop(STOP_GRACE);
    }
}

fn terminate(pid: u32) {
    // Sending a signal to our own child by pid: no memory is touched.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status();
}

pub fn run(args: UpArgs) -> anyhow::Result<()> {
    let cluster = &args.cluster;
    if cluster.dp_size == 0 {
        bail!("--dp-size must be at least 1");
    }
    let roles = cluster.roles()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handler")?;
    }
    let (dir, owned) = match &args.runtime_dir {
        Some(dir) => (RuntimeDir::create(dir)?, false),
        None => (
            RuntimeDir::create(RuntimeDir::default_path(&format!(
                "up-{}",
                std::process::id()
            )))?,
            true,
        ),
    };
    let addrs = Addrs {
        controller: dir.endpoint("controller.sock").to_string(),
        worker: dir.endpoint("worker.sock").to_string(),
        tokenizer: dir.endpoint("tokenizer.sock").to_string(),
    };
    let mut deployment = Deployment {
        actors: Vec::new(),
        runtime_dir: owned.then(|| dir.path().to_path_buf()),
    };

    let controller = controller_args(&args, &addrs);
    check_controller_args(&controller)?;
    deployment.spawn("tokenizer", tokenizer_args(&args, &addrs))?;
    deployment.spawn("controller", controller)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (rank, mode) in roles.iter().enumerate() {
        let rank = rank as u32;
        let mut argv = worker_args(&args, &addrs, rank, cpus);
        if !mode.is_null() {
            push(&mut argv, "--disaggregation-mode", Some(mode));
        }
        if *mode == DisaggMode::Prefill {
            let kv = dir.endpoint(&format!("kv-{rank}.sock"));
            push(&mut argv, "--disaggregation-kv-addr", Some(kv));
        }
        let name = match mode {
            DisaggMode::Null => format!("worker {rank}"),
            role => format!("worker {rank} ({role})"),
        };
        deployment.spawn(&name, argv)?;
    }

    // Wait until the tokenizer reports every rank live.
    let deadline = Instant::now() + Duration::from_secs_f64(cluster.startup_timeout.max(1.0));
    let probe = format!("127.0.0.1:{}", args.http.port);
    loop {
        if stop.load(Ordering::Relaxed) {
            deployment.stop(STOP_GRACE);
            bail!("interrupted during start");
        }
        if let Some((name, status)) = deployment.exited() {
            deployment.stop(STOP_GRACE);
            bail!("{name} exited during start ({status}); see its log above");
        }
        if let Some(live) = live_ranks(&probe, args.http.api_key.as_deref()) {
            if live >= roles.len() {
                break;
            }
        }
        if Instant::now() >= deadline {
            deployment.stop(STOP_GRACE);
            bail!(
                "not every rank became live within {}s (--startup-timeout)",
                cluster.startup_timeout
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://{}:{}", args.http.host, args.http.port);
    println!("dpserve is ready: {url} ({} ranks live)", roles.len());
    println!("try: curl -s {url}/generate -d '{{\"text\": \"hello\", \"sampling_params\": {{\"max_new_tokens\": 16}}}}'");
    std::io::stdout().flush().ok();

    // Serve until a signal; a worker that dies is logged (the controller stops routing to it),
    // the tokenizer or controller dying ends the deployment.
    while !stop.load(Ordering::Relaxed) {
        if let Some((name, status)) = deployment.exited() {
            if name.starts_with("worker") {
                tracing::error!(actor = %name, %status, "worker exited; serving with the remaining ranks");
                deployment.actors.retain(|a| a.name != name);
            } else {
                deployment.stop(STOP_GRACE);
                bail!("{name} exited ({status}); stopping the deployment");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("stopping");
    // Workers drain what they hold first (within their --drain-timeout).
    let drain = Duration::from_secs_f64(cluster.serve.drain_timeout.max(0.0));
    deployment.stop(drain + STOP_GRACE);
    Ok(())
}

/// The three ZeroMQ endpoints of this deployment.
struct Addrs {
    controller: String,
    worker: String,
    tokenizer: String,
}

/// `dpserve tokenizer …` for this deployment.
fn tokenizer_args(args: &UpArgs, addrs: &Addrs) -> Vec<OsString> {
    let mut t: Vec<OsString> = vec!["tokenizer".into()];
    let model_path = args.cluster.model.model_path.as_ref();
    push(&mut t, "--model-path", model_path.map(|p| p.display()));
    // Always: `up` probes this address for readiness.
    push(&mut t, "--host", Some(&args.http.host));
    push(&mut t, "--port", Some(args.http.port));
    t.extend(args.http.argv_without(&["host", "port"]));
    push(&mut t, "--tokenizer-addr", Some(&addrs.tokenizer));
    push(&mut t, "--controller-addr", Some(&addrs.controller));
    push(&mut t, "--dp-size", Some(args.cluster.num_ranks()));
    push(
        &mut t,
        "--trace-dir",
        args.trace_dir.as_ref().map(|p| p.display()),
    );
    push(&mut t, "--trace-max-mb", args.trace_max_mb);
    t
}

/// `dpserve controller …` for this deployment.
fn controller_args(args: &UpArgs, addrs: &Addrs) -> Vec<OsString> {
    let mut c: Vec<OsString> = vec!["controller".into()];
    push(&mut c, "--controller-addr", Some(&addrs.controller));
    push(&mut c, "--worker-addr", Some(&addrs.worker));
    push(&mut c, "--tokenizer-addr", Some(&addrs.tokenizer));
    c.extend(args.routing.argv());
    push(
        &mut c,
        "--trace-dir",
        args.trace_dir.as_ref().map(|p| p.display()),
    );
    push(&mut c, "--trace-max-mb", args.trace_max_mb);
    c
}

/// `dpserve worker --rank R …` for this deployment, on a host with `cpus` CPUs.
fn worker_args(args: &UpArgs, addrs: &Addrs, rank: u32, cpus: usize) -> Vec<OsString> {
    let cluster = &args.cluster;
    let mut w: Vec<OsString> = vec!["worker".into()];
    push(&mut w, "--rank", Some(rank));
    w.extend(cluster.model.argv());
    push(&mut w, "--worker-addr", Some(&addrs.worker));
    push(&mut w, "--tokenizer-addr", Some(&addrs.tokenizer));
    w.extend(cluster.serve.argv_without(&["mem_fraction", "num_threads"]));
    // The workers share this host's memory and CPUs: each sizes its pool from its share, and
    // computes on its share of the CPUs unless told otherwise.
    let dp = cluster.num_ranks().max(1);
    push(
        &mut w,
        "--mem-fraction",
        Some(cluster.serve.mem_fraction / f64::from(dp)),
    );
    let threads = cluster
        .serve
        .num_threads
        .unwrap_or_else(|| (cpus / dp as usize).max(1));
    push(&mut w, "--num-threads", Some(threads));
    w.extend(args.device.argv());
    push(
        &mut w,
        "--trace-dir",
        args.trace_dir.as_ref().map(|p| p.display()),
    );
    push(&mut w, "--trace-max-mb", args.trace_max_mb);
    w
}

/// Parse and check the controller's arguments exactly as the child will (same parser, same
/// environment), so a bad value stops `up` before anything starts.
fn check_controller_args(argv: &[OsString]) -> anyhow::Result<()> {
    #[derive(clap::Parser)]
    struct ControllerCli {
        #[command(flatten)]
        args: controller::ControllerArgs,
    }
    use clap::Parser;
    let cli = ControllerCli::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("invalid controller settings: {}", e.render()))?;
    cli.args.resolve().context("invalid controller settings")?;
    Ok(())
}

fn push<T: ToString>(args: &mut Vec<OsString>, flag: &str, value: Option<T>) {
    if let Some(v) = value {
        args.push(flag.into());
        args.push(v.to_string().into());
    }
}

/// Number of live ranks per the tokenizer's `/get_server_info`, or `None` if it is not up yet.
fn live_ranks(addr: &str, api_key: Option<&str>) -> Option<usize> {
    let mut stream =
        TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let auth = api_key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET /get_server_info HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let body = response.split_once("\r\n\r\n")?.1;
    let info: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(info.get("live_ranks")?.as_array()?.len())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: UpArgs,
    }

    fn up(flags: &[&str]) -> UpArgs {
        Cli::try_parse_from(std::iter::once("up").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    fn addrs() -> Addrs {
        Addrs {
            controller: "ipc:///tmp/dps-test/c.sock".into(),
            worker: "ipc:///tmp/dps-test/w.sock".into(),
            tokenizer: "ipc:///tmp/dps-test/t.sock".into(),
        }
    }

    fn strings(argv: &[OsString]) -> Vec<String> {
        argv.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn prefix_affinity_and_trace_flags_reach_the_controller() {
        let args = up(&[
            "--load-balance-method",
            "prefix_affinity",
            "--prefix-affinity-hash-tokens",
            "64",
            "--prefix-affinity-disable-token-fallback",
            "--prefix-affinity-fallback",
            "round_robin",
            "--prefix-affinity-max-load-skew",
            "2.5",
            "--trace-dir",
            "/tmp/dps-msgs",
        ]);
        let argv = controller_args(&args, &addrs());
        let shown = strings(&argv).join(" ");
        for want in [
            "--prefix-affinity-hash-tokens 64",
            "--prefix-affinity-disable-token-fallback",
            "--prefix-affinity-fallback round_robin",
            "--prefix-affinity-max-load-skew 2.5",
            "--trace-dir /tmp/dps-msgs",
        ] {
            assert!(shown.contains(want), "{want:?} not in {shown}");
        }
        check_controller_args(&argv).unwrap();
    }

    #[test]
    fn unset_flags_are_not_forwarded() {
        let shown = strings(&controller_args(&up(&[]), &addrs())).join(" ");
        assert!(!shown.contains("--prefix-affinity"), "{shown}");
        assert!(!shown.contains("--trace-dir"), "{shown}");
    }

    /// The error `up` stops with for these flags: its parser's, or the controller's check.
    fn up_error(flags: &[&str]) -> String {
        match Cli::try_parse_from(std::iter::once("up").chain(flags.iter().copied())) {
            Err(e) => e.render().to_string(),
            Ok(cli) => {
                let argv = controller_args(&cli.args, &addrs());
                format!("{:#}", check_controller_args(&argv).unwrap_err())
            }
        }
    }

    #[test]
    fn invalid_controller_values_are_errors_of_up_that_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--prefix-affinity-max-load-skew", "0.5"],
                "--prefix-affinity-max-load-skew",
            ),
            (
                &["--prefix-affinity-hash-tokens", "0"],
                "--prefix-affinity-hash-tokens",
            ),
            (
                &["--prefix-affinity-fallback", "prefix_affinity"],
                "--prefix-affinity-fallback",
            ),
            (
                &["--load-balance-method", "fastest"],
                "--load-balance-method",
            ),
            (&["--worker-timeout", "0"], "--worker-timeout"),
            (&["--kernel-path", "sse9"], "--kernel-path"),
            (&["--builtin-size", "huge"], "--builtin-size"),
        ];
        for (flags, name) in cases {
            let err = up_error(flags);
            assert!(err.contains(name), "{flags:?}: {err}");
        }
    }

    #[test]
    fn the_trace_size_cap_reaches_every_actor_only_when_set() {
        let args = up(&["--trace-dir", "/tmp/t", "--trace-max-mb", "64"]);
        for argv in [
            tokenizer_args(&args, &addrs()),
            controller_args(&args, &addrs()),
            worker_args(&args, &addrs(), 0, 2),
        ] {
            let shown = strings(&argv).join(" ");
            assert!(shown.contains("--trace-max-mb 64"), "{shown}");
        }
        let args = up(&["--trace-dir", "/tmp/t"]);
        let shown = strings(&worker_args(&args, &addrs(), 0, 2)).join(" ");
        assert!(!shown.contains("--trace-max-mb"), "{shown}");
    }

    #[test]
    fn worker_flags_reach_every_worker_with_a_share_of_the_host() {
        let args = up(&[
            "--dp-size",
            "4",
            "--mem-fraction",
            "0.8",
            "--schedule-policy",
            "fcfs",
            "--disable-radix-cache",
            "--builtin-size",
            "tiny",
            "--drain-timeout",
            "7",
            "--kernel-path",
            "portable",
        ]);
        let shown = strings(&worker_args(&args, &addrs(), 3, 8)).join(" ");
        for want in [
            "worker --rank 3 --builtin-size tiny",
            "--schedule-policy fcfs",
            "--disable-radix-cache",
            "--drain-timeout 7",
            "--mem-fraction 0.2",
            "--num-threads 2",
            "--kernel-path portable",
            "--worker-addr ipc:///tmp/dps-test/w.sock",
        ] {
            assert!(shown.contains(want), "{want:?} not in {shown}");
        }
        assert!(!shown.contains("--max-running-requests"), "{shown}");
        // Unset, each worker gets 1/dp of the worker's own default fraction.
        let shown = strings(&worker_args(&up(&["--dp-size", "2"]), &addrs(), 0, 2)).join(" ");
        let half = worker::mem::DEFAULT_MEM_FRACTION / 2.0;
        assert!(shown.contains(&format!("--mem-fraction {half}")), "{shown}");
        assert!(shown.contains("--num-threads 1"), "{shown}");
    }

    #[test]
    fn http_flags_reach_the_tokenizer() {
        let args = up(&["--port", "0", "--api-key", "k", "--request-timeout-s", "9"]);
        let shown = strings(&tokenizer_args(&args, &addrs())).join(" ");
        for want in [
            "--host 127.0.0.1 --port 0",
            "--api-key k",
            "--request-timeout-s 9",
            "--dp-size 2",
        ] {
            assert!(shown.contains(want), "{want:?} not in {shown}");
        }
        assert!(!shown.contains("--max-request-bytes"), "{shown}");
    }
}
