//! `dpserve bench --launch`: a fresh single-host cluster per load-balance method. Spawns this
//! same binary as `dpserve up --port <free> --runtime-dir <tmp> --load-balance-method M ...`,
//! waits for its "dpserve is ready" line, and SIGTERMs it afterwards (`up` stops its children).
//! The cluster's logs go to a file, so the benchmark's output stays readable; a cluster that
//! fails to start (for instance a method the controller does not know) is reported with the
//! last error line of that log instead of failing the whole comparison.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, Once};
use std::time::{Duration, Instant};

use crate::forwarded::{BenchEnv, Given};
use crate::up::ClusterArgs;

/// The cluster flags of `up`, as `bench --launch` takes them: the same names, values and
/// defaults, read from `DPSERVE_BENCH_<FLAG>`; the set ones are passed on to `up`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerFlags {
    #[command(flatten)]
    pub cluster: BenchEnv<Given<ClusterArgs>>,
    /// [--launch] Any other `up` argument, verbatim (repeat: `--up-arg=--flag --up-arg=value`).
    #[arg(long = "up-arg", allow_hyphen_values = true)]
    pub up_args: Vec<String>,
    /// A `--sim-config` TOML a preset gives every rank (written beside the results).
    #[arg(skip)]
    pub sim_config: Option<String>,
}

impl ServerFlags {
    /// The parsed cluster flags (defaults where unset).
    pub fn cluster(&self) -> &ClusterArgs {
        &self.cluster.0.value
    }

    /// The `up` arguments for one method, on `port` with sockets under `runtime_dir`.
    /// `dpserve up …` for one compared entry: `METHOD`, or `METHOD@<P>p<D>d` for a
    /// disaggregated deployment of P prefill and D decode workers (METHOD picks the prefill
    /// rank) instead of the unified ranks the flags describe.
    pub fn up_args(&self, entry: &str, port: u16, runtime_dir: &Path) -> Vec<OsString> {
        let (method, deployment) = match entry.split_once('@') {
            Some((m, d)) => (m, Some(d)),
            None => (entry, None),
        };
        let mut a: Vec<OsString> = vec!["up".into()];
        let mut flags = vec![
            ("--port", port.to_string()),
            ("--host", "127.0.0.1".into()),
            ("--runtime-dir", runtime_dir.display().to_string()),
            ("--load-balance-method", method.to_string()),
        ];
        if let Some((p, d)) = deployment.and_then(parse_deployment) {
            flags.push(("--prefill-dp-size", p.to_string()));
            flags.push(("--decode-dp-size", d.to_string()));
        }
        for (flag, value) in flags {
            a.push(flag.into());
            a.push(value.into());
        }
        a.extend(self.cluster.argv());
        a.extend(self.up_args.iter().map(OsString::from));
        // `/generate` streams each step alone: SGLang's default form repeats every id and all the
        // text so far in each event, work for the tokenizer and this client that grows with the
        // square of the answer's length and, with many simulated ranks, fell behind them. The
        // times the client reads are the same in either form.
        if !self.up_args.iter().any(|a| a == INCREMENTAL) {
            a.push(INCREMENTAL.into());
        }
        a
    }
}

/// The `up` flag for `/generate`'s incremental stream form, which every launched cluster gets.
const INCREMENTAL: &str = "--incremental-streaming-output";

/// `<P>p<D>d` (e.g. `1p1d`) as (P, D).
pub fn parse_deployment(s: &str) -> Option<(u32, u32)> {
    let (p, d) = s.strip_suffix('d')?.split_once('p')?;
    Some((p.parse().ok()?, d.parse().ok()?))
}

/// How long a stopped `up` gets to stop its actors before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// The `up` processes started and not yet stopped. They live here rather than in their
/// [`Cluster`] so that a SIGTERM or SIGINT to the benchmark, which ends the process without
/// running any `Drop`, stops them too (see [`stop_clusters_on_signal`]).
static RUNNING: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Takes `up` process `pid` out of [`RUNNING`], if it is there.
fn take_running(pid: u32) -> Option<Child> {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let i = running.iter().position(|c| c.id() == pid)?;
    Some(running.swap_remove(i))
}

/// Once per process: a thread that, on SIGTERM or SIGINT, stops every running cluster and then
/// exits as the signal would have (128 + its number).
fn stop_clusters_on_signal() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "warning: no signal handler ({e}); a signal would leave clusters running"
                );
                return;
            }
        };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                // Held until the exit: the main thread, which sees its cluster go away, blocks
                // on its next start or stop instead of finishing (and exiting) first.
                let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
                eprintln!("== signal {sig}: stopping {} cluster(s)", running.len());
                for child in running.drain(..) {
                    stop_child(child, STOP_GRACE);
                }
                std::process::exit(128 + sig);
            }
        });
    });
}

