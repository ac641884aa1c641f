//! End to end: `dpserve bench --launch` starts a cluster per method (the tiny built-in model),
//! runs a small shared-prefix workload on each, and writes the comparison. Checks the JSON
//! it writes (counts, keys, per-rank shares), the routing picture of each method, and that an
//! unknown method is skipped with its reason instead of failing the comparison.

use crate::common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// A fresh output directory under /tmp (short: cluster sockets live below it).
fn out_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("temp dir")
}

/// `dpserve bench --launch` on 2-rank clusters of the tiny built-in model with `args`, writing
/// to `out`.
fn bench_launch_command(out: &Path, args: &[&str]) -> Command {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_dpserve"));
    bench
        .args([
            "bench",
            "--launch",
            "--builtin-size",
            "tiny",
            "--dp-size",
            "2",
        ])
        .args(["--max-total-tokens", "4096", "--disable-progress-bar"])
        .args(["--startup-timeout", "60"])
        .args(args)
        .arg("--output-dir")
        .arg(out)
        .env("DPSERVE_LOG", "warn");
    bench
}

/// Runs [`bench_launch_command`]; returns its compare.json.
fn bench_launch(out: &Path, args: &[&str]) -> Value {
    let status = bench_launch_command(out, args)
        .status()
        .expect("run dpserve bench");
    assert!(status.success(), "dpserve bench failed: {status}");
    serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap())
        .expect("compare.json is JSON")
}

