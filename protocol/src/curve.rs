//! CURVE keys for ZeroMQ over TCP (RFC 26, CurveZMQ): keypairs an operator manages as files,
//! the allow-list of public keys a bound socket admits, and the ZAP handler (RFC 27) that
//! applies it during each handshake. libzmq does the cryptography, linked against libsodium
//! (`third_party/zmq-sys`); `transport::Transport` puts these on the sockets.
//!
//! Key files use czmq's certificate text (`zcert`), so ZeroMQ's own tools read them: a secret
//! file holds both keys, a public file the public key alone, each in Z85 (40 characters).
//! A public-key file may also be the bare 40-character key on one line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{ProtocolError, Result};

/// Where libzmq sends ZAP requests; one handler per context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
/// The ZAP domain every dpserve CURVE server socket names.
pub const ZAP_DOMAIN: &str = "dpserve";
/// A key file larger than this is not a key file.
const MAX_KEY_FILE: u64 = 64 * 1024;
/// The refusal log's window: a refused key is logged at most once in it, and at most
/// [`REFUSAL_LOGS_PER_WINDOW`] keys in all (a refused peer reconnects every second).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// A CURVE public key (32 bytes); shown in Z85.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// Parse a 40-character Z85 key.
    pub fn from_z85(text: &str) -> std::result::Result<Self, String> {
        decode_z85(text).map(PublicKey)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn z85(&self) -> String {
        encode_z85(&self.0)
    }

    /// The public-key file at `path` (a certificate or the bare key).
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_key_file(path)?;
        let bad = |reason: String| key_error(path, reason);
        let cert = Cert::parse(&text);
        match cert.public {
            Some(public) => PublicKey::from_z85(&public).map_err(bad),
            None if text.trim().len() == 40 => PublicKey::from_z85(text.trim()).map_err(bad),
            None => Err(bad(
                "no `public-key = \"…\"` line and not a bare Z85 key".into()
            )),
        }
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.z85())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.z85())
    }
}

/// A CURVE keypair. Its `Debug` shows the public key only.
#[derive(Clone)]
pub struct Keypair {
    public: PublicKey,
    secret: [u8; 32],
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keypair(public {})", self.public)
    }
}

impl Keypair {
    /// A fresh keypair from libsodium's random source.
    pub fn generate() -> Result<Self> {
        let pair = zmq::CurveKeyPair::new().map_err(|e| ProtocolError::zmq("CURVE keygen", e))?;
        Ok(Keypair {
            public: PublicKey(pair.public_key),
            secret: pair.secret_key,
        })
    }

    /// The keypair whose secret key is `secret` (the public key is derived from it).
    pub fn from_secret(secret: [u8; 32]) -> Result<Self> {
        let public = derive_public(&secret)?;
        Ok(Keypair { public, secret })
    }

    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub fn secret_bytes(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The secret-key file at `path`: a certificate with a `secret-key` line, readable by its
    /// owner only (as `dpserve keygen` and systemd's `LoadCredential=` leave it). A `public-key`
    /// line, when present, must be the secret's own.
    pub fn load(path: &Path) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let text = read_key_file(path)?;
        let cert = Cert::parse(&text);
        let Some(secret) = cert.secret else {
            return Err(key_error(
                path,
                "no `secret-key = \"…\"` line (a public-key file where the secret one belongs?)"
                    .into(),
            ));
        };
        let meta = std::fs::metadata(path).map_err(|e| key_error(path, e.to_string()))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(key_error(
                path,
                format!("a secret key readable by others (mode {mode:04o}); chmod 600 it"),
            ));
        }
        let secret = decode_z85(&secret).map_err(|reason| key_error(path, reason))?;
        let pair = Keypair::from_secret(secret)?;
        if let Some(public) = cert.public {
            if PublicKey::from_z85(&public).ok() != Some(pair.public) {
                return Err(key_error(
                    path,
                    "its public-key line is not the public key of its secret-key line".into(),
                ));
            }
        }
        Ok(pair)
    }

    /// Write `<stem>.key` (both keys, mode 0600) and `<stem>.pub` (the public key, 0644).
    /// Refuses to overwrite either file.
    pub fn write(&self, stem: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let with_ext = |ext: &str| {
            let mut name = stem.as_os_str().to_owned();
            name.push(ext);
            PathBuf::from(name)
        };
        let (secret_path, public_path) = (with_ext(".key"), with_ext(".pub"));
        for (path, mode, text) in [
            (&secret_path, 0o600, self.cert_text(true)),
            (&public_path, 0o644, self.cert_text(false)),
        ] {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            file.write_all(text.as_bytes())?;
        }
        Ok((secret_path, public_path))
    }

    fn cert_text(&self, secret: bool) -> String {
        let (kind, warning) = if secret {
            (
                "**Secret**",
                "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n",
            )
        } else {
            ("Public", "")
        };
        let mut text = format!(
            "#   ****  Generated by dpserve keygen  ****\n\
             #   ZeroMQ CURVE {kind} Certificate\n{warning}\n\
             metadata\ncurve\n    public-key = \"{}\"\n",
            self.public
        );
        if secret {
            text.push_str(&format!(
                "    secret-key = \"{}\"\n",
                encode_z85(&self.secret)
            ));
        }
        text
    }
}

