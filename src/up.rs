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
//!
//! With `--device cuda[:N]` the GPUs are probed first and each rank gets its own `--device
//! cuda:<i>` (see [`gpus`]); a GPU that cannot be used stops `up` before anything starts.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use controller::RoutingArgs;
use protocol::{DisaggMode, RuntimeDir};
use tokenizer_actor::tls::Probe;
use tokenizer_actor::HttpArgs;
use worker::{DeviceArgs, ModelArgs, ServeArgs, WorkerError};

use crate::failure::{Failure, REFUSAL_FILE_ENV};
use crate::forwarded::Given;

mod gpus;

use gpus::GpuPlacement;

/// `up --dp-size` when not given (the tokenizer alone expects 1 rank; `up` starts 2).
pub const DEFAULT_DP_SIZE: u32 = 2;
/// `--startup-timeout` (seconds) of `up`, and of each cluster `bench --launch` starts.
pub const DEFAULT_STARTUP_TIMEOUT_S: f64 = 300.0;
/// How long children get to stop beyond the workers' drain timeout.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub cluster: Given<ClusterArgs>,
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
    /// Number of data-parallel workers to start. Unset with `--device cuda`: one per visible
    /// GPU (rank r on `cuda:<r mod GPUs>` either way); with `--device cuda:N`: one, on GPU N.
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
    /// Where it writes its refusal's line, if it refuses (`DPSERVE_REFUSAL_FILE`).
    refusal_file: PathBuf,
}

/// The children of this deployment; dropping it stops them.
struct Deployment {
    actors: Vec<Actor>,
    runtime_dir: Option<PathBuf>,
    /// Where the children's refusal files go (the runtime directory).
    refusals: PathBuf,
}

/// A child that exited: its name, its status, and its refusal's line if it refused.
struct Exited {
    name: String,
    status: std::process::ExitStatus,
    refusal: Option<String>,
}

impl Exited {
    /// The failure `up` ends with: the child's own refusal (exit 78) when it refused.
    fn failure(self, serving: bool) -> Failure {
        let Exited {
            name,
            status,
            refusal,
        } = self;
        match (refusal, serving) {
            (Some(line), false) => Failure::refusal(anyhow!("{name} refused to start: {line}")),
            (Some(line), true) => {
                Failure::refusal(anyhow!("{name} refused: {line}; stopping the deployment"))
            }
            (None, false) => {
                anyhow!("{name} exited during start ({status}); see its log above").into()
            }
            (None, true) => anyhow!("{name} exited ({status}); stopping the deployment").into(),
        }
    }
}

impl Deployment {
    fn spawn(&mut self, name: &str, args: Vec<OsString>) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("locating the dpserve binary")?;
        let refusal_file = self.refusals.join(format!("refusal-{}", self.actors.len()));
        // One left by an earlier run in a --runtime-dir is not this child's.
        let _ = std::fs::remove_file(&refusal_file);
        let child = Command::new(&exe)
            .args(&args)
            .env(REFUSAL_FILE_ENV, &refusal_file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        tracing::info!(actor = name, pid = child.id(), "started");
        self.actors.push(Actor {
            name: name.to_string(),
            child,
            refusal_file,
        });
        Ok(())
    }

