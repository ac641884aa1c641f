//! Incremental detokenization of one request's output, SGLang style.
//!
//! Decoding token by token is wrong for most tokenizers (leading-space stripping, byte-fallback
//! tokens that form one character only together). Instead we keep two offsets into the ids
//! (prompt tail + output): `surr` (start of a context window already turned into text) and
//! `read` (end of what has been emitted). Each step decodes `ids[surr..read]` and
//! `ids[surr..]`; the new text is the difference. Text ending in U+FFFD is an incomplete
//! UTF-8 sequence and is held back until later tokens complete it, or until the request ends.
//! The emitted deltas therefore concatenate to exactly the final text. Cost per step is the
//! decode of a short window, not of the whole output.

use crate::error::Result;
use crate::tokenizer::TextTokenizer;

/// Prompt tokens kept as left context, as SGLang's `INIT_INCREMENTAL_DETOKENIZATION_OFFSET`:
/// enough for a decoder to know whether the first output token starts a new word.
const PROMPT_CONTEXT_TOKENS: usize = 5;

const REPLACEMENT: char = '\u{FFFD}';

/// Detokenizer state of one request.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    surr_offset: usize,
    read_offset: usize,
}

impl IncrementalDetokenizer {
    /// Start after `prompt_ids`; only their tail is kept.
    pub fn new(prompt_ids: &[u32]) -> Self {
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        IncrementalDetokenizer {
            ids: tail.to_vec(),
            surr_offset: 0,
            read_offset: tail.len(),
        }
    }

    /// Add `new_ids` and return the text they complete (possibly empty while held back).
    pub fn push(&mut self, tok: &dyn TextTokenizer, new_ids: &[u32]) -> Result<String> {
        self.ids.extend_from_slice(new_ids);
        let delta = self.pending(tok)?;
        if delta.is_empty() || delta.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        self.surr_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }

    /// The request ended: return whatever is held back, incomplete characters included.
    pub fn finish(&mut self, tok: &dyn TextTokenizer) -> Result<String> {
        let delta = self.pending(tok)?;
        self.surr_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }

    /// Text of `ids[read..]` in the context of `ids[surr..read]`.
    fn pending(&self, tok: &dyn TextTokenizer) -> Result<String> {
        if self.ids.len() == self.read_offset {
            return Ok(String::new());
        }
        let context = tok.decode(&self.ids[self.surr_offset..self.read_offset])?;
        let full = tok.decode(&self.ids[self.surr_offset..])?;
        if let Some(rest) = full.strip_prefix(context.as_str()) {
            return Ok(rest.to_string());
        }
        // The context decoded differently once followed by more tokens (a decoder that looks
        // ahead). Emit from the last shared character; never slice inside a character.
        let shared = context
            .char_indices()
            .zip(full.chars())
            .find(|((_, a), b)| a != b)
            .map_or(context.len().min(full.len()), |((i, _), _)| i);
        Ok(full.get(shared..).unwrap_or_default().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{BuiltinTokenizer, LoadedTokenizer};

    fn stream_all(tok: &dyn TextTokenizer, prompt: &[u32], out: &[u32]) -> (Vec<String>, String) {
        let mut d = IncrementalDetokenizer::new(prompt);
        let mut deltas: Vec<String> = out.iter().map(|&id| d.push(tok, &[id]).unwrap()).collect();
        deltas.push(d.finish(tok).unwrap());
        let text = deltas.concat();
        (deltas, text)
    }

    #[test]
    fn golden_continuation_has_its_leading_space_and_matches() {
        let Some(dir) = crate::tokenizer::hf_test_dir() else {
            return;
        };
        let loaded = LoadedTokenizer::load(Some(&dir)).unwrap();
        let out = [
            432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410,
            408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394,
        ];
        let (_, text) = stream_all(&*loaded.tokenizer, &[1, 403, 407, 261, 378], &out);
        assert_eq!(
            text,
            ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
        );
        // A continuation starting with a word keeps the space the decoder would strip alone.
        let ids = loaded.tokenizer.encode("Once upon a time there").unwrap();
        let (_, text) = stream_all(&*loaded.tokenizer, &ids[..5], &ids[5..]);
        assert_eq!(text, " there");
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        let Some(dir) = crate::tokenizer::hf_test_dir() else {
            return;
        };
        let loaded = LoadedTokenizer::load(Some(&dir)).unwrap();
        let tok = &*loaded.tokenizer;
        let full = "héllo 你好 wörld 😀";
        let ids = tok.encode(full).unwrap();
        // The byte-fallback tokenizer must spread some characters over several tokens, or this
        // test would prove nothing.
        assert!(ids.len() > full.chars().count());
        let (deltas, text) = stream_all(tok, &ids[..1], &ids[1..]);
        for d in &deltas {
            assert!(!d.contains(REPLACEMENT), "{d:?}");
        }
        assert_eq!(text, tok.decode(&ids).unwrap());
        assert_eq!(text, full);
        assert!(deltas.iter().filter(|d| d.is_empty()).count() > 0);
    }

    #[test]
    fn incomplete_tail_is_flushed_at_finish() {
        let Some(dir) = crate::tokenizer::hf_test_dir() else {
            return;
        };
        let loaded = LoadedTokenizer::load(Some(&dir)).unwrap();
        let tok = &*loaded.tokenizer;
        let ids = tok.encode("你").unwrap();
        let mut d = IncrementalDetokenizer::new(&ids[..1]);
        // Feed all but the last byte token: nothing may come out yet.
        assert_eq!(d.push(tok, &ids[1..ids.len() - 1]).unwrap(), "");
        let rest = d.finish(tok).unwrap();
        assert!(rest.ends_with(REPLACEMENT));
    }

    #[test]
    fn builtin_words_stream_with_spaces() {
        let tok = BuiltinTokenizer::new();
        let prompt = tok.encode("once upon a time").unwrap();
        let out = tok.encode("there was a dog").unwrap();
        let (deltas, text) = stream_all(&tok, &prompt, &out[1..]);
        assert_eq!(deltas[0], " there");
        assert_eq!(text, " there was a dog");
        // With only BOS as context the first word has no leading space.
        let (_, text) = stream_all(&tok, &[1], &out[1..]);
        assert_eq!(text, "there was a dog");
    }
}