/// The public keys a bound socket admits: every key file in a directory, plus keys always
/// admitted (this process's own, its server key). The directory is read again when it changes
/// (a file added or removed: its mtime moves, so that peer's next connection is admitted or
/// turned away) and at least once a second (a file rewritten in place), never more often: a
/// flood of handshakes from unknown keys costs one directory read a second, not one each.
#[derive(Debug, Clone)]
pub struct AllowList {
    dir: Option<PathBuf>,
    always: Vec<PublicKey>,
    /// What the directory listed when last read.
    cache: Arc<std::sync::Mutex<Option<Listed>>>,
    /// Directory reads by [`AllowList::admits`] so far.
    reads: Arc<std::sync::atomic::AtomicU64>,
}

/// One read of the allow-list directory.
#[derive(Debug)]
struct Listed {
    keys: Vec<PublicKey>,
    /// The directory's mtime then.
    mtime: Option<std::time::SystemTime>,
    at: std::time::SystemTime,
    read: Instant,
}

/// The allow-list directory is read again at least this often.
const ALLOW_REREAD_EVERY: Duration = Duration::from_secs(1);
/// A directory changed less than this before it was read may change again within the same
/// mtime tick (filesystem timestamps are coarse): such a read is not trusted for later checks.
const MTIME_RACY: Duration = Duration::from_secs(2);

impl Listed {
    fn still_current(&self, mtime: Option<std::time::SystemTime>) -> bool {
        let settled = self
            .mtime
            .and_then(|m| self.at.duration_since(m).ok())
            .is_some_and(|age| age >= MTIME_RACY);
        settled && mtime == self.mtime && self.read.elapsed() < ALLOW_REREAD_EVERY
    }
}

impl AllowList {
    /// `dir` must be a readable directory now; its files are read when a handshake needs them
    /// (see the type's doc).
    pub fn new(dir: Option<PathBuf>, always: Vec<PublicKey>) -> Result<Self> {
        if let Some(dir) = &dir {
            std::fs::read_dir(dir).map_err(|e| ProtocolError::Security {
                reason: format!("--curve-allow-dir {}: {e}", dir.display()),
            })?;
        }
        Ok(AllowList {
            dir,
            always,
            cache: Arc::default(),
            reads: Arc::default(),
        })
    }

    /// Whether `key` may connect.
    pub fn admits(&self, key: &PublicKey) -> bool {
        if self.always.contains(key) {
            return true;
        }
        let Some(dir) = &self.dir else {
            return false;
        };
        let mtime = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if !cache.as_ref().is_some_and(|c| c.still_current(mtime)) {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *cache = Some(Listed {
                keys: self.listed(),
                mtime,
                at: std::time::SystemTime::now(),
                read: Instant::now(),
            });
        }
        cache.as_ref().is_some_and(|c| c.keys.contains(key))
    }

    /// The keys the directory lists now (read now); files that hold no public key are skipped.
    pub fn listed(&self) -> Vec<PublicKey> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), %e, "CURVE allow-list unreadable: no key admitted from it");
                return Vec::new();
            }
        };
        entries
            .flatten()
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|entry| PublicKey::load(&entry.path()).ok())
            .collect()
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
}

