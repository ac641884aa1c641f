//! GBNF (llama.cpp's grammar format, which SGLang's `ebnf` and xgrammar take) rewritten as
//! llguidance's Lark: `name ::= …` rules, `"…"` literals, `[…]` classes (`^` negated),
//! `.` any character, `( )`, `|`, `*` `+` `?`, `{m}` `{m,}` `{m,n}`, `#` comments. `root` is the
//! start. Token references (`<think>`, `<[1000]>`) are refused by name. Written from the
//! format's documentation (llama.cpp's `grammars/README.md`).

use crate::GrammarError;

fn bad(why: impl Into<String>) -> GrammarError {
    GrammarError::Compile {
        kind: "grammar",
        why: format!("GBNF: {}", why.into()),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    Literal(String),
    /// A class as regex text, `[`…`]` included.
    Class(String),
    Any,
    Open,
    Close,
    Or,
    /// `*`, `+`, `?`, or `{m,n}` as Lark writes it.
    Repeat(String),
}

/// A character as a regex class member.
fn class_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' => format!("\\{c}"),
        // `/` ends a Lark regex; control characters are written by number.
        c if c.is_control() || c == '/' => format!("\\x{{{:X}}}", c as u32),
        c => c.to_string(),
    }
}

/// The character an escape (after its `\`) stands for.
fn escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<char, GrammarError> {
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| {
        let digits: String = (0..n).filter_map(|_| chars.next()).collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| bad(format!("bad escape digits {digits:?}")))
    };
    match chars.next() {
        Some('n') => Ok('\n'),
        Some('t') => Ok('\t'),
        Some('r') => Ok('\r'),
        Some('x') => hex(chars, 2),
        Some('u') => hex(chars, 4),
        Some('U') => hex(chars, 8),
        Some(c) => Ok(c),
        None => Err(bad("an escape at the end")),
    }
}

/// `text` split into tokens, comments and white space dropped.
fn tokens(text: &str) -> Result<Vec<Tok>, GrammarError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => while chars.next().is_some_and(|c| c != '\n') {},
            '"' => out.push(Tok::Literal(literal(&mut chars)?)),
            '[' => out.push(Tok::Class(class(&mut chars)?)),
            '{' => {
                let mut body = String::new();
                chars.next();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) if c.is_ascii_digit() || c == ',' || c == ' ' => body.push(c),
                        _ => return Err(bad("a repetition is {m}, {m,} or {m,n}")),
                    }
                }
                out.push(Tok::Repeat(repetition(&body)?));
            }
            '<' | '!' => {
                return Err(bad(
                    "token references (<…>, <[id]>, !<…>) are not supported",
                ))
            }
            _ => {
                chars.next();
                out.push(match c {
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    '|' => Tok::Or,
                    '.' => Tok::Any,
                    '*' | '+' | '?' => Tok::Repeat(c.to_string()),
                    ':' if chars.next() == Some(':') && chars.next() == Some('=') => Tok::Defines,
                    c if name_char(c) => Tok::Name(name(c, &mut chars)),
                    c => return Err(bad(format!("unexpected {c:?}"))),
                });
            }
        }
    }
    Ok(out)
}

