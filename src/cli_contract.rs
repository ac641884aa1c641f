//! The command-line contract (`docs/ARCHITECTURE.md`, README, `docs/FLAGS.md`, `deploy/`): every flag of `up`, the
//! actors and `bench --launch` with its variable, its default and a value it must accept, checked
//! against the parser that `main` uses. A flag added, renamed or given another default fails here
//! until this table, and the docs it mirrors, say so.

use clap::{Arg, ArgMatches, Command, CommandFactory};

use crate::Cli;

/// `(subcommand, flag, variable, default, a value it accepts)`. Default `"*"`: computed at run
/// time (the runtime directory); a switch's value is `""` (given bare, `true` in a variable).
type Row = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
);

#[rustfmt::skip]
const CONTRACT: &[Row] = &[
    // dpserve up
    ("up", "--dp-size", "DPSERVE_DP_SIZE", Some("2"), "3"),
    ("up", "--prefill-dp-size", "DPSERVE_PREFILL_DP_SIZE", None, "1"),
    ("up", "--decode-dp-size", "DPSERVE_DECODE_DP_SIZE", None, "1"),
    ("up", "--model-path", "DPSERVE_MODEL_PATH", None, "/m"),
    ("up", "--load-format", "DPSERVE_LOAD_FORMAT", Some("auto"), "dummy"),
    ("up", "--builtin-size", "DPSERVE_BUILTIN_SIZE", Some("base"), "tiny"),
    ("up", "--weight-seed", "DPSERVE_WEIGHT_SEED", Some("0"), "5"),
    ("up", "--weight-dtype", "DPSERVE_WEIGHT_DTYPE", Some("auto"), "bf16"),
    ("up", "--compute-dtype", "DPSERVE_COMPUTE_DTYPE", Some("f32"), "bf16"),
    ("up", "--weight-cache", "DPSERVE_WEIGHT_CACHE", None, "/var/cache/dpserve"),
    ("up", "--max-total-tokens", "DPSERVE_MAX_TOTAL_TOKENS", None, "4096"),
    ("up", "--mem-fraction", "DPSERVE_MEM_FRACTION", Some("0.5"), "0.25"),
    ("up", "--max-running-requests", "DPSERVE_MAX_RUNNING_REQUESTS", Some("64"), "8"),
    ("up", "--chunked-prefill-size", "DPSERVE_CHUNKED_PREFILL_SIZE", Some("2048"), "256"),
    ("up", "--max-prefill-tokens", "DPSERVE_MAX_PREFILL_TOKENS", Some("8192"), "1024"),
    ("up", "--decode-prealloc-size", "DPSERVE_DECODE_PREALLOC_SIZE", Some("auto"), "4"),
    ("up", "--schedule-policy", "DPSERVE_SCHEDULE_POLICY", Some("lpm"), "fcfs"),
    ("up", "--disable-radix-cache", "DPSERVE_DISABLE_RADIX_CACHE", None, ""),
    ("up", "--kv-event-block-size", "DPSERVE_KV_EVENT_BLOCK_SIZE", Some("32"), "64"),
    ("up", "--context-length", "DPSERVE_CONTEXT_LENGTH", None, "512"),
    ("up", "--num-threads", "DPSERVE_NUM_THREADS", None, "2"),
    ("up", "--heartbeat-interval-ms", "DPSERVE_HEARTBEAT_INTERVAL_MS", Some("500"), "100"),
    ("up", "--drain-timeout", "DPSERVE_DRAIN_TIMEOUT", Some("30"), "7"),
    ("up", "--prefill-step-target-ms", "DPSERVE_PREFILL_STEP_TARGET_MS", Some("500"), "0"),
    ("up", "--finish-first-tokens", "DPSERVE_FINISH_FIRST_TOKENS", Some("16"), "4"),
    ("up", "--finish-first-max-wait-ms", "DPSERVE_FINISH_FIRST_MAX_WAIT_MS", Some("600"), "300"),
    ("up", "--max-queued-requests", "DPSERVE_MAX_QUEUED_REQUESTS", None, "64"),
    ("up", "--disaggregation-bootstrap-timeout", "DPSERVE_DISAGGREGATION_BOOTSTRAP_TIMEOUT", Some("300"), "30"),
    ("up", "--disaggregation-waiting-timeout", "DPSERVE_DISAGGREGATION_WAITING_TIMEOUT", Some("300"), "30"),
    ("up", "--startup-timeout", "DPSERVE_STARTUP_TIMEOUT", Some("300"), "60"),
    ("up", "--host", "DPSERVE_HOST", Some("127.0.0.1"), "0.0.0.0"),
    ("up", "--port", "DPSERVE_PORT", Some("30000"), "8080"),
    ("up", "--served-model-name", "DPSERVE_SERVED_MODEL_NAME", None, "m"),
    ("up", "--max-request-bytes", "DPSERVE_MAX_REQUEST_BYTES", Some("33554432"), "1024"),
    ("up", "--request-timeout-s", "DPSERVE_REQUEST_TIMEOUT_S", Some("600"), "9"),
    ("up", "--api-key", "DPSERVE_API_KEY", None, "k"),
    ("up", "--api-key-file", "DPSERVE_API_KEY_FILE", None, "/keys"),
    ("up", "--open-endpoints", "DPSERVE_OPEN_ENDPOINTS", Some("health"), "metrics"),
    ("up", "--ssl-certfile", "DPSERVE_SSL_CERTFILE", None, "/c.pem"),
    ("up", "--ssl-keyfile", "DPSERVE_SSL_KEYFILE", None, "/k.pem"),
    ("up", "--incremental-streaming-output", "DPSERVE_INCREMENTAL_STREAMING_OUTPUT", None, ""),
    ("up", "--chat-template", "DPSERVE_CHAT_TEMPLATE", None, "/t.jinja"),
    ("up", "--tool-call-parser", "DPSERVE_TOOL_CALL_PARSER", None, "hermes"),
    ("up", "--max-in-flight-requests", "DPSERVE_MAX_IN_FLIGHT_REQUESTS", Some("4096"), "64"),
    ("up", "--load-balance-method", "DPSERVE_LOAD_BALANCE_METHOD", Some("cache_aware"), "round_robin"),
    ("up", "--decode-load-balance-method", "DPSERVE_DECODE_LOAD_BALANCE_METHOD", Some("total_tokens"), "round_robin"),
    ("up", "--prefix-affinity-hash-tokens", "DPSERVE_PREFIX_AFFINITY_HASH_TOKENS", Some("4096"), "64"),
    ("up", "--prefix-affinity-disable-token-fallback", "DPSERVE_PREFIX_AFFINITY_DISABLE_TOKEN_FALLBACK", None, ""),
    ("up", "--prefix-affinity-fallback", "DPSERVE_PREFIX_AFFINITY_FALLBACK", Some("total_tokens"), "total_requests"),
    ("up", "--prefix-affinity-max-load-skew", "DPSERVE_PREFIX_AFFINITY_MAX_LOAD_SKEW", Some("1.5"), "2.5"),
    ("up", "--cache-aware-compute-weight", "DPSERVE_CACHE_AWARE_COMPUTE_WEIGHT", Some("0.25"), "0.5"),
    ("up", "--cache-aware-tpot-weight", "DPSERVE_CACHE_AWARE_TPOT_WEIGHT", Some("80"), "20"),
    ("up", "--cache-aware-work-weight", "DPSERVE_CACHE_AWARE_WORK_WEIGHT", Some("1"), "0"),
    ("up", "--cache-aware-max-load-skew", "DPSERVE_CACHE_AWARE_MAX_LOAD_SKEW", Some("2"), "2.5"),
    ("up", "--cache-aware-hold-ms", "DPSERVE_CACHE_AWARE_HOLD_MS", Some("0"), "150"),
    ("up", "--cache-aware-max-hold-ms", "DPSERVE_CACHE_AWARE_MAX_HOLD_MS", Some("1000"), "500"),
    ("up", "--smg-cache-threshold", "DPSERVE_SMG_CACHE_THRESHOLD", Some("0.3"), "0.5"),
    ("up", "--smg-balance-abs-threshold", "DPSERVE_SMG_BALANCE_ABS_THRESHOLD", Some("64"), "32"),
    ("up", "--smg-balance-rel-threshold", "DPSERVE_SMG_BALANCE_REL_THRESHOLD", Some("1.5"), "1.1"),
    ("up", "--smg-eviction-interval", "DPSERVE_SMG_EVICTION_INTERVAL", Some("120"), "30"),
    ("up", "--smg-max-tree-size", "DPSERVE_SMG_MAX_TREE_SIZE", Some("67108864"), "10000"),
    ("up", "--dynamo-overlap-score-weight", "DPSERVE_DYNAMO_OVERLAP_SCORE_WEIGHT", Some("1"), "2"),
    ("up", "--dynamo-router-temperature", "DPSERVE_DYNAMO_ROUTER_TEMPERATURE", Some("0"), "0.5"),
    ("up", "--llmd-prefix-cache-weight", "DPSERVE_LLMD_PREFIX_CACHE_WEIGHT", Some("2"), "3"),
    ("up", "--llmd-queue-weight", "DPSERVE_LLMD_QUEUE_WEIGHT", Some("1"), "0.5"),
    ("up", "--llmd-kv-cache-utilization-weight", "DPSERVE_LLMD_KV_CACHE_UTILIZATION_WEIGHT", Some("1"), "0"),
    ("up", "--trace-file", "DPSERVE_TRACE_FILE", None, "/r.jsonl"),
    ("up", "--worker-timeout", "DPSERVE_WORKER_TIMEOUT", Some("3"), "5"),
    ("up", "--model-id", "DPSERVE_MODEL_ID", None, "m"),
    ("up", "--kernel-path", "DPSERVE_KERNEL_PATH", Some("auto"), "portable"),
    ("up", "--device", "DPSERVE_DEVICE", Some("cpu"), "cuda:1"),
    ("up", "--sim-profile", "DPSERVE_SIM_PROFILE", Some("h100-qwen3.5-122b-a10b-fp8"), "cpu-calibrated"),
    ("up", "--sim-config", "DPSERVE_SIM_CONFIG", None, "/sim.toml"),
    ("up", "--sim-lock-step", "DPSERVE_SIM_LOCK_STEP", Some("false"), "true"),
    ("up", "--trace-dir", "DPSERVE_TRACE_DIR", None, "/d"),
    ("up", "--trace-max-mb", "DPSERVE_TRACE_MAX_MB", None, "64"),
    ("up", "--runtime-dir", "DPSERVE_RUNTIME_DIR", None, "/rt"),
    // dpserve tokenizer
    ("tokenizer", "--host", "DPSERVE_HOST", Some("127.0.0.1"), "0.0.0.0"),
    ("tokenizer", "--port", "DPSERVE_PORT", Some("30000"), "8080"),
    ("tokenizer", "--served-model-name", "DPSERVE_SERVED_MODEL_NAME", None, "m"),
    ("tokenizer", "--max-request-bytes", "DPSERVE_MAX_REQUEST_BYTES", Some("33554432"), "1024"),
    ("tokenizer", "--request-timeout-s", "DPSERVE_REQUEST_TIMEOUT_S", Some("600"), "9"),
    ("tokenizer", "--api-key", "DPSERVE_API_KEY", None, "k"),
    ("tokenizer", "--api-key-file", "DPSERVE_API_KEY_FILE", None, "/keys"),
    ("tokenizer", "--open-endpoints", "DPSERVE_OPEN_ENDPOINTS", Some("health"), "metrics"),
    ("tokenizer", "--ssl-certfile", "DPSERVE_SSL_CERTFILE", None, "/c.pem"),
    ("tokenizer", "--ssl-keyfile", "DPSERVE_SSL_KEYFILE", None, "/k.pem"),
    ("tokenizer", "--incremental-streaming-output", "DPSERVE_INCREMENTAL_STREAMING_OUTPUT", None, ""),
    ("tokenizer", "--chat-template", "DPSERVE_CHAT_TEMPLATE", None, "/t.jinja"),
    ("tokenizer", "--tool-call-parser", "DPSERVE_TOOL_CALL_PARSER", None, "hermes"),
    ("tokenizer", "--max-in-flight-requests", "DPSERVE_MAX_IN_FLIGHT_REQUESTS", Some("4096"), "64"),
    ("tokenizer", "--model-path", "DPSERVE_MODEL_PATH", None, "/m"),
    ("tokenizer", "--tokenizer-addr", "DPSERVE_TOKENIZER_ADDR", Some("*"), "ipc:///x/t.sock"),
    ("tokenizer", "--controller-addr", "DPSERVE_CONTROLLER_ADDR", Some("*"), "ipc:///x/c.sock"),
    ("tokenizer", "--dp-size", "DPSERVE_DP_SIZE", Some("1"), "3"),
    ("tokenizer", "--trace-dir", "DPSERVE_TRACE_DIR", None, "/d"),
    ("tokenizer", "--trace-max-mb", "DPSERVE_TRACE_MAX_MB", Some("512"), "64"),
    ("tokenizer", "--curve-secret-key", "DPSERVE_CURVE_SECRET_KEY", None, "/n.key"),
    ("tokenizer", "--curve-server-key", "DPSERVE_CURVE_SERVER_KEY", None, "/h.pub"),
    ("tokenizer", "--curve-allow-dir", "DPSERVE_CURVE_ALLOW_DIR", None, "/allow"),
    ("tokenizer", "--insecure-tcp", "DPSERVE_INSECURE_TCP", None, ""),
    // dpserve controller
    ("controller", "--controller-addr", "DPSERVE_CONTROLLER_ADDR", None, "ipc:///x/c.sock"),
    ("controller", "--worker-addr", "DPSERVE_WORKER_ADDR", None, "ipc:///x/w.sock"),
    ("controller", "--tokenizer-addr", "DPSERVE_TOKENIZER_ADDR", None, "ipc:///x/t.sock"),
    ("controller", "--load-balance-method", "DPSERVE_LOAD_BALANCE_METHOD", Some("cache_aware"), "round_robin"),
    ("controller", "--decode-load-balance-method", "DPSERVE_DECODE_LOAD_BALANCE_METHOD", Some("total_tokens"), "round_robin"),
    ("controller", "--prefix-affinity-hash-tokens", "DPSERVE_PREFIX_AFFINITY_HASH_TOKENS", Some("4096"), "64"),
    ("controller", "--prefix-affinity-disable-token-fallback", "DPSERVE_PREFIX_AFFINITY_DISABLE_TOKEN_FALLBACK", None, ""),
    ("controller", "--prefix-affinity-fallback", "DPSERVE_PREFIX_AFFINITY_FALLBACK", Some("total_tokens"), "total_requests"),
    ("controller", "--prefix-affinity-max-load-skew", "DPSERVE_PREFIX_AFFINITY_MAX_LOAD_SKEW", Some("1.5"), "2.5"),
    ("controller", "--cache-aware-compute-weight", "DPSERVE_CACHE_AWARE_COMPUTE_WEIGHT", Some("0.25"), "0.5"),
    ("controller", "--cache-aware-tpot-weight", "DPSERVE_CACHE_AWARE_TPOT_WEIGHT", Some("80"), "20"),
    ("controller", "--cache-aware-work-weight", "DPSERVE_CACHE_AWARE_WORK_WEIGHT", Some("1"), "0"),
    ("controller", "--cache-aware-max-load-skew", "DPSERVE_CACHE_AWARE_MAX_LOAD_SKEW", Some("2"), "2.5"),
    ("controller", "--cache-aware-hold-ms", "DPSERVE_CACHE_AWARE_HOLD_MS", Some("0"), "150"),
    ("controller", "--cache-aware-max-hold-ms", "DPSERVE_CACHE_AWARE_MAX_HOLD_MS", Some("1000"), "500"),
    ("controller", "--smg-cache-threshold", "DPSERVE_SMG_CACHE_THRESHOLD", Some("0.3"), "0.5"),
    ("controller", "--smg-balance-abs-threshold", "DPSERVE_SMG_BALANCE_ABS_THRESHOLD", Some("64"), "32"),
    ("controller", "--smg-balance-rel-threshold", "DPSERVE_SMG_BALANCE_REL_THRESHOLD", Some("1.5"), "1.1"),
    ("controller", "--smg-eviction-interval", "DPSERVE_SMG_EVICTION_INTERVAL", Some("120"), "30"),
    ("controller", "--smg-max-tree-size", "DPSERVE_SMG_MAX_TREE_SIZE", Some("67108864"), "10000"),
    ("controller", "--dynamo-overlap-score-weight", "DPSERVE_DYNAMO_OVERLAP_SCORE_WEIGHT", Some("1"), "2"),
    ("controller", "--dynamo-router-temperature", "DPSERVE_DYNAMO_ROUTER_TEMPERATURE", Some("0"), "0.5"),
    ("controller", "--llmd-prefix-cache-weight", "DPSERVE_LLMD_PREFIX_CACHE_WEIGHT", Some("2"), "3"),
    ("controller", "--llmd-queue-weight", "DPSERVE_LLMD_QUEUE_WEIGHT", Some("1"), "0.5"),
    ("controller", "--llmd-kv-cache-utilization-weight", "DPSERVE_LLMD_KV_CACHE_UTILIZATION_WEIGHT", Some("1"), "0"),
    ("controller", "--trace-file", "DPSERVE_TRACE_FILE", None, "/r.jsonl"),
    ("controller", "--worker-timeout", "DPSERVE_WORKER_TIMEOUT", Some("3"), "5"),
    ("controller", "--model-id", "DPSERVE_MODEL_ID", None, "m"),
    ("controller", "--trace-dir", "DPSERVE_TRACE_DIR", None, "/d"),
    ("controller", "--trace-max-mb", "DPSERVE_TRACE_MAX_MB", Some("512"), "64"),
    ("controller", "--curve-secret-key", "DPSERVE_CURVE_SECRET_KEY", None, "/n.key"),
    ("controller", "--curve-server-key", "DPSERVE_CURVE_SERVER_KEY", None, "/h.pub"),
    ("controller", "--curve-allow-dir", "DPSERVE_CURVE_ALLOW_DIR", None, "/allow"),
    ("controller", "--insecure-tcp", "DPSERVE_INSECURE_TCP", None, ""),
    // dpserve worker
    ("worker", "--rank", "DPSERVE_RANK", None, "3"),
    ("worker", "--model-path", "DPSERVE_MODEL_PATH", None, "/m"),
    ("worker", "--load-format", "DPSERVE_LOAD_FORMAT", Some("auto"), "dummy"),
    ("worker", "--builtin-size", "DPSERVE_BUILTIN_SIZE", Some("base"), "tiny"),
    ("worker", "--weight-seed", "DPSERVE_WEIGHT_SEED", Some("0"), "5"),
    ("worker", "--weight-dtype", "DPSERVE_WEIGHT_DTYPE", Some("auto"), "bf16"),
    ("worker", "--compute-dtype", "DPSERVE_COMPUTE_DTYPE", Some("f32"), "bf16"),
    ("worker", "--weight-cache", "DPSERVE_WEIGHT_CACHE", None, "/var/cache/dpserve"),
    ("worker", "--worker-addr", "DPSERVE_WORKER_ADDR", None, "ipc:///x/w.sock"),
    ("worker", "--tokenizer-addr", "DPSERVE_TOKENIZER_ADDR", None, "ipc:///x/t.sock"),
    ("worker", "--max-total-tokens", "DPSERVE_MAX_TOTAL_TOKENS", None, "4096"),
    ("worker", "--mem-fraction", "DPSERVE_MEM_FRACTION", Some("0.5"), "0.25"),
    ("worker", "--max-running-requests", "DPSERVE_MAX_RUNNING_REQUESTS", Some("64"), "8"),
    ("worker", "--chunked-prefill-size", "DPSERVE_CHUNKED_PREFILL_SIZE", Some("2048"), "256"),
    ("worker", "--max-prefill-tokens", "DPSERVE_MAX_PREFILL_TOKENS", Some("8192"), "1024"),
    ("worker", "--decode-prealloc-size", "DPSERVE_DECODE_PREALLOC_SIZE", Some("auto"), "4"),
    ("worker", "--schedule-policy", "DPSERVE_SCHEDULE_POLICY", Some("lpm"), "fcfs"),
    ("worker", "--disable-radix-cache", "DPSERVE_DISABLE_RADIX_CACHE", None, ""),
    ("worker", "--kv-event-block-size", "DPSERVE_KV_EVENT_BLOCK_SIZE", Some("32"), "64"),
    ("worker", "--context-length", "DPSERVE_CONTEXT_LENGTH", None, "512"),
    ("worker", "--num-threads", "DPSERVE_NUM_THREADS", None, "2"),
    ("worker", "--heartbeat-interval-ms", "DPSERVE_HEARTBEAT_INTERVAL_MS", Some("500"), "100"),
    ("worker", "--drain-timeout", "DPSERVE_DRAIN_TIMEOUT", Some("30"), "7"),
    ("worker", "--trace-dir", "DPSERVE_TRACE_DIR", None, "/d"),
    ("worker", "--trace-max-mb", "DPSERVE_TRACE_MAX_MB", Some("512"), "64"),
    ("worker", "--curve-secret-key", "DPSERVE_CURVE_SECRET_KEY", None, "/n.key"),
    ("worker", "--curve-server-key", "DPSERVE_CURVE_SERVER_KEY", None, "/h.pub"),
    ("worker", "--curve-allow-dir", "DPSERVE_CURVE_ALLOW_DIR", None, "/allow"),
    ("worker", "--insecure-tcp", "DPSERVE_INSECURE_TCP", None, ""),
    ("worker", "--prefill-step-target-ms", "DPSERVE_PREFILL_STEP_TARGET_MS", Some("500"), "0"),
    ("worker", "--finish-first-tokens", "DPSERVE_FINISH_FIRST_TOKENS", Some("16"), "4"),
    ("worker", "--finish-first-max-wait-ms", "DPSERVE_FINISH_FIRST_MAX_WAIT_MS", Some("600"), "300"),
    ("worker", "--max-queued-requests", "DPSERVE_MAX_QUEUED_REQUESTS", None, "64"),
    ("worker", "--disaggregation-bootstrap-timeout", "DPSERVE_DISAGGREGATION_BOOTSTRAP_TIMEOUT", Some("300"), "30"),
    ("worker", "--disaggregation-waiting-timeout", "DPSERVE_DISAGGREGATION_WAITING_TIMEOUT", Some("300"), "30"),
    ("worker", "--disaggregation-mode", "DPSERVE_DISAGGREGATION_MODE", Some("null"), "prefill"),
    ("worker", "--disaggregation-kv-addr", "DPSERVE_DISAGGREGATION_KV_ADDR", None, "ipc:///x/kv.sock"),
    ("worker", "--kernel-path", "DPSERVE_KERNEL_PATH", Some("auto"), "portable"),
    ("worker", "--device", "DPSERVE_DEVICE", Some("cpu"), "cuda:1"),
    ("worker", "--sim-profile", "DPSERVE_SIM_PROFILE", Some("h100-qwen3.5-122b-a10b-fp8"), "cpu-calibrated"),
    ("worker", "--sim-config", "DPSERVE_SIM_CONFIG", None, "/sim.toml"),
    ("worker", "--sim-lock-step", "DPSERVE_SIM_LOCK_STEP", Some("false"), "true"),
    // dpserve bench: the cluster flags of --launch, and --engine's kernel path
    ("bench", "--kernel-path", "DPSERVE_KERNEL_PATH", Some("auto"), "portable"),
    ("bench", "--dp-size", "DPSERVE_BENCH_DP_SIZE", Some("2"), "3"),
    ("bench", "--prefill-dp-size", "DPSERVE_BENCH_PREFILL_DP_SIZE", None, "1"),
    ("bench", "--decode-dp-size", "DPSERVE_BENCH_DECODE_DP_SIZE", None, "1"),
    ("bench", "--model-path", "DPSERVE_BENCH_MODEL_PATH", None, "/m"),
    ("bench", "--load-format", "DPSERVE_BENCH_LOAD_FORMAT", Some("auto"), "dummy"),
    ("bench", "--builtin-size", "DPSERVE_BENCH_BUILTIN_SIZE", Some("base"), "tiny"),
    ("bench", "--weight-seed", "DPSERVE_BENCH_WEIGHT_SEED", Some("0"), "5"),
    ("bench", "--weight-dtype", "DPSERVE_BENCH_WEIGHT_DTYPE", Some("auto"), "bf16"),
    ("bench", "--compute-dtype", "DPSERVE_BENCH_COMPUTE_DTYPE", Some("f32"), "bf16"),
    ("bench", "--weight-cache", "DPSERVE_BENCH_WEIGHT_CACHE", None, "/var/cache/dpserve"),
    ("bench", "--max-total-tokens", "DPSERVE_BENCH_MAX_TOTAL_TOKENS", None, "4096"),
    ("bench", "--mem-fraction", "DPSERVE_BENCH_MEM_FRACTION", Some("0.5"), "0.25"),
    ("bench", "--max-running-requests", "DPSERVE_BENCH_MAX_RUNNING_REQUESTS", Some("64"), "8"),
    ("bench", "--chunked-prefill-size", "DPSERVE_BENCH_CHUNKED_PREFILL_SIZE", Some("2048"), "256"),
    ("bench", "--max-prefill-tokens", "DPSERVE_BENCH_MAX_PREFILL_TOKENS", Some("8192"), "1024"),
    ("bench", "--decode-prealloc-size", "DPSERVE_BENCH_DECODE_PREALLOC_SIZE", Some("auto"), "4"),
    ("bench", "--schedule-policy", "DPSERVE_BENCH_SCHEDULE_POLICY", Some("lpm"), "fcfs"),
    ("bench", "--disable-radix-cache", "DPSERVE_BENCH_DISABLE_RADIX_CACHE", None, ""),
    ("bench", "--kv-event-block-size", "DPSERVE_BENCH_KV_EVENT_BLOCK_SIZE", Some("32"), "64"),
    ("bench", "--context-length", "DPSERVE_BENCH_CONTEXT_LENGTH", None, "512"),
    ("bench", "--num-threads", "DPSERVE_BENCH_NUM_THREADS", None, "2"),
    ("bench", "--heartbeat-interval-ms", "DPSERVE_BENCH_HEARTBEAT_INTERVAL_MS", Some("500"), "100"),
    ("bench", "--drain-timeout", "DPSERVE_BENCH_DRAIN_TIMEOUT", Some("30"), "7"),
    ("bench", "--prefill-step-target-ms", "DPSERVE_BENCH_PREFILL_STEP_TARGET_MS", Some("500"), "0"),
    ("bench", "--finish-first-tokens", "DPSERVE_BENCH_FINISH_FIRST_TOKENS", Some("16"), "4"),
    ("bench", "--finish-first-max-wait-ms", "DPSERVE_BENCH_FINISH_FIRST_MAX_WAIT_MS", Some("600"), "300"),
    ("bench", "--max-queued-requests", "DPSERVE_BENCH_MAX_QUEUED_REQUESTS", None, "64"),
    ("bench", "--disaggregation-bootstrap-timeout", "DPSERVE_BENCH_DISAGGREGATION_BOOTSTRAP_TIMEOUT", Some("300"), "30"),
    ("bench", "--disaggregation-waiting-timeout", "DPSERVE_BENCH_DISAGGREGATION_WAITING_TIMEOUT", Some("300"), "30"),
    ("bench", "--startup-timeout", "DPSERVE_BENCH_STARTUP_TIMEOUT", Some("300"), "60"),
];

