//! `dpserve trace PATH [--rid R]`.
//!
//! - PATH a file: a controller routing trace (`--trace-file`); summarise every decision, or
//!   explain one request's (`--rid`).
//! - PATH a directory: message traces (`--trace-dir`), one `*.jsonl` per actor, plus a routing
//!   trace if one is there; merge them into one request's timeline (`--rid`), or count messages
//!   per actor and list the requests seen.
//!
//! With `--svg OUT.svg` and/or `--chrome OUT.json` it also draws: with `--rid`, the request's
//! journey across the actors (a directory); without, routing over the whole run (a file or a
//! directory).
//!
//! The analysis lives in the `trace-tools` crate (`report`, `timeline`, `journey`, `picture`,
//! `traffic`, `chrome`); this file is only the I/O.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use trace_tools::{chrome, journey, picture, report, timeline, traffic};

#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// A routing trace file (`--trace-file`), or a message-trace directory (`--trace-dir`).
    pub path: PathBuf,
    /// Explain this request: its routing decision (a file) or its timeline across actors (a
    /// directory).
    #[arg(long)]
    pub rid: Option<String>,
    /// Also draw an SVG: the request's journey across the actors (with `--rid`, a directory), or
    /// routing over the run (requests per rank and per branch over time, ranks joining and
    /// leaving).
    #[arg(long, value_name = "OUT.svg")]
    pub svg: Option<PathBuf>,
    /// Also write the same as Chrome trace-event JSON, for Perfetto or chrome://tracing.
    #[arg(long, value_name = "OUT.json")]
    pub chrome: Option<PathBuf>,
}

/// Where the pictures go.
struct Outputs<'a> {
    svg: Option<&'a Path>,
    chrome: Option<&'a Path>,
}

impl Outputs<'_> {
    fn any(&self) -> bool {
        self.svg.is_some() || self.chrome.is_some()
    }

    fn write(
        &self,
        svg: impl FnOnce() -> String,
        chrome: impl FnOnce() -> serde_json::Value,
    ) -> anyhow::Result<()> {
        if let Some(path) = self.svg {
            std::fs::write(path, svg()).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("dpserve trace: wrote {}", path.display());
        }
        if let Some(path) = self.chrome {
            let text = serde_json::to_string(&chrome())?;
            std::fs::write(path, text + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!(
                "dpserve trace: wrote {} (open it in https://ui.perfetto.dev)",
                path.display()
            );
        }
        Ok(())
    }

    /// Routing over a run.
    fn traffic(&self, points: &[traffic::RoutePoint], source: &Path) -> anyhow::Result<()> {
        if !self.any() {
            return Ok(());
        }
        if points.is_empty() {
            bail!("no routing decisions in {} to draw", source.display());
        }
        let tr = traffic::Traffic::of(points);
        let name = source.file_name().map_or_else(
            || source.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let title = format!("routing over time: {name}");
        self.write(
            || traffic::traffic_svg(&tr, &title),
            || chrome::traffic_json(&tr),
        )
    }
}

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let out = Outputs {
        svg: args.svg.as_deref(),
        chrome: args.chrome.as_deref(),
    };
    if args.path.is_dir() {
        return run_dir(&args.path, args.rid.as_deref(), &out);
    }
    if args.rid.is_some() && out.any() {
        bail!(
            "a request's picture needs its message traces: give the --trace-dir directory \
             (with the routing trace in it), not the routing trace file"
        );
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
        None => {
            print!("{}", report::summarize(&records));
            let points: Vec<_> = records.iter().map(traffic::RoutePoint::of_record).collect();
            out.traffic(&points, &args.path)?;
        }
    }
    Ok(())
}

fn run_dir(dir: &Path, rid: Option<&str>, out: &Outputs<'_>) -> anyhow::Result<()> {
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
            Some(tl) => {
                print!("{tl}");
                let j = journey::Journey::of(&tl);
                out.write(|| picture::request_svg(&j), || chrome::request_json(&j))?;
            }
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
        None => {
            print!("{}", timeline::overview(&set));
            out.traffic(&traffic::points_of_set(&set), dir)?;
        }
    }
    Ok(())
}
