//! The message types the documents name are the message types the code has, both ways: every
//! `### \`Type\`` section of `WIRE.md`, every type its socket table (§2) says a socket carries,
//! and every row of the message table in `docs/ARCHITECTURE.md` is a variant of
//! [`protocol::Message`], and every variant is in all three. A type added on one side only fails
//! here.
//!
//! The variants are read from the code itself: serde's derived `Deserialize` hands the list of
//! variant names to the deserializer (the same list it matches a frame's type key against), and
//! [`VariantProbe`] is a deserializer that only records it.

mod common;

use std::collections::BTreeSet;

use protocol::Message;
use serde::de::{self, Deserialize, Visitor};

const WIRE_MD: &str = include_str!("../WIRE.md");
const ARCHITECTURE_MD: &str = include_str!("../../docs/ARCHITECTURE.md");

/// A deserializer that answers every request with an error, recording the variant names of the
/// enum it was asked for.
struct VariantProbe<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for VariantProbe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not an enum"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(variants);
        Err(de::Error::custom("probed"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

/// The wire names of `Message`'s variants, as its `Deserialize` knows them.
fn message_variants() -> BTreeSet<String> {
    let mut variants = None;
    assert!(Message::deserialize(VariantProbe(&mut variants)).is_err());
    let variants = variants.expect("Message deserializes as an enum");
    variants.iter().map(|v| v.to_string()).collect()
}

/// Whether `s` looks like a message type name: an upper-case letter, then letters only.
fn is_type_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase()) && chars.all(|c| c.is_ascii_alphabetic())
}

/// The text of `doc` from the line starting with `heading` to the next heading of the same or a
/// higher level.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let start = doc
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("no section {heading:?}"))
        + 1;
    let body = &doc[start..];
    let end = body
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| {
            let hashes = body[i..].chars().take_while(|&c| c == '#').count();
            hashes > 0 && hashes <= level && body[i + hashes..].starts_with(' ')
        })
        .unwrap_or(body.len());
    &body[..end]
}

/// The backticked type names in `text`.
fn backticked_types(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| is_type_name(s))
        .map(str::to_string)
        .collect()
}

/// `WIRE.md`'s `### \`Type\`` headings.
fn wire_md_sections() -> BTreeSet<String> {
    WIRE_MD
        .lines()
        .filter_map(|l| l.strip_prefix("### `")?.strip_suffix('`'))
        .map(str::to_string)
        .collect()
}

/// The types the socket table of `doc`'s §2 says some socket carries (its last column).
fn socket_table_types(doc: &str) -> BTreeSet<String> {
    let carries: Vec<&str> = section(doc, "## 2. Sockets")
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.rsplit('|').nth(1).unwrap_or(""))
        .collect();
    backticked_types(&carries.join(" "))
}

/// The first column of the message table in `docs/ARCHITECTURE.md`.
fn architecture_md_messages() -> BTreeSet<String> {
    section(ARCHITECTURE_MD, "## Messages")
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .filter(|s| is_type_name(s))
        .map(str::to_string)
        .collect()
}

/// Fails with both differences of `doc` (what a document names) against the code.
fn assert_same(what: &str, doc: BTreeSet<String>) {
    let code = message_variants();
    let only_doc: Vec<_> = doc.difference(&code).collect();
    let only_code: Vec<_> = code.difference(&doc).collect();
    assert!(
        only_doc.is_empty() && only_code.is_empty(),
        "{what} and protocol::Message disagree: only in the document {only_doc:?}, only in the \
         code {only_code:?}"
    );
}

#[test]
fn the_probe_sees_every_variant() {
    let variants = message_variants();
    for name in [
        "GenerateReq",
        "TokenOut",
        "Hello",
        "WorkerStatus",
        "KvEvents",
    ] {
        assert!(variants.contains(name), "{variants:?}");
    }
    assert!(variants.len() >= 20, "{variants:?}");
}

#[test]
fn wire_md_has_a_section_for_exactly_the_message_types() {
    assert_same("WIRE.md's `### `Type`` sections", wire_md_sections());
}

#[test]
fn wire_md_socket_table_carries_exactly_the_message_types() {
    assert_same(
        "WIRE.md's socket table (§2, column Carries)",
        socket_table_types(WIRE_MD),
    );
}

#[test]
fn architecture_md_lists_exactly_the_message_types() {
    assert_same(
        "docs/ARCHITECTURE.md's message table (## Messages)",
        architecture_md_messages(),
    );
}

#[test]
fn type_name_is_the_wire_name() {
    // `Message::type_name` is written by hand; the wire name is serde's. Every golden example
    // must agree on both.
    let variants = message_variants();
    for (name, msg) in common::examples() {
        let json = serde_json::to_value(&msg).unwrap();
        let key = json.as_object().and_then(|m| m.keys().next()).cloned();
        assert_eq!(key.as_deref(), Some(msg.type_name()), "example {name}");
        assert!(variants.contains(msg.type_name()), "example {name}");
    }
}

#[test]
fn the_document_parsers_find_what_they_look_for() {
    // Guards the parsers above against matching nothing or too much: the last column only, and
    // only within §2.
    let doc = "# T\n\n## 2. Sockets\n\n| a | b |\n|---|---|\n\
               | `Rejoin` | `Hello`, `KvChunk` (+ payload) |\n\n## 3. Next\n| y | `Abort` |\n";
    assert_eq!(
        socket_table_types(doc),
        ["Hello", "KvChunk"].map(String::from).into()
    );
    assert!(!is_type_name("rank-<R>"));
    assert!(!is_type_name("--worker-addr"));
}
