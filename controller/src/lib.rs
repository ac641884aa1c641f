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
    CacheAwareConfig, DynamoKvConfig, FallbackMethod, LlmdPrefixConfig, Method, PeerConfigs,
    PrefixAffinityConfig, SmgCacheAwareConfig,
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
    /// cache_aware: the weight (>= 0) of the stall a request's prefill puts on each request
    /// already active on a rank, relative to its own wait; 0 routes by the predicted time to
    /// first token alone.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_COMPUTE_WEIGHT",
          default_value_t = CacheAwareConfig::default().compute_weight)]
    pub cache_aware_compute_weight: f64,
    /// cache_aware: seconds of time to first token that one second of time per output token
    /// is worth (>= 0; 80 is 2 s / 25 ms): a stall of a request's decode counts this much more
    /// per token of TPOT it adds, so stalls weigh on requests with short max_new_tokens; 0:
    /// a stall weighs the same on every request.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_TPOT_WEIGHT",
          default_value_t = CacheAwareConfig::default().tpot_weight)]
    pub cache_aware_tpot_weight: f64,
    /// cache_aware: a rank is overloaded when its active requests exceed this multiple
    /// (>= 1.0) of max(mean over live ranks, 1); the request goes to the next cheapest rank.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_MAX_LOAD_SKEW",
          default_value_t = CacheAwareConfig::default().max_load_skew)]
    pub cache_aware_max_load_skew: f64,
    /// cache_aware: late binding. While every rank's predicted wait (its queued prompt tokens
    /// over its measured prefill speed) exceeds this many milliseconds, hold requests in the
    /// controller and dispatch each, shortest prompt first, as soon as some rank's wait drops
    /// below it, choosing the rank with the cache and loads of that moment; 0: off.
    #[arg(long, env = "DPSERVE_CACHE_AWARE_HOLD_MS",
          default_value_t = CacheAwareConfig::default().hold_wait.as_millis() as u64)]
    pub cache_aware_hold_ms: u64,
    /// cache_aware: a held request is dispatched after this many milliseconds whatever the
    /// waits (>= 1).
    #[arg(long, env = "DPSERVE_CACHE_AWARE_MAX_HOLD_MS",
          default_value_t = CacheAwareConfig::default().max_hold.as_millis() as u64)]
    pub cache_aware_max_hold_ms: u64,
    /// smg_cache_aware: the best match in the routing-history tree wins when it covers more
    /// than this share (0..=1) of the prompt; otherwise the least loaded rank.
    #[arg(long, env = "DPSERVE_SMG_CACHE_THRESHOLD",
          default_value_t = SmgCacheAwareConfig::default().cache_threshold)]
    pub smg_cache_threshold: f64,
    /// smg_cache_aware: loads are imbalanced (shortest queue, no affinity) when max − min
    /// active requests exceeds this...
    #[arg(long, env = "DPSERVE_SMG_BALANCE_ABS_THRESHOLD",
          default_value_t = SmgCacheAwareConfig::default().balance_abs_threshold)]
    pub smg_balance_abs_threshold: u64,
    /// smg_cache_aware: ...and max exceeds this multiple (>= 1.0) of min.
    #[arg(long, env = "DPSERVE_SMG_BALANCE_REL_THRESHOLD",
          default_value_t = SmgCacheAwareConfig::default().balance_rel_threshold)]
    pub smg_balance_rel_threshold: f64,
    /// smg_cache_aware: seconds between evictions of the trees to --smg-max-tree-size
    /// (0: never).
    #[arg(long, env = "DPSERVE_SMG_EVICTION_INTERVAL",
          default_value_t = SmgCacheAwareConfig::default().eviction_interval.as_secs())]
    pub smg_eviction_interval: u64,
    /// smg_cache_aware: tokens each rank's tree keeps after an eviction.
    #[arg(long, env = "DPSERVE_SMG_MAX_TREE_SIZE",
          default_value_t = SmgCacheAwareConfig::default().max_tree_size)]
    pub smg_max_tree_size: u64,
    /// dynamo_kv: weight (>= 0) of the prompt blocks a rank would still compute against its
    /// active decode blocks.
    #[arg(long, env = "DPSERVE_DYNAMO_OVERLAP_SCORE_WEIGHT",
          default_value_t = DynamoKvConfig::default().overlap_score_weight)]
    pub dynamo_overlap_score_weight: f64,
    /// dynamo_kv: softmax temperature (>= 0) over the normalised costs; 0 takes the lowest.
    #[arg(long, env = "DPSERVE_DYNAMO_ROUTER_TEMPERATURE",
          default_value_t = DynamoKvConfig::default().router_temperature)]
    pub dynamo_router_temperature: f64,
    /// llmd_prefix: weight (>= 0) of the precise prefix-cache scorer.
    #[arg(long, env = "DPSERVE_LLMD_PREFIX_CACHE_WEIGHT",
          default_value_t = LlmdPrefixConfig::default().prefix_cache_weight)]
    pub llmd_prefix_cache_weight: f64,
    /// llmd_prefix: weight (>= 0) of the queue scorer.
    #[arg(long, env = "DPSERVE_LLMD_QUEUE_WEIGHT",
          default_value_t = LlmdPrefixConfig::default().queue_weight)]
    pub llmd_queue_weight: f64,
    /// llmd_prefix: weight (>= 0) of the KV-cache-utilisation scorer.
    #[arg(long, env = "DPSERVE_LLMD_KV_CACHE_UTILIZATION_WEIGHT",
          default_value_t = LlmdPrefixConfig::default().kv_cache_utilization_weight)]
    pub llmd_kv_cache_utilization_weight: f64,
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
        let peers = PeerConfigs::default();
        RoutingArgs {
            load_balance_method: Method::default(),
            decode_load_balance_method: DEFAULT_DECODE_METHOD,
            prefix_affinity_hash_tokens: affinity.hash_tokens,
            prefix_affinity_disable_token_fallback: !affinity.token_fallback,
            prefix_affinity_fallback: affinity.fallback,
            prefix_affinity_max_load_skew: affinity.max_load_skew,
            cache_aware_compute_weight: cache.compute_weight,
            cache_aware_tpot_weight: cache.tpot_weight,
            cache_aware_max_load_skew: cache.max_load_skew,
            cache_aware_hold_ms: cache.hold_wait.as_millis() as u64,
            cache_aware_max_hold_ms: cache.max_hold.as_millis() as u64,
            smg_cache_threshold: peers.smg.cache_threshold,
            smg_balance_abs_threshold: peers.smg.balance_abs_threshold,
            smg_balance_rel_threshold: peers.smg.balance_rel_threshold,
            smg_eviction_interval: peers.smg.eviction_interval.as_secs(),
            smg_max_tree_size: peers.smg.max_tree_size,
            dynamo_overlap_score_weight: peers.dynamo.overlap_score_weight,
            dynamo_router_temperature: peers.dynamo.router_temperature,
            llmd_prefix_cache_weight: peers.llmd.prefix_cache_weight,
            llmd_queue_weight: peers.llmd.queue_weight,
            llmd_kv_cache_utilization_weight: peers.llmd.kv_cache_utilization_weight,
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
        let prefix_affinity = routing.prefix_affinity_config()?;
        let cache_aware = routing.cache_aware_config()?;
        let peers = routing.peer_configs()?;
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
        self.cache_aware_config()?;
        self.peer_configs()?;
        self.prefix_affinity_config().map(|_| ())
    }

    /// The `--smg-*`, `--dynamo-*` and `--llmd-*` flags, checked.
    pub fn peer_configs(&self) -> Result<PeerConfigs> {
        fn check(flag: &'static str, rule: &'static str, got: f64, ok: bool) -> Result<f64> {
            if got.is_finite() && ok {
                Ok(got)
            } else {
                Err(Error::PeerFlag { flag, rule, got })
            }
        }
        const WEIGHT: &str = "a finite number >= 0";
        let weight = |flag, got: f64| check(flag, WEIGHT, got, got >= 0.0);
        let threshold = self.smg_cache_threshold;
        let rel = self.smg_balance_rel_threshold;
        Ok(PeerConfigs {
            smg: SmgCacheAwareConfig {
                cache_threshold: check(
                    "--smg-cache-threshold",
                    "a number in 0..=1",
                    threshold,
                    (0.0..=1.0).contains(&threshold),
                )?,
                balance_abs_threshold: self.smg_balance_abs_threshold,
                balance_rel_threshold: check(
                    "--smg-balance-rel-threshold",
                    "a finite number >= 1.0",
                    rel,
                    rel >= 1.0,
                )?,
                eviction_interval: Duration::from_secs(self.smg_eviction_interval),
                max_tree_size: self.smg_max_tree_size,
            },
            dynamo: DynamoKvConfig {
                overlap_score_weight: weight(
                    "--dynamo-overlap-score-weight",
                    self.dynamo_overlap_score_weight,
                )?,
                router_temperature: weight(
                    "--dynamo-router-temperature",
                    self.dynamo_router_temperature,
                )?,
                ..DynamoKvConfig::default()
            },
            llmd: LlmdPrefixConfig {
                prefix_cache_weight: weight(
                    "--llmd-prefix-cache-weight",
                    self.llmd_prefix_cache_weight,
                )?,
                queue_weight: weight("--llmd-queue-weight", self.llmd_queue_weight)?,
                kv_cache_utilization_weight: weight(
                    "--llmd-kv-cache-utilization-weight",
                    self.llmd_kv_cache_utilization_weight,
                )?,
                ..LlmdPrefixConfig::default()
            },
        })
    }

    /// The `--cache-aware-*` flags, checked.
    pub fn cache_aware_config(&self) -> Result<CacheAwareConfig> {
        let skew = self.cache_aware_max_load_skew;
        if !(skew.is_finite() && skew >= 1.0) {
            return Err(Error::CacheAwareLoadSkew { got: skew });
        }
        let weight = self.cache_aware_compute_weight;
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(Error::CacheAwareComputeWeight { got: weight });
        }
        let tpot_weight = self.cache_aware_tpot_weight;
        if !(tpot_weight.is_finite() && tpot_weight >= 0.0) {
            return Err(Error::CacheAwareTpotWeight { got: tpot_weight });
        }
        if self.cache_aware_max_hold_ms == 0 {
            return Err(Error::CacheAwareMaxHold);
        }
        Ok(CacheAwareConfig {
            compute_weight: weight,
            tpot_weight,
            max_load_skew: skew,
            hold_wait: std::time::Duration::from_millis(self.cache_aware_hold_ms),
            max_hold: std::time::Duration::from_millis(self.cache_aware_max_hold_ms),
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
            (1.0, 80.0, 2.0)
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
