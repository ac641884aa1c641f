//! Structured output: a [`Constraint`] compiled by llguidance against a model's vocabulary, and
//! per request a [`Guide`] that masks each step's logits to the tokens that keep the text inside
//! the constraint, then follows the token sampled.
//!
//! One [`Grammars`] per process and model. The tokenizer's compiles each constrained request
//! before it is routed, so what does not compile is refused with a 400 naming the problem; each
//! worker's compiles it again (cached by its text) and enforces it, so any rank, any routing
//! method and a decode worker after a disaggregated transfer hold the same rule. The vocabulary
//! is the model's `tokenizer.json` read as bytes (byte-level or byte-fallback pieces, by
//! llguidance's own reader), sized to the model's logit rows: rows the tokenizer does not name
//! are never allowed.
//!
//! JSON schemas are compiled without free whitespace (`{"a":1}`, as llguidance's
//! `whitespace_flexible: false`) unless the schema sets its own `x-guidance` options: a weak
//! model then cannot spend its tokens on blank lines; and after `schema.rs` (closed objects,
//! unknown formats dropped, disjoint `oneOf`s as `anyOf`).

pub mod gbnf;
mod schema;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
pub use protocol::Constraint;

/// Why the built-in model (`dpserve up` without `--model-path`) refuses constraints.
pub const BUILTIN_HAS_NO_BYTES: &str =
    "the built-in model's word-level tokenizer has no byte pieces to constrain (serve a model directory with --model-path)";

/// Compiled constraints kept per process (by their text), most recent last.
const CACHED: usize = 64;

/// Why a constraint cannot be served. The messages name the problem for the client's 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// This model's vocabulary cannot be read as bytes (or there is none to read).
    #[error("structured output is not available with this model: {0}")]
    Unavailable(String),
    /// The constraint does not compile.
    #[error("the {kind} does not compile: {why}")]
    Compile { kind: &'static str, why: String },
    /// It compiles, but no token of the vocabulary can start it.
    #[error("no token of this model's vocabulary can start text matching the {0}")]
    Unspellable(&'static str),
    /// Mid-way: no token of the vocabulary continues the text.
    #[error("the constraint cannot continue: {0}")]
    Stuck(String),
}

/// What a constraint is called in messages.
fn kind(c: &Constraint) -> &'static str {
    match c {
        Constraint::JsonSchema(_) => "JSON schema",
        Constraint::Regex(_) => "regular expression",
        Constraint::Lark(_) => "grammar",
    }
}

/// llguidance's grammar for `c`, or why its text is not one.
fn top_level(c: &Constraint) -> Result<TopLevelGrammar, GrammarError> {
    Ok(match c {
        Constraint::JsonSchema(text) => {
            let mut schema: serde_json::Value =
                serde_json::from_str(text).map_err(|e| GrammarError::Compile {
                    kind: kind(c),
                    why: format!("not JSON: {e}"),
                })?;
            schema::prepare(&mut schema);
            if let serde_json::Value::Object(o) = &mut schema {
                o.entry("x-guidance")
                    .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
            }
            TopLevelGrammar::from_json_schema(schema)
        }
        Constraint::Regex(re) => TopLevelGrammar::from_regex(re),
        Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
    })
}

/// A model's vocabulary as llguidance sees it, and the constraints compiled against it.
pub struct Grammars {
    factory: ParserFactory,
    eos: Arc<[u32]>,
    compiled: Mutex<Compiled>,
}

#[derive(Default)]
struct Compiled {
    by_text: HashMap<Constraint, Matcher>,
    order: VecDeque<Constraint>,
}

impl Grammars {
    /// The vocabulary of a Hugging Face `tokenizer.json`, padded or cut to `rows` (the model's
    /// logit rows); `eos` are the ids that end generation (at least one).
    pub fn from_tokenizer_json(
        path: &Path,
        rows: usize,
        eos: &[u32],
    ) -> Result<Self, GrammarError> {
        let unavailable =
            |why: String| GrammarError::Unavailable(format!("{}: {why}", path.display()));
        let bytes = std::fs::read(path).map_err(|e| unavailable(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| unavailable(e.to_string()))?;
        let tokens = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| unavailable(format!("its pieces cannot be read as bytes ({e})")))?;
        Self::from_token_bytes(tokens, rows, eos)
    }

