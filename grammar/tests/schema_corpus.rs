//! Real-world JSON Schemas against a real vocabulary: how many compile, and for each one that
//! does, a walk of pseudo-random allowed tokens to its end (leaning towards closing quotes and
//! brackets so that most walks end). Ignored by default: it needs a corpus (JSONSchemaBench's
//! `data/<split>/*.json`, github.com/guidance-ai/jsonschemabench) and a `tokenizer.json`:
//!
//! ```sh
//! DPSERVE_SCHEMA_CORPUS=…/jsonschemabench/data/Github_medium \
//! DPSERVE_SCHEMA_VOCAB=…/SmolLM2-135M-Instruct/tokenizer.json DPSERVE_SCHEMA_OUT=walks.jsonl \
//!   cargo test -p grammar --test schema_corpus -- --ignored --nocapture
//! python3 scripts/check-schema-corpus.py walks.jsonl
//! ```
//!
//! Each line of the output: `{"schema": path, "compiled": bool, "error": …, "ended": bool,
//! "output": text}`; the script validates every ended output against its schema with the
//! `jsonschema` package and prints the counts (docs/HTTP.md, "Structured output").

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use grammar::{Constraint, Grammars};

const MAX_STEPS: usize = 3000;

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

#[test]
#[ignore]
fn a_corpus_of_schemas_compiles_and_every_ended_walk_is_a_document_of_its_schema() {
    let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let (Some(corpus), Some(vocab), Some(out)) = (
        var("DPSERVE_SCHEMA_CORPUS"),
        var("DPSERVE_SCHEMA_VOCAB"),
        var("DPSERVE_SCHEMA_OUT"),
    ) else {
        panic!("set DPSERVE_SCHEMA_CORPUS, DPSERVE_SCHEMA_VOCAB and DPSERVE_SCHEMA_OUT (see the file's doc)");
    };
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&vocab).unwrap()).unwrap();
    let mut pieces = llguidance::token_bytes_from_tokenizer_json(&json).unwrap();
    // One EOS of our own at id 0 would clash with the vocabulary: put it at the end.
    let eos = pieces.len() as u32;
    pieces.push(b"\xFF<eos>".to_vec());
    let rows = pieces.len();
    let g = Grammars::from_token_bytes(pieces.clone(), rows, &[eos]).unwrap();
    let closers: Vec<bool> = pieces
        .iter()
        .map(|p| p.iter().any(|b| matches!(b, b'"' | b'}' | b']')) && p.len() <= 3)
        .collect();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut w = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
    let (mut compiled, mut ended) = (0, 0);
    let started = Instant::now();
    for (i, file) in files.iter().enumerate() {
        let text = std::fs::read_to_string(file).unwrap();
        let mut line = serde_json::json!({"schema": file, "compiled": false});
        match g.compile(&Constraint::JsonSchema(text)) {
            Err(e) => line["error"] = e.to_string().into(),
            Ok(mut guide) => {
                compiled += 1;
                line["compiled"] = true.into();
                let mut rng = Lcg(i as u64 + 1);
                let mut bytes = Vec::new();
                let mut done = false;
                let mut l = vec![0f32; rows];
                for _ in 0..MAX_STEPS {
                    l.iter_mut().for_each(|x| *x = 0.0);
                    if let Err(e) = guide.mask(&mut l) {
                        line["error"] = e.to_string().into();
                        break;
                    }
                    let allowed: Vec<u32> =
                        (0..rows as u32).filter(|&t| l[t as usize] == 0.0).collect();
                    let close: Vec<u32> = allowed
                        .iter()
                        .copied()
                        .filter(|&t| closers[t as usize])
                        .collect();
                    let t = if allowed.contains(&eos) && rng.below(2) == 0 || allowed == [eos] {
                        eos
                    } else if !close.is_empty() && rng.below(3) == 0 {
                        close[rng.below(close.len())]
                    } else {
                        let not_eos: Vec<u32> =
                            allowed.iter().copied().filter(|&t| t != eos).collect();
                        not_eos[rng.below(not_eos.len())]
                    };
                    if t != eos {
                        bytes.extend_from_slice(&pieces[t as usize]);
                    }
                    match guide.advance(t) {
                        Ok(true) => {
                            done = true;
                            break;
                        }
                        Ok(false) => {}
                        Err(e) => {
                            line["error"] = e.to_string().into();
                            break;
                        }
                    }
                }
                ended += done as usize;
                line["ended"] = done.into();
                line["output"] = String::from_utf8_lossy(&bytes).into_owned().into();
            }
        }
        writeln!(w, "{line}").unwrap();
    }
    eprintln!(
        "{} schemas: {compiled} compiled ({:.1} %), {ended} walks ended, in {:.0} s",
        files.len(),
        100.0 * compiled as f64 / files.len().max(1) as f64,
        started.elapsed().as_secs_f64()
    );
}