#[test]
fn bench_launch_compares_methods_and_writes_json() {
    let out = out_dir("dpsb");
    let jsonl = out.path().join("results.jsonl");
    let compare = bench_launch(
        out.path(),
        &[
            "--compare",
            "round_robin,no_such_method,prefix_affinity",
            "--gsp-num-groups",
            "2",
            "--gsp-prompts-per-group",
            "4",
            "--gsp-system-prompt-len",
            "64",
            "--gsp-question-len",
            "8",
            "--gsp-output-len",
            "4",
            "--gsp-send-routing-key",
            "--max-concurrency",
            "4",
            "--seed",
            "7",
            "--output-file",
            jsonl.to_str().expect("utf-8 path"),
        ],
    );
    let methods = compare["methods"].as_array().expect("methods");
    assert_eq!(methods.len(), 3);

    let bogus = &methods[1];
    assert_eq!(bogus["method"], "no_such_method");
    assert_eq!(bogus["status"], "skipped");
    assert!(!bogus["reason"].as_str().unwrap_or("").is_empty());

    for m in [&methods[0], &methods[2]] {
        assert_eq!(m["status"], "ok", "{m}");
        let r = &m["result"];
        assert_eq!(r["load_balance_method"], m["method"]);
        assert_eq!(r["completed"], 8);
        assert_eq!(r["failed"], 0);
        assert_eq!(r["total_input_tokens"], 8 * 72);
        assert_eq!(
            r["total_output_tokens"],
            8 * 4,
            "ignore_eos makes output lengths exact"
        );
        for key in [
            "request_throughput",
            "output_throughput",
            "mean_ttft_ms",
            "p99_ttft_ms",
            "mean_tpot_ms",
            "mean_itl_ms",
        ] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
        }
        let hit = r["cache_hit_rate"].as_f64().expect("cache_hit_rate");
        assert!((0.0..=1.0).contains(&hit));
        let shares: f64 = r["rank_share"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(Value::as_f64)
            .sum();
        assert!((shares - 1.0).abs() < 1e-9, "rank shares sum to 1: {r}");
    }
    // round_robin alternates the two ranks.
    assert_eq!(methods[0]["result"]["requests_per_rank"]["0"], 4);

    let lines = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(
        lines.lines().count(),
        2,
        "one JSON line per method that ran"
    );
    for line in lines.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        assert!(v["mean_ttft_ms"].is_number());
    }
    let md = std::fs::read_to_string(out.path().join("compare.md")).unwrap();
    assert!(md.contains("| round_robin |") && md.contains("skipped"));
    let svg = std::fs::read_to_string(out.path().join("compare.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("prefix_affinity"));
    // Each method that ran has its routing picture beside the tables, drawn from its cluster's
    // routing trace: a band per rank, and every decision counted.
    for method in ["round_robin", "prefix_affinity"] {
        let svg = std::fs::read_to_string(out.path().join(format!("routing-{method}.svg")))
            .unwrap_or_else(|e| panic!("routing-{method}.svg: {e}"));
        assert!(
            svg.contains(&format!("routing over time: {method}")),
            "{svg}"
        );
        assert!(svg.contains("class=\"area\" data-rank=\"0\""), "{svg}");
        assert!(svg.contains("class=\"area\" data-rank=\"1\""), "{svg}");
        // The workload's 8 requests, plus whatever the bench sends to learn the server.
        let decisions: usize = svg
            .split(" routing decisions")
            .next()
            .and_then(|s| s.rsplit('>').next())
            .and_then(|n| n.parse().ok())
            .expect("a decision count");
        assert!(decisions >= 8, "{svg}");
    }
    assert!(!out.path().join("routing-no_such_method.svg").exists());
}

/// `dpserve bench --engine` as docs/ENGINE.md runs it, scaled down: every supported kernel path in
/// its own process, a table each, the comparison, and one JSON line per path.
#[test]
fn bench_engine_compares_every_kernel_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let jsonl = dir.path().join("engine.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args([
            "bench",
            "--engine",
            "--kernel-path",
            "all",
            "--builtin-size",
            "tiny",
            "--engine-prompt-lens",
            "40,70",
            "--engine-batches",
            "1,3",
            "--engine-decode-steps",
            "5",
            "--engine-reps",
            "1",
            "--num-threads",
            "2",
            "--output-file",
        ])
        .arg(&jsonl)
        .env_remove("DPSERVE_KERNEL_PATH")
        .output()
        .expect("run dpserve bench --engine");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&jsonl)
        .expect("results written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert!(!lines.is_empty());
    assert_eq!(
        lines[0]["kernel_path"], "portable",
        "portable first: the baseline"
    );
    for r in &lines {
        let path = r["kernel_path"].as_str().unwrap();
        assert!(
            stdout.contains(&format!("kernel path {path}, 2 threads")),
            "{stdout}"
        );
        let tests: Vec<&str> = r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["test"].as_str().unwrap())
            .collect();
        assert_eq!(tests, ["pp40", "pp70", "tg5 b1", "tg5 b3"], "{path}");
        for row in r["rows"].as_array().unwrap() {
            assert!(row["tokens_per_s"].as_f64().unwrap() > 0.0, "{path}: {row}");
        }
        assert!(r["fma_peak_gflops"].as_f64().unwrap() > 0.0);
        assert!(r["copy_gbps"].as_f64().unwrap() > 0.0);
    }
    // The comparison table: one column per path, the baseline at 1.00×.
    assert!(
        stdout.contains("| pp40 |") && stdout.contains("(1.00×)"),
        "{stdout}"
    );

    // A path this CPU cannot run is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_dpserve"))
        .args(["bench", "--engine", "--kernel-path", "sse9"])
        .output()
        .expect("run dpserve bench --engine");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a kernel path"));
}