/// Binds the ZAP handler of `ctx` unless one is already bound there (by an earlier CURVE
/// socket of this process), and serves it on a thread of its own for as long as the process
/// lives (its socket keeps the context alive, and the context's sockets keep asking it). Every
/// CURVE server socket also enforces ZAP ([`enforce_zap`]), so no handler means no entry
/// rather than libzmq's default of every key. One allow-list per context: the first CURVE
/// bind's.
pub(crate) fn ensure_zap_handler(ctx: &zmq::Context, allow: Arc<AllowList>) -> Result<()> {
    let sock = ctx
        .socket(zmq::REP)
        .map_err(|e| ProtocolError::zmq("ZAP handler socket", e))?;
    sock.set_linger(0)
        .map_err(|e| ProtocolError::zmq("ZAP handler socket", e))?;
    match sock.bind(ZAP_ENDPOINT) {
        Ok(()) => {}
        Err(zmq::Error::EADDRINUSE) => return Ok(()),
        Err(e) => return Err(ProtocolError::zmq(format!("bind {ZAP_ENDPOINT}"), e)),
    }
    std::thread::Builder::new()
        .name("zap".into())
        .spawn(move || serve_zap(&sock, &allow))
        .map_err(|e| ProtocolError::Security {
            reason: format!("starting the ZAP handler thread: {e}"),
        })?;
    Ok(())
}

/// libzmq's `ZMQ_ZAP_ENFORCE_DOMAIN` (zmq.h 4.3, listed among the draft options but handled in
/// every build: options.cpp), which zmq-sys does not bind.
const ZMQ_ZAP_ENFORCE_DOMAIN: i32 = 93;

/// Makes `sock` refuse every CURVE client when no ZAP handler answers, instead of libzmq's
/// default of admitting them all (curve_server.cpp): the allow-list cannot be bypassed by a
/// handler that is missing.
pub(crate) fn enforce_zap(sock: &mut zmq::Socket) -> Result<()> {
    let on: i32 = 1;
    // SAFETY: `sock` is a live socket owned by the caller; libzmq copies the 4-byte int option
    // out of `on`, which outlives the call.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            sock.as_mut_ptr(),
            ZMQ_ZAP_ENFORCE_DOMAIN,
            (&on as *const i32).cast(),
            std::mem::size_of::<i32>(),
        )
    };
    if rc != 0 {
        return Err(ProtocolError::Security {
            reason: "this libzmq cannot enforce ZAP (ZMQ_ZAP_ENFORCE_DOMAIN)".into(),
        });
    }
    Ok(())
}

/// Answers ZAP requests for the life of the process. Should its socket ever fail, every CURVE
/// handshake would be refused from then on ([`enforce_zap`]): no peer could join or come back,
/// so the process stops instead (its unit restarts it).
fn serve_zap(sock: &zmq::Socket, allow: &AllowList) {
    answer_zap(sock, allow);
    tracing::error!("the CURVE ZAP handler's socket failed; stopping, as no peer could connect");
    std::process::abort();
}

fn answer_zap(sock: &zmq::Socket, allow: &AllowList) {
    let mut log = RefusalLog::default();
    while let Ok(request) = sock.recv_multipart(0) {
        let (reply, refused) = zap_reply(&request, allow);
        if let Some((key, address)) = refused {
            log.refused(key, &address, allow.dir(), Instant::now());
        }
        if sock.send_multipart(reply, 0).is_err() {
            return;
        }
    }
}

/// Refused keys logged at most per [`REFUSAL_LOG_EVERY`] window, whatever the keys.
const REFUSAL_LOGS_PER_WINDOW: usize = 8;

/// The refusal log's limit, global rather than per key (a fresh key per handshake must not
/// buy a line each): in each window the first [`REFUSAL_LOGS_PER_WINDOW`] distinct keys are
/// logged, the rest counted and reported in one line when the next window opens. Its state
/// is bounded by that cap.
#[derive(Debug, Default)]
struct RefusalLog {
    window: Option<Instant>,
    logged: Vec<PublicKey>,
    suppressed: u64,
}

