//! `--ssl-certfile` / `--ssl-keyfile`: the HTTP server speaks HTTPS (rustls, with ring's
//! cryptography; TLS 1.2 and 1.3, HTTP/1.1 by ALPN). Both files are PEM, read once at start: a
//! file that cannot be read, holds no certificate or no unencrypted private key, or a key that
//! does not match the certificate stops the start with one line (exit status 78).
//!
//! [`Probe`] is the other end for `dpserve up`'s readiness check of its own tokenizer: it
//! trusts exactly the certificate the server was given (pinned, by its bytes), since the name
//! `up` dials (127.0.0.1) need not be one the certificate names.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};

use crate::error::{Result, TokenizerError};

/// The one cryptography provider of every TLS end here.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn refused(flag: &'static str, path: &Path, reason: impl ToString) -> TokenizerError {
    TokenizerError::TlsFile {
        flag,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The certificate chain of `--ssl-certfile`, leaf first.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let flag = "ssl-certfile";
    let text = std::fs::read(path).map_err(|e| refused(flag, path, e))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| refused(flag, path, format!("not a PEM certificate file ({e})")))?;
    if certs.is_empty() {
        return Err(refused(
            flag,
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let flag = "ssl-keyfile";
    let text = std::fs::read(path).map_err(|e| refused(flag, path, e))?;
    if let Some(why) = exposed(path) {
        return Err(refused(flag, path, why));
    }
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| {
        let encrypted = String::from_utf8_lossy(&text).contains("ENCRYPTED");
        refused(
            flag,
            path,
            if encrypted {
                "the private key is encrypted, which is not supported; decrypt it first \
                 (openssl pkey -in KEY -out PLAIN) and keep the plain file mode 0600"
                    .to_string()
            } else {
                format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}")
            },
        )
    })
}

/// Why the private key at `path` is exposed to other users, by PostgreSQL's rule for its own
/// `ssl_key_file` (be-secure-common.c): owned by this user, no group or other bits (0600 or
/// less); owned by root, group read at most (0640, for a group such as Debian's ssl-cert);
/// owned by anyone else, refused.
fn exposed(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let (owner, mode) = (meta.uid(), meta.mode() & 0o777);
    let me = protocol::current_uid()?;
    if owner != me && owner != 0 {
        return Some(format!(
            "the private key belongs to uid {owner}, neither this user (uid {me}) nor root"
        ));
    }
    let allowed = if owner == me && me != 0 { 0o700 } else { 0o740 };
    (mode & !allowed != 0).then(|| {
        format!(
            "the private key is readable or writable by others (mode {mode:04o}); chmod {} it",
            if owner == me && me != 0 {
                "600"
            } else {
                "600 (or 640, root-owned)"
            }
        )
    })
}

/// The server's TLS settings from the two PEM files.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<ServerConfig> {
    let certs = read_certificates(cert_file)?;
    let key = read_private_key(key_file)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused("ssl-certfile", cert_file, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            refused(
                "ssl-keyfile",
                key_file,
                format!(
                    "cannot serve the certificate of {}: {e}",
                    cert_file.display()
                ),
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The two files, when both flags are given; one without the other is refused.
pub fn files(cert: Option<&PathBuf>, key: Option<&PathBuf>) -> Result<Option<(PathBuf, PathBuf)>> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert.clone(), key.clone()))),
        (None, None) => Ok(None),
        (given, _) => Err(TokenizerError::Flag {
            flag: if given.is_some() {
                "ssl-certfile"
            } else {
                "ssl-keyfile"
            },
            reason: "HTTPS needs both --ssl-certfile and --ssl-keyfile".into(),
        }),
    }
}

/// A GET against this server, over TLS when it has a certificate (trusting that one only).
pub struct Probe {
    tls: Option<Arc<ClientConfig>>,
}

