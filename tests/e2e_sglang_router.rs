//! Runs `tests/python/e2e_sglang_router.py` (SGLang's own gateway, `sglang-router` from PyPI,
//! with `--dp-aware` in front of a real `dpserve up`) from `cargo test`, so the README's one test
//! command covers it. Skips with a message when the pinned package is not installed
//! (`pip install -r tests/python/requirements.txt`).

use std::process::Command;

#[test]
fn sglang_router_dp_aware_in_front_of_a_real_cluster() {
    let root = env!("CARGO_MANIFEST_DIR");
    let probe = Command::new("python3")
        .args(["-c", "import sglang_router.launch_router"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        _ => {
            eprintln!(
                "skipping: the sglang-router Python package is not installed \
                 (pip install -r tests/python/requirements.txt)"
            );
            return;
        }
    }
    let out = Command::new("python3")
        .args(["tests/python/e2e_sglang_router.py", "-v"])
        .current_dir(root)
        .env("DPSERVE_BIN", env!("CARGO_BIN_EXE_dpserve"))
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sglang-router tests failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{stderr}");
}
