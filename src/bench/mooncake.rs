//! Replaying a Mooncake-format trace (`--dataset-name mooncake --dataset-path FILE`): Kimi's
//! production traffic as released with the Mooncake paper (FAST'25), the workload SGLang's
//! bench_serving, AIPerf and Dynamo's recipes replay. One JSON object a line:
//!
//! ```text
//! {"timestamp": ms from start, "input_length": prompt tokens, "output_length": tokens
//!  generated, "hash_ids": [one id per 512-token prompt block; equal ids = equal blocks]}
//! ```
//!
//! The trace carries no text, so each hash id becomes one fixed pseudo-random block of token
//! ids (seeded by the id and `--seed`, so equal ids give equal tokens in any run and against any
//! server with the same vocabulary); a prompt is its blocks in order, cut to its length.
//!
//! Scaling for small machines, stated in every result:
//! ```text
//! block tokens  b   = --trace-block-tokens (512 = the trace's own); prompt = ⌈input_length · b / 512⌉
//! arrival       t   = (timestamp − --trace-start-ms) / --trace-time-compression
//! output        o   = max(1, round(output_length · --trace-output-scale))
//! window            = the first --num-prompts requests at or after the start offset
//! ```
//! Requests go out open-loop at `t` (no concurrency cap unless `--max-concurrency` is given),
//! with EOS ignored, so each generates exactly `o` tokens.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use protocol::hash;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use super::workload::{BenchRequest, FIRST_PLAIN_TOKEN};

/// Tokens per hash block in the released traces.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// How a trace is scaled and windowed (the `--trace-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceConfig {
    pub path: Option<PathBuf>,
    /// Tokens each hash id stands for (the trace's own: `native_block_tokens`).
    pub block_tokens: usize,
    /// Tokens a hash id stands for in the trace's own format (Mooncake 512, Bailian 16): its
    /// `input_length`s count these.
    pub native_block_tokens: usize,
    /// Timestamps are divided by this (2.0 replays an hour in half an hour).
    pub time_compression: f64,
    /// Requests before this timestamp are skipped; the window's clock starts here.
    pub start_ms: u64,
    /// Output lengths are multiplied by this (at least one token each).
    pub output_scale: f64,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            path: None,
            block_tokens: TRACE_BLOCK_TOKENS,
            native_block_tokens: TRACE_BLOCK_TOKENS,
            time_compression: 1.0,
            start_ms: 0,
            output_scale: 1.0,
        }
    }
}

impl TraceConfig {
    /// The scaling in words, for every result.
    pub fn describe(&self) -> String {
        format!(
            "{} tokens per block (trace: {}), time compressed {}x, from {} ms, output lengths x{}",
            self.block_tokens,
            self.native_block_tokens,
            self.time_compression,
            self.start_ms,
            self.output_scale
        )
    }

    /// The trace file, once the scaling and the vocabulary prompts are drawn from are checked;
    /// `missing` says what to give when no file is.
    pub(super) fn checked_path(
        &self,
        vocab_size: u32,
        missing: &'static str,
    ) -> anyhow::Result<&Path> {
        self.check()?;
        anyhow::ensure!(
            vocab_size > FIRST_PLAIN_TOKEN,
            "vocab_size {vocab_size} leaves no ids above the specials"
        );
        self.path.as_deref().context(missing)
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.block_tokens > 0,
            "--trace-block-tokens must be at least 1"
        );
        anyhow::ensure!(
            self.time_compression.is_finite() && self.time_compression > 0.0,
            "--trace-time-compression must be a positive number, got {}",
            self.time_compression
        );
        anyhow::ensure!(
            self.output_scale.is_finite() && self.output_scale > 0.0,
            "--trace-output-scale must be a positive number, got {}",
            self.output_scale
        );
        Ok(())
    }
}

/// One line of the trace file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceEntry {
    pub timestamp: u64,
    pub input_length: usize,
    pub output_length: usize,
    pub hash_ids: Vec<u64>,
}

/// Reads the trace's entries at or after `start_ms`, at most `limit` of them, in file order
/// (which the released traces keep sorted by timestamp; an unsorted file is refused).
pub fn read(path: &Path, start_ms: u64, limit: Option<usize>) -> anyhow::Result<Vec<TraceEntry>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("--dataset-path {}: cannot open", path.display()))?;
    let mut out = Vec::new();
    let mut last = 0u64;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|n| out.len() >= n) {
            break;
        }
        let line = line.with_context(|| format!("{}: reading line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let e: TraceEntry = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: not a trace entry (timestamp, input_length, output_length, hash_ids)",
                path.display(),
                i + 1
            )
        })?;
        anyhow::ensure!(
            e.timestamp >= last,
            "{} line {}: timestamp {} is before the previous line's {last} (the trace must be \
             sorted by time)",
            path.display(),
            i + 1,
            e.timestamp
        );
        last = e.timestamp;
        anyhow::ensure!(
            e.input_length > 0 && !e.hash_ids.is_empty(),
            "{} line {}: an empty prompt",
            path.display(),
            i + 1
        );
        anyhow::ensure!(
            e.input_length <= e.hash_ids.len() * TRACE_BLOCK_TOKENS,
            "{} line {}: input_length {} is longer than its {} blocks of {TRACE_BLOCK_TOKENS}",
            path.display(),
            i + 1,
            e.input_length,
            e.hash_ids.len()
        );
        if e.timestamp >= start_ms {
            out.push(e);
        }
    }
    Ok(out)
}

