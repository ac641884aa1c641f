//! `dpserve trace PATH [--rid R]`.
//!
//! - PATH a file: a controller routing trace (`--trace-file`); summarise every decision, or
//!   explain one request's (`--rid`).
//! - PATH a directory: message traces (`--trace-dir`), one `*.jsonl` per actor, plus a routing
//!   trace if one is there; merge them into one request's timeline (`--rid`), or count messages
//!   per actor and list the requests seen.
//!
//! The analysis lives in `controller::trace::{report, timeline}`; this file is only the I/O.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use controller::trace::{report, timeline};

#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// A routing trace file (`--trace-file`), or a message-trace directory (`--trace-dir`).
    pub path: PathBuf,
    /// Explain this request: its routing decision (a file) or its timeline across actors (a
    /// directory).
    #[arg(long)]
    pub rid: Option<String>,
}

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    if args.path.is_dir() {
        return run_dir(&args.path, args.rid.as_deref());
    }
    let file = File::open(&args.path)
        .with_context(|| format!("cannot open trace file {}", args.path.display()))?;
    let (records, bad) = report::parse(BufReader::new(file))
        .with_context(|| format!("reading {}", args.path.display()))?;
    if bad > 0 {
        eprintln!("dpserve trace: skipped {bad} line(s) that are not routing records");
    }
    match args.rid {
        Some(rid) => {
            let matches: Vec<_> = records.iter().filter(|r| r.rid == rid).collect();
            if matches.is_empty() {
                bail!(
                    "no routing decision for rid {rid:?} in {}",
                    args.path.display()
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

fn run_dir(dir: &Path, rid: Option<&str>) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read trace directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!(
            "no trace files (*.jsonl) in {}; start the actors with --trace-dir {0}",
            dir.display()
        );
    }
    let mut set = timeline::TraceSet::default();
    for path in &files {
        // One unreadable file (another user's, cut off by a full disk) must not hide what the
        // other actors' files say: skip it, and say so.
        let added = File::open(path).and_then(|file| set.add(BufReader::new(file)));
        if let Err(e) = added {
            eprintln!(
                "dpserve trace: warning: skipped {} (cannot read it: {e})",
                path.display()
            );
        }
    }
    if set.malformed > 0 {
        eprintln!(
            "dpserve trace: skipped {} line(s) that are neither message-trace lines nor routing \
             records",
            set.malformed
        );
    }
    if set.is_empty() {
        bail!(
            "the trace files in {} hold no trace lines ({} file(s))",
            dir.display(),
            files.len()
        );
    }
    match rid {
        Some(rid) => match timeline::timeline(&set, rid) {
            Some(tl) => print!("{tl}"),
            None => {
                let rids = set.rids();
                let children: Vec<&str> = rids
                    .iter()
                    .copied()
                    .filter(|r| {
                        r.strip_prefix(rid)
                            .and_then(|rest| rest.strip_prefix('-'))
                            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .collect();
                if !children.is_empty() {
                    bail!(
                        "no events for rid {rid:?} in {}; it fanned out into: {}",
                        dir.display(),
                        children.join(", ")
                    );
                }
                bail!(
                    "no events for rid {rid:?} in {} ({} request(s) seen; \
                     `dpserve trace {0}` lists them)",
                    dir.display(),
                    rids.len()
                );
            }
        },
        None => print!("{}", timeline::overview(&set)),
    }
    Ok(())
}
