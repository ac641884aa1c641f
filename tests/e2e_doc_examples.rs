//! Every `curl` example a newcomer copies from README.md, docs/HTTP.md and deploy/README.md is
//! run against a live `dpserve up` (the built-in model, 2 ranks), and answers the status the
//! doc says: 200, or the `# → STATUS` at the end of its line. A block fenced ```` ```sh
//! stories260k ```` runs against the real stories260k model instead (skipped where
//! `../shared` is absent): what the built-in model cannot do (structured output) is shown
//! with it. docs/HTTP.md has one for every
//! path of the OpenAPI document (checked here too), so a renamed endpoint or a changed answer
//! fails this test instead of a reader.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::Server;

/// One example: where it is, the command as a shell runs it, and the status it should answer.
#[derive(Debug)]
struct Example {
    at: String,
    command: String,
    status: u16,
    /// Against stories260k (its block is fenced ```` ```sh stories260k ````), not the
    /// built-in model.
    stories: bool,
}

/// The `curl … localhost:30000 …` commands of the ```sh blocks of `doc` (continued lines
/// joined), without their comments and pipes.
fn examples(doc: &str) -> Vec<Example> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc))
        .unwrap_or_else(|e| panic!("{doc}: {e}"));
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut stories = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = trimmed == "```sh" || trimmed == "```sh stories260k";
            stories = trimmed == "```sh stories260k";
            continue;
        }
        if !in_sh {
            continue;
        }
        let (start, joined) = match pending.take() {
            Some((start, head)) => (start, format!("{head} {trimmed}")),
            None => (i + 1, trimmed.to_string()),
        };
        if let Some(head) = joined.strip_suffix('\\') {
            pending = Some((start, head.trim_end().to_string()));
            continue;
        }
        if joined.starts_with("curl ") && joined.contains("localhost:30000") {
            let (command, comment) = split_unquoted(&joined, '#');
            let status = comment
                .and_then(|c| c.trim().strip_prefix('→'))
                .map_or(200, |s| s.trim().parse().expect("# → STATUS"));
            let (command, _pipe) = split_unquoted(command, '|');
            out.push(Example {
                at: format!("{doc}:{start}"),
                command: command.trim().to_string(),
                status,
                stories,
            });
        }
    }
    out
}

/// `s` before the first `sep` outside single quotes (and after whitespace), and what follows.
fn split_unquoted(s: &str, sep: char) -> (&str, Option<&str>) {
    let mut quoted = false;
    let mut prev_space = false;
    for (i, c) in s.char_indices() {
        if c == '\'' {
            quoted = !quoted;
        } else if c == sep && !quoted && prev_space {
            return (&s[..i], Some(&s[i + c.len_utf8()..]));
        }
        prev_space = c.is_whitespace();
    }
    (s, None)
}

#[test]
fn every_curl_example_in_the_docs_answers_what_the_doc_says() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipping: curl is not installed (the docs' examples are curl commands)");
        return;
    }
    let all: Vec<Example> = ["README.md", "docs/HTTP.md", "deploy/README.md"]
        .iter()
        .flat_map(|doc| examples(doc))
        .collect();
    assert!(
        all.len() >= 30,
        "found only {} examples: {all:?}",
        all.len()
    );
    // A curl example for every endpoint of the OpenAPI document.
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    for path in spec["paths"].as_object().unwrap().keys() {
        let named = |e: &Example| {
            e.command.contains(&format!("localhost:30000{path} "))
                || e.command.contains(&format!("localhost:30000{path}'"))
                || e.command.contains(&format!("localhost:30000{path}?"))
                || e.command.ends_with(&format!("localhost:30000{path}"))
        };
        assert!(
            all.iter()
                .any(|e| e.at.starts_with("docs/HTTP.md") && named(e)),
            "docs/HTTP.md has no curl example of {path}"
        );
    }

    let (stories, builtin): (Vec<&Example>, Vec<&Example>) = all.iter().partition(|e| e.stories);
    let mut failed = run(&Server::tiny(&[]), &builtin);
    match common::stories_dir() {
        Some(dir) => {
            let server = Server::up(&["--model-path", dir.to_str().unwrap(), "--dp-size", "2"]);
            failed.extend(run(&server, &stories));
        }
        None => eprintln!(
            "skipped {} examples of stories260k: ../shared is absent",
            stories.len()
        ),
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Runs `examples` against `server`; what answered another status than its doc says.
fn run(server: &Server, examples: &[&Example]) -> Vec<String> {
    let host = server.url("").trim_start_matches("http://").to_string();
    let mut failed = Vec::new();
    for e in examples {
        let command = e.command.replace("localhost:30000", &host);
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{command} -o /dev/null -w '%{{http_code}}' --max-time 60"
            ))
            .output()
            .expect("sh");
        let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if got != e.status.to_string() {
            failed.push(format!(
                "{}: `{}` answered {got:?}, the doc says {} ({})",
                e.at,
                e.command,
                e.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    failed
}

#[test]
fn the_example_reader_joins_lines_and_reads_statuses() {
    let (cmd, comment) = split_unquoted("curl -d '{\"a\": \"# not\"}' x   # → 400", '#');
    assert_eq!(cmd.trim(), "curl -d '{\"a\": \"# not\"}' x");
    assert_eq!(comment.map(str::trim), Some("→ 400"));
    let (cmd, pipe) = split_unquoted("curl -s x/get_server_info | jq .live_ranks", '|');
    assert_eq!(
        (cmd.trim(), pipe.is_some()),
        ("curl -s x/get_server_info", true)
    );
    let http = examples("docs/HTTP.md");
    let flush = http
        .iter()
        .find(|e| e.command.contains("flush_cache?timeout=60"))
        .expect("the /flush_cache example");
    assert_eq!(flush.status, 200);
    assert!(
        http.iter().any(|e| e.status == 400),
        "the refused examples: {http:?}"
    );
    // Structured output and tool calls are shown on stories260k, in its own blocks.
    let stories: Vec<&Example> = http.iter().filter(|e| e.stories).collect();
    assert!(
        stories.len() >= 5
            && stories.iter().all(|e| e.command.contains("json_schema")
                || e.command.contains("regex")
                || e.command.contains("ebnf")
                || e.command.contains("response_format")
                || e.command.contains("tools")),
        "{stories:?}"
    );
    // A continued command is one example.
    assert!(http
        .iter()
        .any(|e| e.command.contains("x-dpserve-return-routing: 1") && e.command.contains("-d")));
}