/// Requests/s a window of entries offers at time compression 1: its requests after the first
/// over the time from the first to the last (a window of one request, or of one instant, is
/// refused: it has no rate).
pub fn window_rate(entries: &[TraceEntry], path: &Path) -> anyhow::Result<f64> {
    let span_ms = match (entries.first(), entries.last()) {
        (Some(first), Some(last)) => last.timestamp - first.timestamp,
        _ => 0,
    };
    anyhow::ensure!(
        span_ms > 0,
        "{}: the window ({} requests) spans no time, so it has no rate to sweep",
        path.display(),
        entries.len()
    );
    Ok((entries.len() - 1) as f64 / (span_ms as f64 / 1000.0))
}

/// The scaled prompt length of an entry: ⌈input_length · block_tokens / native⌉ (native: the
/// trace's own block, 512 for Mooncake).
pub fn scaled_len(input_length: usize, block_tokens: usize, native: usize) -> usize {
    (input_length * block_tokens).div_ceil(native.max(1)).max(1)
}

/// Builds the trace window's requests; `num_prompts` keeps the first that many.
pub fn generate(
    cfg: &TraceConfig,
    vocab_size: u32,
    num_prompts: Option<usize>,
    seed: u64,
) -> anyhow::Result<Vec<BenchRequest>> {
    let path = cfg.checked_path(
        vocab_size,
        "--dataset-name mooncake needs --dataset-path FILE (a Mooncake trace, e.g. \
         ../shared/workloads/mooncake/conversation_trace.jsonl)",
    )?;
    let entries = read(path, cfg.start_ms, num_prompts)?;
    Ok(requests(&entries, cfg, vocab_size, seed))
}

/// The requests of `entries` (already windowed), in arrival order.
pub fn requests(
    entries: &[TraceEntry],
    cfg: &TraceConfig,
    vocab_size: u32,
    seed: u64,
) -> Vec<BenchRequest> {
    let mut blocks = Blocks::new(cfg.block_tokens, vocab_size, seed);
    entries
        .iter()
        .enumerate()
        .map(|(index, e)| {
            let len = scaled_len(e.input_length, cfg.block_tokens, cfg.native_block_tokens);
            let mut input_ids = Vec::with_capacity(len);
            for &id in &e.hash_ids {
                if input_ids.len() >= len {
                    break;
                }
                input_ids.extend_from_slice(blocks.get(id));
            }
            input_ids.truncate(len);
            let at_ms = e.timestamp.saturating_sub(cfg.start_ms) as f64 / cfg.time_compression;
            BenchRequest {
                index,
                // The first block's id: requests that share it share a prefix.
                group: e.hash_ids[0] as usize,
                input_ids,
                output_len: ((e.output_length as f64 * cfg.output_scale).round() as usize).max(1),
                routing_key: None,
                after: None,
                after_gap_s: 0.0,
                at: Some(at_ms / 1000.0),
            }
        })
        .collect()
}

/// One fixed block of token ids per hash id, made on first use.
pub(super) struct Blocks {
    block_tokens: usize,
    vocab_size: u32,
    seed: u64,
    made: HashMap<u64, Vec<u32>>,
}

impl Blocks {
    fn new(block_tokens: usize, vocab_size: u32, seed: u64) -> Self {
        Blocks {
            block_tokens,
            vocab_size,
            seed,
            made: HashMap::new(),
        }
    }

