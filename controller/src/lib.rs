//! The controller actor: routes each tokenized request to a data-parallel rank, tracks which
//! ranks are live and how loaded they are, and forwards control messages (abort, flush) to them.

pub mod budget;
pub mod error;
pub mod kv_index;
pub mod ledger;
pub mod policy;
pub mod ranks;
pub mod rejoin;
pub mod route_counts;
pub mod router;
pub mod server;
pub mod trace;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use protocol::endpoint::default_endpoint;
use protocol::Endpoint;

pub use error::{Error, Result};
pub use policy::{
    CacheAwareArgs, CacheAwareConfig, DynamoKvConfig, FallbackMethod, LlmdPrefixConfig, Method,
    PeerArgs, PeerConfigs, PrefixAffinityArgs, PrefixAffinityConfig, SmgCacheAwareConfig,
};
pub use server::{Controller, ControllerConfig};

/// `--worker-timeout` (seconds) when not given.
pub const DEFAULT_WORKER_TIMEOUT_S: f64 = 3.0;
/// `--decode-load-balance-method` when not given (SGLang's gateway balances decode by load).
pub const DEFAULT_DECODE_METHOD: Method = Method::TotalTokens;

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
    #[command(flatten)]
    pub routing: RoutingArgs,
    /// Append one JSON line per message sent or received, and per routing decision, to
    /// DIR/controller.jsonl (`dpserve trace DIR --rid R` merges the actors' files).
    #[arg(long, env = "DPSERVE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// A message-trace file past this many MiB is renamed `<actor>.old.jsonl` (replacing the
    /// previous one) and a new one starts, so traces take at most about twice this per actor.
    #[arg(long, env = "DPSERVE_TRACE_MAX_MB", default_value_t = protocol::msg_trace::DEFAULT_TRACE_MAX_MB)]
    pub trace_max_mb: u64,
    #[command(flatten)]
    pub security: protocol::SecurityArgs,
}

/// How requests are routed and which workers belong (also `dpserve up`'s, which flattens them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct RoutingArgs {
    /// Load-balance method.
    #[arg(long, env = "DPSERVE_LOAD_BALANCE_METHOD", value_enum, default_value_t = Method::default())]
    pub load_balance_method: Method,
    /// Disaggregated deployments: how the decode rank of each request is chosen
    /// (`--load-balance-method` chooses its prefill rank, where the prefix cache matters).
    #[arg(long, env = "DPSERVE_DECODE_LOAD_BALANCE_METHOD", value_enum,
          default_value_t = DEFAULT_DECODE_METHOD)]
    pub decode_load_balance_method: Method,
    #[command(flatten)]
    pub prefix_affinity: PrefixAffinityArgs,
    #[command(flatten)]
    pub cache_aware: CacheAwareArgs,
    #[command(flatten)]
    pub peers: PeerArgs,
    /// Append one JSON line per routing decision to this file (read it with `dpserve trace`).
    #[arg(long, env = "DPSERVE_TRACE_FILE")]
    pub trace_file: Option<PathBuf>,
    /// Seconds without a heartbeat after which a worker leaves the live set.
    #[arg(long, env = "DPSERVE_WORKER_TIMEOUT", default_value_t = DEFAULT_WORKER_TIMEOUT_S)]
    pub worker_timeout: f64,
    /// Model id every worker must serve (default: the first worker's).
    #[arg(long, env = "DPSERVE_MODEL_ID")]
    pub model_id: Option<String>,
}

impl Default for RoutingArgs {
    fn default() -> Self {
        RoutingArgs {
            load_balance_method: Method::default(),
            decode_load_balance_method: DEFAULT_DECODE_METHOD,
            prefix_affinity: PrefixAffinityArgs::default(),
            cache_aware: CacheAwareArgs::default(),
            peers: PeerArgs::default(),
            trace_file: None,
            worker_timeout: DEFAULT_WORKER_TIMEOUT_S,
            model_id: None,
        }
    }
}

