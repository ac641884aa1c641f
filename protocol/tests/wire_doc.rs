//! Keeps `WIRE.md` honest: every golden vector must be quoted there byte for byte, and every
//! message type must have its section. `print_wire_examples` regenerates the quoted examples.

mod common;

use common::{examples, from_hex, to_hex_lines};
use protocol::{encode, Envelope};

const WIRE_MD: &str = include_str!("../WIRE.md");

/// The bodies of every ```hex fenced block in `WIRE.md`, whitespace removed.
fn hex_blocks(doc: &str) -> Vec<Vec<u8>> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match (&mut current, line.trim()) {
            (None, "```hex") => current = Some(String::new()),
            (Some(body), "```") => {
                blocks.push(from_hex(body));
                current = None;
            }
            (Some(body), text) => body.push_str(text),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn wire_md_quotes_every_golden_vector() {
    let blocks = hex_blocks(WIRE_MD);
    for (name, msg) in examples() {
        let frame = encode(&msg).unwrap();
        assert!(
            blocks.contains(&frame),
            "WIRE.md lacks the exact bytes of example {name}; run \
             `cargo test -p protocol --test wire_doc -- --ignored --nocapture` and paste them"
        );
    }
}

#[test]
fn wire_md_has_a_section_per_message_type() {
    for (_, msg) in examples() {
        let heading = format!("### `{}`", msg.type_name());
        assert!(WIRE_MD.contains(&heading), "WIRE.md lacks {heading:?}");
    }
}

#[test]
#[ignore = "prints the examples quoted in WIRE.md"]
fn print_wire_examples() {
    for (name, msg) in examples() {
        let frame = encode(&msg).unwrap();
        let json = serde_json::to_string(&Envelope::new(msg.clone())).unwrap();
        println!("#### {name} ({} bytes)\n", frame.len());
        println!("```text\n{}\n```\n", json_like(&json));
        println!("```hex\n{}\n```\n", to_hex_lines(&frame));
    }
}

/// A compact JSON document re-laid out for reading: a value that fits in the line stays on
/// it, a longer object or array gets one member per line. Keys keep their wire order (which a
/// `serde_json::Value` would sort).
fn json_like(compact: &str) -> String {
    let node = Node::parse(&mut compact.as_bytes());
    let mut out = String::new();
    node.write(&mut out, 0, 0);
    out
}

enum Node {
    Atom(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

impl Node {
    fn parse(input: &mut &[u8]) -> Node {
        let take = |input: &mut &[u8]| {
            let b = input[0];
            *input = &input[1..];
            b
        };
        match input[0] {
            b'[' => {
                take(input);
                let mut items = Vec::new();
                while input[0] != b']' {
                    items.push(Node::parse(input));
                    if input[0] == b',' {
                        take(input);
                    }
                }
                take(input);
                Node::Array(items)
            }
            b'{' => {
                take(input);
                let mut members = Vec::new();
                while input[0] != b'}' {
                    let Node::Atom(key) = Node::parse(input) else {
                        panic!("object key is not a string")
                    };
                    assert_eq!(take(input), b':');
                    members.push((key, Node::parse(input)));
                    if input[0] == b',' {
                        take(input);
                    }
                }
                take(input);
                Node::Object(members)
            }
            b'"' => {
                let mut end = 1;
                while input[end] != b'"' {
                    end += if input[end] == b'\\' { 2 } else { 1 };
                }
                let atom = String::from_utf8(input[..=end].to_vec()).unwrap();
                *input = &input[end + 1..];
                Node::Atom(atom)
            }
            _ => {
                let end = input
                    .iter()
                    .position(|b| matches!(b, b',' | b']' | b'}'))
                    .unwrap_or(input.len());
                let atom = String::from_utf8(input[..end].to_vec()).unwrap();
                *input = &input[end..];
                Node::Atom(atom)
            }
        }
    }

    fn inline(&self) -> String {
        match self {
            Node::Atom(a) => a.clone(),
            Node::Array(items) => {
                let items: Vec<_> = items.iter().map(Node::inline).collect();
                format!("[{}]", items.join(", "))
            }
            Node::Object(members) => {
                let members: Vec<_> = members
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.inline()))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
        }
    }

    /// Write at nesting `level`, the line already holding `column` characters.
    fn write(&self, out: &mut String, level: usize, column: usize) {
        const WIDTH: usize = 96;
        let inline = self.inline();
        if column + inline.len() <= WIDTH {
            out.push_str(&inline);
            return;
        }
        let pad = "  ".repeat(level + 1);
        let (open, close, members): (char, char, Vec<(Option<&str>, &Node)>) = match self {
            Node::Atom(a) => {
                out.push_str(a);
                return;
            }
            Node::Array(items) => ('[', ']', items.iter().map(|n| (None, n)).collect()),
            Node::Object(members) => (
                '{',
                '}',
                members.iter().map(|(k, n)| (Some(k.as_str()), n)).collect(),
            ),
        };
        out.push(open);
        out.push('\n');
        let last = members.len().saturating_sub(1);
        for (i, (key, value)) in members.into_iter().enumerate() {
            out.push_str(&pad);
            let mut column = pad.len();
            if let Some(key) = key {
                out.push_str(key);
                out.push_str(": ");
                column += key.len() + 2;
            }
            value.write(out, level + 1, column);
            out.push_str(if i == last { "\n" } else { ",\n" });
        }
        out.push_str(&"  ".repeat(level));
        out.push(close);
    }
}
