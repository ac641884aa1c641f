//! Why a `dpserve` command stopped, and whether a restart could help.
//!
//! Each actor's library says which of its errors are refusals (a flag, file or model the
//! operator must change: `is_config_error`); this type carries that answer from the typed error
//! to the exit status, so `main` asks nothing of the error's inner type.

use std::fmt;
use std::io::Write;
use std::process::ExitCode;

/// EX_CONFIG (sysexits.h): retrying cannot help, so systemd units stop restarting on it
/// (`RestartPreventExitStatus=78`).
const REFUSED: u8 = worker::WorkerError::REFUSED_EXIT_CODE;

#[derive(Debug)]
pub struct Failure {
    error: anyhow::Error,
    refused: bool,
}

impl Failure {
    /// The same failure, its message led by `context`.
    pub fn context(self, context: &'static str) -> Failure {
        Failure {
            error: self.error.context(context),
            refused: self.refused,
        }
    }

    /// 78 for a refusal, 1 for anything else.
    pub fn exit_code(&self) -> ExitCode {
        if self.refused {
            ExitCode::from(REFUSED)
        } else {
            ExitCode::FAILURE
        }
    }

    /// A refusal `up` passes on from the actor that refused (exit 78).
    pub fn refusal(error: anyhow::Error) -> Failure {
        Failure {
            error,
            refused: true,
        }
    }

    /// Print the chain of causes on one line, in one write (so another process's log line
    /// cannot land inside it), and give the exit status. Under `up` a refusal's line also goes
    /// to the file `up` named ([`REFUSAL_FILE_ENV`]), for `up` to end its own output with.
    pub fn report(self) -> ExitCode {
        let line = format!("dpserve: error: {self:#}\n");
        std::io::stderr().write_all(line.as_bytes()).ok();
        if self.refused {
            if let Some(path) = std::env::var_os(REFUSAL_FILE_ENV) {
                std::fs::write(path, format!("{self:#}")).ok();
            }
        }
        self.exit_code()
    }
}

/// Set by `up` for each child: where the child writes its refusal's one line (without the
/// `dpserve: error:` lead) before it exits 78.
pub const REFUSAL_FILE_ENV: &str = "DPSERVE_REFUSAL_FILE";

/// `{:#}` prints the chain of causes on one line, as `report` does.
impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            write!(f, "{:#}", self.error)
        } else {
            write!(f, "{}", self.error)
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure {
            error,
            refused: false,
        }
    }
}

/// A typed error keeps its library's answer to "must the operator change something?".
macro_rules! from_typed {
    ($($error:ty),*) => {$(
        impl From<$error> for Failure {
            fn from(error: $error) -> Failure {
                Failure {
                    refused: error.is_config_error(),
                    error: error.into(),
                }
            }
        }
    )*};
}

from_typed!(
    worker::WorkerError,
    tokenizer_actor::TokenizerError,
    controller::Error,
    protocol::ProtocolError
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_its_exit_status_through_context_and_others_do_not() {
        let refused = Failure::from(worker::WorkerError::Refused(
            "refused by the controller: another model".into(),
        ));
        assert!(refused.refused);
        let refused = refused.context("joining the controller");
        assert!(refused.refused);
        assert_eq!(
            format!("{:#}", refused.error),
            "joining the controller: refused by the controller: another model"
        );
        assert_eq!(refused.report(), ExitCode::from(REFUSED));

        // A flag out of range, a crash or anything untyped exits 1 (systemd may restart it).
        let out_of_range = Failure::from(worker::WorkerError::Flag("--max-batch 0".into()));
        assert!(!out_of_range.refused);
        let crashed = Failure::from(worker::WorkerError::Panicked("scheduler"));
        assert!(!crashed.refused);
        let io = Failure::from(anyhow::anyhow!("starting tokenizer"));
        assert_eq!(io.report(), ExitCode::FAILURE);
    }
}
