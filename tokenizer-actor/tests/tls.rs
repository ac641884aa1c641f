//! `--ssl-certfile` / `--ssl-keyfile` on a real server (no controller: `/health` answers 503,
//! which is an answer): `dpserve up`'s readiness probe reaches it over TLS trusting exactly the
//! certificate it was given, and no other.

use std::path::{Path, PathBuf};

use protocol::Endpoint;
use tokenizer_actor::tls::Probe;
use tokenizer_actor::{SpawnedServer, TokenizerArgs};

fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    // A private key readable by others is refused: 0600, as an operator keeps it.
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&key, private).unwrap();
    (cert, key)
}

#[test]
fn the_probe_reaches_an_https_server_through_its_own_certificate_only() {
    let dir = tempfile::Builder::new()
        .prefix("dps-tls")
        .tempdir_in("/tmp")
        .unwrap();
    let (cert, key) = pair(dir.path(), "server");
    let (other, _) = pair(dir.path(), "other");
    let mut args = TokenizerArgs {
        tokenizer_addr: Endpoint::Ipc(dir.path().join("tok.sock")).to_string(),
        controller_addr: Endpoint::Ipc(dir.path().join("ctl.sock")).to_string(),
        ..TokenizerArgs::default()
    };
    args.http.ssl_certfile = Some(cert.clone());
    args.http.ssl_keyfile = Some(key);
    let server = SpawnedServer::start(args).unwrap();
    let addr = server.addr.to_string();

    let pinned = Probe::new(Some(&cert)).unwrap();
    assert_eq!(pinned.scheme(), "https");
    let response = pinned
        .get(&addr, "/health", "")
        .expect("an answer over TLS");
    assert!(
        response.starts_with("HTTP/1.1 503"),
        "no controller is there: {response}"
    );
    assert!(
        response.contains("the controller is unreachable"),
        "{response}"
    );

    // Another certificate's holder is not trusted, and plain HTTP gets no HTTP answer.
    let wrong = Probe::new(Some(&other)).unwrap();
    assert_eq!(wrong.get(&addr, "/health", ""), None);
    let plain = Probe::new(None).unwrap();
    assert_eq!(plain.scheme(), "http");
    let answer = plain.get(&addr, "/health", "").unwrap_or_default();
    assert!(!answer.starts_with("HTTP/"), "{answer}");

    // The server is unharmed by both.
    let again = pinned.get(&addr, "/health", "").expect("still serving");
    assert!(again.starts_with("HTTP/1.1 503"), "{again}");
    server.stop().unwrap();
}
