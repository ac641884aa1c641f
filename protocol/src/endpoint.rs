//! Endpoints (`ipc://path`, `tcp://host:port`) and the per-deployment runtime directory that
//! holds the default ipc sockets.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::ProtocolError;

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
    /// Create (or reuse) `path` with mode 0700.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, ProtocolError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(RuntimeDir { path })
    }

    /// The default location: `$XDG_RUNTIME_DIR/dpserve-<name>` or `/tmp/dpserve-<uid>-<name>`.
    pub fn default_path(name: &str) -> PathBuf {
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir).join(format!("dpserve-{name}")),
            _ => {
                // The owner of /proc/self is our uid; this avoids an unsafe libc call here.
                let uid = std::fs::metadata("/proc/self")
                    .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
                    .unwrap_or(0);
                PathBuf::from(format!("/tmp/dpserve-{uid}-{name}"))
            }
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