impl Probe {
    /// Plain HTTP without `cert_file`; else HTTPS trusting only its leaf certificate.
    pub fn new(cert_file: Option<&Path>) -> Result<Probe> {
        let Some(path) = cert_file else {
            return Ok(Probe { tls: None });
        };
        let leaf = read_certificates(path)?.swap_remove(0);
        let provider = provider();
        let config = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| refused("ssl-certfile", path, e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned { leaf, provider }))
            .with_no_client_auth();
        Ok(Probe {
            tls: Some(Arc::new(config)),
        })
    }

    /// `http` or `https`, for the URL shown to users.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `GET path` on `addr` (`ip:port`) with `Connection: close` and the extra header lines
    /// given (each ending in CRLF); the whole response, or `None` when there is none yet.
    pub fn get(&self, addr: &str, path: &str, headers: &str) -> Option<String> {
        let mut tcp =
            TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_millis(500)).ok()?;
        tcp.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        tcp.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
        let mut response = Vec::new();
        match &self.tls {
            None => {
                tcp.write_all(request.as_bytes()).ok()?;
                tcp.read_to_end(&mut response).ok()?;
            }
            Some(config) => {
                // The pinned verifier ignores the name; any valid one will do.
                let name = ServerName::try_from("localhost").ok()?;
                let conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                tls.write_all(request.as_bytes()).ok()?;
                // The server may close without close_notify once the body is sent.
                match tls.read_to_end(&mut response) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                    Err(_) => return None,
                }
            }
        }
        String::from_utf8(response).ok()
    }
}

/// Trusts one certificate, by its bytes, whatever name it carries; signatures are still
/// checked, so only the holder of its key can complete the handshake.
#[derive(Debug)]
struct Pinned {
    leaf: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.leaf.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the server's certificate is not the one of --ssl-certfile".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `localhost` and its key, as PEM files in `dir`.
    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
        chmod(&key, 0o600);
        (cert, key)
    }

    fn chmod(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_key_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        for mode in [0o644, 0o604, 0o660] {
            chmod(&key, mode);
            let msg = refusal(server_config(&cert, &key));
            assert!(msg.starts_with("cannot use --ssl-keyfile "), "{msg}");
            assert!(msg.contains(&format!("(mode {mode:04o})")), "{msg}");
        }
        chmod(&key, 0o400);
        server_config(&cert, &key).unwrap();
    }

    fn refusal(result: Result<ServerConfig>) -> String {
        let err = result.expect_err("refused");
        assert!(err.is_config_error(), "{err}");
        err.to_string()
    }

    #[test]
    fn a_certificate_and_its_key_serve_http_1_1() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let config = server_config(&cert, &key).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = pair(dir.path(), "a");
        let (_, other_key) = pair(dir.path(), "b");
        let msg = refusal(server_config(&cert, &other_key));
        assert!(msg.starts_with("cannot use --ssl-keyfile "), "{msg}");
        assert!(msg.contains("b.key") && msg.contains("a.crt"), "{msg}");
    }

    #[test]
    fn unreadable_empty_or_swapped_files_are_refused_with_the_flag_that_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let missing = dir.path().join("absent.pem");
        let msg = refusal(server_config(&missing, &key));
        assert!(msg.starts_with("cannot use --ssl-certfile ") && msg.contains("absent.pem"));
        let msg = refusal(server_config(&cert, &missing));
        assert!(msg.starts_with("cannot use --ssl-keyfile "), "{msg}");
        // The two files given the other way round.
        let msg = refusal(server_config(&key, &cert));
        assert!(msg.contains("holds no PEM certificate"), "{msg}");
    }

    #[test]
    fn an_encrypted_key_is_refused_saying_it_must_be_decrypted() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = pair(dir.path(), "a");
        let key = dir.path().join("enc.key");
        // The PEM label openssl writes for a PKCS#8 key under a passphrase.
        std::fs::write(
            &key,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkqhkiG9w0BBQ0w\n\
             -----END ENCRYPTED PRIVATE KEY-----\n",
        )
        .unwrap();
        chmod(&key, 0o600);
        let msg = refusal(server_config(&cert, &key));
        assert!(msg.contains("encrypted, which is not supported"), "{msg}");
    }

    #[test]
    fn one_file_without_the_other_is_refused() {
        let p = PathBuf::from("/x");
        assert!(files(None, None).unwrap().is_none());
        assert!(files(Some(&p), Some(&p)).unwrap().is_some());
        for (cert, key, flag) in [
            (Some(&p), None, "--ssl-certfile"),
            (None, Some(&p), "--ssl-keyfile"),
        ] {
            let err = files(cert, key).unwrap_err();
            assert!(err.is_config_error());
            let msg = err.to_string();
            assert!(msg.starts_with(&format!("bad {flag}: ")), "{msg}");
            assert!(msg.contains("needs both"), "{msg}");
        }
    }
}
