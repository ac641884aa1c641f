//! The worker's wall clock. It is read only for the `timestamp` its statuses and heartbeats
//! carry: every deadline and interval the worker keeps is a monotonic `Instant`, and the
//! controller orders a rank's statuses by their `status_seq`, never by this clock. So a clock
//! the host steps (NTP, an operator, a VM resumed) changes nothing the deployment decides.
//!
//! The chaos soak checks that end to end by stepping one worker's clock: with
//! `DPSERVE_TEST_CLOCK_OFFSET_FILE=F` set, each reading adds the seconds written in `F` (a signed
//! number; a missing or unreadable file adds nothing). For tests only: the worker warns at start
//! when it is set.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable that names the offset file.
pub const OFFSET_FILE_VAR: &str = "DPSERVE_TEST_CLOCK_OFFSET_FILE";

fn offset_file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        std::env::var_os(OFFSET_FILE_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

/// Seconds since the Unix epoch, as this worker's statuses and heartbeats carry them.
pub fn unix_time() -> f64 {
    protocol::unix_time() + offset_file().map_or(0.0, |f| read_offset(f.as_path()))
}

fn read_offset(file: &Path) -> f64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite())
        .unwrap_or(0.0)
}

/// A warning line at start when the test clock is on, naming the file.
pub fn warn_if_stepped() {
    if let Some(file) = offset_file() {
        tracing::warn!(
            file = %file.display(),
            "{OFFSET_FILE_VAR} is set: this worker's timestamps are offset by the seconds in \
             that file (for tests only)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_file_steps_the_clock_and_anything_else_reads_as_no_step() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("offset");
        assert_eq!(read_offset(&file), 0.0, "missing");
        for (text, want) in [
            ("-3600\n", -3600.0),
            ("  12.5 ", 12.5),
            ("", 0.0),
            ("soon", 0.0),
            ("inf", 0.0),
        ] {
            std::fs::write(&file, text).unwrap();
            assert_eq!(read_offset(&file), want, "{text:?}");
        }
    }
}