    /// The first child that has exited.
    fn exited(&mut self) -> Option<Exited> {
        for actor in &mut self.actors {
            if let Ok(Some(status)) = actor.child.try_wait() {
                let refused = status.code() == Some(i32::from(WorkerError::REFUSED_EXIT_CODE));
                let refusal = refused
                    .then(|| std::fs::read_to_string(&actor.refusal_file).ok())
                    .flatten()
                    .map(|line| line.trim().to_string())
                    .filter(|line| !line.is_empty());
                return Some(Exited {
                    name: actor.name.clone(),
                    status,
                    refusal,
                });
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

pub fn run(mut args: UpArgs) -> Result<(), Failure> {
    if args.cluster.dp_size == 0 {
        return Err(anyhow!("--dp-size must be at least 1").into());
    }
    // The workers would refuse their roles; say why before starting anything.
    let disaggregated =
        args.cluster.prefill_dp_size.is_some() || args.cluster.decode_dp_size.is_some();
    if let Some(refusal) = disaggregated
        .then(|| args.device.device.disagg_refusal())
        .flatten()
    {
        return Err(anyhow!(refusal).into());
    }
    // The tokenizer would refuse them; refused here, nothing starts. The first key is also the
    // one the readiness probe sends.
    let api_keys = args.http.api_keys()?;
    args.http.open_paths()?;
    args.http.tls()?;
    // HTTPS: the probe trusts the certificate the tokenizer is given, and only that one.
    let probe = Probe::new(args.http.ssl_certfile.as_deref())?;
    let gpus = place_on_gpus(&mut args)?;
    let roles = args.cluster.roles()?;
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
        refusals: dir.path().to_path_buf(),
    };

    let controller = controller_args(&args, &addrs);
    check_controller_args(&controller)?;
    deployment.spawn("tokenizer", tokenizer_args(&args, &addrs))?;
    deployment.spawn("controller", controller)?;
    spawn_workers(&mut deployment, &args, &addrs, &dir, &roles, gpus)?;

    let auth = api_keys
        .first()
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    wait_until_live(&mut deployment, &stop, &probe, &args, &auth, roles.len())?;
    let url = format!("{}://{}:{}", probe.scheme(), args.http.host, args.http.port);
    println!("dpserve is ready: {url} ({} ranks live)", roles.len());
    println!("try: curl -s {url}/generate -d '{{\"text\": \"hello\", \"sampling_params\": {{\"max_new_tokens\": 16}}}}'");
    std::io::stdout().flush().ok();

    serve_until_stopped(&mut deployment, &stop)?;
    tracing::info!("stopping");
    // Workers drain what they hold first (within their --drain-timeout).
    let drain = Duration::from_secs_f64(args.cluster.serve.drain_timeout.max(0.0));
    deployment.stop(drain + STOP_GRACE);
    Ok(())
}

/// One worker per role in `roles`, rank by rank (a prefill worker with its KV socket in `dir`).
fn spawn_workers(
    deployment: &mut Deployment,
    args: &UpArgs,
    addrs: &Addrs,
    dir: &RuntimeDir,
    roles: &[DisaggMode],
    gpus: Option<GpuPlacement>,
) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (rank, mode) in roles.iter().enumerate() {
        let rank = rank as u32;
        let mut argv = worker_args(args, addrs, rank, cpus, gpus);
        if !mode.is_null() {
            push(&mut argv, "--disaggregation-mode", Some(mode));
        }
        if *mode == DisaggMode::Prefill {
            let kv = dir.endpoint(&format!("kv-{rank}.sock"));
            push(&mut argv, "--disaggregation-kv-addr", Some(kv));
        }
        let name = match (mode, gpus) {
            (DisaggMode::Null, None) => format!("worker {rank}"),
            (DisaggMode::Null, Some(p)) => format!("worker {rank} on cuda:{}", p.gpu_of(rank)),
            (role, _) => format!("worker {rank} ({role})"),
        };
        deployment.spawn(&name, argv)?;
    }
    Ok(())
}

/// Waits until the tokenizer reports `ranks` ranks live; a signal, an actor exiting or
/// `--startup-timeout` stops the deployment and says why. An actor that refused its
/// configuration (exit 78) makes `up` refuse with its line, last, and exit 78 too.
fn wait_until_live(
    deployment: &mut Deployment,
    stop: &AtomicBool,
    probe: &Probe,
    args: &UpArgs,
    auth: &str,
    ranks: usize,
) -> Result<(), Failure> {
    let timeout = args.cluster.startup_timeout;
    let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(1.0));
    let probe_addr = format!("127.0.0.1:{}", args.http.port);
    loop {
        if stop.load(Ordering::Relaxed) {
            deployment.stop(STOP_GRACE);
            return Err(anyhow!("interrupted during start").into());
        }
        if let Some(exited) = deployment.exited() {
            deployment.stop(STOP_GRACE);
            return Err(exited.failure(false));
        }
        if live_ranks(probe, &probe_addr, auth).is_some_and(|live| live >= ranks) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            deployment.stop(STOP_GRACE);
            let why = format!("not every rank became live within {timeout}s (--startup-timeout)");
            return Err(anyhow!(why).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Serves until a signal. A worker that exits is logged (the controller stops routing to it):
/// at INFO when it drained and stopped cleanly (status 0), at ERROR otherwise; the tokenizer
/// or controller exiting ends the deployment.
fn serve_until_stopped(deployment: &mut Deployment, stop: &AtomicBool) -> Result<(), Failure> {
    while !stop.load(Ordering::Relaxed) {
        if let Some(exited) = deployment.exited() {
            let (name, status) = (exited.name.clone(), exited.status);
            if !name.starts_with("worker") {
                deployment.stop(STOP_GRACE);
                return Err(exited.failure(true));
            }
            if status.success() {
                tracing::info!(actor = %name, "worker drained and exited; serving with the remaining ranks");
            } else {
                tracing::error!(actor = %name, %status, "worker exited; serving with the remaining ranks");
            }
            deployment.actors.retain(|a| a.name != name);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// `--device cuda[:N]`: probe the GPUs (stopping here, with the probe's reason and EX_CONFIG,
/// when they cannot be used), size `--dp-size` from them unless it was given, and say where
/// each rank goes. `None` for a device that is not a GPU.
fn place_on_gpus(args: &mut UpArgs) -> Result<Option<GpuPlacement>, WorkerError> {
    let Some((placement, gpu)) =
        GpuPlacement::for_device(args.device.device, kernels::cuda::probe)?
    else {
        return Ok(None);
    };
    if !args.cluster.is_set("dp_size") {
        args.cluster.value.dp_size = placement.default_ranks();
    }
    let ranks = args.cluster.num_ranks();
    tracing::info!(
        device = %args.device.device,
        visible_gpus = gpu.device_count,
        gpu = %gpu.name,
        ranks,
        placement = %placement.describe(ranks),
        "ranks placed on GPUs (rank:device)"
    );
    Ok(Some(placement))
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

/// `dpserve worker --rank R …` for this deployment, on a host with `cpus` CPUs, and on its
/// GPU when `gpus` places the ranks.
fn worker_args(
    args: &UpArgs,
    addrs: &Addrs,
    rank: u32,
    cpus: usize,
    gpus: Option<GpuPlacement>,
) -> Vec<OsString> {
    let cluster = &args.cluster;
    let mut w: Vec<OsString> = vec!["worker".into()];
    push(&mut w, "--rank", Some(rank));
    w.extend(cluster.model.argv());
    push(&mut w, "--worker-addr", Some(&addrs.worker));
    push(&mut w, "--tokenizer-addr", Some(&addrs.tokenizer));
    w.extend(cluster.serve.argv_without(&["mem_fraction", "num_threads"]));
    // The workers share this host's memory and CPUs: each sizes its pool from its share, and
    // computes on its share of the CPUs unless told otherwise. A GPU rank's pool is in its
    // GPU's memory instead: ranks on one GPU split it, and a rank with a GPU to itself is
    // passed the fraction only when the user set one (the worker's default stays its own).
    let dp = cluster.num_ranks().max(1);
    let mem_share = match gpus {
        None => Some(dp),
        Some(p) => match p.sharing(rank, dp) {
            1 if !cluster.serve.is_set("mem_fraction") => None,
            n => Some(n),
        },
    };
    push(
        &mut w,
        "--mem-fraction",
        mem_share.map(|n| cluster.serve.mem_fraction / f64::from(n)),
    );
    let threads = cluster
        .serve
        .num_threads
        .unwrap_or_else(|| (cpus / dp as usize).max(1));
    push(&mut w, "--num-threads", Some(threads));
    match gpus {
        None => w.extend(args.device.argv()),
        Some(p) => {
            w.extend(args.device.argv_without(&["device"]));
            push(&mut w, "--device", Some(format!("cuda:{}", p.gpu_of(rank))));
        }
    }
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
fn check_controller_args(argv: &[OsString]) -> Result<(), Failure> {
    #[derive(clap::Parser)]
    struct ControllerCli {
        #[command(flatten)]
        args: controller::ControllerArgs,
    }
    use clap::Parser;
    let cli = ControllerCli::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("invalid controller settings: {}", e.render()))?;
    cli.args
        .resolve()
        .map_err(|error| Failure::from(error).context("invalid controller settings"))?;
    Ok(())
}

fn push<T: ToString>(args: &mut Vec<OsString>, flag: &str, value: Option<T>) {
    if let Some(v) = value {
        args.push(flag.into());
        args.push(v.to_string().into());
    }
}

/// Number of live ranks per the tokenizer's `/get_server_info`, or `None` if it is not up yet.
fn live_ranks(probe: &Probe, addr: &str, auth: &str) -> Option<usize> {
    let response = probe.get(addr, "/get_server_info", auth)?;
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
            worker_args(&args, &addrs(), 0, 2, None),
        ] {
            let shown = strings(&argv).join(" ");
            assert!(shown.contains("--trace-max-mb 64"), "{shown}");
        }
        let args = up(&["--trace-dir", "/tmp/t"]);
        let shown = strings(&worker_args(&args, &addrs(), 0, 2, None)).join(" ");
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
        let shown = strings(&worker_args(&args, &addrs(), 3, 8, None)).join(" ");
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
        let shown = strings(&worker_args(&up(&["--dp-size", "2"]), &addrs(), 0, 2, None)).join(" ");
        let half = worker::mem::DEFAULT_MEM_FRACTION / 2.0;
        assert!(shown.contains(&format!("--mem-fraction {half}")), "{shown}");
        assert!(shown.contains("--num-threads 1"), "{shown}");
    }

    #[test]
    fn each_gpu_rank_gets_its_own_device_and_ranks_on_one_gpu_split_it() {
        let spread = Some(GpuPlacement::Spread { visible: 2 });
        let worker = |flags: &[&str], rank: u32, gpus: Option<GpuPlacement>| {
            let mut args = up(flags);
            if !args.cluster.is_set("dp_size") {
                args.cluster.value.dp_size = gpus.map_or(DEFAULT_DP_SIZE, |p| p.default_ranks());
            }
            strings(&worker_args(&args, &addrs(), rank, 4, gpus)).join(" ")
        };
        // Unset --dp-size: one rank per GPU, each alone on it, so the worker's own default
        // fraction applies; the user's --device cuda becomes each rank's cuda:<i>.
        for rank in [0, 1] {
            let shown = worker(&["--device", "cuda"], rank, spread);
            assert!(shown.contains(&format!("--device cuda:{rank}")), "{shown}");
            assert!(!shown.contains("--device cuda "), "{shown}");
            assert!(!shown.ends_with("--device cuda"), "{shown}");
            assert!(!shown.contains("--mem-fraction"), "{shown}");
            assert!(shown.contains("--num-threads 2"), "{shown}");
        }
        // --dp-size 3 on 2 GPUs: ranks 0 and 2 share GPU 0 and take half each.
        let flags = [
            "--device",
            "cuda",
            "--dp-size",
            "3",
            "--mem-fraction",
            "0.8",
        ];
        for (rank, gpu, fraction) in [(0, 0, 0.4), (1, 1, 0.8), (2, 0, 0.4)] {
            let shown = worker(&flags, rank, spread);
            assert!(shown.contains(&format!("--device cuda:{gpu}")), "{shown}");
            assert!(
                shown.contains(&format!("--mem-fraction {fraction}")),
                "{shown}"
            );
        }
        // Two ranks pinned to GPU 1 split it, from the worker's default when unset.
        let pinned = Some(GpuPlacement::Pinned { ordinal: 1 });
        let shown = worker(&["--device", "cuda:1", "--dp-size", "2"], 1, pinned);
        let half = worker::mem::DEFAULT_MEM_FRACTION / 2.0;
        assert!(shown.contains("--device cuda:1"), "{shown}");
        assert!(shown.contains(&format!("--mem-fraction {half}")), "{shown}");
        // cpu and sim ranks: --device as given, the host split as before.
        let shown = worker(&["--device", "sim", "--dp-size", "2"], 1, None);
        assert!(shown.contains("--device sim"), "{shown}");
        assert!(shown.contains(&format!("--mem-fraction {half}")), "{shown}");
        let shown = worker(&["--dp-size", "2"], 1, None);
        assert!(!shown.contains("--device"), "{shown}");
    }

    #[test]
    fn disaggregated_gpu_or_sim_ranks_are_refused_before_anything_starts() {
        for device in ["cuda", "cuda:1", "sim"] {
            let args = up(&[
                "--device",
                device,
                "--prefill-dp-size",
                "1",
                "--decode-dp-size",
                "1",
            ]);
            let err = format!("{:#}", run(args).unwrap_err());
            assert!(
                err.starts_with(&format!("--device {device} does not ")),
                "{device}: {err}"
            );
            assert!(err.contains("disaggregated roles yet"), "{err}");
        }
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