/// Subcommands whose every flag is in [`CONTRACT`] (`bench` has workload flags besides).
const COMPLETE: &[&str] = &["up", "tokenizer", "controller", "worker"];

fn sub(name: &str) -> Command {
    Cli::command()
        .find_subcommand(name)
        .unwrap_or_else(|| panic!("no subcommand {name}"))
        .clone()
}

fn arg<'a>(cmd: &'a Command, long: &str) -> &'a Arg {
    cmd.get_arguments()
        .find(|a| a.get_long().map(|l| format!("--{l}")).as_deref() == Some(long))
        .unwrap_or_else(|| panic!("{} has no {long}", cmd.get_name()))
}

fn is_switch(a: &Arg) -> bool {
    !a.get_action().takes_values()
}

#[test]
fn every_flag_has_its_documented_variable_and_default() {
    for &(name, long, env, default, _) in CONTRACT {
        let cmd = sub(name);
        let a = arg(&cmd, long);
        assert_eq!(
            a.get_env().and_then(|e| e.to_str()),
            Some(env),
            "{name} {long}"
        );
        let got: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        match default {
            Some("*") => assert_eq!(got.len(), 1, "{name} {long}: {got:?}"),
            Some(d) => assert_eq!(got, [d], "{name} {long}"),
            // A switch: unset is false (clap fills that in only when the command is built).
            None if is_switch(a) => assert!(got.is_empty() || got == ["false"], "{name} {long}"),
            None => assert!(got.is_empty(), "{name} {long}: {got:?}"),
        }
    }
}

