//! The built-in word-level tokenizer of the dummy model: exactly `protocol::builtin::VOCAB_SIZE`
//! tokens, built deterministically from nothing, so `dpserve up` works without files and a
//! random-weight model streams readable (if meaningless) words.
//!
//! Layout: 0 `<unk>`, 1 `<s>`, 2 `</s>`, then punctuation, then common English words (so
//! ordinary prompts mostly tokenize), then consonant-vowel pseudo-words until the vocabulary is
//! full. Every entry is distinct, printable and lowercase.

use std::collections::HashMap;

use protocol::builtin::{BOS_ID, CONTEXT_LEN, EOS_ID, UNK_ID, VOCAB_SIZE};

use super::{ModelFacts, TextTokenizer};
use crate::error::Result;

const SPECIALS: [&str; 3] = ["<unk>", "<s>", "</s>"];
/// Split off words when encoding, and tokens of their own.
const PUNCTUATION: [&str; 8] = [".", ",", "!", "?", ";", ":", "'", "\""];
const COMMON_WORDS: &str = "the a an and or but if then so to of in on at by for with from \
    up down out over under once upon time there was were is are be been he she it they we you i \
    me him her them his its their our my your this that these those what who when where why how \
    one two three day night little big small old new good bad happy sad girl boy man woman dog \
    cat bird tree house sun moon sky sea water fire friend mom dad play run walk see saw look \
    said say go went come came like loved love want wanted had has have do did not no yes all \
    very much many some more most";
const CONSONANTS: &[u8] = b"bdfghklmnprstvwz";
const VOWELS: &[u8] = b"aeiou";

