//! `dpserve trace FILE [--rid R]`: read a controller routing trace (`--trace-file`) and print a
//! summary of all decisions, or explain one request's. The analysis lives in
//! `controller::trace::report`; this file is only the command's I/O.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::Context;
use controller::trace::report;

#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// A routing trace written by `dpserve controller --trace-file`.
    pub file: PathBuf,
    /// Explain the decision for this request id instead of summarising.
    #[arg(long)]
    pub rid: Option<String>,
}

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let file = File::open(&args.file)
        .with_context(|| format!("cannot open trace file {}", args.file.display()))?;
    let (records, bad) = report::parse(BufReader::new(file))
        .with_context(|| format!("reading {}", args.file.display()))?;
    if bad > 0 {
        eprintln!("dpserve trace: skipped {bad} line(s) that are not routing records");
    }
    match args.rid {
        Some(rid) => {
            let matches: Vec<_> = records.iter().filter(|r| r.rid == rid).collect();
            if matches.is_empty() {
                anyhow::bail!(
                    "no routing decision for rid {rid:?} in {}",
                    args.file.display()
                );
            }
            // A rid routed more than once (a retried request) shows every decision.
            for r in matches {
                print!("{}", report::explain(r));
            }
        }
        None => print!("{}", report::summarize(&records)),
    }
    Ok(())
}