#[test]
fn no_flag_is_outside_the_contract() {
    for &name in COMPLETE {
        let cmd = sub(name);
        for a in cmd.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            let long = format!("--{long}");
            assert!(
                CONTRACT.iter().any(|r| r.0 == name && r.1 == long),
                "{name} {long} is not in the contract table"
            );
        }
    }
}

/// The argv that gives every flag of `name` its sample value.
fn sample_argv(name: &str) -> Vec<String> {
    let cmd = sub(name);
    let mut argv = vec!["dpserve".to_string(), name.to_string()];
    for &(_, long, _, _, value) in CONTRACT.iter().filter(|r| r.0 == name) {
        argv.push(long.to_string());
        if !is_switch(arg(&cmd, long)) {
            argv.push(value.to_string());
        }
    }
    argv
}

/// Checks that `m` (the matches of subcommand `name`) holds every sample value.
fn check_samples(name: &str, m: &ArgMatches) {
    let cmd = sub(name);
    for &(_, long, _, _, value) in CONTRACT.iter().filter(|r| r.0 == name) {
        let a = arg(&cmd, long);
        let id = a.get_id().as_str();
        if is_switch(a) {
            assert_eq!(m.get_one::<bool>(id), Some(&true), "{name} {long}");
        } else {
            let raw: Vec<String> = m
                .get_raw(id)
                .unwrap_or_else(|| panic!("{name} {long}: no value"))
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            assert_eq!(raw, [value], "{name} {long}");
        }
    }
}

