//! Runs `tests/python` (the real `openai` Python client against a real `dpserve up`) from
//! `cargo test`, so the README's one test command covers it. Skips with a message when the
//! pinned client is not installed (`pip install -r tests/python/requirements.txt`).

use std::process::Command;

#[test]
fn openai_python_client_against_a_real_cluster() {
    let root = env!("CARGO_MANIFEST_DIR");
    let probe = Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        _ => {
            eprintln!(
                "skipping: the openai Python package is not installed \
                 (pip install -r tests/python/requirements.txt)"
            );
            return;
        }
    }
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests/python", "-v"])
        .current_dir(root)
        .env("DPSERVE_BIN", env!("CARGO_BIN_EXE_dpserve"))
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python tests failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{stderr}");
}
