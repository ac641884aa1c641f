//! HTTPS at the edge (`--ssl-certfile` / `--ssl-keyfile`) on a real `dpserve up`, with a
//! certificate signed by a test CA made here (no key is kept in the repository): curl and the
//! openai Python client and `dpserve bench` reach it trusting that CA, a client that does not trust it and plain
//! HTTP fail cleanly and the server keeps serving, the tokenizer unit's readiness check passes,
//! and files that cannot be used stop the start with one line and exit status 78.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::Server;
use serde_json::Value;

/// The test CA's certificate, and a certificate for `localhost` and 127.0.0.1 it signed, with
/// its key, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "dpserve test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let files = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    };
    std::fs::write(&files.ca, ca.pem()).unwrap();
    std::fs::write(&files.cert, leaf.pem()).unwrap();
    std::fs::write(&files.key, leaf_key.serialize_pem()).unwrap();
    // A private key readable by others is refused: 0600, as an operator keeps it.
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&files.key, private).unwrap();
    files
}

fn have_curl() -> bool {
    let found = Command::new("curl").arg("--version").output().is_ok();
    if !found {
        eprintln!("skipping: curl not found (apt-get install curl)");
    }
    found
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "60"])
        .args(args)
        .output()
        .expect("run curl")
}

#[test]
fn https_serves_curl_through_the_ca_and_refuses_untrusting_and_plain_clients() {
    if !have_curl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let server = Server::up(&[
        "--builtin-size",
        "tiny",
        "--ssl-certfile",
        cert,
        "--ssl-keyfile",
        key,
    ]);
    let https = format!("https://127.0.0.1:{}", server.port);
    assert!(
        server
            .ready
            .contains(&format!("https://127.0.0.1:{}", server.port)),
        "up shows the https URL: {}",
        server.ready
    );
    let generate = |base: &str, extra: &[&str]| {
        let url = format!("{base}/generate");
        let body = r#"{"text": "hello", "sampling_params": {"max_new_tokens": 4}}"#;
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["-H", "content-type: application/json", "-d", body, &url]);
        curl(&args)
    };
    let ca = pki.ca.to_str().unwrap();
    let out = generate(&https, &["--cacert", ca]);
    assert!(out.status.success(), "{out:?}");
    let resp: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(resp["meta_info"]["completion_tokens"], 4, "{resp}");

    // A client that does not trust the CA stops at the certificate (curl: 60).
    let out = generate(&https, &[]);
    assert_eq!(out.status.code(), Some(60), "{out:?}");
    // Plain HTTP to the HTTPS port gets no HTTP answer: the connection ends.
    let out = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{}/health", server.port),
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "000", "{out:?}");

    // Unharmed by both; the tokenizer unit's readiness check speaks HTTPS when the unit is
    // given a certificate.
    let out = curl(&["--cacert", ca, &format!("{https}/health")]);
    assert!(out.status.success(), "{out:?}");
    let health: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(health["live_ranks"], serde_json::json!([0, 1]), "{health}");
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg(common::tokenizer_readiness_command())
        .env("DPSERVE_HOST", "127.0.0.1")
        .env("DPSERVE_PORT", server.port.to_string())
        .env("DPSERVE_SSL_CERTFILE", cert)
        .status()
        .expect("run the readiness check");
    assert!(status.success(), "the readiness check over HTTPS");

    // `dpserve bench` against it, trusting the CA through $SSL_CERT_FILE.
    let out = Command::new(common::dpserve_bin())
        .args(["bench", "--base-url", &https, "--disable-progress-bar"])
        .args(["--gsp-num-groups", "1", "--gsp-prompts-per-group", "3"])
        .args(["--gsp-system-prompt-len", "16", "--gsp-question-len", "4"])
        .args(["--gsp-output-len", "3", "--vocab-size", "300"])
        .env("SSL_CERT_FILE", ca)
        .env_remove("DPSERVE_BENCH_BASE_URL")
        .output()
        .expect("run dpserve bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let succeeded = stdout
        .lines()
        .find(|l| l.starts_with("Successful requests"));
    assert!(succeeded.is_some_and(|l| l.ends_with(" 3")), "{stdout}");
}

#[test]
fn the_openai_python_client_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    // Completions and chat, streamed and not; the rest of the suite runs over plain HTTP
    // (tests/e2e_openai_python.rs).
    common::run_python_suite_with_env(
        "openai",
        "openai",
        &[
            "-m",
            "unittest",
            "discover",
            "-s",
            "tests/python",
            "-p",
            "test_openai.py",
            "-k",
            "Completions",
            "-k",
            "Chat",
            "-v",
        ],
        &[
            ("DPSERVE_TEST_SSL_CERTFILE", pki.cert.to_str().unwrap()),
            ("DPSERVE_TEST_SSL_KEYFILE", pki.key.to_str().unwrap()),
            ("DPSERVE_TEST_SSL_CAFILE", pki.ca.to_str().unwrap()),
        ],
    );
}

#[test]
fn certificate_files_that_cannot_be_used_stop_the_start_with_one_line_and_78() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let (cert, key) = (pki.cert.to_str().unwrap(), pki.key.to_str().unwrap());
    let missing = dir.path().join("absent.key");
    let missing = missing.to_str().unwrap();
    // The CA's certificate with the server's key: they do not match.
    let ca = pki.ca.to_str().unwrap();
    for (what, args, want) in [
        (
            "up, missing key",
            vec!["up", "--ssl-certfile", cert, "--ssl-keyfile", missing],
            "--ssl-keyfile",
        ),
        (
            "up, key of another certificate",
            vec!["up", "--ssl-certfile", ca, "--ssl-keyfile", key],
            "--ssl-keyfile",
        ),
        (
            "up, certificate alone",
            vec!["up", "--ssl-certfile", cert],
            "--ssl-certfile",
        ),
        (
            "tokenizer, missing key",
            vec![
                "tokenizer",
                "--ssl-certfile",
                cert,
                "--ssl-keyfile",
                missing,
            ],
            "--ssl-keyfile",
        ),
    ] {
        common::assert_refused_at_start(what, &args, want);
    }
}
