//! Replaying a Qwen-Bailian-format trace of sessions (`--dataset-name bailian --dataset-path
//! FILE`), the format of alibaba-edu/qwen-bailian-usagetraces-anon: agentic and multi-turn
//! traffic whose turns depend on each other. One JSON object a line:
//!
//! ```text
//! {"chat_id": id, "parent_chat_id": the turn it continues (-1: a session's first),
//!  "timestamp": seconds from start, "input_length": prompt tokens, "output_length": tokens
//!  generated, "type": kind of request, "turn": turn number,
//!  "hash_ids": [one id per 16-token prompt block; equal ids = equal blocks]}
//! ```
//!
//! Prompts are built from `hash_ids` as for a Mooncake trace (`bench::mooncake`: one fixed
//! block of token ids per id, `--trace-block-tokens` tokens each, the trace's own being 16),
//! so a turn's prompt shares with its parent's whatever blocks the trace says it shares — the
//! parent's prompt, and the parent's answer as the trace recorded it (the server generated its
//! own, so that part is computed again, as for a chat client that re-sends a drawn answer).
//!
//! When a turn is sent (times divided by `--trace-time-compression`):
//! ```text
//! root turn   at its timestamp
//! child turn  never before its parent has finished: at parent's end + gap, where
//!             gap = (its timestamp − parent's timestamp) / compression (the trace's own pause
//!             between the two, kept from the parent's end: self-paced sessions)
//! siblings    (same parent) together: each takes the earliest sibling's timestamp and gap
//! ```
//! A turn whose parent is before the window (`--trace-start-ms`) starts its own session; one
//! whose parent the file never names is refused, as is a file not sorted by time.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::mooncake::{self, TraceConfig, TraceEntry};
use super::workload::BenchRequest;

/// Tokens per hash block in the released Bailian traces.
pub const BAILIAN_BLOCK_TOKENS: usize = 16;

/// One line of the file.
#[derive(Debug, Clone, Deserialize)]
struct Line {
    chat_id: i64,
    parent_chat_id: i64,
    timestamp: f64,
    input_length: usize,
    output_length: usize,
    hash_ids: Vec<u64>,
}

/// A window of the trace: its turns as trace entries (timestamps in ms) and each one's parent
/// (an index into the window; `None` for a session's first turn in the window).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sessions {
    pub entries: Vec<TraceEntry>,
    pub parents: Vec<Option<usize>>,
}

/// Reads the turns at or after `start_ms`, at most `limit` of them, in file order (sorted by
/// time; an unsorted file, a repeated chat_id or a parent never named before its child are
/// refused).
pub fn read(path: &Path, start_ms: u64, limit: Option<usize>) -> anyhow::Result<Sessions> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("--dataset-path {}: cannot open", path.display()))?;
    let mut out = Sessions::default();
    // chat_id → its index in the window, or None when it came before the window.
    let mut seen: HashMap<i64, Option<usize>> = HashMap::new();
    let mut last = 0u64;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|n| out.entries.len() >= n) {
            break;
        }
        let at = |what: String| format!("{} line {}: {what}", path.display(), i + 1);
        let line = line.with_context(|| at("cannot read".into()))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).with_context(|| {
            at(
                "not a Bailian trace entry (chat_id, parent_chat_id, timestamp, input_length, \
                output_length, hash_ids)"
                    .into(),
            )
        })?;
        anyhow::ensure!(
            l.timestamp.is_finite() && l.timestamp >= 0.0,
            at(format!(
                "timestamp {} is not a time in seconds",
                l.timestamp
            ))
        );
        let ts = (l.timestamp * 1000.0).round() as u64;
        anyhow::ensure!(
            ts >= last,
            at(format!(
                "timestamp {} is before the previous line's (the trace must be sorted by time)",
                l.timestamp
            ))
        );
        last = ts;
        anyhow::ensure!(
            l.input_length > 0 && !l.hash_ids.is_empty(),
            at("an empty prompt".into())
        );
        anyhow::ensure!(
            l.input_length <= l.hash_ids.len() * BAILIAN_BLOCK_TOKENS,
            at(format!(
                "input_length {} is longer than its {} blocks of {BAILIAN_BLOCK_TOKENS}",
                l.input_length,
                l.hash_ids.len()
            ))
        );
        let parent = match l.parent_chat_id {
            -1 => None,
            p => *seen.get(&p).with_context(|| {
                at(format!(
                    "parent_chat_id {p} names no earlier line (a turn follows its parent)"
                ))
            })?,
        };
        let index = (ts >= start_ms).then_some(out.entries.len());
        anyhow::ensure!(
            seen.insert(l.chat_id, index).is_none(),
            at(format!("chat_id {} is repeated", l.chat_id))
        );
        if index.is_some() {
            out.entries.push(TraceEntry {
                timestamp: ts,
                input_length: l.input_length,
                output_length: l.output_length,
                hash_ids: l.hash_ids,
            });
            out.parents.push(parent);
        }
    }
    Ok(out)
}

