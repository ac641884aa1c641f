//! Stop strings over a stream of text deltas: the text before the first occurrence of any stop
//! string is emitted, the stop string and everything after it never is.
//!
//! A stop string may straddle two deltas ("Hel" + "lo" for "Hello"), so the matcher holds back
//! the longest tail of the unemitted text that is a proper prefix of some stop string, and
//! emits it only once later text proves it is not one. Why that is enough: an occurrence that
//! started before the held-back tail would make a longer tail a prefix of a stop string.
//! Cost per delta: O(held + delta) × number of stop strings.

/// Stop-string state of one request.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not emitted yet (a possible stop-string start).
    held: String,
    matched: Option<String>,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everything).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            matched: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Add `delta`; return the text that may be emitted now. With `last`, nothing is held back.
    /// After a match every later call returns "".
    pub fn push(&mut self, delta: &str, last: bool) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        if self.stops.is_empty() {
            return delta.to_string();
        }
        self.held.push_str(delta);
        // The earliest occurrence wins; at one position, the longest stop string.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
        if let Some((at, stop)) = hit {
            self.matched = Some(stop.clone());
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        if last {
            return std::mem::take(&mut self.held);
        }
        let keep = self.held_back_len();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// Byte length of the longest tail of `held` that is a proper prefix of a stop string.
    fn held_back_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let h = &self.held;
        (1..longest.min(h.len() + 1))
            .rev()
            .filter(|&n| h.is_char_boundary(h.len() - n))
            .find(|&n| {
                let tail = &h[h.len() - n..];
                self.stops
                    .iter()
                    .any(|s| s.len() > n && s.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `deltas`, return (emitted text per delta, matched stop).
    fn run(stops: &[&str], deltas: &[&str]) -> (Vec<String>, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let n = deltas.len();
        let out = deltas
            .iter()
            .enumerate()
            .map(|(i, d)| m.push(d, i + 1 == n))
            .collect();
        (out, m.matched().map(str::to_string))
    }

    /// Stop strings, deltas, emitted text, matched stop.
    type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a str, Option<&'a str>);

    #[test]
    fn table() {
        let cases: &[Case] = &[
            (&[], &["a", "b"], "ab", None),
            (&["x"], &["abc", "def"], "abcdef", None),
            (&["lo"], &["hel", "lo world"], "hel", Some("lo")),
            (
                &["Hello"],
                &["say H", "el", "l", "o there"],
                "say ",
                Some("Hello"),
            ),
            // A false start is released once it cannot be a match any more.
            (&["abc"], &["xab", "d", "abz"], "xabdabz", None),
            (&["abc"], &["ab"], "ab", None),
            // Earliest occurrence wins, then the longest.
            (&["c", "ab"], &["xabc"], "x", Some("ab")),
            (&["ab", "abc"], &["xabcd"], "x", Some("abc")),
            (&["\n\n"], &["line\n", "\nmore"], "line", Some("\n\n")),
            (&["é!"], &["café", "!"], "caf", Some("é!")),
            (&[""], &["a"], "a", None),
        ];
        for (stops, deltas, want, matched) in cases {
            let (out, m) = run(stops, deltas);
            assert_eq!(out.concat(), *want, "{stops:?} {deltas:?}");
            assert_eq!(m.as_deref(), *matched, "{stops:?} {deltas:?}");
        }
    }

    #[test]
    fn holds_back_only_possible_starts() {
        let (out, _) = run(&["Hello"], &["abc He", "x"]);
        assert_eq!(out, vec!["abc ".to_string(), "Hex".to_string()]);
        // Nothing after a match.
        let stops = vec!["b".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("abc", false), "a");
        assert_eq!(m.push("more", true), "");
    }

    #[test]
    fn matches_the_whole_text_at_any_split() {
        let text = "once upon a time, the end. again";
        let stops = vec!["the end".to_string()];
        for split in 0..=text.len() {
            let (a, b) = text.split_at(split);
            let mut m = StopMatcher::new(&stops);
            let out = m.push(a, false) + &m.push(b, true);
            assert_eq!(out, "once upon a time, ", "split at {split}");
        }
    }
}
