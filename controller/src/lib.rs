//! The controller actor: routes each tokenized request to a data-parallel rank, tracks which
//! ranks are live and how loaded they are, and forwards control messages (abort, flush) to them.

pub mod policy;
pub mod ranks;
pub mod router;
pub mod server;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use protocol::endpoint::default_endpoint;
use protocol::Endpoint;

pub use policy::Method;
pub use server::{Controller, ControllerConfig};

/// `dpserve controller` flags. Every flag also reads `DPSERVE_<FLAG>`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Where the controller receives requests from the tokenizer (bind). Default: ipc socket in
    /// the default runtime directory.
    #[arg(long, env = "DPSERVE_CONTROLLER_ADDR")]
    pub controller_addr: Option<String>,
    /// Where workers connect (bind, ROUTER).
    #[arg(long, env = "DPSERVE_WORKER_ADDR")]
    pub worker_addr: Option<String>,
    /// The tokenizer's output socket (connect).
    #[arg(long, env = "DPSERVE_TOKENIZER_ADDR")]
    pub tokenizer_addr: Option<String>,
    /// Load-balance method.
    #[arg(long, env = "DPSERVE_LOAD_BALANCE_METHOD", default_value = "round_robin")]
    pub load_balance_method: String,
    /// Seconds without a heartbeat after which a worker leaves the live set.
    #[arg(long, env = "DPSERVE_WORKER_TIMEOUT", default_value_t = 3.0)]
    pub worker_timeout: f64,
    /// Model id every worker must serve (default: the first worker's).
    #[arg(long, env = "DPSERVE_MODEL_ID")]
    pub model_id: Option<String>,
}

impl ControllerArgs {
    pub fn resolve(&self) -> anyhow::Result<ControllerConfig> {
        let addr = |flag: &str, value: &Option<String>, name: &str| -> anyhow::Result<Endpoint> {
            match value {
                Some(s) => s.parse().with_context(|| format!("--{flag}")),
                None => Ok(default_endpoint(name)),
            }
        };
        if !(self.worker_timeout.is_finite() && self.worker_timeout > 0.0) {
            anyhow::bail!(
                "--worker-timeout must be a positive number of seconds, got {}",
                self.worker_timeout
            );
        }
        let method = self
            .load_balance_method
            .parse::<Method>()
            .map_err(|e| anyhow::anyhow!("--load-balance-method: {e}"))?;
        Ok(ControllerConfig {
            controller_addr: addr("controller-addr", &self.controller_addr, "controller")?,
            worker_addr: addr("worker-addr", &self.worker_addr, "worker")?,
            tokenizer_addr: addr("tokenizer-addr", &self.tokenizer_addr, "tokenizer")?,
            method,
            worker_timeout: Duration::from_secs_f64(self.worker_timeout),
            model_id: self.model_id.clone(),
            cluster_status_interval: Duration::from_millis(500),
        })
    }
}

/// Run the controller until SIGTERM or SIGINT.
pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handler")?;
    }
    let ctx = zmq::Context::new();
    let controller = Controller::bind(&ctx, config)?;
    controller.run(stop)
}