/// The text of a `"…"` literal, read from its opening quote.
fn literal(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<String, GrammarError> {
    chars.next();
    let mut s = String::new();
    loop {
        match chars.next() {
            Some('"') => break,
            Some('\\') => s.push(escape(chars)?),
            Some(c) => s.push(c),
            None => return Err(bad("a string that does not end")),
        }
    }
    Ok(s)
}

/// A `[…]` class as regex text, read from its `[`.
fn class(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<String, GrammarError> {
    chars.next();
    let mut class = String::from("[");
    if chars.peek() == Some(&'^') {
        chars.next();
        class.push('^');
    }
    loop {
        let (c, escaped) = match chars.next() {
            Some(']') => break,
            Some('\\') => (escape(chars)?, true),
            Some(c) => (c, false),
            None => return Err(bad("a character class that does not end")),
        };
        // A range's dash stays a dash (`a-z`); first, last or escaped it is one.
        let first = class == "[" || class == "[^";
        if c == '-' && !escaped && !first && chars.peek() != Some(&']') {
            class.push('-');
        } else {
            class.push_str(&class_char(c));
        }
    }
    class.push(']');
    Ok(class)
}

/// A repetition's body (`m`, `m,` or `m,n`, between its braces) as Lark writes the repetition.
fn repetition(body: &str) -> Result<String, GrammarError> {
    let body: String = body.chars().filter(|c| *c != ' ').collect();
    let (m, n) = match body.split_once(',') {
        None => (body.clone(), Some(body.clone())),
        Some((m, "")) => (m.to_string(), None),
        Some((m, n)) => (m.to_string(), Some(n.to_string())),
    };
    if m.is_empty() {
        return Err(bad("a repetition needs its least count"));
    }
    Ok(match n {
        Some(n) => format!("{{{m},{n}}}"),
        None => format!("{{{m},}}"),
    })
}

/// Whether `c` can be part of a rule name.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// A rule name that starts with `first`, the rest read from `chars`.
fn name(first: char, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut name = first.to_string();
    while let Some(&c) = chars.peek() {
        if !name_char(c) {
            break;
        }
        name.push(c);
        chars.next();
    }
    name
}

/// A rule name as Lark spells it: `root` is `start`, the others `r_` and the name in lower
/// case with `_` for `-` (so `Move` and `move` would clash: refused).
fn lark_name(name: &str) -> String {
    match name {
        "root" => "start".into(),
        n => format!("r_{}", n.to_lowercase().replace('-', "_")),
    }
}

/// `text`, a GBNF grammar, as llguidance Lark.
pub fn to_lark(text: &str) -> Result<String, GrammarError> {
    let toks = tokens(text)?;
    // Each rule starts where a name is followed by `::=`.
    let starts: Vec<usize> = (0..toks.len())
        .filter(|&i| matches!(toks[i], Tok::Name(_)) && toks.get(i + 1) == Some(&Tok::Defines))
        .collect();
    if starts.first() != Some(&0) {
        return Err(bad("a grammar is rules, `name ::= …`"));
    }
    let mut seen = std::collections::HashMap::new();
    let mut out = String::from("%llguidance {}\n");
    for (k, &at) in starts.iter().enumerate() {
        let Tok::Name(name) = &toks[at] else {
            unreachable!()
        };
        let lark = lark_name(name);
        if let Some(other) = seen.insert(lark.clone(), name.clone()) {
            return Err(bad(format!(
                "rules {other:?} and {name:?} differ only in case"
            )));
        }
        let end = starts.get(k + 1).copied().unwrap_or(toks.len());
        out.push_str(&format!("{lark}: {}\n", body(&toks[at + 2..end])?));
    }
    if !seen.contains_key("start") {
        return Err(bad("no root rule (`root ::= …`)"));
    }
    Ok(out)
}

/// One rule's body, its empty alternatives as `""`.
fn body(toks: &[Tok]) -> Result<String, GrammarError> {
    let mut out = String::new();
    let mut depth = 0usize;
    // Whether the current alternative (at this depth) has an item yet.
    let mut filled = vec![false];
    for t in toks {
        let item = match t {
            Tok::Name(n) => lark_name(n),
            Tok::Literal(s) => serde_json::Value::String(s.clone()).to_string(),
            Tok::Class(c) => format!("/{c}/"),
            Tok::Any => "/(?s:.)/".into(),
            Tok::Open => {
                depth += 1;
                filled.push(false);
                out.push_str("( ");
                continue;
            }
            Tok::Close => {
                if depth == 0 {
                    return Err(bad("a ')' without its '('"));
                }
                if !filled.pop().unwrap_or(true) {
                    out.push_str("\"\" ");
                }
                depth -= 1;
                if let Some(f) = filled.last_mut() {
                    *f = true;
                }
                out.push_str(") ");
                continue;
            }
            Tok::Or => {
                if !filled.last().copied().unwrap_or(true) {
                    out.push_str("\"\" ");
                }
                if let Some(f) = filled.last_mut() {
                    *f = false;
                }
                out.push_str("| ");
                continue;
            }
            Tok::Repeat(r) => {
                if !filled.last().copied().unwrap_or(false) {
                    return Err(bad(format!("{r} with nothing before it")));
                }
                let trimmed = out.trim_end().len();
                out.truncate(trimmed);
                out.push_str(r);
                out.push(' ');
                continue;
            }
            Tok::Defines => return Err(bad("`::=` inside a rule")),
        };
        if let Some(f) = filled.last_mut() {
            *f = true;
        }
        out.push_str(&item);
        out.push(' ');
    }
    if depth != 0 {
        return Err(bad("a '(' without its ')'"));
    }
    if !filled.last().copied().unwrap_or(true) {
        out.push_str("\"\"");
    }
    Ok(out.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Constraint, Grammars};

    /// Printable ASCII and newline, one byte a token, and EOS at 0.
    fn grammars() -> (Grammars, usize) {
        let mut v = vec![b"\xFF</s>".to_vec()];
        v.extend((0x20u8..0x7f).chain([b'\n']).map(|b| vec![b]));
        let rows = v.len();
        (Grammars::from_token_bytes(v, rows, &[0]).unwrap(), rows)
    }

    /// Every text of `gbnf` a greedy walk (lowest allowed id, EOS when allowed) and a few
    /// pseudo-random walks write.
    fn walks(gbnf: &str, n: u64) -> Vec<String> {
        let (g, rows) = grammars();
        let lark = to_lark(gbnf).unwrap_or_else(|e| panic!("{gbnf}: {e}"));
        let mut out = Vec::new();
        for seed in 0..n {
            let mut guide = g
                .compile(&Constraint::Lark(lark.clone()))
                .unwrap_or_else(|e| panic!("{lark}: {e}"));
            let mut text = String::new();
            let mut rng = crate::tests::Lcg(seed);
            for _ in 0..300 {
                let mut l = vec![0f32; rows];
                guide.mask(&mut l).unwrap();
                let allowed: Vec<u32> =
                    (0..rows as u32).filter(|&t| l[t as usize] == 0.0).collect();
                let t = if allowed.contains(&0) && rng.below(16) < 6 {
                    0
                } else {
                    let rest: Vec<u32> = allowed.iter().copied().filter(|&t| t != 0).collect();
                    rest[rng.below(rest.len())]
                };
                if t != 0 {
                    text.push(if t as usize == rows - 1 {
                        '\n'
                    } else {
                        (0x1f + t as u8) as char
                    });
                }
                if guide.advance(t).unwrap() {
                    break;
                }
            }
            out.push(text);
        }
        out
    }

    #[test]
    fn sglang_s_documented_example_writes_its_sentences() {
        // SGLang's docs' EBNF example (structured outputs).
        let g = r#"root ::= city | description
city ::= "London" | "Paris" | "Berlin" | "Rome"
description ::= city " is " status
status ::= "the capital of " country
country ::= "England" | "France" | "Germany" | "Italy""#;
        let cities = ["London", "Paris", "Berlin", "Rome"];
        for t in walks(g, 12) {
            let ok = cities.contains(&t.as_str())
                || t.split_once(" is the capital of ").is_some_and(|(c, k)| {
                    cities.contains(&c) && ["England", "France", "Germany", "Italy"].contains(&k)
                });
            assert!(ok, "{t:?}");
        }
    }

    #[test]
    fn classes_repetitions_groups_comments_and_empty_alternatives() {
        // After llama.cpp's README: a list, a chess opening, JSON-ish strings.
        let g = r#"
# a list of one to three items
root ::= ("- " item){1,3} end
item ::= [a-z0-9]{2,4} "\n"   # no spaces
end ::= | "." | [^a-z\x00-\x1F \-]
"#;
        for t in walks(g, 10) {
            let lines: Vec<&str> = t.split('\n').collect();
            let (items, end) = lines.split_at(lines.len() - 1);
            assert!((1..=3).contains(&items.len()), "{t:?}");
            for i in items {
                let w = i.strip_prefix("- ").unwrap_or_else(|| panic!("{t:?}"));
                assert!((2..=4).contains(&w.len()), "{t:?}");
                assert!(
                    w.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                    "{t:?}"
                );
            }
            let end = end[0];
            assert!(end.len() <= 1, "{t:?}");
            assert!(
                end.bytes()
                    .all(|b| !b.is_ascii_lowercase() && b != b' ' && b != b'-'),
                "{t:?}"
            );
        }
        let chess = r#"root ::= "1. " move " " move
move ::= (pawn | castle) [+#]?
pawn ::= [a-h] [1-8]
castle ::= "O-O" "-O"?"#;
        for t in walks(chess, 8) {
            let moves: Vec<&str> = t.strip_prefix("1. ").unwrap().split(' ').collect();
            assert_eq!(moves.len(), 2, "{t:?}");
            for m in moves {
                let m = m.trim_end_matches(['+', '#']);
                assert!(
                    ["O-O", "O-O-O"].contains(&m)
                        || (m.len() == 2 && m.as_bytes()[0].is_ascii_lowercase()),
                    "{t:?}"
                );
            }
        }
    }

    #[test]
    fn what_gbnf_cannot_say_here_is_refused_by_name() {
        let err = |g: &str| to_lark(g).unwrap_err().to_string();
        assert!(err("root ::= <think> x").contains("token references"));
        assert!(err("item ::= \"a\"").contains("no root rule"));
        assert!(err("root ::= (\"a\"").contains("without its ')'"));
        assert!(err("root ::= \"a").contains("does not end"));
        assert!(err("root ::= * \"a\"").contains("nothing before it"));
        assert!(err("root ::= a\na ::= \"x\"\nA ::= \"y\"").contains("differ only in case"));
        assert!(err("\"a\" root ::= \"b\"").contains("rules"));
        assert_eq!(
            to_lark("root ::= \"a\" | \n  x-y*\nx-y ::= [/]").unwrap(),
            "%llguidance {}\nstart: \"a\" | r_x_y*\nr_x_y: /[\\x{2F}]/\n"
        );
    }
}