/// `--engine-json-schema`: each batch decoded again under a JSON Schema (stories260k's
/// vocabulary); the built-in model, which has no byte vocabulary, is refused by name.
#[test]
fn bench_engine_prices_a_json_schema_per_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"ok": {"type": "boolean"}}}"#,
    )
    .unwrap();
    let engine = |model: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dpserve"))
            .args([
                "bench",
                "--engine",
                "--engine-prompt-lens",
                "8",
                "--engine-batches",
                "2",
            ])
            .args([
                "--engine-decode-steps",
                "12",
                "--num-threads",
                "2",
                "--engine-json-schema",
            ])
            .arg(&schema)
            .args(model)
            .output()
            .expect("run dpserve bench --engine")
    };
    let out = engine(&["--builtin-size", "tiny"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--engine-json-schema needs --model-path")
    );
    let Some(stories) = common::stories_dir() else {
        return;
    };
    let out = engine(&["--model-path", stories.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| tg12 b2 |") && stdout.contains("| tg12 b2 json_schema |"),
        "{stdout}"
    );
}

/// `dpserve bench --backend openai` against an OpenAI-compatible server that is not dpserve:
/// no `/get_server_info` (404), the model from `/v1/models`, the vocabulary from
/// `--vocab-size`; the run completes, prints its table, and reports the server-side numbers as
/// unknown. Without `--vocab-size` it stops with a message that names the flag.
#[test]
fn bench_runs_against_a_plain_openai_server() {
    let server = plain_openai::Server::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let jsonl = dir.path().join("results.jsonl");
    let bench = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dpserve"))
            .args([
                "bench",
                "--base-url",
                &server.base_url(),
                "--backend",
                "openai",
            ])
            .args([
                "--gsp-num-groups",
                "2",
                "--gsp-prompts-per-group",
                "3",
                "--gsp-system-prompt-len",
                "32",
                "--gsp-question-len",
                "8",
                "--gsp-output-len",
                "5",
                "--max-concurrency",
                "4",
                "--disable-progress-bar",
            ])
            .args(extra)
            .env_remove("DPSERVE_BENCH_MODEL")
            .env_remove("DPSERVE_BENCH_VOCAB_SIZE")
            .env_remove("DPSERVE_BENCH_BASE_URL")
            .env_remove("DPSERVE_BENCH_BACKEND")
            .output()
            .expect("run dpserve bench")
    };

    let out = bench(&[
        "--vocab-size",
        "300",
        "--output-file",
        jsonl.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}");
    assert!(stdout.contains("Serving Benchmark Result"), "{stdout}");
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{stdout}"))
            .to_string()
    };
    assert!(row("Successful requests").ends_with(" 6"), "{stdout}");
    assert!(row("Failed requests").ends_with(" 0"), "{stdout}");
    for unknown in [
        "Load-balance method",
        "Cache hit rate (server)",
        "Requests per rank",
    ] {
        assert!(row(unknown).ends_with("unknown"), "{stdout}");
    }
    for note in [
        "note: GET /get_server_info: HTTP 404 Not Found: not a dpserve server",
        "note: token ids drawn from a vocabulary of 300 (from --vocab-size)",
        "note: model \"plain-model\" (from /v1/models)",
    ] {
        assert!(stdout.contains(note), "{note} in\n{stdout}");
    }

    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&jsonl)
            .expect("results written")
            .trim(),
    )
    .expect("one JSON line");
    assert_eq!(line["completed"], 6);
    assert_eq!(line["total_output_tokens"], 6 * 5);
    assert_eq!(line["total_input_tokens"], 6 * 40);
    assert!(
        line["mean_ttft_ms"].as_f64().is_some_and(|v| v > 0.0),
        "{line}"
    );
    assert_eq!(line["model"], plain_openai::MODEL);
    assert_eq!(line["model_from"], "/v1/models");
    assert_eq!(line["vocab_size"], 300);
    assert_eq!(line["vocab_size_from"], "--vocab-size");
    for unknown in [
        "load_balance_method",
        "cache_hit_rate",
        "requests_per_rank",
        "server_rank_cache_hit_rate",
    ] {
        assert!(line[unknown].is_null(), "{unknown} in {line}");
    }

    // What the server saw: the warm-up and the 6 requests, each for the listed model, with ids
    // inside the vocabulary.
    let seen = server.seen();
    assert_eq!(seen.completions, 7, "{seen:?}");
    assert_eq!(seen.bad, Vec::<String>::new());
    assert!(seen.max_token_id < 300, "{seen:?}");

    // Nothing says the vocabulary size: a clear stop, before any request is sent.
    let out = bench(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("GET /get_server_info: HTTP 404 Not Found")
            && stderr.contains("pass --vocab-size"),
        "{stderr}"
    );
    assert_eq!(server.seen().completions, 7, "no request sent");
}

/// A minimal OpenAI-compatible server shaped like vLLM's: `GET /v1/models` lists one model,
/// `POST /v1/completions` streams one chunk per token and a usage chunk, and every other path
/// (`/get_server_info` among them) is 404. Standard library only; a thread per connection, each
/// answer closes its connection.
mod plain_openai {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use serde_json::{json, Value};