#[test]
fn every_flag_accepts_a_value_on_the_command_line() {
    for name in ["up", "tokenizer", "controller", "worker", "bench"] {
        let m = Cli::command()
            .try_get_matches_from(sample_argv(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (_, m) = m.subcommand().unwrap();
        check_samples(name, m);
    }
}

/// Set in the child process of [`every_flag_reads_its_variable`].
const CHILD: &str = "DPSERVE_CLI_CONTRACT_CHILD";

#[test]
fn every_flag_reads_its_variable() {
    // In a child process: variables set here would race the other tests' parsing.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child.args([
        "cli_contract::parse_from_variables",
        "--exact",
        "--ignored",
        "--nocapture",
    ]);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DPSERVE_") {
            child.env_remove(key);
        }
    }
    child.env(CHILD, "1");
    for &(_, _, env, _, value) in CONTRACT {
        child.env(env, if value.is_empty() { "true" } else { value });
    }
    let out = child.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run by every_flag_reads_its_variable, in a child process with the variables set"]
fn parse_from_variables() {
    assert!(std::env::var_os(CHILD).is_some(), "run only as a child");
    for name in ["up", "tokenizer", "controller", "worker", "bench"] {
        let m = Cli::command()
            .try_get_matches_from(["dpserve", name])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (_, m) = m.subcommand().unwrap();
        check_samples(name, m);
    }
}