/// Word-level tokenizer over a fixed generated vocabulary.
pub struct BuiltinTokenizer {
    words: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Default for BuiltinTokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl BuiltinTokenizer {
    pub fn new() -> Self {
        let mut words: Vec<String> = Vec::with_capacity(VOCAB_SIZE);
        let mut ids: HashMap<String, u32> = HashMap::with_capacity(VOCAB_SIZE);
        let mut push = |w: String, words: &mut Vec<String>| {
            if words.len() < VOCAB_SIZE && !ids.contains_key(&w) {
                ids.insert(w.clone(), words.len() as u32);
                words.push(w);
            }
        };
        for w in SPECIALS.iter().chain(PUNCTUATION.iter()) {
            push(w.to_string(), &mut words);
        }
        for w in COMMON_WORDS.split_whitespace() {
            push(w.to_string(), &mut words);
        }
        // Words of 1, 2, 3... consonant-vowel syllables; each syllable is two bytes, so words
        // of different syllable counts can never collide.
        let syllables: Vec<String> = CONSONANTS
            .iter()
            .flat_map(|&c| {
                VOWELS
                    .iter()
                    .map(move |&v| format!("{}{}", c as char, v as char))
            })
            .collect();
        let mut layer: Vec<String> = vec![String::new()];
        while words.len() < VOCAB_SIZE {
            let mut next = Vec::new();
            for prefix in &layer {
                for s in &syllables {
                    let w = format!("{prefix}{s}");
                    push(w.clone(), &mut words);
                    next.push(w);
                }
                if words.len() >= VOCAB_SIZE {
                    break;
                }
            }
            layer = next;
        }
        debug_assert_eq!(words[UNK_ID as usize], "<unk>");
        debug_assert_eq!(words[BOS_ID as usize], "<s>");
        debug_assert_eq!(words[EOS_ID as usize], "</s>");
        BuiltinTokenizer { words, ids }
    }

    pub fn facts() -> ModelFacts {
        ModelFacts {
            model_path: None,
            vocab_size: VOCAB_SIZE,
            context_len: CONTEXT_LEN,
            eos_token_ids: vec![EOS_ID],
            chat_template: None,
            bos_token: Some(SPECIALS[BOS_ID as usize].to_string()),
            bos_token_id: Some(BOS_ID),
            eos_token: Some(SPECIALS[EOS_ID as usize].to_string()),
        }
    }

    pub fn vocab(&self) -> &[String] {
        &self.words
    }

    fn id_of(&self, piece: &str) -> u32 {
        self.ids.get(piece).copied().unwrap_or(UNK_ID)
    }
}

impl TextTokenizer for BuiltinTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = vec![BOS_ID];
        for raw in text.split_whitespace() {
            // A whole piece that is in the vocabulary (e.g. "<unk>", "...") wins over splitting.
            let lower = raw.to_lowercase();
            if let Some(&id) = self.ids.get(&lower) {
                out.push(id);
                continue;
            }
            let is_punct = |c: char| PUNCTUATION.iter().any(|p| p.starts_with(c));
            let core_start = lower.find(|c| !is_punct(c)).unwrap_or(lower.len());
            let core_end = lower
                .rfind(|c| !is_punct(c))
                .map(|i| i + lower[i..].chars().next().map_or(1, char::len_utf8))
                .unwrap_or(core_start)
                .max(core_start);
            out.extend(
                lower[..core_start]
                    .chars()
                    .map(|c| self.id_of(&c.to_string())),
            );
            if core_end > core_start {
                out.push(self.id_of(&lower[core_start..core_end]));
            }
            out.extend(
                lower[core_end..]
                    .chars()
                    .map(|c| self.id_of(&c.to_string())),
            );
        }
        Ok(out)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        let words: Vec<&str> = ids
            .iter()
            .filter(|&&id| id != BOS_ID && id != EOS_ID)
            .map(|&id| {
                self.words
                    .get(id as usize)
                    .map_or(SPECIALS[UNK_ID as usize], String::as_str)
            })
            .collect();
        Ok(words.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn vocabulary_is_full_distinct_printable_lowercase() {
        let tok = BuiltinTokenizer::new();
        assert_eq!(tok.vocab().len(), VOCAB_SIZE);
        let set: HashSet<&String> = tok.vocab().iter().collect();
        assert_eq!(set.len(), VOCAB_SIZE);
        for w in tok.vocab() {
            assert!(!w.is_empty());
            assert!(w.chars().all(|c| c.is_ascii_graphic()), "{w:?}");
            assert_eq!(w, &w.to_lowercase());
        }
        assert_eq!(tok.vocab()[UNK_ID as usize], "<unk>");
        assert_eq!(tok.vocab()[BOS_ID as usize], "<s>");
        assert_eq!(tok.vocab()[EOS_ID as usize], "</s>");
    }

    #[test]
    fn deterministic() {
        assert_eq!(
            BuiltinTokenizer::new().vocab(),
            BuiltinTokenizer::new().vocab()
        );
    }

    #[test]
    fn own_words_round_trip() {
        let tok = BuiltinTokenizer::new();
        let text: Vec<&str> = tok.vocab()[3..]
            .iter()
            .step_by(37)
            .map(String::as_str)
            .collect();
        let text = text.join(" ");
        let ids = tok.encode(&text).unwrap();
        assert_eq!(ids[0], BOS_ID);
        assert!(!ids.contains(&UNK_ID));
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }

    #[test]
    fn every_token_decodes_to_printable_text() {
        let tok = BuiltinTokenizer::new();
        let all: Vec<u32> = (0..VOCAB_SIZE as u32).collect();
        let text = tok.decode(&all).unwrap();
        assert!(text.chars().all(|c| c == ' ' || c.is_ascii_graphic()));
        assert_eq!(tok.decode(&[99_999]).unwrap(), "<unk>");
    }

    #[test]
    fn encodes_prompts_with_punctuation_and_unknown_words() {
        let tok = BuiltinTokenizer::new();
        let ids = tok.encode("Once upon a time, xyzzy!").unwrap();
        assert_eq!(ids.len(), 8);
        assert_eq!(ids[0], BOS_ID);
        assert_eq!(ids[6], UNK_ID);
        assert_eq!(tok.decode(&ids).unwrap(), "once upon a time , <unk> !");
        assert_eq!(tok.encode("").unwrap(), vec![BOS_ID]);
    }
}