    pub const MODEL: &str = "plain-model";

    #[derive(Debug, Default, Clone)]
    pub struct Seen {
        pub completions: usize,
        pub max_token_id: u64,
        /// Requests it refused, and why.
        pub bad: Vec<String>,
    }

    pub struct Server {
        port: u16,
        seen: Arc<Mutex<Seen>>,
    }

    impl Server {
        pub fn start() -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let seen = Arc::new(Mutex::new(Seen::default()));
            let shared = seen.clone();
            // The thread ends with the test process.
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let seen = shared.clone();
                    std::thread::spawn(move || handle(stream, &seen));
                }
            });
            Server { port, seen }
        }

        pub fn base_url(&self) -> String {
            format!("http://127.0.0.1:{}", self.port)
        }

        pub fn seen(&self) -> Seen {
            self.seen.lock().unwrap().clone()
        }
    }

    fn handle(mut stream: TcpStream, seen: &Mutex<Seen>) {
        let Some((method, path, body)) = read_request(&stream) else {
            return;
        };
        let _ = match (method.as_str(), path.as_str()) {
            ("GET", "/v1/models") => respond(
                &mut stream,
                "200 OK",
                &json!({"object": "list", "data": [
                    {"id": MODEL, "object": "model", "owned_by": "test", "max_model_len": 512}
                ]}),
            ),
            ("POST", "/v1/completions") => completions(&mut stream, &body, seen),
            _ => respond(
                &mut stream,
                "404 Not Found",
                &json!({"detail": "Not Found"}),
            ),
        };
    }

    fn read_request(stream: &TcpStream) -> Option<(String, String, Vec<u8>)> {
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        reader.read_line(&mut first).ok()?;
        let mut parts = first.split_whitespace();
        let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).ok()? == 0 || line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().ok()?;
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).ok()?;
        Some((method, path, body))
    }

    fn respond(stream: &mut TcpStream, status: &str, body: &Value) -> std::io::Result<()> {
        let body = body.to_string();
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
    }

    fn completions(stream: &mut TcpStream, body: &[u8], seen: &Mutex<Seen>) -> std::io::Result<()> {
        let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let ids: Vec<u64> = req["prompt"]
            .as_array()
            .map(|p| p.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let max_tokens = req["max_tokens"].as_u64().unwrap_or(0);
        let problem = if req["model"] != MODEL {
            Some(format!("unknown model {}", req["model"]))
        } else if ids.is_empty() || req["stream"] != true {
            Some(format!("not a streaming token-id prompt: {req}"))
        } else {
            None
        };
        {
            let mut seen = seen.lock().unwrap();
            if let Some(why) = &problem {
                seen.bad.push(why.clone());
            } else {
                seen.completions += 1;
                seen.max_token_id = seen
                    .max_token_id
                    .max(ids.iter().copied().max().unwrap_or(0));
            }
        }
        if let Some(why) = problem {
            return respond(
                stream,
                "400 Bad Request",
                &json!({"error": {"message": why}}),
            );
        }
        // No Content-Length: the stream ends when the connection closes.
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
             Connection: close\r\n\r\n"
        )?;
        for i in 0..max_tokens {
            std::thread::sleep(Duration::from_millis(2));
            let chunk = json!({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                "choices": [{"index": 0, "text": format!(" t{i}"), "finish_reason": null}],
                "usage": null});
            write!(stream, "data: {chunk}\n\n")?;
            stream.flush()?;
        }
        let usage = json!({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
            "choices": [], "usage": {"prompt_tokens": ids.len(), "completion_tokens": max_tokens,
            "total_tokens": ids.len() as u64 + max_tokens}});
        write!(stream, "data: {usage}\n\ndata: [DONE]\n\n")?;
        stream.flush()
    }
}

