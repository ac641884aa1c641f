//! What the worker's integration tests share: running this test binary again as a child (one
//! kernel path per process, since the path is fixed once per process).

use std::process::Command;

/// A command that runs this test binary again. Under an emulator (the aarch64 tests run under
/// qemu-user, see `.ci/aarch64`) the child needs the same runner: `DPSERVE_TEST_RUNNER` names
/// it, program and arguments split at spaces.
pub fn this_binary() -> Command {
    let exe = std::env::current_exe().expect("test binary");
    match std::env::var("DPSERVE_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut cmd = Command::new(words.next().expect("a runner program"));
            cmd.args(words).arg(exe);
            cmd
        }
        _ => Command::new(exe),
    }
}
