//! `dpserve`: one binary for every actor. `up` starts a whole single-host deployment as child
//! processes; `tokenizer`, `controller` and `worker` run one actor each (for systemd).

mod bench;
mod trace;
mod up;

use clap::{Parser, Subcommand};

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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Up(args) => up::run(args),
        Command::Tokenizer(args) => tokenizer_actor::run(args),
        Command::Controller(args) => controller::run(args),
        Command::Worker(args) => worker::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Trace(args) => trace::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) if err.downcast_ref::<worker::Refused>().is_some() => {
            eprintln!("dpserve: error: {err:#}");
            // EX_CONFIG: retrying cannot help, so systemd units can stop restarting on it.
            std::process::ExitCode::from(worker::Refused::EXIT_CODE)
        }
        Err(err) => {
            eprintln!("dpserve: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