#[test]
fn help_lists_the_choices_of_closed_sets() {
    let cases: &[(&str, &[&str])] = &[
        (
            "worker",
            &[
                "dummy", "tiny", "fcfs", "avx512", "portable", "cpu", "sim", "cuda:N",
            ],
        ),
        (
            "controller",
            &["round_robin", "follow_bootstrap_room", "total_requests"],
        ),
        (
            "up",
            &[
                "dummy",
                "tiny",
                "fcfs",
                "avx2",
                "prefix_affinity",
                "cpu",
                "cuda:N",
            ],
        ),
        (
            "bench",
            &["dummy", "tiny", "fcfs", "all", "cpu-small", "openai"],
        ),
    ];
    for (name, choices) in cases {
        let help = sub(name).render_long_help().to_string();
        for choice in *choices {
            assert!(
                help.contains(&format!("- {choice}"))
                    || help.contains(&format!(" {choice},"))
                    || help.contains(&format!(" {choice}]")),
                "{name} --help does not list {choice}:\n{help}"
            );
        }
    }
}

/// The documents whose `| flag | default | meaning |` tables state defaults.
const FLAG_TABLES: &[(&str, &str)] = &[
    ("README.md", include_str!("../README.md")),
    ("docs/FLAGS.md", include_str!("../docs/FLAGS.md")),
];

