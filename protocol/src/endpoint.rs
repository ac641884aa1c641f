//! Endpoints (`ipc://path`, `tcp://host:port`) and the per-deployment runtime directory that
//! holds the default ipc sockets.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::ProtocolError;

/// A validated ZeroMQ endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Ipc(PathBuf),
    Tcp { host: String, port: u16 },
}

impl FromStr for Endpoint {
    type Err = ProtocolError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| ProtocolError::InvalidEndpoint {
            endpoint: s.to_string(),
            reason: reason.to_string(),
        };
        if let Some(path) = s.strip_prefix("ipc://") {
            if path.is_empty() {
                return Err(bad("empty ipc path"));
            }
            // The kernel limits sun_path to 108 bytes including the terminator.
            if path.len() > 107 {
                return Err(bad("ipc path longer than 107 bytes"));
            }
            Ok(Endpoint::Ipc(PathBuf::from(path)))
        } else if let Some(rest) = s.strip_prefix("tcp://") {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad("expected tcp://host:port"))?;
            if host.is_empty() {
                return Err(bad("empty host"));
            }
            let port = port
                .parse::<u16>()
                .map_err(|_| bad("port is not a number in 0..=65535"))?;
            Ok(Endpoint::Tcp {
                host: host.to_string(),
                port,
            })
        } else {
            Err(bad("expected ipc://PATH or tcp://HOST:PORT"))
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Ipc(path) => write!(f, "ipc://{}", path.display()),
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
        }
    }
}

impl Endpoint {
    /// The directory an ipc endpoint's socket file is in.
    pub fn ipc_dir(&self) -> Option<&Path> {
        match self {
            Endpoint::Ipc(path) => path.parent().filter(|d| !d.as_os_str().is_empty()),
            Endpoint::Tcp { .. } => None,
        }
    }

    /// The address a connecting peer uses. A `tcp://*:port` or `tcp://0.0.0.0:port` bind is
    /// reached at loopback from this host.
    pub fn connect_addr(&self) -> String {
        match self {
            Endpoint::Tcp { host, port } if host == "*" || host == "0.0.0.0" => {
                format!("tcp://127.0.0.1:{port}")
            }
            other => other.to_string(),
        }
    }
}

/// A directory for one deployment's ipc sockets, created with mode 0700.
#[derive(Debug, Clone)]
pub struct RuntimeDir {
    path: PathBuf,
}

impl RuntimeDir {
    /// Create (or reuse) `path` with mode 0700. A directory that exists must be this user's
    /// own (another user who made it first, at a predictable path such as the default, could
    /// replace its sockets) and a real directory, not a link to one.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, ProtocolError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let path = path.as_ref().to_path_buf();
        let err = |source| ProtocolError::RuntimeDir {
            path: path.display().to_string(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .map_err(err)?;
        let meta = std::fs::symlink_metadata(&path).map_err(err)?;
        let unsafe_dir = |why: String| ProtocolError::UnsafeDir {
            path: path.display().to_string(),
            why,
        };
        if !meta.is_dir() {
            return Err(unsafe_dir("it is a link, not a directory".into()));
        }
        let me = current_uid().unwrap_or(0);
        if meta.uid() != me {
            let why = format!(
                "it belongs to uid {}, not to this user (uid {me})",
                meta.uid()
            );
            return Err(unsafe_dir(why));
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(RuntimeDir { path })
    }

    /// The default location: `$XDG_RUNTIME_DIR/dpserve-<name>` or `/tmp/dpserve-<uid>-<name>`.
    pub fn default_path(name: &str) -> PathBuf {
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir).join(format!("dpserve-{name}")),
            _ => PathBuf::from(format!(
                "/tmp/dpserve-{}-{name}",
                current_uid().unwrap_or(0)
            )),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ipc endpoint of socket `name` inside this directory.
    pub fn endpoint(&self, name: &str) -> Endpoint {
        Endpoint::Ipc(self.path.join(name))
    }
}

/// This process's uid: the owner of `/proc/self` (no unsafe libc call); `None` where `/proc`
/// cannot be read. The one place the actors and the weight cache ask who they run as.
pub fn current_uid() -> Option<u32> {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .ok()
}

/// Refuses an existing directory of ipc sockets that another user could replace a socket in:
/// owned by another user (root aside), or writable by others without the sticky bit.
#[cfg(feature = "transport")]
pub(crate) fn check_socket_dir(dir: &Path) -> Result<(), ProtocolError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(()); // missing: created (bind) or not yet there (connect retries)
    };
    let (owner, mode, me) = (meta.uid(), meta.mode(), current_uid().unwrap_or(0));
    let why = if owner != me && owner != 0 {
        format!("it belongs to uid {owner}, not to this user (uid {me}) or root")
    } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        format!(
            "others may write in it (mode {:o}) and it is not sticky",
            mode & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(ProtocolError::UnsafeDir {
        path: dir.display().to_string(),
        why,
    })
}

/// The default endpoint of socket `name` (`controller`, `worker`, `tokenizer`): an ipc path in
/// the default runtime directory, so processes started alone on one host find each other.
pub fn default_endpoint(name: &str) -> Endpoint {
    Endpoint::Ipc(RuntimeDir::default_path("default").join(format!("{name}.sock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_valid_endpoints() {
        let cases = [
            ("ipc:///run/dpserve/c.sock", "ipc:///run/dpserve/c.sock"),
            ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
            ("tcp://*:5555", "tcp://*:5555"),
            ("tcp://[::1]:80", "tcp://[::1]:80"),
        ];
        for (input, shown) in cases {
            let ep: Endpoint = input.parse().unwrap();
            assert_eq!(ep.to_string(), shown);
        }
    }

    #[test]
    fn rejects_invalid_endpoints() {
        for input in [
            "",
            "ipc://",
            "tcp://host",
            "tcp://:80",
            "tcp://h:99999",
            "http://x:1",
            "inproc://x",
        ] {
            assert!(input.parse::<Endpoint>().is_err(), "{input:?} accepted");
        }
        let long = format!("ipc:///{}", "a".repeat(120));
        assert!(long.parse::<Endpoint>().is_err());
    }

    #[test]
    fn wildcard_binds_connect_on_loopback() {
        let ep: Endpoint = "tcp://*:7000".parse().unwrap();
        assert_eq!(ep.connect_addr(), "tcp://127.0.0.1:7000");
    }

    #[test]
    fn runtime_dir_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("dpserve-rt-test-{}", std::process::id()));
        let dir = RuntimeDir::create(&base).unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