/// SIGTERM `up` (it stops its children), wait up to `grace`, then SIGKILL.
fn stop_child(mut child: Child, grace: Duration) {
    // Our own child, by pid; `up` handles SIGTERM by stopping every actor it started.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() >= deadline => {
                child.kill().ok();
                child.wait().ok();
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A running `dpserve up`; dropping it stops the cluster.
pub struct Cluster {
    /// The `up` process's pid, its `Child` in [`RUNNING`]; `None` once stopped or exited.
    pid: Option<u32>,
    pub base_url: String,
    pub log_path: PathBuf,
    runtime_dir: PathBuf,
}

/// A port that was free a moment ago (the usual race; `up` fails clearly if it lost it).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a cluster for `method`, its sockets under `runtime_root` (keep it short: socket paths
/// have a length limit) and its log in `log_dir`. `Err` is a one-line reason ("skipped: …").
pub fn start(
    method: &str,
    flags: &ServerFlags,
    runtime_root: &Path,
    log_dir: &Path,
) -> Result<Cluster, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the dpserve binary: {e}"))?;
    let port = free_port().map_err(|e| format!("finding a free port: {e}"))?;
    let runtime_dir = runtime_root.join(format!("rt-{method}"));
    std::fs::remove_dir_all(&runtime_dir).ok();
    let log_path = log_dir.join(format!("up-{method}.log"));
    let log =
        File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
    stop_clusters_on_signal();
    // Held across the spawn: while a signal is being handled no new cluster starts.
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new(exe)
        .args(flags.up_args(method, port, &runtime_dir))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting dpserve up: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout from dpserve up")?;
    let pid = child.id();
    running.push(child);
    drop(running);
    let (tx, rx) = mpsc::channel::<String>();
    // Drains `up`'s stdout for its whole life, so the pipe never fills.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                // Nobody listens any more; keep draining.
            }
        }
    });
    let mut cluster = Cluster {
        pid: Some(pid),
        base_url: format!("http://127.0.0.1:{port}"),
        log_path,
        runtime_dir,
    };
    let startup_timeout = flags.cluster().startup_timeout;
    let deadline = Instant::now() + Duration::from_secs_f64(startup_timeout.max(1.0) + 5.0);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.contains("dpserve is ready") => return Ok(cluster),
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: `up` is exiting; wait for its status below.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let exited = cluster.pid.and_then(|pid| {
            let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
            let child = running.iter_mut().find(|c| c.id() == pid)?;
            child.try_wait().ok().flatten()
        });
        if let Some(status) = exited {
            cluster.pid.take().and_then(take_running);
            return Err(format!(
                "dpserve up exited ({status}): {}",
                last_error_line(&cluster.log_path)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "not ready within {}s: {}",
                startup_timeout,
                last_error_line(&cluster.log_path)
            ));
        }
    }
}

/// A one-line reason from a cluster's log: the first actor's fatal error (`dpserve: error:`,
/// the cause; `up`'s own "X exited" comes after it), else the last error line, else the last
/// line.
fn last_error_line(path: &Path) -> String {
    let text = strip_ansi(&std::fs::read_to_string(path).unwrap_or_default());
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let pick = lines
        .iter()
        .find(|l| l.starts_with("dpserve: error:") && !l.contains("exited"))
        .or_else(|| {
            lines
                .iter()
                .rev()
                .find(|l| l.contains("error") || l.contains("ERROR"))
        })
        .or(lines.last())
        .map_or("no output", |l| l.trim());
    let clean = pick.to_string();
    let mut s: String = clean.chars().take(300).collect();
    if clean.chars().count() > 300 {
        s.push('…');
    }
    format!("{s} (log: {})", path.display())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip to the end of the escape sequence (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Cluster {
    /// SIGTERM `up` (it stops its children), wait up to `grace`, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(child) = self.pid.take().and_then(take_running) {
            stop_child(child, grace);
        }
        std::fs::remove_dir_all(&self.runtime_dir).ok();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop(STOP_GRACE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ServerFlags,
    }

    #[test]
    fn up_args_forward_only_what_is_set() {
        use clap::Parser;
        let flags = Cli::try_parse_from([
            "bench",
            "--dp-size",
            "2",
            "--builtin-size",
            "tiny",
            "--up-arg=--worker-timeout",
            "--up-arg=5",
            "--startup-timeout",
            "60",
        ])
        .unwrap()
        .flags;
        assert_eq!(flags.cluster().startup_timeout, 60.0);
        let args: Vec<String> = flags
            .up_args("total_tokens", 1234, Path::new("/tmp/x"))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let joined = args.join(" ");
        assert!(args[0] == "up");
        assert!(joined.contains("--port 1234"));
        assert!(joined.contains("--load-balance-method total_tokens"));
        assert!(joined.contains("--dp-size 2") && joined.contains("--builtin-size tiny"));
        assert!(joined.contains("--startup-timeout 60"));
        assert!(joined.ends_with("--worker-timeout 5 --incremental-streaming-output"));
        assert!(!joined.contains("--max-total-tokens") && !joined.contains("--model-path"));
        assert!(!joined.contains("--prefill-dp-size"));
        let pd: Vec<String> = flags
            .up_args("round_robin@1p2d", 1234, Path::new("/tmp/x"))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let joined = pd.join(" ");
        assert!(
            joined.contains("--load-balance-method round_robin "),
            "{joined}"
        );
        assert!(
            joined.contains("--prefill-dp-size 1 --decode-dp-size 2"),
            "{joined}"
        );
        assert_eq!(parse_deployment("2p3d"), Some((2, 3)));
        assert_eq!(parse_deployment("pd"), None);
    }

    #[test]
    fn reason_is_the_last_error_line_without_colours() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.log");
        std::fs::write(
            &p,
            "info start\n\u{1b}[31mERROR\u{1b}[0m unknown method x\nbye\n",
        )
        .unwrap();
        let r = last_error_line(&p);
        assert!(r.starts_with("ERROR unknown method x"), "{r}");
        std::fs::write(
            &p,
            "info\ndpserve: error: --load-balance-method: unknown method \"x\"\n\
             dpserve: error: controller exited during start (exit status: 1)\n",
        )
        .unwrap();
        let r = last_error_line(&p);
        assert!(
            r.starts_with("dpserve: error: --load-balance-method: unknown"),
            "{r}"
        );
    }
}
