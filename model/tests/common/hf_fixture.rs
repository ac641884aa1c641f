//! The Hugging Face parity fixtures of `tests/fixtures/hf` (see its README): each a tiny
//! checkpoint with transformers' greedy continuation and f32 logits for a few prompts. The
//! repository holds each one's `config.json` and `reference.json`; its weights are generated
//! (see `hf_weights`) into a temporary directory when the fixture is read.

use std::path::{Path, PathBuf};

#[path = "hf_weights.rs"]
pub mod hf_weights;

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
    /// A temporary checkpoint directory: the fixture's `config.json` and the generated
    /// `model.safetensors` (removed with the fixture).
    pub dir: PathBuf,
    pub seqs: Vec<RefSeq>,
    _checkpoint: tempfile::TempDir,
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
    dirs.into_iter().map(|dir| read(&dir)).collect()
}

/// The fixture of directory `src`, its checkpoint generated.
fn read(src: &Path) -> Fixture {
    let name = src.file_name().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(src.join("reference.json")).expect("reference");
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
    let checkpoint = tempfile::tempdir().expect("temporary directory");
    generate_checkpoint(&name, &v, checkpoint.path());
    std::fs::copy(
        src.join("config.json"),
        checkpoint.path().join("config.json"),
    )
    .unwrap_or_else(|e| panic!("{name}: config.json: {e}"));
    Fixture {
        name,
        dir: checkpoint.path().to_path_buf(),
        seqs,
        _checkpoint: checkpoint,
    }
}

/// `dir/model.safetensors` from the generator and the tensor list of `reference` (`v`),
/// every tensor's hash checked first.
fn generate_checkpoint(name: &str, v: &serde_json::Value, dir: &Path) {
    assert_eq!(
        v["weights"].as_str(),
        Some(hf_weights::WEIGHTS),
        "{name}: reference.json names another weight generator (remade by an older script?)"
    );
    let seed = v["seed"].as_u64().expect("seed");
    let specs: Vec<hf_weights::TensorSpec> = v["tensors"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: reference.json lists no tensors"))
        .iter()
        .map(|t| hf_weights::TensorSpec::from_json(t).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    let tensors =
        hf_weights::generate_checked(seed, &specs).unwrap_or_else(|e| panic!("{name}: {e}"));
    hf_weights::write_safetensors(&dir.join("model.safetensors"), &tensors);
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