/// The cells of a Markdown table row, split on the `|`s outside backticks.
fn table_cells(row: &str) -> Vec<String> {
    let row = row.trim().trim_start_matches('|');
    let row = row.strip_suffix('|').unwrap_or(row);
    let mut cells = vec![String::new()];
    let mut code = false;
    for c in row.chars() {
        match c {
            '`' => code = !code,
            '|' if !code => {
                cells.push(String::new());
                continue;
            }
            _ => {}
        }
        cells.last_mut().unwrap().push(c);
    }
    cells.iter().map(|c| c.trim().to_string()).collect()
}

/// The rows (as cells) of every table in `doc` whose header is `header`.
fn table_rows(doc: &str, header: &[&str]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut lines = doc.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with('|') || table_cells(line) != header {
            continue;
        }
        lines.next(); // the |---| line
        while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
            rows.push(table_cells(row));
        }
    }
    rows
}

/// The backticked words of `cell`.
fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// What a documented default cell says of one flag.
#[derive(Debug, PartialEq)]
enum DocDefault {
    /// `none` or `off` (a first word): clap has no default.
    Unset,
    /// A single value, checked against clap's.
    Value(String),
    /// Words (`from --mem-fraction`, `CPUs / dp-size`): computed at run time, not checked.
    Computed,
}