    /// A vocabulary of the given pieces (token id = index; a special token is `\xFF` then its
    /// name, an empty piece is never allowed), padded or cut to `rows`.
    pub fn from_token_bytes(
        mut tokens: Vec<Vec<u8>>,
        rows: usize,
        eos: &[u32],
    ) -> Result<Self, GrammarError> {
        tokens.resize(rows, Vec::new());
        let Some(&first) = eos.first() else {
            return Err(GrammarError::Unavailable(
                "the model names no end-of-sequence token".into(),
            ));
        };
        if let Some(e) = eos.iter().find(|&&e| e as usize >= rows) {
            return Err(GrammarError::Unavailable(format!(
                "end-of-sequence id {e} is outside the {rows} logit rows"
            )));
        }
        let trie = TokTrie::from(&TokRxInfo::new(rows as u32, first), &tokens).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| GrammarError::Unavailable(e.to_string()))?;
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        Ok(Grammars {
            factory,
            eos: eos.into(),
            compiled: Mutex::default(),
        })
    }

    /// A guide for `c` from its first token, or why `c` cannot be served.
    pub fn compile(&self, c: &Constraint) -> Result<Guide, GrammarError> {
        let cached = self.lock().by_text.get(c).cloned();
        let matcher = match cached {
            Some(m) => m,
            None => {
                let m = self.compile_new(c)?;
                let mut compiled = self.lock();
                if compiled.by_text.insert(c.clone(), m.clone()).is_none() {
                    compiled.order.push_back(c.clone());
                }
                while compiled.order.len() > CACHED {
                    if let Some(old) = compiled.order.pop_front() {
                        compiled.by_text.remove(&old);
                    }
                }
                m
            }
        };
        Ok(Guide {
            matcher,
            eos: self.eos.clone(),
        })
    }

    fn compile_new(&self, c: &Constraint) -> Result<Matcher, GrammarError> {
        let m = Matcher::new(self.factory.create_parser(top_level(c)?));
        if let Some(why) = m.get_error() {
            return Err(GrammarError::Compile { kind: kind(c), why });
        }
        // A vocabulary that cannot spell the first byte (the built-in words against `{`) is
        // refused here, not discovered by the first decode step.
        let mut probe = m.clone();
        match probe.compute_mask() {
            Ok(mask) if mask.num_set() > 0 => Ok(m),
            _ => Err(GrammarError::Unspellable(kind(c))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Compiled> {
        // A panic while holding the lock leaves only a cache behind: go on with it.
        self.compiled.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A process's [`Grammars`], built on the first constrained request (reading a large
/// vocabulary takes about a second) and kept; or the reason there are none.
pub struct LazyGrammars {
    source: Source,
    built: OnceLock<Result<Grammars, GrammarError>>,
}

enum Source {
    TokenizerJson {
        path: PathBuf,
        rows: usize,
        eos: Vec<u32>,
    },
    None(String),
}

impl LazyGrammars {
    /// From the model's `tokenizer.json` (see [`Grammars::from_tokenizer_json`]).
    pub fn tokenizer_json(path: PathBuf, rows: usize, eos: Vec<u32>) -> Self {
        Self::of(Source::TokenizerJson { path, rows, eos })
    }

    /// No structured output with this model, for the reason given.
    pub fn none(why: impl Into<String>) -> Self {
        Self::of(Source::None(why.into()))
    }

    fn of(source: Source) -> Self {
        LazyGrammars {
            source,
            built: OnceLock::new(),
        }
    }

    pub fn get(&self) -> Result<&Grammars, GrammarError> {
        let built = self.built.get_or_init(|| match &self.source {
            Source::TokenizerJson { path, rows, eos } => {
                Grammars::from_tokenizer_json(path, *rows, eos)
            }
            Source::None(why) => Err(GrammarError::Unavailable(why.clone())),
        });
        built.as_ref().map_err(Clone::clone)
    }

    /// See [`Grammars::compile`].
    pub fn compile(&self, c: &Constraint) -> Result<Guide, GrammarError> {
        self.get()?.compile(c)
    }
}

impl From<Grammars> for LazyGrammars {
    /// Grammars built already (a test's vocabulary).
    fn from(g: Grammars) -> Self {
        let lazy = Self::none("");
        let _ = lazy.built.set(Ok(g));
        lazy
    }
}

/// The tokens a constraint allows at one step (a bit per token id).
pub struct Mask(llguidance::toktrie::SimpleVob);

impl Mask {
    /// Sets the logit of every token not allowed to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits >> b & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// One request's constraint as its text grows.
#[derive(Clone)]
pub struct Guide {
    matcher: Matcher,
    eos: Arc<[u32]>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Guide {
    /// Sets the logit of every token the constraint does not allow next to -inf: the
    /// end-of-sequence ids stay only where the text so far is complete.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        self.next_mask()?.apply(logits);
        Ok(())
    }

    /// The tokens the constraint allows next, to apply once the step's logits are there (a
    /// worker computes it while the forward pass runs: it depends only on the tokens so far).
    pub fn next_mask(&mut self) -> Result<Mask, GrammarError> {
        self.matcher
            .compute_mask()
            .map(Mask)
            .map_err(|e| GrammarError::Stuck(e.to_string()))
    }

    /// Follows `token` (one the last [`Guide::mask`] allowed); true when the constraint is
    /// complete and can go no further, or `token` ends the sequence: the request ends there.
    pub fn advance(&mut self, token: u32) -> Result<bool, GrammarError> {
        if self.eos.contains(&token) {
            return Ok(true);
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Stuck(e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }

    /// Follows tokens generated elsewhere (a disaggregated request's first token, sampled by
    /// its prefill worker under the same constraint).
    pub fn advance_all(&mut self, tokens: &[u32]) -> Result<bool, GrammarError> {
        let mut ended = false;
        for &t in tokens {
            ended = self.advance(t)?;
            if ended {
                break;
            }
        }
        Ok(ended)
    }
}

#[cfg(test)]
pub(crate) mod tests;