impl RefusalLog {
    /// Notes a refusal at `now`; true when it was logged.
    fn refused(&mut self, key: PublicKey, address: &str, dir: Option<&Path>, now: Instant) -> bool {
        let expired = self
            .window
            .is_none_or(|start| now.duration_since(start) >= REFUSAL_LOG_EVERY);
        if expired {
            if self.suppressed > 0 {
                tracing::warn!(
                    refusals = self.suppressed,
                    window_s = REFUSAL_LOG_EVERY.as_secs(),
                    "CURVE refusals not logged in the last window (a key is logged once a window, {REFUSAL_LOGS_PER_WINDOW} keys at most)"
                );
            }
            *self = RefusalLog {
                window: Some(now),
                ..RefusalLog::default()
            };
        }
        if self.logged.contains(&key) || self.logged.len() >= REFUSAL_LOGS_PER_WINDOW {
            self.suppressed += 1;
            return false;
        }
        self.logged.push(key);
        tracing::warn!(
            peer = %address,
            key = %key,
            allow_dir = ?dir,
            "refused a CURVE peer: its public key is not in the allow-list"
        );
        true
    }
}

/// The reply to one ZAP request (RFC 27: version, request id, status code, status text, user
/// id, metadata), and the refused key with the peer's address when it is a refusal of a key.
fn zap_reply(
    request: &[Vec<u8>],
    allow: &AllowList,
) -> (Vec<Vec<u8>>, Option<(PublicKey, String)>) {
    let request_id = request.get(1).cloned().unwrap_or_default();
    let reply = |code: &str, text: &str, user: &str| {
        vec![
            b"1.0".to_vec(),
            request_id.clone(),
            code.as_bytes().to_vec(),
            text.as_bytes().to_vec(),
            user.as_bytes().to_vec(),
            Vec::new(),
        ]
    };
    let well_formed = request.len() >= 7 && request[0] == b"1.0" && request[5] == b"CURVE";
    let key = well_formed
        .then(|| <[u8; 32]>::try_from(request[6].as_slice()).ok())
        .flatten()
        .map(PublicKey);
    let Some(key) = key else {
        return (reply("400", "only CURVE clients are admitted", ""), None);
    };
    if allow.admits(&key) {
        (reply("200", "OK", &key.z85()), None)
    } else {
        let address = String::from_utf8_lossy(&request[3]).into_owned();
        (
            reply("400", "public key not in the allow-list", ""),
            Some((key, address)),
        )
    }
}

/// The lines of a key file that matter: `public-key = "…"` and `secret-key = "…"`.
struct Cert {
    public: Option<String>,
    secret: Option<String>,
}

impl Cert {
    fn parse(text: &str) -> Self {
        let mut cert = Cert {
            public: None,
            secret: None,
        };
        for line in text.lines() {
            let Some((name, value)) = line.trim().split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"').to_string();
            match name.trim() {
                "public-key" => cert.public = Some(value),
                "secret-key" => cert.secret = Some(value),
                _ => {}
            }
        }
        cert
    }
}

fn read_key_file(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).map_err(|e| key_error(path, e.to_string()))?;
    if !meta.is_file() || meta.len() > MAX_KEY_FILE {
        return Err(key_error(path, "not a key file".into()));
    }
    std::fs::read_to_string(path).map_err(|e| key_error(path, e.to_string()))
}

fn key_error(path: &Path, reason: String) -> ProtocolError {
    ProtocolError::CurveKey {
        path: path.display().to_string(),
        reason,
    }
}

fn encode_z85(key: &[u8; 32]) -> String {
    zmq::z85_encode(key).expect("32 bytes are a multiple of 4")
}

fn decode_z85(text: &str) -> std::result::Result<[u8; 32], String> {
    if text.len() != 40 {
        return Err(format!(
            "a CURVE key is 40 Z85 characters, this one is {}",
            text.len()
        ));
    }
    let bytes = zmq::z85_decode(text).map_err(|_| "not a Z85 key".to_string())?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| "not a Z85 key".to_string())
}

/// The public key of a secret key (libzmq's `zmq_curve_public`).
fn derive_public(secret: &[u8; 32]) -> Result<PublicKey> {
    let secret_z85 = std::ffi::CString::new(encode_z85(secret)).expect("Z85 has no NUL");
    let mut public_z85 = [0u8; 41];
    // SAFETY: libzmq reads a NUL-terminated 40-character Z85 secret and writes a 40-character
    // Z85 public key plus NUL into the 41 bytes given; both buffers outlive the call.
    let rc =
        unsafe { zmq_sys::zmq_curve_public(public_z85.as_mut_ptr().cast(), secret_z85.as_ptr()) };
    if rc != 0 {
        return Err(ProtocolError::Security {
            reason: "this libzmq cannot derive CURVE public keys (built without CURVE)".into(),
        });
    }
    let text = std::str::from_utf8(&public_z85[..40]).map_err(|_| ProtocolError::Security {
        reason: "libzmq returned a public key that is not Z85".into(),
    })?;
    PublicKey::from_z85(text).map_err(|reason| ProtocolError::Security { reason })
}