impl DocDefault {
    fn parse(part: &str) -> Self {
        let text = part.replace('`', "");
        let text = text.trim();
        // Seconds are written with their unit; clap's values are bare.
        let text = text.strip_suffix(" s").unwrap_or(text);
        let first = text.split([' ', ':', ',', '(']).next().unwrap_or("");
        if matches!(first, "none" | "off") {
            DocDefault::Unset
        } else if text.contains(char::is_whitespace) {
            DocDefault::Computed
        } else {
            DocDefault::Value(text.to_string())
        }
    }
}

/// The default of `long` in effect under `dpserve up`: `up`'s own when it has one; else (a flag
/// `up` only forwards, or one it does not take) the default of the actors that read it, which
/// must agree. `None`: no default. Panics on a flag no command has.
fn effective_default(long: &str) -> Option<String> {
    let default_of = |name: &str| -> Option<Option<String>> {
        let cmd = sub(name);
        let a = cmd
            .get_arguments()
            .find(|a| a.get_long().map(|l| format!("--{l}")).as_deref() == Some(long))?;
        let values: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        Some(match values.as_slice() {
            [] => None,
            [v] if is_switch(a) && v == "false" => None,
            [v] => Some(v.clone()),
            _ => Some(values.join(",")),
        })
    };
    if let Some(Some(d)) = default_of("up") {
        return Some(d);
    }
    let actors: Vec<(&str, Option<String>)> = ["tokenizer", "controller", "worker"]
        .into_iter()
        .filter_map(|name| Some((name, default_of(name)?)))
        .collect();
    assert!(
        default_of("up").is_some() || !actors.is_empty(),
        "no command has {long}"
    );
    let set: Vec<&(&str, Option<String>)> = actors.iter().filter(|(_, d)| d.is_some()).collect();
    let first = set.first().and_then(|(_, d)| d.clone());
    assert!(
        set.iter().all(|(_, d)| *d == first),
        "the actors disagree on the default of {long}: {actors:?}"
    );
    first
}