    fn get(&mut self, id: u64) -> &[u32] {
        let (n, vocab, seed) = (self.block_tokens, self.vocab_size, self.seed);
        self.made.entry(id).or_insert_with(|| {
            // splitmix64 of (seed, id): independent streams for neighbouring ids.
            let z = seed ^ id.wrapping_mul(hash::SPLITMIX64_GAMMA);
            let mut rng = StdRng::seed_from_u64(hash::splitmix64_mix(z));
            (0..n)
                .map(|_| rng.gen_range(FIRST_PLAIN_TOKEN..vocab))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ts: u64, len: usize, out: usize, ids: &[u64]) -> TraceEntry {
        TraceEntry {
            timestamp: ts,
            input_length: len,
            output_length: out,
            hash_ids: ids.to_vec(),
        }
    }

    fn write(lines: &[&str]) -> tempfile::NamedTempFile {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    #[test]
    fn equal_hash_ids_give_equal_tokens_and_prompts_are_cut_to_length() {
        let cfg = TraceConfig {
            block_tokens: 16,
            ..TraceConfig::default()
        };
        // 1000 tokens = 2 blocks of 512 → 32 tokens at 16 per block (1000·16/512 = 31.25 → 32).
        let entries = [
            entry(0, 1000, 10, &[0, 1]),
            entry(5, 600, 3, &[0, 2]),
            entry(9, 100, 1, &[7]),
        ];
        let a = requests(&entries, &cfg, 1000, 1);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].prompt_len(), 32);
        assert_eq!(a[1].prompt_len(), scaled_len(600, 16, TRACE_BLOCK_TOKENS));
        assert_eq!(a[1].prompt_len(), 19);
        assert_eq!(a[2].prompt_len(), 4);
        assert_eq!(a[0].input_ids[..16], a[1].input_ids[..16], "block 0 shared");
        assert_ne!(
            a[0].input_ids[16..],
            a[1].input_ids[16..19],
            "blocks 1, 2 differ"
        );
        assert_eq!(
            (a[0].output_len, a[1].output_len, a[2].output_len),
            (10, 3, 1)
        );
        assert!(a
            .iter()
            .all(|r| r.input_ids.iter().all(|&t| (3..1000).contains(&t))));
        // The same ids in another run give the same tokens; another seed gives others.
        let again = requests(&entries[1..], &cfg, 1000, 1);
        assert_eq!(again[0].input_ids, a[1].input_ids);
        assert_ne!(
            requests(&entries, &cfg, 1000, 2)[0].input_ids,
            a[0].input_ids
        );
        assert_eq!(a[1].at, Some(0.005));
    }

    #[test]
    fn time_is_compressed_and_offset_and_outputs_scaled() {
        let cfg = TraceConfig {
            block_tokens: 8,
            time_compression: 4.0,
            start_ms: 2000,
            output_scale: 0.1,
            path: None,
            native_block_tokens: TRACE_BLOCK_TOKENS,
        };
        let entries = [entry(2000, 512, 500, &[3]), entry(6000, 512, 4, &[3])];
        let r = requests(&entries, &cfg, 100, 1);
        assert_eq!(r[0].at, Some(0.0));
        assert_eq!(r[1].at, Some(1.0), "(6000 − 2000) ms / 4");
        assert_eq!((r[0].output_len, r[1].output_len), (50, 1), "at least one");
        assert!(cfg.describe().contains("8 tokens per block"));
    }

    #[test]
    fn reads_a_window_and_refuses_malformed_files() {
        let f = write(&[
            r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}"#,
            "",
            r#"{"timestamp": 10, "input_length": 10, "output_length": 5, "hash_ids": [0]}"#,
            r#"{"timestamp": 20, "input_length": 10, "output_length": 5, "hash_ids": [2]}"#,
        ]);
        assert_eq!(read(f.path(), 0, None).unwrap().len(), 3);
        let w = read(f.path(), 5, Some(1)).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].timestamp, 10);

        let unsorted = write(&[
            r#"{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [0]}"#,
            r#"{"timestamp": 3, "input_length": 1, "output_length": 1, "hash_ids": [0]}"#,
        ]);
        let e = read(unsorted.path(), 0, None).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("sorted"), "{e}");
        let bad = write(&[r#"{"timestamp": 0, "input_length": 1}"#]);
        let e = format!("{:#}", read(bad.path(), 0, None).unwrap_err());
        assert!(e.contains("line 1") && e.contains("hash_ids"), "{e}");
        let long = write(&[
            r#"{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0]}"#,
        ]);
        assert!(
            read(long.path(), 0, None).is_err(),
            "longer than its blocks"
        );
        let e = format!(
            "{:#}",
            read(Path::new("/no/such/trace.jsonl"), 0, None).unwrap_err()
        );
        assert!(e.contains("--dataset-path /no/such/trace.jsonl"), "{e}");
    }

    #[test]
    fn bad_scaling_and_a_missing_path_are_refused() {
        let no_path = generate(&TraceConfig::default(), 100, None, 1).unwrap_err();
        assert!(no_path.to_string().contains("--dataset-path"), "{no_path}");
        for cfg in [
            TraceConfig {
                block_tokens: 0,
                ..TraceConfig::default()
            },
            TraceConfig {
                time_compression: 0.0,
                ..TraceConfig::default()
            },
            TraceConfig {
                output_scale: f64::NAN,
                ..TraceConfig::default()
            },
        ] {
            assert!(generate(&cfg, 100, None, 1).is_err(), "{cfg:?}");
        }
    }

    /// The real trace, when it is beside the checkout: every line reads, and the sharing the
    /// docs/BENCHMARKS.md states (first blocks repeat) survives the scaling.
    #[test]
    fn the_shared_conversation_trace_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/workloads/mooncake/conversation_trace.jsonl");
        if !path.exists() {
            eprintln!("skipped: {} is absent", path.display());
            return;
        }
        let all = read(&path, 0, None).unwrap();
        assert_eq!(all.len(), 12_031);
        let cfg = TraceConfig {
            block_tokens: 4,
            ..TraceConfig::default()
        };
        let r = requests(&all[..200], &cfg, 512, 1);
        let mean = r.iter().map(|r| r.prompt_len()).sum::<usize>() as f64 / 200.0;
        assert!((20.0..300.0).contains(&mean), "mean scaled prompt {mean}");
        let shared = r.iter().filter(|x| x.group == r[0].group).count();
        assert!(shared > 1, "the first block repeats");
    }
}
