//! Constraints walked token by token over a byte vocabulary (every piece one byte, plus a few
//! merges) and over the real stories260k tokenizer where this checkout has it: whatever the
//! walk picks among the allowed tokens, the text it ends with parses and matches.

use super::*;

const EOS: u32 = 0;

/// `\xFF</s>`, then the printable bytes and newline, then a few multi-byte pieces.
fn byte_vocab() -> Vec<Vec<u8>> {
    let mut v = vec![b"\xFF</s>".to_vec()];
    v.extend((0x20u8..0x7f).chain([b'\n']).map(|b| vec![b]));
    for s in ["\"name\"", "\":", "{\"", "\"}", "true", "ab", "abc", ".com"] {
        v.push(s.as_bytes().to_vec());
    }
    v
}

fn grammars(rows: usize) -> Grammars {
    Grammars::from_token_bytes(byte_vocab(), rows, &[EOS]).unwrap()
}

/// A small deterministic generator: which allowed token the walk takes.
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

/// Walks `c` from its start, taking a pseudo-random allowed token each step (EOS only when
/// nothing else is allowed, or one time in eight), until the guide says it ended; the tokens.
fn walk(g: &Grammars, c: &Constraint, seed: u64, rows: usize) -> Vec<u32> {
    let mut guide = g.compile(c).unwrap();
    let mut rng = Lcg(seed);
    let mut out = Vec::new();
    for _ in 0..400 {
        let mut logits = vec![0f32; rows];
        guide.mask(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..rows as u32)
            .filter(|&t| logits[t as usize] > f32::NEG_INFINITY)
            .collect();
        assert!(!allowed.is_empty(), "nothing allowed after {out:?}");
        let not_eos: Vec<u32> = allowed.iter().copied().filter(|&t| t != EOS).collect();
        let token = if not_eos.is_empty() || (allowed.contains(&EOS) && rng.below(8) == 0) {
            EOS
        } else {
            not_eos[rng.below(not_eos.len())]
        };
        out.push(token);
        if guide.advance(token).unwrap() {
            return out;
        }
    }
    panic!("{c:?} did not end in 400 tokens: {out:?}");
}

