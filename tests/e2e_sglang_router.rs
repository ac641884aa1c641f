//! Runs `tests/python/e2e_sglang_router.py` (SGLang's own gateway, `sglang-router` from PyPI,
//! with `--dp-aware` in front of a real `dpserve up`) from `cargo test`, so the README's one test
//! command covers it. Skips with a message when the pinned package is not installed
//! (`pip install -r tests/python/requirements.txt`).

use crate::common;

#[test]
fn sglang_router_dp_aware_in_front_of_a_real_cluster() {
    common::run_python_suite(
        "sglang-router",
        "sglang_router.launch_router",
        &["tests/python/e2e_sglang_router.py", "-v"],
    );
}