/// The multi-turn workload through `--launch` with `cache_aware`: every turn is sent after the
/// one before it finished, so each turn's prompt (the last one's plus an answer and a question)
/// finds the earlier turn in some rank's cache and is routed there (branch `cached`); the
/// routing summary lands in compare.json.
#[test]
fn bench_multi_turn_finds_the_previous_turn_cached() {
    let out = out_dir("dpsm");
    let compare = bench_launch(
        out.path(),
        &[
            "--compare",
            "cache_aware",
            "--dataset-name",
            "multi-turn",
            "--kv-event-block-size",
            "16",
            "--gsp-num-groups",
            "3",
            "--gsp-prompts-per-group",
            "3",
            "--gsp-system-prompt-len",
            "64",
            "--gsp-question-len",
            "8",
            "--gsp-output-len",
            "4",
            // One at a time: with two in flight on one rank, the overload guard may rightly
            // spill the second (threshold 1.5 × max(mean active, 1)).
            "--max-concurrency",
            "1",
            "--seed",
            "3",
        ],
    );
    assert_eq!(compare["workload"]["dataset_name"], "multi-turn");
    let m = &compare["methods"][0];
    assert_eq!(m["status"], "ok", "{m}");
    let r = &m["result"];
    assert_eq!(r["completed"], 9);
    assert_eq!(r["failed"], 0);
    // Turn t (0-based): system 64 + t × (question 8 + answer 4) + question 8.
    assert_eq!(r["total_input_tokens"], 3 * (72 + 84 + 96));
    assert!(r["cache_hit_rate"].as_f64().unwrap() > 0.3, "{r}");
    let routing = &m["routing"];
    assert!(routing["decisions"].as_u64().unwrap() >= 9, "{routing}");
    // Turns 2 and 3 of each conversation find their earlier turn cached (the 64-token system
    // prompts are distinct, and 4 whole 16-token blocks of them are in the index).
    assert!(
        routing["branches"]["cached"].as_u64().unwrap() >= 6,
        "{routing}"
    );
    assert_eq!(routing["over_guard"], 0, "{routing}");
}