/// Whether the linked libzmq has CURVE (it does when built from this workspace).
pub fn available() -> bool {
    zmq::has("curve") == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dpserve-curve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn libzmq_has_curve() {
        assert!(available(), "libzmq was built without CURVE");
    }

    #[test]
    fn a_written_keypair_loads_back_and_its_public_key_is_derived_from_the_secret() {
        let dir = temp_dir("roundtrip");
        let pair = Keypair::generate().unwrap();
        let (secret, public) = pair.write(&dir.join("node")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&secret), 0o600);
        assert_eq!(mode(&public), 0o644);
        let loaded = Keypair::load(&secret).unwrap();
        assert_eq!(loaded.public(), pair.public());
        assert_eq!(loaded.secret_bytes(), pair.secret_bytes());
        assert_eq!(PublicKey::load(&public).unwrap(), pair.public());
        // The public file holds no secret, the secret file both.
        let public_text = std::fs::read_to_string(&public).unwrap();
        assert!(!public_text.contains("secret-key"), "{public_text}");
        assert!(Keypair::load(&public).is_err());
        // Writing again does not overwrite.
        assert!(pair.write(&dir.join("node")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_secret_key_readable_by_others_or_mismatched_or_malformed_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("refuse");
        let pair = Keypair::generate().unwrap();
        let (secret, _) = pair.write(&dir.join("a")).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Keypair::load(&secret).unwrap_err().to_string();
        assert!(
            err.contains("readable by others") && err.contains("0644"),
            "{err}"
        );

        let other = Keypair::generate().unwrap();
        let mixed = dir.join("mixed.key");
        let text = pair
            .cert_text(true)
            .replace(&pair.public().z85(), &other.public().z85());
        std::fs::write(&mixed, text).unwrap();
        std::fs::set_permissions(&mixed, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = Keypair::load(&mixed).unwrap_err().to_string();
        assert!(err.contains("not the public key of its secret"), "{err}");

        let short = dir.join("short.key");
        std::fs::write(&short, "secret-key = \"abc\"\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = Keypair::load(&short).unwrap_err().to_string();
        assert!(err.contains("40 Z85 characters"), "{err}");
        let err = Keypair::load(&dir.join("absent.key"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("absent.key"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_allow_list_follows_its_directory() {
        let dir = temp_dir("allow");
        let own = Keypair::generate().unwrap().public();
        let peer = Keypair::generate().unwrap();
        let allow = AllowList::new(Some(dir.clone()), vec![own]).unwrap();
        assert!(allow.admits(&own));
        assert!(!allow.admits(&peer.public()));
        // A bare key file counts as much as a certificate; junk is skipped.
        std::fs::write(dir.join("junk"), "not a key\n").unwrap();
        std::fs::write(dir.join("peer.pub"), format!("{}\n", peer.public())).unwrap();
        assert!(allow.admits(&peer.public()));
        std::fs::remove_file(dir.join("peer.pub")).unwrap();
        assert!(!allow.admits(&peer.public()));
        assert!(AllowList::new(Some(dir.join("missing")), vec![]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_flood_of_unknown_keys_reads_the_allow_list_at_most_once_a_second() {
        let dir = temp_dir("flood");
        let peer = Keypair::generate().unwrap();
        std::fs::write(dir.join("peer.pub"), format!("{}\n", peer.public())).unwrap();
        // A directory that last changed a while ago (a fresh one is re-read until it settles).
        let past = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(past)
            .unwrap();
        let allow = AllowList::new(Some(dir.clone()), vec![]).unwrap();
        let started = Instant::now();
        for _ in 0..20_000 {
            assert!(!allow.admits(&Keypair::generate().unwrap().public()));
        }
        assert!(allow.admits(&peer.public()));
        let reads = allow.reads.load(std::sync::atomic::Ordering::Relaxed);
        let most = 1 + started.elapsed().as_secs() + 1;
        assert!(reads <= most, "{reads} reads in {:?}", started.elapsed());
        // A key file added is admitted at once: the directory's mtime moved.
        let late = Keypair::generate().unwrap();
        std::fs::write(dir.join("late.pub"), format!("{}\n", late.public())).unwrap();
        assert!(allow.admits(&late.public()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refusals_are_logged_a_few_keys_a_window_whatever_the_keys() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        let repeated = Keypair::generate().unwrap().public();
        assert!(log.refused(repeated, "a", None, t0));
        assert!(!log.refused(repeated, "a", None, t0), "a key once a window");
        // 20 000 handshakes, a fresh key each (what bypassed a per-key limit).
        let logged = (0..20_000)
            .filter(|_| log.refused(Keypair::generate().unwrap().public(), "b", None, t0))
            .count();
        assert_eq!(logged, REFUSAL_LOGS_PER_WINDOW - 1);
        assert_eq!(log.logged.len(), REFUSAL_LOGS_PER_WINDOW, "bounded state");
        assert_eq!(log.suppressed, 20_000 - logged as u64 + 1);
        // The next window logs again (after one line counting what was not).
        let later = t0 + REFUSAL_LOG_EVERY;
        assert!(log.refused(repeated, "a", None, later));
        assert_eq!((log.logged.len(), log.suppressed), (1, 0));
    }

    /// Without a ZAP handler libzmq admits every CURVE client unless told to enforce ZAP.
    #[test]
    fn a_curve_server_without_a_zap_handler_admits_no_one_when_enforcing() {
        let server = Keypair::generate().unwrap();
        let client = Keypair::generate().unwrap();
        for enforce in [false, true] {
            // A fresh context each time: no handler is bound in it.
            let ctx = zmq::Context::new();
            let mut pull = ctx.socket(zmq::PULL).unwrap();
            pull.set_curve_server(true).unwrap();
            pull.set_curve_secretkey(server.secret_bytes()).unwrap();
            pull.set_zap_domain(ZAP_DOMAIN).unwrap();
            if enforce {
                enforce_zap(&mut pull).unwrap();
            }
            pull.bind("tcp://127.0.0.1:*").unwrap();
            let endpoint = pull.get_last_endpoint().unwrap().unwrap();
            let push = ctx.socket(zmq::PUSH).unwrap();
            push.set_curve_serverkey(server.public().as_bytes())
                .unwrap();
            push.set_curve_publickey(client.public().as_bytes())
                .unwrap();
            push.set_curve_secretkey(client.secret_bytes()).unwrap();
            push.set_linger(0).unwrap();
            push.connect(&endpoint).unwrap();
            push.send("in?", zmq::DONTWAIT).unwrap();
            pull.set_rcvtimeo(1_000).unwrap();
            let got = pull.recv_bytes(0).ok();
            if enforce {
                assert_eq!(got, None, "enforcing: a client got in without a handler");
            } else {
                assert_eq!(
                    got.as_deref(),
                    Some(&b"in?"[..]),
                    "libzmq's default changed"
                );
            }
        }
    }

    #[test]
    fn zap_admits_listed_curve_keys_only() {
        let key = Keypair::generate().unwrap().public();
        let allow = AllowList::new(None, vec![key]).unwrap();
        let request = |mechanism: &[u8], credential: &[u8]| {
            vec![
                b"1.0".to_vec(),
                b"7".to_vec(),
                ZAP_DOMAIN.as_bytes().to_vec(),
                b"10.0.0.9".to_vec(),
                Vec::new(),
                mechanism.to_vec(),
                credential.to_vec(),
            ]
        };
        let (reply, refused) = zap_reply(&request(b"CURVE", key.as_bytes()), &allow);
        assert_eq!(reply[1], b"7");
        assert_eq!(reply[2], b"200");
        assert_eq!(reply[4], key.z85().as_bytes());
        assert!(refused.is_none());
        let stranger = Keypair::generate().unwrap().public();
        let (reply, refused) = zap_reply(&request(b"CURVE", stranger.as_bytes()), &allow);
        assert_eq!(reply[2], b"400");
        assert_eq!(refused, Some((stranger, "10.0.0.9".to_string())));
        let (reply, _) = zap_reply(&request(b"NULL", b""), &allow);
        assert_eq!(reply[2], b"400");
        let (reply, _) = zap_reply(&[b"1.0".to_vec()], &allow);
        assert_eq!(reply.len(), 6);
        assert_eq!(reply[2], b"400");
    }
}