impl ControllerArgs {
    pub fn resolve(&self) -> Result<ControllerConfig> {
        let addr = |flag: &'static str, value: &Option<String>, name: &str| -> Result<Endpoint> {
            match value {
                Some(s) => s.parse().map_err(|error| Error::Endpoint { flag, error }),
                None => Ok(default_endpoint(name)),
            }
        };
        let routing = &self.routing;
        routing.check_worker_timeout()?;
        // Validated whatever the method, so a typo surfaces before someone switches to it.
        let prefix_affinity = routing.prefix_affinity.config()?;
        let cache_aware = routing.cache_aware.config()?;
        let peers = routing.peers.configs()?;
        let controller_addr = addr("controller-addr", &self.controller_addr, "controller")?;
        let worker_addr = addr("worker-addr", &self.worker_addr, "worker")?;
        let tokenizer_addr = addr("tokenizer-addr", &self.tokenizer_addr, "tokenizer")?;
        let transport = self.security.resolve(
            &[&controller_addr, &worker_addr, &tokenizer_addr],
            "controller",
        )?;
        Ok(ControllerConfig {
            controller_addr,
            worker_addr,
            tokenizer_addr,
            transport,
            method: routing.load_balance_method,
            decode_method: routing.decode_load_balance_method,
            prefix_affinity,
            cache_aware,
            peers,
            trace_file: routing.trace_file.clone(),
            trace_dir: self.trace_dir.clone(),
            trace_max_bytes: self.trace_max_mb << 20,
            worker_timeout: Duration::from_secs_f64(routing.worker_timeout),
            model_id: routing.model_id.clone(),
            cluster_status_interval: Duration::from_millis(500),
        })
    }
}

impl RoutingArgs {
    /// Every check of these flags that clap's parsers do not make (`up` runs it before it
    /// starts anything).
    pub fn check(&self) -> Result<()> {
        self.check_worker_timeout()?;
        self.cache_aware.config()?;
        self.peers.configs()?;
        self.prefix_affinity.config().map(|_| ())
    }

    fn check_worker_timeout(&self) -> Result<()> {
        if !(self.worker_timeout.is_finite() && self.worker_timeout > 0.0) {
            return Err(Error::WorkerTimeout {
                got: self.worker_timeout,
            });
        }
        Ok(())
    }
}