/// A Mooncake-format trace replayed through `--launch` on tiny CPU ranks: the real
/// conversation trace's first requests when `../shared` is beside the checkout, else a trace
/// this test writes in the same format. Every request finishes with exactly its scaled output
/// length, the prompts have their scaled lengths, and goodput, the ceilings and the per-rank
/// load are in the results.
#[test]
fn bench_replays_a_mooncake_trace_window() {
    let out = out_dir("dpsmc");
    let shared = std::env::var_os("DPSERVE_TEST_SHARED")
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"),
            std::path::PathBuf::from,
        )
        .join("workloads/mooncake/conversation_trace.jsonl");
    let trace = if shared.exists() {
        shared
    } else {
        eprintln!("{} is absent: replaying a written trace", shared.display());
        let path = out.path().join("trace.jsonl");
        let lines: Vec<String> = (0..24)
            .map(|i| {
                // Three conversations whose prompts grow by a block each turn.
                let c = i % 3;
                let blocks: Vec<u64> = (0..=(i / 3) % 4).map(|b| c * 100 + b).collect();
                format!(
                    r#"{{"timestamp": {}, "input_length": {}, "output_length": {}, "hash_ids": {:?}}}"#,
                    i * 250,
                    blocks.len() * 512 - 100,
                    100 + i * 37,
                    blocks
                )
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    };
    let n = 24;
    let (block, scale) = (2usize, 0.02f64);
    let window: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .take(n)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want_in: u64 = window
        .iter()
        .map(|e| (e["input_length"].as_u64().unwrap() * block as u64).div_ceil(512))
        .sum();
    let want_out: u64 = window
        .iter()
        .map(|e| ((e["output_length"].as_f64().unwrap() * scale).round() as u64).max(1))
        .sum();
    let compare = bench_launch(
        out.path(),
        &[
            "--compare",
            "round_robin,cache_aware",
            "--dataset-name",
            "mooncake",
            "--dataset-path",
            trace.to_str().unwrap(),
            "--trace-block-tokens",
            &block.to_string(),
            "--trace-time-compression",
            "40",
            "--trace-output-scale",
            &scale.to_string(),
            "--num-prompts",
            &n.to_string(),
            "--kv-event-block-size",
            "2",
        ],
    );
    let w = &compare["workload"];
    assert_eq!(w["dataset_name"], "mooncake");
    assert_eq!(w["trace"]["block_tokens"], 2);
    assert_eq!(w["trace"]["time_compression"], 40.0);
    for m in compare["methods"].as_array().unwrap() {
        assert_eq!(m["status"], "ok", "{m}");
        let r = &m["result"];
        assert_eq!(r["completed"], n, "{r}");
        assert_eq!(r["failed"], 0, "{r}");
        assert_eq!(r["total_input_tokens"], want_in, "scaled prompt lengths");
        assert_eq!(r["total_output_tokens"], want_out, "exact scaled outputs");
        assert_eq!(r["trace_block_tokens"], 2);
        for key in [
            "goodput",
            "goodput_share",
            "p90_ttft_ms",
            "median_itl_ms",
            "p99_e2e_latency_ms",
            "prompt_load_max_over_mean",
        ] {
            assert!(r[key].as_f64().is_some(), "{key} in {r}");
        }
        let unlimited = r["cache_hit_ceiling_unlimited"].as_f64().unwrap();
        let pooled = r["cache_hit_ceiling_pooled_lru"].as_f64().unwrap();
        assert!(unlimited > 0.0, "the window's prompts share blocks: {r}");
        assert!(pooled <= unlimited + 1e-12, "{r}");
        assert_eq!(r["cache_hit_ceiling_pooled_tokens"], 2 * 4096);
        let hit = r["cache_hit_rate"].as_f64().unwrap();
        // Token-level server matches can pass whole-block ceilings by a partial block (or two
        // random blocks that begin alike), never by more.
        assert!(hit <= unlimited + 0.02, "no router beats the ceiling: {r}");
        assert_eq!(r["refused"], 0);
    }
}

/// SIGTERM to `bench --launch` mid-run stops the cluster it started (a signal ends the process
/// without running the cluster's `Drop`), then exits 143: nothing is left serving on the port.
#[test]
fn a_signalled_bench_stops_its_cluster() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let out = out_dir("dpss");
    // Long enough that the signal lands mid-workload.
    let long = [
        "--compare",
        "round_robin",
        "--gsp-num-groups",
        "8",
        "--gsp-prompts-per-group",
        "64",
        "--gsp-system-prompt-len",
        "64",
        "--gsp-question-len",
        "8",
        "--gsp-output-len",
        "256",
    ];
    let mut bench = bench_launch_command(out.path(), &long)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run dpserve bench");
    let stderr = BufReader::new(bench.stderr.take().unwrap());
    let mut lines = stderr.lines().map_while(Result::ok);
    let url = lines
        .by_ref()
        .find_map(|l| {
            l.split_once("ready at ")
                .map(|(_, rest)| rest.split(';').next().unwrap().to_string())
        })
        .expect("the cluster came up");
    let addr = url.trim_start_matches("http://").to_string();
    assert!(std::net::TcpStream::connect(&addr).is_ok(), "{addr} serves");
    // Keep draining stderr so the benchmark never blocks on a full pipe.
    let drain = std::thread::spawn(move || lines.collect::<Vec<_>>());
    let killed = Command::new("kill")
        .args(["-TERM", &bench.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = bench.wait().unwrap();
    let said = drain.join().unwrap().join("\n");
    assert_eq!(status.code(), Some(143), "{status}: {said}");
    assert!(said.contains("stopping 1 cluster"), "{said}");
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "{addr} still serves after the benchmark was stopped"
    );
}

/// A Qwen-Bailian-format trace of sessions whose turns all carry their parent's timestamp (gaps
/// of 0): replayed through `--launch` on tiny CPU ranks, no turn is sent before its parent's
/// answer has ended, siblings go out together, and every turn completes with its length.
#[test]
fn bench_replays_bailian_sessions_each_turn_after_its_parent() {
    let out = out_dir("dpsbl");
    let path = out.path().join("sessions.jsonl");
    // Per session s: a root, its child, and two siblings under the child; all at the root's
    // time. Prompts grow by a block each turn and share the session's earlier blocks.
    let mut lines = Vec::new();
    for s in 0..3u64 {
        let ts = s as f64 * 0.1;
        let base = s * 100;
        let turns: [(u64, i64, Vec<u64>); 4] = [
            (base + 1, -1, vec![base, base + 1]),
            (base + 2, (base + 1) as i64, vec![base, base + 1, base + 2]),
            (
                base + 3,
                (base + 2) as i64,
                vec![base, base + 1, base + 2, base + 3],
            ),
            (
                base + 4,
                (base + 2) as i64,
                vec![base, base + 1, base + 2, base + 4],
            ),
        ];
        for (id, parent, ids) in turns {
            lines.push((
                ts,
                serde_json::json!({"chat_id": id, "parent_chat_id": parent, "timestamp": ts,
                    "input_length": ids.len() * 16, "output_length": 12, "type": "text",
                    "turn": 1, "hash_ids": ids}),
            ));
        }
    }
    // A fourth session whose second turn comes 2 s of trace after its first (0.5 s at the
    // compression below): sent that long after the first one ended, not after its timestamp.
    lines.push((
        0.3,
        serde_json::json!({"chat_id": 901, "parent_chat_id": -1, "timestamp": 0.3,
            "input_length": 16, "output_length": 12, "type": "text", "turn": 1,
            "hash_ids": [900]}),
    ));
    lines.push((
        2.3,
        serde_json::json!({"chat_id": 902, "parent_chat_id": 901, "timestamp": 2.3,
            "input_length": 32, "output_length": 12, "type": "text", "turn": 2,
            "hash_ids": [900, 901]}),
    ));
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let compare = bench_launch(
        out.path(),
        &[
            "--compare",
            "cache_aware",
            "--dataset-name",
            "bailian",
            "--dataset-path",
            path.to_str().unwrap(),
            "--trace-block-tokens",
            "4",
            "--trace-time-compression",
            "4",
            "--kv-event-block-size",
            "4",
            "--output-details",
        ],
    );
    let w = &compare["workload"];
    assert_eq!(w["dataset_name"], "bailian");
    assert_eq!(w["trace"]["native_block_tokens"], 16);
    let m = &compare["methods"][0];
    assert_eq!(m["status"], "ok", "{m}");
    let r = &m["result"];
    assert_eq!(r["completed"], 14, "{r}");
    assert_eq!(r["total_output_tokens"], 14 * 12, "{r}");
    let d = &r["details"];
    let f = |key: &str, i: usize| d[key][i].as_f64().unwrap();
    // The file is in time order, ties in file order: session s's turns are at 4s..4s+3 in
    // the order root, child, sibling, sibling (the sort above is stable); the fourth session's
    // two turns are next (at 0.3 s) and last (at 2.3 s).
    let (first, second) = (12, 13);
    let wait = f("sent_s", second) - f("ended_s", first);
    assert!(
        (0.45..0.9).contains(&wait),
        "the second turn went {wait:.3} s after the first ended, not the trace's 0.5 s: {d}"
    );
    for s in 0..3 {
        let (root, child, a, b) = (4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3);
        assert_eq!(d["input_lens"][root], 8, "2 blocks of 4 tokens: {d}");
        assert!(
            f("sent_s", child) >= f("ended_s", root),
            "session {s}: the child was sent before its parent ended: {d}"
        );
        for sib in [a, b] {
            assert!(
                f("sent_s", sib) >= f("ended_s", child),
                "session {s}: a sub-turn was sent before its parent ended: {d}"
            );
        }
        assert!(
            (f("sent_s", a) - f("sent_s", b)).abs() < 0.05,
            "session {s}: siblings go together: {d}"
        );
    }
    // Each turn's prompt extends its parent's: the later turns find it cached.
    assert!(r["cache_hit_rate"].as_f64().unwrap() > 0.3, "{r}");
}

/// `--sweep` on tiny CPU ranks: every method at every rate on a fresh cluster, sweep.json with
/// each point's runs and each method's capacity; with an SLO every request meets, the capacity
/// is the top rate flagged a lower bound; with one none meets it is 0, and a method stops at
/// its first rate that misses (unless `--sweep-all-rates`); the table and the chart are
/// written.
#[test]
fn bench_sweep_finds_each_methods_capacity() {
    for (ttft_ms, want_capacity, lower_bound) in [("600000", 8.0, true), ("0.001", 0.0, false)] {
        let all_rates = if lower_bound {
            "--sweep-all-rates"
        } else {
            "--seed=1"
        };
        let out = out_dir("dpsw");
        let status = bench_launch_command(
            out.path(),
            &[
                "--compare",
                "round_robin,prefix_affinity",
                "--gsp-num-groups",
                "2",
                "--gsp-prompts-per-group",
                "3",
                "--gsp-system-prompt-len",
                "32",
                "--gsp-question-len",
                "8",
                "--gsp-output-len",
                "4",
                "--sweep",
                "8,4",
                "--sweep-repeats",
                "2",
                all_rates,
                "--slo-ttft-ms",
                ttft_ms,
                "--slo-itl-ms",
                "600000",
            ],
        )
        .status()
        .expect("run dpserve bench");
        assert!(status.success(), "dpserve bench --sweep failed: {status}");
        let sweep: Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("sweep.json")).unwrap())
                .unwrap();
        assert_eq!(sweep["slo"]["attainment"], 0.9);
        assert_eq!(sweep["rate_unit"], "request_rate");
        let methods = sweep["methods"].as_array().unwrap();
        assert_eq!(methods.len(), 2);
        for m in methods {
            let points = m["points"].as_array().unwrap();
            let rates: Vec<f64> = points.iter().map(|p| p["rate"].as_f64().unwrap()).collect();
            assert_eq!(rates, [4.0, 8.0], "ascending: {m}");
            for (p, runs) in points.iter().zip([2, if lower_bound { 2 } else { 0 }]) {
                assert_eq!(p["attainment"].as_array().unwrap().len(), runs, "{p}");
                assert_eq!(p["achieved_rps"].as_array().unwrap().len(), runs, "{p}");
                assert_eq!(p["offered_rps"], p["rate"]);
            }
            assert_eq!(m["capacity_rps"].as_f64().unwrap(), want_capacity, "{m}");
            assert_eq!(m["capacity_lower_bound"], lower_bound, "{m}");
        }
        assert_eq!(methods[0]["peer"], true, "round_robin is SGLang's");
        assert_eq!(methods[1]["peer"], false, "prefix_affinity is dpserve's");
        let md = std::fs::read_to_string(out.path().join("sweep.md")).unwrap();
        assert!(
            md.contains("capacity req/s") && md.contains("Every run"),
            "{md}"
        );
        let svg = std::fs::read_to_string(out.path().join("sweep.svg")).unwrap();
        assert!(svg.contains("data-series=\"prefix_affinity\""));
    }
}

