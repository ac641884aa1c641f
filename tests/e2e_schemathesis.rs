//! The OpenAPI document against a live server: `GET /openapi.json` serves `docs/openapi.json`,
//! schemathesis (pinned in tests/python/requirements.txt) loads it as valid OpenAPI, then fuzzes
//! every operation of a real `dpserve up` on the built-in tiny model with valid and invalid
//! requests and checks every answer (no 5xx, documented status codes, content types, headers
//! and bodies, invalid data refused, valid data accepted: see tests/python/schemathesis_hooks.py
//! for the one refinement of that last check). Skips with a message when schemathesis is not
//! installed (`pip install -r tests/python/requirements.txt`).
//!
//! `--context-length 256` bounds the work of one request (n = 128 choices of at most 256
//! tokens) with a limit the server enforces; examples per operation are bounded so the run
//! takes well under two minutes on two cores.

use crate::common;

use std::process::Command;

use common::Server;

/// Examples per operation in the fuzzing phase (the coverage phase adds its own boundary cases).
const MAX_EXAMPLES: &str = "25";

const VALIDATE: &str = "import json, sys, jsonschema_rs
from schemathesis.specs.openapi.definitions import OPENAPI_31
jsonschema_rs.validator_for(OPENAPI_31).validate(json.load(open(sys.argv[1])))
print('docs/openapi.json is valid OpenAPI 3.1')";

fn schemathesis_installed() -> bool {
    let probe = Command::new("python3")
        .args(["-c", "import schemathesis"])
        .output();
    matches!(&probe, Ok(out) if out.status.success())
}

#[test]
fn the_served_document_is_the_committed_one_and_schemathesis_finds_nothing() {
    let root = env!("CARGO_MANIFEST_DIR");
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/docs/openapi.json")).expect("docs/openapi.json"),
    )
    .expect("docs/openapi.json is JSON");
    let server = Server::up(&[
        "--builtin-size",
        "tiny",
        "--dp-size",
        "2",
        "--context-length",
        "256",
    ]);
    let (status, served) = server.get("/openapi.json");
    assert_eq!(status, 200);
    assert_eq!(
        served, committed,
        "GET /openapi.json differs from docs/openapi.json"
    );

    if !schemathesis_installed() {
        eprintln!(
            "skipping the schemathesis run: the schemathesis Python package is not installed \
             (pip install -r tests/python/requirements.txt)"
        );
        return;
    }
    // The document against the OpenAPI 3.1 meta-schema schemathesis ships.
    let out = Command::new("python3")
        .args(["-c", VALIDATE, &format!("{root}/docs/openapi.json")])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "docs/openapi.json is not valid OpenAPI 3.1:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scratch = tempfile::tempdir().expect("scratch dir");
    let out = Command::new("python3")
        .args(["-m", "schemathesis.cli", "run"])
        .arg(server.url("/openapi.json"))
        .args(["--max-examples", MAX_EXAMPLES])
        // Reproducible: a failure here fails the same way on a rerun.
        .args(["--seed", "1", "--generation-database", "none"])
        .args(["--request-timeout", "60", "--no-color"])
        // Replaced by positive_data_acceptance_within_limits from the hooks (see there).
        .args(["--exclude-checks", "positive_data_acceptance"])
        // Its caches (.schemathesis/) go to a scratch directory, not the checkout.
        .current_dir(scratch.path())
        .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
        .env("PYTHONPATH", format!("{root}/tests/python"))
        .output()
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{stdout}\n{stderr}"
    );
    // The summary, for the log.
    let summary = stdout
        .rfind("SUMMARY")
        .map_or(&stdout[..], |i| &stdout[i..]);
    eprintln!("{summary}");
    let (status, _) = server.get("/health");
    assert_eq!(status, 200, "the server still serves after the run");
}
