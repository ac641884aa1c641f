//! Runs `tests/python` (the real `openai` Python client against a real `dpserve up`) from
//! `cargo test`, so the README's one test command covers it. Skips with a message when the
//! pinned client is not installed (`pip install -r tests/python/requirements.txt`).

use crate::common;

#[test]
fn openai_python_client_against_a_real_cluster() {
    common::run_python_suite(
        "openai",
        "openai",
        &["-m", "unittest", "discover", "-s", "tests/python", "-v"],
    );
}
