//! `dpserve up`: a whole deployment on one host. It starts the tokenizer, the controller and
//! `--dp-size` workers as child processes of this binary (so each actor shows in `ps` and can be
//! run alone the same way), waits until every rank is live, prints the URL, and stops all
//! children on Ctrl-C or SIGTERM. A child that dies during start fails `up` with its name.
//!
//! Flags left unset are not forwarded, so each actor's own default stays the one source of truth.
//! The controller's arguments are checked here, by the controller's own parser, before any child
//! starts: a bad `--load-balance-method` or `--prefix-affinity-*` value is a startup error of
//! `up`, not a child that dies later.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use protocol::RuntimeDir;

#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    /// Number of data-parallel workers to start.
    #[arg(long, env = "DPSERVE_DP_SIZE", default_value_t = 2)]
    pub dp_size: u32,
    /// Hugging Face model directory (default: the built-in model, no download).
    #[arg(long, env = "DPSERVE_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// `auto` or `dummy` (built-in model with random weights).
    #[arg(long, env = "DPSERVE_LOAD_FORMAT")]
    pub load_format: Option<String>,
    /// Built-in model size: `base` or `tiny`.
    #[arg(long, env = "DPSERVE_BUILTIN_SIZE")]
    pub builtin_size: Option<String>,
    /// HTTP bind address.
    #[arg(long, env = "DPSERVE_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// HTTP port.
    #[arg(long, env = "DPSERVE_PORT", default_value_t = 30000)]
    pub port: u16,
    /// Load-balance method of the controller.
    #[arg(long, env = "DPSERVE_LOAD_BALANCE_METHOD")]
    pub load_balance_method: Option<String>,
    /// prefix_affinity: leading input ids hashed into the key of a request without a routing
    /// key (the controller's default when unset).
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_HASH_TOKENS")]
    pub prefix_affinity_hash_tokens: Option<usize>,
    /// prefix_affinity: never hash the token prefix; requests without a routing key go to the
    /// fallback method.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_DISABLE_TOKEN_FALLBACK")]
    pub prefix_affinity_disable_token_fallback: bool,
    /// prefix_affinity: method for requests without a key (round_robin, total_requests,
    /// total_tokens).
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_FALLBACK")]
    pub prefix_affinity_fallback: Option<String>,
    /// prefix_affinity: overload threshold as a multiple (>= 1.0) of the mean active requests.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_MAX_LOAD_SKEW")]
    pub prefix_affinity_max_load_skew: Option<f64>,
    /// KV pool size per worker, in tokens (default: sized from --mem-fraction).
    #[arg(long, env = "DPSERVE_MAX_TOTAL_TOKENS")]
    pub max_total_tokens: Option<usize>,
    /// Share of this host's free memory for all workers' weights and KV pools together; each
    /// of the --dp-size workers gets 1/dp-size of it (default: the worker's --mem-fraction).
    #[arg(long, env = "DPSERVE_MEM_FRACTION", value_parser = worker::mem::parse_mem_fraction)]
    pub mem_fraction: Option<f64>,
    /// Most running requests per worker.
    #[arg(long, env = "DPSERVE_MAX_RUNNING_REQUESTS")]
    pub max_running_requests: Option<usize>,
    /// Prompt chunk size per request per step.
    #[arg(long, env = "DPSERVE_CHUNKED_PREFILL_SIZE")]
    pub chunked_prefill_size: Option<usize>,
    /// Prompt tokens per prefill step.
    #[arg(long, env = "DPSERVE_MAX_PREFILL_TOKENS")]
    pub max_prefill_tokens: Option<usize>,
    /// Context length (default: the model's).
    #[arg(long, env = "DPSERVE_CONTEXT_LENGTH")]
    pub context_length: Option<usize>,
    /// Compute threads per worker (default: this host's CPUs divided by --dp-size).
    #[arg(long, env = "DPSERVE_NUM_THREADS")]
    pub num_threads: Option<usize>,
    /// CPU kernel path of every worker: `auto` (the widest this CPU supports), `avx512`,
    /// `avx2`, `neon` or `portable` (bit-identical results; forcing one is for tests and
    /// benchmarks). A path this CPU cannot run is refused before anything starts.
    #[arg(long, env = kernels::KERNEL_PATH_ENV)]
    pub kernel_path: Option<String>,
    /// A worker's prefill step computes only the prompt tokens that fit in about this many
    /// milliseconds (0 = no time bound; the workers' default when unset).
    #[arg(long, env = "DPSERVE_PREFILL_STEP_TARGET_MS")]
    pub prefill_step_target_ms: Option<u64>,
    /// Seconds without a heartbeat before a worker leaves the live set.
    #[arg(long, env = "DPSERVE_WORKER_TIMEOUT")]
    pub worker_timeout: Option<f64>,
    /// Routing trace: one JSON line per routing decision (`dpserve trace FILE`).
    #[arg(long, env = "DPSERVE_TRACE_FILE")]
    pub trace_file: Option<PathBuf>,
    /// Message traces: every actor (tokenizer, controller, workers) appends one JSON line per
    /// message and request milestone to its file here (`dpserve trace DIR [--rid R]`).
    #[arg(long, env = "DPSERVE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// Bearer key required on every HTTP endpoint but /health.
    #[arg(long, env = "DPSERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Chat template file (Jinja) instead of the model's.
    #[arg(long, env = "DPSERVE_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Seconds a stopping worker keeps running what it holds (its default when unset).
    #[arg(long, env = "DPSERVE_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<f64>,
    /// Directory for the ipc sockets (default: a fresh one per deployment, mode 0700).
    #[arg(long, env = "DPSERVE_RUNTIME_DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// Seconds to wait for every rank to become live.
    #[arg(long, env = "DPSERVE_STARTUP_TIMEOUT", default_value_t = 300.0)]
    pub startup_timeout: f64,
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
        self.stop(Duration::from_secs(5));
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
    if args.dp_size == 0 {
        bail!("--dp-size must be at least 1");
    }
    if let Some(path) = &args.kernel_path {
        path.parse::<kernels::KernelPath>()
            .map_err(|e| anyhow::anyhow!("--kernel-path: {e}"))?;
    }
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
    let controller_addr = dir.endpoint("controller.sock").to_string();
    let worker_addr = dir.endpoint("worker.sock").to_string();
    let tokenizer_addr = dir.endpoint("tokenizer.sock").to_string();
    let mut deployment = Deployment {
        actors: Vec::new(),
        runtime_dir: owned.then(|| dir.path().to_path_buf()),
    };

    let mut common_model: Vec<OsString> = Vec::new();
    if let Some(path) = &args.model_path {
        common_model.extend(["--model-path".into(), path.clone().into_os_string()]);
    }

    let addrs = Addrs {
        controller: controller_addr.clone(),
        worker: worker_addr.clone(),
        tokenizer: tokenizer_addr.clone(),
    };
    let controller = controller_args(&args, &addrs);
    check_controller_args(&controller)?;

    let mut tokenizer: Vec<OsString> = vec!["tokenizer".into()];
    tokenizer.extend(common_model.iter().cloned());
    push(&mut tokenizer, "--host", Some(&args.host));
    push(&mut tokenizer, "--port", Some(args.port));
    push(&mut tokenizer, "--tokenizer-addr", Some(&tokenizer_addr));
    push(&mut tokenizer, "--controller-addr", Some(&controller_addr));
    push(&mut tokenizer, "--dp-size", Some(args.dp_size));
    push(&mut tokenizer, "--api-key", args.api_key.as_ref());
    push(
        &mut tokenizer,
        "--chat-template",
        args.chat_template.as_ref().map(|p| p.display()),
    );
    push(
        &mut tokenizer,
        "--trace-dir",
        args.trace_dir.as_ref().map(|p| p.display()),
    );
    deployment.spawn("tokenizer", tokenizer)?;
    deployment.spawn("controller", controller)?;

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args
        .num_threads
        .unwrap_or_else(|| (cpus / args.dp_size as usize).max(1));
    for rank in 0..args.dp_size {
        let mut worker: Vec<OsString> = vec!["worker".into()];
        push(&mut worker, "--rank", Some(rank));
        worker.extend(common_model.iter().cloned());
        push(&mut worker, "--load-format", args.load_format.as_ref());
        push(&mut worker, "--builtin-size", args.builtin_size.as_ref());
        push(&mut worker, "--worker-addr", Some(&worker_addr));
        push(&mut worker, "--tokenizer-addr", Some(&tokenizer_addr));
        push(&mut worker, "--max-total-tokens", args.max_total_tokens);
        // The workers share this host's memory: each sizes its pool from its share.
        let host_fraction = args
            .mem_fraction
            .unwrap_or(worker::mem::DEFAULT_MEM_FRACTION);
        push(
            &mut worker,
            "--mem-fraction",
            Some(host_fraction / f64::from(args.dp_size)),
        );
        push(
            &mut worker,
            "--max-running-requests",
            args.max_running_requests,
        );
        push(
            &mut worker,
            "--chunked-prefill-size",
            args.chunked_prefill_size,
        );
        push(&mut worker, "--max-prefill-tokens", args.max_prefill_tokens);
        push(&mut worker, "--context-length", args.context_length);
        push(&mut worker, "--num-threads", Some(threads));
        push(&mut worker, "--kernel-path", args.kernel_path.as_ref());
        push(
            &mut worker,
            "--prefill-step-target-ms",
            args.prefill_step_target_ms,
        );
        push(&mut worker, "--drain-timeout", args.drain_timeout);
        push(
            &mut worker,
            "--trace-dir",
            args.trace_dir.as_ref().map(|p| p.display()),
        );
        deployment.spawn(&format!("worker {rank}"), worker)?;
    }

    // Wait until the tokenizer reports every rank live.
    let deadline = Instant::now() + Duration::from_secs_f64(args.startup_timeout.max(1.0));
    let probe = format!("127.0.0.1:{}", args.port);
    loop {
        if stop.load(Ordering::Relaxed) {
            deployment.stop(Duration::from_secs(5));
            bail!("interrupted during start");
        }
        if let Some((name, status)) = deployment.exited() {
            deployment.stop(Duration::from_secs(5));
            bail!("{name} exited during start ({status}); see its log above");
        }
        if let Some(live) = live_ranks(&probe, args.api_key.as_deref()) {
            if live >= args.dp_size as usize {
                break;
            }
        }
        if Instant::now() >= deadline {
            deployment.stop(Duration::from_secs(5));
            bail!(
                "not every rank became live within {}s (--startup-timeout)",
                args.startup_timeout
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://{}:{}", args.host, args.port);
    println!("dpserve is ready: {url} ({} ranks live)", args.dp_size);
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
                deployment.stop(Duration::from_secs(5));
                bail!("{name} exited ({status}); stopping the deployment");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("stopping");
    // Workers drain what they hold first (30 s unless --drain-timeout says otherwise).
    let grace = args.drain_timeout.unwrap_or(30.0).max(0.0) + 5.0;
    deployment.stop(Duration::from_secs_f64(grace));
    Ok(())
}

/// The three ZeroMQ endpoints of this deployment.
struct Addrs {
    controller: String,
    worker: String,
    tokenizer: String,
}

/// `dpserve controller …` for this deployment.
fn controller_args(args: &UpArgs, addrs: &Addrs) -> Vec<OsString> {
    let mut c: Vec<OsString> = vec!["controller".into()];
    push(&mut c, "--controller-addr", Some(&addrs.controller));
    push(&mut c, "--worker-addr", Some(&addrs.worker));
    push(&mut c, "--tokenizer-addr", Some(&addrs.tokenizer));
    push(
        &mut c,
        "--load-balance-method",
        args.load_balance_method.as_ref(),
    );
    push(
        &mut c,
        "--prefix-affinity-hash-tokens",
        args.prefix_affinity_hash_tokens,
    );
    if args.prefix_affinity_disable_token_fallback {
        c.push("--prefix-affinity-disable-token-fallback".into());
    }
    push(
        &mut c,
        "--prefix-affinity-fallback",
        args.prefix_affinity_fallback.as_ref(),
    );
    push(
        &mut c,
        "--prefix-affinity-max-load-skew",
        args.prefix_affinity_max_load_skew,
    );
    push(&mut c, "--worker-timeout", args.worker_timeout);
    push(
        &mut c,
        "--trace-file",
        args.trace_file.as_ref().map(|p| p.display()),
    );
    push(
        &mut c,
        "--trace-dir",
        args.trace_dir.as_ref().map(|p| p.display()),
    );
    c
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
        ];
        for (flags, name) in cases {
            let err = check_controller_args(&controller_args(&up(flags), &addrs())).unwrap_err();
            let err = format!("{err:#}");
            assert!(err.contains(name), "{flags:?}: {err}");
        }
    }
}