/// `--sweep-extend`: while a method still meets the target at the highest rate, a rate 1.5
/// times higher is added (here once: 4 → 6 req/s); while every method misses it at the lowest,
/// a rate 1.5 times lower (4 → 2.67).
#[test]
fn bench_sweep_extends_its_rates_while_a_method_still_meets_the_target() {
    for (ttft_ms, want_rates) in [("600000", vec![4.0, 6.0]), ("0.001", vec![2.67, 4.0])] {
        let out = out_dir("dpsx");
        let status = bench_launch_command(
            out.path(),
            &[
                "--compare",
                "round_robin",
                "--gsp-num-groups",
                "2",
                "--gsp-prompts-per-group",
                "2",
                "--gsp-system-prompt-len",
                "32",
                "--gsp-question-len",
                "8",
                "--gsp-output-len",
                "4",
                "--sweep",
                "4",
                "--sweep-extend",
                "1",
                "--sweep-repeats",
                "1",
                "--slo-ttft-ms",
                ttft_ms,
                "--slo-itl-ms",
                "600000",
            ],
        )
        .status()
        .expect("run dpserve bench");
        assert!(status.success(), "dpserve bench --sweep failed: {status}");
        let sweep: Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("sweep.json")).unwrap())
                .unwrap();
        let m = &sweep["methods"][0];
        let rates: Vec<f64> = m["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["rate"].as_f64().unwrap())
            .collect();
        assert_eq!(rates, want_rates, "{m}");
    }
}
