//! The controller actor: routes each tokenized request to a data-parallel rank, tracks which
//! ranks are live and how loaded they are, and forwards control messages (abort, flush) to them.

pub mod budget;
pub mod error;
pub mod kv_index;
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

use anyhow::Context;
use protocol::endpoint::default_endpoint;
use protocol::Endpoint;

pub use error::{Error, Result};
pub use policy::{CacheAwareConfig, FallbackMethod, Method, PeerConfigs, PrefixAffinityConfig};
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
    /// prefix_affinity: how many leading input ids are hashed into the key of a request
    /// without a routing key.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_HASH_TOKENS",
          default_value_t = PrefixAffinityConfig::default().hash_tokens)]
    pub prefix_affinity_hash_tokens: usize,
    /// prefix_affinity: never hash the token prefix; requests without a routing key go to the
    /// fallback method.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_DISABLE_TOKEN_FALLBACK")]
    pub prefix_affinity_disable_token_fallback: bool,
    /// prefix_affinity: method for requests without a key.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_FALLBACK", value_enum,
          default_value_t = PrefixAffinityConfig::default().fallback)]
    pub prefix_affinity_fallback: FallbackMethod,
    /// prefix_affinity: a rank is overloaded when its active requests exceed this multiple
    /// (>= 1.0) of max(mean over live ranks, 1); the key then spills to its next HRW choice.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_MAX_LOAD_SKEW",
          default_value_t = PrefixAffinityConfig::default().max_load_skew)]
    pub prefix_affinity_max_load_skew: f64,
    /// cache_aware: the cost of one active token on a rank, in prompt tokens to compute
    /// (>= 0): a rank holding a longer prefix wins unless its load outweighs the saving.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_LOAD_WEIGHT",
          default_value_t = CacheAwareConfig::default().load_weight)]
    pub cache_aware_load_weight: f64,
    /// cache_aware: a rank is overloaded when its active requests exceed this multiple
    /// (>= 1.0) of max(mean over live ranks, 1); the request goes to the next cheapest rank.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_MAX_LOAD_SKEW",
          default_value_t = CacheAwareConfig::default().max_load_skew)]
    pub cache_aware_max_load_skew: f64,
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
        let affinity = PrefixAffinityConfig::default();
        let cache = CacheAwareConfig::default();
        RoutingArgs {
            load_balance_method: Method::default(),
            decode_load_balance_method: DEFAULT_DECODE_METHOD,
            prefix_affinity_hash_tokens: affinity.hash_tokens,
            prefix_affinity_disable_token_fallback: !affinity.token_fallback,
            prefix_affinity_fallback: affinity.fallback,
            prefix_affinity_max_load_skew: affinity.max_load_skew,
            cache_aware_load_weight: cache.load_weight,
            cache_aware_max_load_skew: cache.max_load_skew,
            trace_file: None,
            worker_timeout: DEFAULT_WORKER_TIMEOUT_S,
            model_id: None,
        }
    }
}

impl ControllerArgs {
    pub fn resolve(&self) -> anyhow::Result<ControllerConfig> {
        let addr = |flag: &str, value: &Option<String>, name: &str| -> anyhow::Result<Endpoint> {
            match value {
                Some(s) => s.parse().with_context(|| format!("--{flag}")),
                None => Ok(default_endpoint(name)),
            }
        };
        let routing = &self.routing;
        routing.check_worker_timeout()?;
        // Validated whatever the method, so a typo surfaces before someone switches to it.
        let prefix_affinity = routing.prefix_affinity_config()?;
        let cache_aware = routing.cache_aware_config()?;
        Ok(ControllerConfig {
            controller_addr: addr("controller-addr", &self.controller_addr, "controller")?,
            worker_addr: addr("worker-addr", &self.worker_addr, "worker")?,
            tokenizer_addr: addr("tokenizer-addr", &self.tokenizer_addr, "tokenizer")?,
            method: routing.load_balance_method,
            decode_method: routing.decode_load_balance_method,
            prefix_affinity,
            cache_aware,
            // The peers' methods at their projects' defaults (their flags come next).
            peers: PeerConfigs::default(),
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
        self.cache_aware_config()?;
        self.prefix_affinity_config().map(|_| ())
    }

    /// The `--cache-aware-*` flags, checked.
    pub fn cache_aware_config(&self) -> Result<CacheAwareConfig> {
        let skew = self.cache_aware_max_load_skew;
        if !(skew.is_finite() && skew >= 1.0) {
            return Err(Error::CacheAwareLoadSkew { got: skew });
        }
        let weight = self.cache_aware_load_weight;
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(Error::CacheAwareLoadWeight { got: weight });
        }
        Ok(CacheAwareConfig {
            load_weight: weight,
            max_load_skew: skew,
        })
    }

    fn check_worker_timeout(&self) -> Result<()> {
        if !(self.worker_timeout.is_finite() && self.worker_timeout > 0.0) {
            return Err(Error::WorkerTimeout {
                got: self.worker_timeout,
            });
        }
        Ok(())
    }

    /// The `--prefix-affinity-*` flags, checked.
    pub fn prefix_affinity_config(&self) -> Result<PrefixAffinityConfig> {
        let skew = self.prefix_affinity_max_load_skew;
        if !(skew.is_finite() && skew >= 1.0) {
            return Err(Error::LoadSkew { got: skew });
        }
        if self.prefix_affinity_hash_tokens == 0 {
            return Err(Error::HashTokens {
                got: self.prefix_affinity_hash_tokens,
            });
        }
        Ok(PrefixAffinityConfig {
            hash_tokens: self.prefix_affinity_hash_tokens,
            token_fallback: !self.prefix_affinity_disable_token_fallback,
            fallback: self.prefix_affinity_fallback,
            max_load_skew: skew,
        })
    }
}

/// Run the controller until SIGTERM or SIGINT.
///
/// Why no actor framework here (as the tokenizer's registry and cluster view have): the
/// controller is already one actor in DESIGN.md's sense. One thread owns its three ZeroMQ
/// sockets (a socket belongs to one thread, and the ROUTER to the workers is used in both
/// directions) and every piece of routing state (ranks, DP budget, route counts, traces), and
/// reacts to frames and a liveness tick in one `zmq::poll` loop (`server::Controller::run`).
/// Nothing else reads that state, so there is no lock to replace. Splitting it into actors
/// (sockets, budget, ranks) would add a mailbox hop to every routing decision and let one
/// decision read a rank's load before the previous dispatch's speculative increment landed,
/// which is how a burst ends up on one rank.
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
        cli.args.resolve()
    }

    #[test]
    fn defaults_are_prefix_affinity_with_the_documented_settings() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.method, Method::PrefixAffinity);
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
                &["--cache-aware-load-weight", "NaN"],
                "--cache-aware-load-weight",
            ),
        ];
        for (flags, name) in cases {
            let err = format!("{:#}", parse(flags).unwrap_err());
            assert!(err.contains(name), "{flags:?}: {err}");
        }
    }
}
