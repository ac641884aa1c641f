//! `dpserve`: one binary for every actor. `up` starts a whole single-host deployment as child
//! processes; `tokenizer`, `controller` and `worker` run one actor each (for systemd).

mod bench;
#[cfg(test)]
mod cli_contract;
#[cfg(test)]
mod cli_reference;
mod failure;
mod forwarded;
mod keygen;
mod trace;
mod up;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use failure::Failure;

#[derive(Parser, Debug)]
#[command(
    name = "dpserve",
    version,
    about = "Data-parallel LLM serving with prefix-cache-aware routing"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the tokenizer, the controller and --dp-size workers on this host.
    Up(up::UpArgs),
    /// Run the tokenizer actor (HTTP API, tokenization, detokenization).
    Tokenizer(tokenizer_actor::TokenizerArgs),
    /// Run the controller actor (routing, liveness).
    Controller(controller::ControllerArgs),
    /// Run one worker actor (one data-parallel rank).
    Worker(worker::WorkerArgs),
    /// Benchmark a server with the shared-prefix workload, or compare load-balance methods.
    Bench(bench::BenchArgs),
    /// Summarise a routing trace file or a message-trace directory, or follow one request
    /// (--rid).
    Trace(trace::TraceArgs),
    /// Make a CURVE keypair for authenticated, encrypted ZeroMQ between hosts.
    Keygen(keygen::KeygenArgs),
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DPSERVE_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colours only on a terminal: the journal and log files get plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// An empty `DPSERVE_*` variable means "unset", for every actor and every flag: an
/// uncommented `DPSERVE_X=` line in the EnvironmentFile must not turn into `--x ''` (a parse
/// error for numbers and paths, an empty API key that refuses every call, an empty model id
/// that refuses every worker). Done once, before clap reads the environment, and inherited by
/// the children `up` starts. Returns the names removed.
fn unset_empty_dpserve_vars() -> Vec<String> {
    let empty: Vec<std::ffi::OsString> = std::env::vars_os()
        .filter(|(k, v)| k.to_string_lossy().starts_with("DPSERVE_") && v.is_empty())
        .map(|(k, _)| k)
        .collect();
    for key in &empty {
        // Single-threaded here: nothing else reads the environment yet.
        std::env::remove_var(key);
    }
    empty
        .iter()
        .map(|k| k.to_string_lossy().into_owned())
        .collect()
}

fn main() -> std::process::ExitCode {
    let unset = unset_empty_dpserve_vars();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging();
    if !unset.is_empty() {
        tracing::debug!(?unset, "empty DPSERVE_* variables ignored (same as unset)");
    }
    let result = match cli.command {
        Command::Up(args) => up::run(args),
        Command::Tokenizer(args) => tokenizer_actor::run(args).map_err(Failure::from),
        Command::Controller(args) => controller::run(args).map_err(Failure::from),
        Command::Worker(args) => {
            // Given on the command line or in the environment, not clap's default.
            let mem_fraction_given = matches
                .subcommand_matches("worker")
                .and_then(|m| m.value_source("mem_fraction"))
                .is_some_and(|source| source != clap::parser::ValueSource::DefaultValue);
            worker::run(args, mem_fraction_given).map_err(Failure::from)
        }
        Command::Bench(args) => bench::run(args).map_err(Failure::from),
        Command::Trace(args) => trace::run(args).map_err(Failure::from),
        Command::Keygen(args) => keygen::run(args).map_err(Failure::from),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}