fn text(tokens: &[u32]) -> String {
    let v = byte_vocab();
    let bytes: Vec<u8> = tokens
        .iter()
        .filter(|&&t| t != EOS)
        .flat_map(|&t| v[t as usize].clone())
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn every_walk_of_a_json_schema_ends_in_a_document_that_matches_it() {
    let schema = r#"{"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8},
                       "age": {"type": "integer", "minimum": 0, "maximum": 150},
                       "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["name", "age"], "additionalProperties": false}"#;
    let g = grammars(byte_vocab().len());
    for seed in 0..20 {
        let out = text(&walk(
            &g,
            &Constraint::JsonSchema(schema.into()),
            seed,
            byte_vocab().len(),
        ));
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
        assert!(
            v["name"].as_str().is_some_and(|s| s.chars().count() <= 8),
            "{out}"
        );
        assert!(v["age"].as_u64().is_some_and(|a| a <= 150), "{out}");
        if let Some(tags) = v.get("tags") {
            let tags = tags.as_array().unwrap();
            assert!(
                tags.len() <= 3 && tags.iter().all(|t| t == "a" || t == "b"),
                "{out}"
            );
        }
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert!(
            keys.iter()
                .all(|k| ["name", "age", "tags"].contains(&k.as_str())),
            "{out}"
        );
        assert!(
            !out.contains(' ') || v["name"].as_str().unwrap().contains(' '),
            "compact: {out}"
        );
    }
}

#[test]
fn a_regex_walk_matches_it_whole_and_ends_when_nothing_can_follow() {
    let g = grammars(byte_vocab().len());
    let c = Constraint::Regex(r"[a-c]{1,4}@[a-z]{2}\.com".into());
    for seed in 0..10 {
        let tokens = walk(&g, &c, seed, byte_vocab().len());
        let out = text(&tokens);
        let (user, host) = out.split_once('@').unwrap_or_else(|| panic!("{out}"));
        assert!(
            (1..=4).contains(&user.len()) && user.bytes().all(|b| (b'a'..=b'c').contains(&b)),
            "{out}"
        );
        assert_eq!(host.len(), 6, "{out}");
        assert!(
            host.ends_with(".com") && host[..2].bytes().all(|b| b.is_ascii_lowercase()),
            "{out}"
        );
        // Nothing can follow ".com": the guide ends the text itself, with no EOS sampled.
        assert_ne!(tokens.last(), Some(&EOS), "{out}");
    }
}

#[test]
fn a_lark_grammar_and_the_end_of_sequence_only_where_the_text_is_complete() {
    let g = grammars(byte_vocab().len());
    let c = Constraint::Lark("start: \"yes\" | \"no\" | \"ab\"+".into());
    let mut guide = g.compile(&c).unwrap();
    let rows = byte_vocab().len();
    let allowed = |guide: &mut Guide| {
        let mut l = vec![0f32; rows];
        guide.mask(&mut l).unwrap();
        (0..rows as u32)
            .filter(|&t| l[t as usize] == 0.0)
            .collect::<Vec<_>>()
    };
    let first = allowed(&mut guide);
    assert!(!first.contains(&EOS), "empty text is not complete");
    let ab = byte_vocab().iter().position(|p| p == b"ab").unwrap() as u32;
    assert!(first.contains(&ab));
    assert!(!guide.advance(ab).unwrap());
    assert!(allowed(&mut guide).contains(&EOS), "\"ab\" is complete");
    assert!(!guide.advance(ab).unwrap() && guide.advance(EOS).unwrap());
    for seed in 0..10 {
        let out = text(&walk(&g, &c, seed, rows));
        let ok = out == "yes"
            || out == "no"
            || (!out.is_empty()
                && out.len().is_multiple_of(2)
                && out.as_bytes().chunks(2).all(|p| p == b"ab"));
        assert!(ok, "{out}");
    }
}

#[test]
fn a_walk_of_an_object_ends_when_its_named_properties_are_written() {
    let g = grammars(byte_vocab().len());
    let c = Constraint::JsonSchema(
        r#"{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}"#
            .into(),
    );
    for seed in 0..5 {
        let out = text(&walk(&g, &c, seed, byte_vocab().len()));
        assert!(out == r#"{"ok":true}"# || out == r#"{"ok":false}"#, "{out}");
    }
}

#[test]
fn rows_beyond_the_tokenizer_are_never_allowed() {
    let rows = byte_vocab().len() + 40;
    let g = grammars(rows);
    let mut guide = g.compile(&Constraint::Regex("[ -~]*".into())).unwrap();
    let mut l = vec![1f32; rows];
    guide.mask(&mut l).unwrap();
    assert!(l[byte_vocab().len()..]
        .iter()
        .all(|&x| x == f32::NEG_INFINITY));
    assert_eq!(l[1], 1.0, "' ' is allowed and keeps its logit");
}

#[test]
fn what_does_not_compile_is_refused_with_the_reason() {
    let g = grammars(byte_vocab().len());
    let err = |c: Constraint| g.compile(&c).unwrap_err().to_string();
    let e = err(Constraint::JsonSchema("{not json".into()));
    assert!(
        e.starts_with("the JSON schema does not compile: not JSON"),
        "{e}"
    );
    let e = err(Constraint::JsonSchema(r#"{"type": "foo"}"#.into()));
    assert!(e.contains("JSON schema") && e.contains("foo"), "{e}");
    let e = err(Constraint::JsonSchema(
        r##"{"$ref": "#/$defs/nope"}"##.into(),
    ));
    assert!(e.contains("nope"), "{e}");
    let e = err(Constraint::Regex("[a-z".into()));
    assert!(
        e.starts_with("the regular expression does not compile"),
        "{e}"
    );
    let e = err(Constraint::Lark("start: foo".into()));
    assert!(
        e.starts_with("the grammar does not compile") && e.contains("foo"),
        "{e}"
    );
    // The refusals are not cached as guides: a good constraint still compiles after them.
    assert!(g.compile(&Constraint::Regex("a".into())).is_ok());
}

#[test]
fn a_vocabulary_that_cannot_start_the_text_is_refused_at_compile() {
    // Word pieces without '{' (as the built-in model's): no JSON object can start.
    let words: Vec<Vec<u8>> = ["\u{FF}</s>", "the", "cat", " ", "."]
        .iter()
        .map(|w| {
            if w.starts_with('\u{FF}') {
                b"\xFF</s>".to_vec()
            } else {
                w.as_bytes().to_vec()
            }
        })
        .collect();
    let g = Grammars::from_token_bytes(words, 5, &[0]).unwrap();
    let e = g
        .compile(&Constraint::JsonSchema(r#"{"type": "object"}"#.into()))
        .unwrap_err();
    assert_eq!(e, GrammarError::Unspellable("JSON schema"));
    assert!(g
        .compile(&Constraint::Regex("(the|cat)( (the|cat))*".into()))
        .is_ok());
}

#[test]
fn no_vocabulary_is_a_clear_refusal() {
    let lazy = LazyGrammars::none("the built-in model's words are not byte pieces");
    let e = lazy
        .compile(&Constraint::Regex("a".into()))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "structured output is not available with this model: the built-in model's words are not byte pieces"
    );
    assert!(matches!(
        Grammars::from_token_bytes(byte_vocab(), 10, &[]),
        Err(GrammarError::Unavailable(_))
    ));
    let missing = LazyGrammars::tokenizer_json("/nonexistent/tokenizer.json".into(), 10, vec![0]);
    assert!(missing
        .get()
        .is_err_and(|e| e.to_string().contains("/nonexistent/tokenizer.json")));
}

/// stories260k's tokenizer.json, when this checkout has `../shared`.
fn stories260k() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/models/stories260k/tokenizer.json");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} is absent", p.display());
        None
    }
}

#[test]
fn the_real_stories260k_vocabulary_spells_any_json_object() {
    let Some(path) = stories260k() else { return };
    let rows = 512;
    let g = LazyGrammars::tokenizer_json(path, rows, vec![2]);
    let g = g.get().unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stories260k().unwrap()).unwrap()).unwrap();
    let pieces = llguidance::token_bytes_from_tokenizer_json(&json).unwrap();
    for seed in 0..5 {
        let mut guide = g.compile(&Constraint::JsonSchema(r#"{"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}, "required": ["ok", "n"], "additionalProperties": false}"#.into())).unwrap();
        let mut rng = Lcg(seed);
        let mut bytes = Vec::new();
        for _ in 0..200 {
            let mut l = vec![0f32; rows];
            guide.mask(&mut l).unwrap();
            let allowed: Vec<u32> = (0..rows as u32)
                .filter(|&t| l[t as usize] == 0.0 && t != 2)
                .collect();
            let t = if allowed.is_empty() {
                2
            } else {
                allowed[rng.below(allowed.len())]
            };
            if t != 2 {
                bytes.extend(&pieces[t as usize]);
            }
            if guide.advance(t).unwrap() {
                break;
            }
        }
        let out = String::from_utf8(bytes).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
        assert!(v["ok"].is_boolean() && v["n"].is_i64(), "{out}");
    }
}
