//! `dpserve bench`: the serving benchmark. Against a running server (`--base-url`) it sends a
//! workload (SGLang bench_serving's generated shared prefixes, multi-turn conversations, a
//! replayed Mooncake production trace, or one of the routers' known failure cases) and reports
//! bench_serving's metrics plus goodput under an SLO and the workload's cache-hit ceilings;
//! with `--launch --compare m1,m2,…` it starts a fresh cluster per load-balance method
//! (or deployment, `m@1p1d`), runs the identical workload on each and compares them (table,
//! JSON, Markdown, SVG).
//!
//! Module map: `args` is the command line, `preset` names workloads and cluster sizes, `plan`
//! resolves the flags over them, `runner` drives one run against a server, `compare` one per launched cluster,
//! `sweep` every method at several rates for its capacity at SLO; `workload` builds requests
//! (`mooncake` from a trace), `client` sends and times one,
//! `metrics` aggregates, `ceiling` bounds the hit rate, `report` formats, `launch` starts and
//! stops clusters, `chart` draws the comparison.

pub mod args;
pub mod bailian;
pub mod ceiling;
pub mod chart;
pub mod client;
pub mod compare;
pub mod engine;
pub mod launch;
pub mod metrics;
pub mod mooncake;
pub mod plan;
pub mod preset;
pub mod probe;
pub mod report;
pub mod routes;
pub mod runner;
pub mod sweep;
pub mod sweep_spec;
pub mod workload;

use anyhow::Context;

pub use args::BenchArgs;
use compare::run_compare;
use report::append_jsonl;
use runner::run_once;

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.engine {
        return engine::run(&args.engine_args()?);
    }
    let (plan, server) = args.resolve()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if let Some(spec) = &plan.sweep {
        return sweep::run_sweep(&args, spec, &plan, &server, &rt);
    }
    if args.launch {
        return run_compare(&args, &plan, &server, &rt);
    }
    let (info, m) = rt.block_on(run_once(&args.base_url, &plan))?;
    print!("{}", report::result_table(&info, &m));
    if let Some(path) = &args.output_file {
        append_jsonl(path, &report::result_json(&info, &m))?;
    }
    if m.completed == 0 {
        anyhow::bail!("no request completed");
    }
    Ok(())
}