/// Checks every `| flag | default | meaning |` row of `doc` against clap: how many defaults it
/// compared, and what disagrees. Rows for a family of flags (`--smg-*`) are left to `--help`.
fn flag_table_problems(doc: &str) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut problems = Vec::new();
    for row in table_rows(doc, &["flag", "default", "meaning"]) {
        let flags: Vec<&str> = backticked(&row[0])
            .into_iter()
            .filter(|f| f.starts_with("--"))
            .collect();
        if flags.is_empty() || flags.iter().any(|f| f.contains('*')) {
            continue;
        }
        // "2; `--device cuda`: one per visible GPU" states 2 and then the exceptions.
        let stated = row[1].split(';').next().unwrap_or("");
        let parts: Vec<&str> = stated.split(", ").collect();
        let parts: Vec<&str> = match parts.len() {
            1 => vec![parts[0]; flags.len()],
            n if n == flags.len() => parts,
            n => {
                problems.push(format!(
                    "{}: {n} defaults for {} flags",
                    row[0],
                    flags.len()
                ));
                continue;
            }
        };
        for (flag, part) in flags.into_iter().zip(parts) {
            let clap = effective_default(flag);
            match (DocDefault::parse(part), clap) {
                (DocDefault::Computed, _) => continue,
                (DocDefault::Unset, None) => {}
                (DocDefault::Value(doc), Some(clap)) if doc == clap => {}
                (doc, clap) => {
                    problems.push(format!("{flag}: the table says {doc:?}, clap {clap:?}"))
                }
            }
            checked += 1;
        }
    }
    (checked, problems)
}

#[test]
fn the_defaults_the_flag_tables_state_are_clap_s() {
    let mut problems = Vec::new();
    for (name, doc) in FLAG_TABLES {
        let (checked, found) = flag_table_problems(doc);
        problems.extend(found.into_iter().map(|p| format!("{name}: {p}")));
        if checked < 10 {
            problems.push(format!("{name}: only {checked} defaults checked"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn a_wrong_default_in_a_flag_table_is_found() {
    let doc = "| flag | default | meaning |\n|---|---|---|\n\
               | `--port`, `--host` | 30000, 127.0.0.1 | right |\n\
               | `--dp-size` | 3; more | wrong |\n\
               | `--api-key` | 1 | has none |\n\
               | `--disable-radix-cache` | off | a switch |\n\
               | `--max-total-tokens` | from `--mem-fraction` | computed |\n\
               | `--drain-timeout` | 30 s | seconds |\n\
               | `--smg-*` | see `--help` | a family |\n";
    let (checked, problems) = flag_table_problems(doc);
    assert_eq!(checked, 6, "{problems:?}");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("--dp-size"), "{problems:?}");
    assert!(problems[1].starts_with("--api-key"), "{problems:?}");
}

#[test]
fn architecture_md_lists_every_load_balance_method() {
    const ARCHITECTURE_MD: &str = include_str!("../docs/ARCHITECTURE.md");
    let documented: std::collections::BTreeSet<String> = table_rows(
        ARCHITECTURE_MD,
        &[
            "method",
            "rule",
            "branches",
            "module (`controller/src/policy/`)",
        ],
    )
    .iter()
    .filter_map(|row| backticked(&row[0]).first().map(|m| m.to_string()))
    .collect();
    let cmd = sub("controller");
    let methods: std::collections::BTreeSet<String> = arg(&cmd, "--load-balance-method")
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_string())
        .collect();
    assert!(methods.len() >= 10, "{methods:?}");
    assert_eq!(
        documented, methods,
        "docs/ARCHITECTURE.md's method table against `dpserve controller --help`"
    );
}

#[test]
fn architecture_md_names_every_source_file() {
    const ARCHITECTURE_MD: &str = include_str!("../docs/ARCHITECTURE.md");
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" || name == "third_party" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk(root, &mut files);
    assert!(files.len() > 200, "found only {} source files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            !matches!(&*name, "mod.rs" | "lib.rs" | "main.rs")
                && !ARCHITECTURE_MD.contains(&format!("`{name}`"))
                && !ARCHITECTURE_MD.contains(&format!("/{name}"))
        })
        .map(|p| p.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md's layout does not name {missing:?}"
    );
}