/// Builds the window's requests; `num_prompts` keeps the first that many.
pub fn generate(
    cfg: &TraceConfig,
    vocab_size: u32,
    num_prompts: Option<usize>,
    seed: u64,
) -> anyhow::Result<Vec<BenchRequest>> {
    let path = cfg.checked_path(
        vocab_size,
        "--dataset-name bailian needs --dataset-path FILE (a Qwen-Bailian-format trace, e.g. \
         one written by scripts/make-agentic-trace.py)",
    )?;
    Ok(requests(
        &read(path, cfg.start_ms, num_prompts)?,
        cfg,
        vocab_size,
        seed,
    ))
}

/// The requests of a window: Mooncake's prompts and times, with each child turn after its
/// parent, siblings together (see the module's rules).
pub fn requests(
    sessions: &Sessions,
    cfg: &TraceConfig,
    vocab_size: u32,
    seed: u64,
) -> Vec<BenchRequest> {
    let mut requests = mooncake::requests(&sessions.entries, cfg, vocab_size, seed);
    let ts = |i: usize| sessions.entries[i].timestamp;
    // The earliest sibling's timestamp, per parent (siblings go together).
    let mut first_child: HashMap<usize, u64> = HashMap::new();
    for (i, parent) in sessions.parents.iter().enumerate() {
        if let Some(p) = *parent {
            let t = first_child.entry(p).or_insert(ts(i));
            *t = (*t).min(ts(i));
        }
    }
    let seconds = |ms: u64| ms as f64 / cfg.time_compression / 1000.0;
    for (r, parent) in requests.iter_mut().zip(&sessions.parents) {
        if let Some(p) = *parent {
            let sent = first_child[&p];
            r.after = Some(p);
            r.after_gap_s = seconds(sent - ts(p));
            r.at = Some(seconds(sent.saturating_sub(cfg.start_ms)));
        }
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(lines: &[String]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    fn line(id: i64, parent: i64, ts: f64, len: usize, ids: &[u64]) -> String {
        serde_json::json!({"chat_id": id, "parent_chat_id": parent, "timestamp": ts,
            "input_length": len, "output_length": 4, "type": "text", "turn": 1,
            "hash_ids": ids})
        .to_string()
    }

    fn cfg(path: &Path) -> TraceConfig {
        TraceConfig {
            path: Some(path.to_path_buf()),
            block_tokens: BAILIAN_BLOCK_TOKENS,
            native_block_tokens: BAILIAN_BLOCK_TOKENS,
            time_compression: 2.0,
            ..TraceConfig::default()
        }
    }

    #[test]
    fn turns_wait_for_their_parent_and_siblings_go_together() {
        // Session 1: root at 0 s, a child 10 s later, which fans out to two sub-agents at 14 s
        // and 15 s. Session 2: a root at 1 s.
        let f = write(&[
            line(1, -1, 0.0, 32, &[1, 2]),
            line(7, -1, 1.0, 16, &[9]),
            line(2, 1, 10.0, 64, &[1, 2, 3, 4]),
            line(3, 2, 14.0, 80, &[1, 2, 3, 4, 5]),
            line(4, 2, 15.0, 80, &[1, 2, 3, 4, 6]),
        ]);
        let c = cfg(f.path());
        let s = read(f.path(), 0, None).unwrap();
        assert_eq!(s.parents, [None, None, Some(0), Some(2), Some(2)]);
        let r = requests(&s, &c, 1000, 1);
        assert_eq!(r.len(), 5);
        assert_eq!((r[0].after, r[0].at), (None, Some(0.0)));
        assert_eq!((r[1].after, r[1].at), (None, Some(0.5)));
        // The child: after the root, 10 s of trace later = 5 s at compression 2.
        assert_eq!(r[2].after, Some(0));
        assert_eq!(r[2].after_gap_s, 5.0);
        // The siblings: both after the child, both at the first one's time and gap.
        for k in [3, 4] {
            assert_eq!(r[k].after, Some(2));
            assert_eq!(r[k].after_gap_s, 2.0);
            assert_eq!(r[k].at, Some(7.0));
        }
        // Prompts share what the trace says they share.
        assert_eq!(r[2].input_ids[..32], r[0].input_ids[..]);
        assert_eq!(r[3].input_ids[..64], r[2].input_ids[..]);
        assert_ne!(r[3].input_ids[64..], r[4].input_ids[64..]);
    }

    #[test]
    fn a_parent_before_the_window_starts_a_session_and_bad_files_are_refused() {
        let f = write(&[line(1, -1, 0.0, 16, &[1]), line(2, 1, 5.0, 32, &[1, 2])]);
        let s = read(f.path(), 1000, None).unwrap();
        assert_eq!(s.parents, [None]);
        assert_eq!(s.entries[0].timestamp, 5000);
        for (lines, says) in [
            (vec![line(1, 5, 0.0, 16, &[1])], "names no earlier line"),
            (
                vec![line(1, -1, 2.0, 16, &[1]), line(2, -1, 1.0, 16, &[1])],
                "sorted by time",
            ),
            (
                vec![line(1, -1, 0.0, 16, &[1]), line(1, -1, 1.0, 16, &[1])],
                "repeated",
            ),
            (vec![line(1, -1, 0.0, 17, &[1])], "longer than its 1 blocks"),
            (
                vec!["{\"chat_id\": 1}".to_string()],
                "not a Bailian trace entry",
            ),
        ] {
            let f = write(&lines);
            let e = format!("{:#}", read(f.path(), 0, None).unwrap_err());
            assert!(e.contains(says), "{e}");
        }
    }

    /// `scripts/mooncake-to-bailian.py` writes what `read` takes: a request continues the
    /// latest earlier one whose whole prompt starts its own, not continued yet, at least 2 s
    /// before it; its 512-token blocks become 32 blocks of 16, cut to its length.
    #[test]
    fn the_mooncake_converter_writes_sessions_this_reads() {
        let mooncake = |ts: u64, len: usize, ids: &[u64]| {
            serde_json::json!({"timestamp": ts, "input_length": len, "output_length": 4,
                "hash_ids": ids})
            .to_string()
        };
        let input = write(&[
            mooncake(0, 1500, &[1, 2, 3]),
            // Starts with request 0's whole blocks, 5 s later: its next turn.
            mooncake(5000, 2000, &[1, 2, 4, 5]),
            // Request 0 is continued already and request 1's prompt does not start this one.
            mooncake(5500, 1400, &[1, 2, 6]),
            // Request 1's prompt starts it, but 0.5 s after it: another session.
            mooncake(5500, 2100, &[1, 2, 4, 5, 7]),
        ]);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mooncake-to-bailian.py");
        let out = match std::process::Command::new("python3")
            .arg(&script)
            .arg(input.path())
            .output()
        {
            Ok(out) => out,
            Err(e) => {
                eprintln!("skipped: python3 is not runnable here ({e})");
                return;
            }
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sessions = write(&[String::from_utf8(out.stdout)
            .unwrap()
            .trim_end()
            .to_string()]);
        let s = read(sessions.path(), 0, None).unwrap();
        assert_eq!(s.parents, [None, Some(0), None, None]);
        assert_eq!(
            s.entries.iter().map(|e| e.timestamp).collect::<Vec<_>>(),
            [0, 5000, 5500, 5500]
        );
        // 1500 tokens: 94 blocks of 16, the first 32 from Mooncake's block 1.
        let first = &s.entries[0].hash_ids;
        assert_eq!(first.len(), 94);
        assert_eq!((first[0], first[31], first[32]), (32, 63, 64));
        // The turn shares its parent's first two Mooncake blocks, 64 blocks of 16.
        assert_eq!(s.entries[1].hash_ids[..64], first[..64]);
    }
}
