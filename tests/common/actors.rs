//! Actors started one process each, the way the systemd units start them, each logging to its
//! own file; every one is stopped (SIGTERM, then SIGKILL) when the set is dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct Actor {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

#[derive(Default)]
pub struct Actors {
    pub list: Vec<Actor>,
}

/// `dpserve args…` configured only by what the caller adds: the `DPSERVE_*` variables (and
/// `XDG_RUNTIME_DIR`) of the test's own environment are removed.
pub fn command(args: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dpserve"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("DPSERVE_") || k == "XDG_RUNTIME_DIR" {
            cmd.env_remove(k);
        }
    }
    cmd
}

impl Actors {
    /// Start `cmd` as actor `name`, its stdout and stderr to `log_dir/<name>.log`.
    pub fn spawn(&mut self, name: &str, log_dir: &Path, mut cmd: Command) {
        let log = log_dir.join(format!("{}.log", name.replace(' ', "-")));
        let file = fs::File::create(&log).expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        self.list.push(Actor {
            name: name.to_string(),
            child,
            log,
        });
    }

    /// The newest process of that name (a restarted actor has several).
    pub fn get(&mut self, name: &str) -> &mut Actor {
        self.list
            .iter_mut()
            .rev()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no actor {name}"))
    }

    /// The log of the newest process of that name.
    pub fn log(&self, name: &str) -> String {
        self.list
            .iter()
            .rev()
            .find(|a| a.name == name)
            .map(|a| fs::read_to_string(&a.log).unwrap_or_default())
            .unwrap_or_default()
    }

    pub fn all_logs(&self) -> String {
        self.list
            .iter()
            .map(|a| {
                let log = fs::read_to_string(&a.log).unwrap_or_default();
                format!("----- {} -----\n{log}", a.name)
            })
            .collect()
    }

    /// Panic (with every log) if an actor that should be running has exited.
    pub fn assert_running(&mut self, names: &[&str]) {
        for name in names {
            if let Ok(Some(status)) = self.get(name).child.try_wait() {
                panic!("{name} exited ({status})\n{}", self.all_logs());
            }
        }
    }

    /// SIGTERM, as `systemctl stop` sends it (KillSignal=SIGTERM).
    pub fn sigterm(&mut self, name: &str) {
        let pid = self.get(name).child.id();
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }

    /// SIGKILL: no drain, no `Shutdown`; the controller only notices the missing heartbeats.
    pub fn kill(&mut self, name: &str) {
        let actor = self.get(name);
        actor.child.kill().expect("SIGKILL");
        actor.child.wait().expect("reap");
    }

    pub fn wait_exit(&mut self, name: &str, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.get(name).child.try_wait() {
                return status;
            }
            if Instant::now() >= deadline {
                panic!("{name} did not exit within {within:?}\n{}", self.all_logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Actors {
    fn drop(&mut self) {
        for actor in &self.list {
            let _ = Command::new("kill")
                .args(["-TERM", &actor.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for actor in &mut self.list {
            while matches!(actor.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = actor.child.try_wait() {
                actor.child.kill().ok();
            }
            actor.child.wait().ok();
        }
    }
}