/// Run the controller until SIGTERM or SIGINT.
///
/// Why no actor framework here (as the tokenizer's registry and cluster view have): the
/// controller is already one actor in docs/ARCHITECTURE.md's sense. One thread owns its three ZeroMQ
/// sockets (a socket belongs to one thread, and the ROUTER to the workers is used in both
/// directions) and every piece of routing state (ranks, DP budget, route counts, traces), and
/// reacts to frames and a liveness tick in one `zmq::poll` loop (`server::Controller::run`).
/// Nothing else reads that state, so there is no lock to replace. Splitting it into actors
/// (sockets, budget, ranks) would add a mailbox hop to every routing decision and let one
/// decision read a rank's load before the previous dispatch's speculative increment landed,
/// which is how a burst ends up on one rank.
pub fn run(args: ControllerArgs) -> Result<()> {
    let config = args.resolve()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(Error::Signal)?;
    }
    let ctx = zmq::Context::new();
    let controller = Controller::bind(&ctx, config)?;
    controller.run(stop)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn parse(flags: &[&str]) -> anyhow::Result<ControllerConfig> {
        let cli = Cli::try_parse_from(std::iter::once("controller").chain(flags.iter().copied()))?;
        Ok(cli.args.resolve()?)
    }

    #[test]
    fn defaults_are_cache_aware_with_the_documented_settings() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.method, Method::CacheAware);
        assert_eq!(c.cache_aware, CacheAwareConfig::default());
        assert_eq!(
            (
                c.cache_aware.compute_weight,
                c.cache_aware.tpot_weight,
                c.cache_aware.max_load_skew
            ),
            (0.25, 80.0, 2.0)
        );
        assert!(c.cache_aware.hold_wait.is_zero(), "late binding is opt-in");
        assert_eq!(c.prefix_affinity, PrefixAffinityConfig::default());
        assert_eq!(c.prefix_affinity.hash_tokens, 4096);
        assert_eq!(c.prefix_affinity.fallback, FallbackMethod::TotalTokens);
        assert_eq!(c.prefix_affinity.max_load_skew, 1.5);
        assert!(c.prefix_affinity.token_fallback);
        assert!(c.trace_file.is_none() && c.trace_dir.is_none());
    }

    #[test]
    fn clap_defaults_are_the_routing_defaults() {
        let cli = Cli::try_parse_from(["controller"]).unwrap();
        assert_eq!(cli.args.routing, RoutingArgs::default());
        assert_eq!(cli.args.routing.worker_timeout, DEFAULT_WORKER_TIMEOUT_S);
    }

    #[test]
    fn every_flag_is_read() {
        let c = parse(&[
            "--load-balance-method",
            "total_requests",
            "--decode-load-balance-method",
            "round_robin",
            "--prefix-affinity-hash-tokens",
            "128",
            "--prefix-affinity-disable-token-fallback",
            "--prefix-affinity-fallback",
            "round_robin",
            "--prefix-affinity-max-load-skew",
            "2.5",
            "--trace-file",
            "/tmp/route.jsonl",
            "--trace-dir",
            "/tmp/msgs",
        ])
        .unwrap();
        assert_eq!(c.method, Method::TotalRequests);
        assert_eq!(c.decode_method, Method::RoundRobin);
        assert_eq!(
            c.prefix_affinity,
            PrefixAffinityConfig {
                hash_tokens: 128,
                token_fallback: false,
                fallback: FallbackMethod::RoundRobin,
                max_load_skew: 2.5,
            }
        );
        assert_eq!(c.trace_file, Some(PathBuf::from("/tmp/route.jsonl")));
        assert_eq!(c.trace_dir, Some(PathBuf::from("/tmp/msgs")));
    }

    #[test]
    fn the_peer_methods_flags_are_read_and_default_to_their_projects_defaults() {
        let c = parse(&["--load-balance-method", "smg_cache_aware"]).unwrap();
        assert_eq!(c.method, Method::SmgCacheAware);
        assert_eq!(c.peers, PeerConfigs::default());
        let c = parse(&[
            "--smg-cache-threshold",
            "0.5",
            "--smg-balance-abs-threshold",
            "32",
            "--smg-balance-rel-threshold",
            "1.1",
            "--smg-eviction-interval",
            "30",
            "--smg-max-tree-size",
            "10000",
            "--dynamo-overlap-score-weight",
            "2",
            "--dynamo-router-temperature",
            "0.5",
            "--llmd-prefix-cache-weight",
            "3",
            "--llmd-queue-weight",
            "0.5",
            "--llmd-kv-cache-utilization-weight",
            "0",
        ])
        .unwrap();
        assert_eq!(
            c.peers.smg,
            SmgCacheAwareConfig {
                cache_threshold: 0.5,
                balance_abs_threshold: 32,
                balance_rel_threshold: 1.1,
                eviction_interval: Duration::from_secs(30),
                max_tree_size: 10000,
            }
        );
        assert_eq!(
            (
                c.peers.dynamo.overlap_score_weight,
                c.peers.dynamo.router_temperature
            ),
            (2.0, 0.5)
        );
        let l = &c.peers.llmd;
        assert_eq!(
            (
                l.prefix_cache_weight,
                l.queue_weight,
                l.kv_cache_utilization_weight
            ),
            (3.0, 0.5, 0.0)
        );
    }

    #[test]
    fn invalid_values_are_startup_errors_that_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--load-balance-method", "random"],
                "--load-balance-method",
            ),
            (
                &["--prefix-affinity-fallback", "prefix_affinity"],
                "--prefix-affinity-fallback",
            ),
            (
                &["--prefix-affinity-max-load-skew", "0.9"],
                "--prefix-affinity-max-load-skew",
            ),
            (
                &["--prefix-affinity-max-load-skew", "NaN"],
                "--prefix-affinity-max-load-skew",
            ),
            (
                &["--prefix-affinity-max-load-skew", "inf"],
                "--prefix-affinity-max-load-skew",
            ),
            (
                &["--prefix-affinity-hash-tokens", "0"],
                "--prefix-affinity-hash-tokens",
            ),
            (&["--worker-timeout", "0"], "--worker-timeout"),
            (
                &["--cache-aware-max-load-skew", "0.5"],
                "--cache-aware-max-load-skew",
            ),
            (
                &["--cache-aware-compute-weight", "NaN"],
                "--cache-aware-compute-weight",
            ),
            (
                &["--cache-aware-tpot-weight=-1"],
                "--cache-aware-tpot-weight",
            ),
            (
                &["--cache-aware-work-weight", "inf"],
                "--cache-aware-work-weight",
            ),
            (&["--smg-cache-threshold", "1.5"], "--smg-cache-threshold"),
            (
                &["--smg-balance-rel-threshold", "0.9"],
                "--smg-balance-rel-threshold",
            ),
            (
                &["--smg-balance-abs-threshold", "many"],
                "--smg-balance-abs-threshold",
            ),
            (
                &["--dynamo-overlap-score-weight=-1"],
                "--dynamo-overlap-score-weight",
            ),
            (
                &["--dynamo-router-temperature", "inf"],
                "--dynamo-router-temperature",
            ),
            (&["--llmd-queue-weight", "NaN"], "--llmd-queue-weight"),
        ];
        for (flags, name) in cases {
            let err = format!("{:#}", parse(flags).unwrap_err());
            assert!(err.contains(name), "{flags:?}: {err}");
        }
    }
}
