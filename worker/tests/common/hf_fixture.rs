//! The Hugging Face parity fixtures of `tests/fixtures/hf` (see its README): each a tiny
//! checkpoint with transformers' greedy continuation and f32 logits for a few prompts.

use std::path::{Path, PathBuf};

/// One prompt of a fixture: its greedy continuation and the logits of every position of
/// prompt + continuation (but the last token), `[len, vocab]`.
pub struct RefSeq {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

impl RefSeq {
    /// Prompt and continuation, less the last token (which nothing reads).
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.prompt.clone();
        t.extend(&self.greedy[..self.greedy.len() - 1]);
        t
    }
}

pub struct Fixture {
    pub name: String,
    pub dir: PathBuf,
    pub seqs: Vec<RefSeq>,
}

/// Where the fixtures are: `DPSERVE_TEST_HF_FIXTURES` (set by scripts/gpu-check.sh, whose test
/// executables run in another checkout), else this crate's `tests/fixtures/hf`.
pub fn dir() -> PathBuf {
    match std::env::var_os("DPSERVE_TEST_HF_FIXTURES") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf"),
    }
}

/// Every fixture, by name.
pub fn fixtures() -> Vec<Fixture> {
    let root = dir();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/fixtures/hf")
        .map(|e| e.expect("fixture entry").path())
        .filter(|p| p.join("reference.json").exists())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixtures in {}", root.display());
    dirs.into_iter()
        .map(|dir| {
            let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference");
            let v: serde_json::Value = serde_json::from_str(&text).expect("reference parses");
            let ids = |x: &serde_json::Value| -> Vec<u32> {
                x.as_array()
                    .expect("ids")
                    .iter()
                    .map(|t| t.as_u64().expect("id") as u32)
                    .collect()
            };
            let seqs = v["sequences"]
                .as_array()
                .expect("sequences")
                .iter()
                .map(|s| RefSeq {
                    prompt: ids(&s["prompt"]),
                    greedy: ids(&s["greedy"]),
                    logits: s["logits"]
                        .as_array()
                        .expect("logits")
                        .iter()
                        .map(|row| {
                            row.as_array()
                                .expect("row")
                                .iter()
                                .map(|x| x.as_f64().expect("logit") as f32)
                                .collect()
                        })
                        .collect(),
                })
                .collect();
            Fixture {
                name: dir.file_name().unwrap().to_string_lossy().into_owned(),
                dir,
                seqs,
            }
        })
        .collect()
}

/// Largest |got − want| (infinite where either is NaN).
pub fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "row lengths");
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(
            0f32,
            |m, x| if x.is_nan() { f32::INFINITY } else { m.max(x) },
        )
}
