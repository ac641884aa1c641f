//! The benchmark's HTTP client: sends one workload request as a streaming request to the native
//! `/generate` or the OpenAI `/v1/completions` endpoint and times it from the SSE events, plus
//! the few control calls a run needs (`/get_server_info`, `/v1/models`, `/flush_cache`).
//!
//! Timing is taken when an event's line is complete in the receive buffer, so TTFT and ITL are
//! what a streaming client sees. Not for load generation without streaming.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::metrics::{chunk_itl, RequestOutcome};
use super::workload::BenchRequest;

/// Which API the benchmark drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// SGLang-native `POST /generate` (SSE with `output_ids` and `meta_info`).
    Generate,
    /// OpenAI `POST /v1/completions` (SSE, `stream_options.include_usage`).
    Openai,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Generate => "generate",
            Backend::Openai => "openai",
        }
    }
}

/// Header carrying the routing key (docs/ARCHITECTURE.md, "HTTP API").
pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";

#[derive(Clone)]
pub struct BenchClient {
    http: reqwest::Client,
    base_url: String,
    backend: Backend,
    /// `model` for the OpenAI API (the served model name).
    model: String,
}

impl BenchClient {
    pub fn new(base_url: &str, backend: Backend, model: Option<String>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(1024)
            .build()
            .context("building the HTTP client")?;
        Ok(BenchClient {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
            backend,
            model: model.unwrap_or_else(|| "default".to_string()),
        })
    }

    pub fn set_model(&mut self, model: String) {
        self.model = model;
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    pub async fn server_info(&self) -> anyhow::Result<Value> {
        self.get_optional("/get_server_info")
            .await?
            .map_err(|why| anyhow::anyhow!("GET /get_server_info: {why}"))
    }

    /// `GET path` as JSON. `Ok(Err(why))` when the server answered but not with JSON (an
    /// endpoint it does not have: `HTTP 404 Not Found`); `Err` when it did not answer at all.
    pub async fn get_optional(&self, path: &str) -> anyhow::Result<Result<Value, String>> {
        let resp = self
            .http
            .get(self.url(path))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .with_context(|| format!("GET {}{path}", self.base_url))?;
        let status = resp.status();
        if !status.is_success() {
            return Ok(Err(format!("HTTP {status}")));
        }
        Ok(resp
            .json()
            .await
            .map_err(|e| format!("HTTP {status} but not JSON ({e})")))
    }

    /// `POST /flush_cache`, retried while the server still reports pending requests (400): the
    /// ranks' status of the warm-up's last requests may lag their final outputs a little.
    pub async fn flush_cache(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let resp = self
                .http
                .post(self.url("/flush_cache"))
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .context("POST /flush_cache")?;
            let status = resp.status();
            if status == reqwest::StatusCode::BAD_REQUEST && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let body = resp.text().await.unwrap_or_default();
            anyhow::ensure!(
                status.is_success(),
                "POST /flush_cache: HTTP {status}: {body}"
            );
            return Ok(());
        }
    }

    /// The request: typed, so a long prompt is written straight from its ids (a `Value` tree
    /// of them costs an allocation per token, and the trace's prompts run to 126 k tokens).
    fn body<'r>(&'r self, req: &'r BenchRequest) -> (&'static str, Body<'r>) {
        match self.backend {
            Backend::Generate => (
                "/generate",
                Body::Generate {
                    input_ids: &req.input_ids,
                    sampling_params: SamplingParams {
                        max_new_tokens: req.output_len,
                        temperature: 0.0,
                        ignore_eos: true,
                    },
                    stream: true,
                },
            ),
            Backend::Openai => (
                "/v1/completions",
                Body::Completions {
                    model: &self.model,
                    prompt: &req.input_ids,
                    max_tokens: req.output_len,
                    temperature: 0.0,
                    ignore_eos: true,
                    stream: true,
                    stream_options: StreamOptions {
                        include_usage: true,
                    },
                },
            ),
        }
    }

    /// Sends `req` and times its stream. Never fails: errors become an unsuccessful outcome.
    pub async fn send(&self, req: &BenchRequest) -> RequestOutcome {
        let mut out = RequestOutcome {
            prompt_len: req.prompt_len(),
            ..Default::default()
        };
        let start = Instant::now();
        if let Err(err) = self.stream(req, start, &mut out).await {
            out.success = false;
            out.error = Some(format!("{err:#}"));
        }
        out.latency_s = start.elapsed().as_secs_f64();
        out
    }

    async fn stream(
        &self,
        req: &BenchRequest,
        start: Instant,
        out: &mut RequestOutcome,
    ) -> anyhow::Result<()> {
        let (path, body) = self.body(req);
        let mut builder = self.http.post(self.url(path)).json(&body);
        if let Some(key) = &req.routing_key {
            builder = builder.header(ROUTING_KEY_HEADER, key);
        }
        let mut resp = builder.send().await.context("sending")?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            anyhow::bail!("HTTP {status}: {}", truncate(&text, 300));
        }
        let mut parser = StreamParser::new(self.backend);
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.context("reading the stream")? {
            buf.extend_from_slice(&chunk);
            let now = start.elapsed().as_secs_f64();
            // Every complete line; a partial one stays in the buffer.
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                parser.line(&line, now)?;
            }
            if parser.done {
                break;
            }
        }
        parser.finish(out)
    }
}

/// A benchmark request's body, for either API.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Body<'r> {
    Generate {
        input_ids: &'r [u32],
        sampling_params: SamplingParams,
        stream: bool,
    },
    Completions {
        model: &'r str,
        prompt: &'r [u32],
        max_tokens: usize,
        temperature: f64,
        ignore_eos: bool,
        stream: bool,
        stream_options: StreamOptions,
    },
}

#[derive(serde::Serialize)]
struct SamplingParams {
    max_new_tokens: usize,
    temperature: f64,
    ignore_eos: bool,
}

#[derive(serde::Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// What the benchmark reads of an SSE event, of either API (everything else, the text
/// included, is skipped unread).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Event {
    error: Option<Value>,
    meta_info: Option<MetaInfo>,
    output_ids: Option<Vec<u32>>,
    choices: Option<Vec<serde::de::IgnoredAny>>,
    usage: Option<Usage>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct MetaInfo {
    #[serde(deserialize_with = "count")]
    prompt_tokens: Option<u64>,
    #[serde(deserialize_with = "count")]
    completion_tokens: Option<u64>,
    #[serde(deserialize_with = "count")]
    cached_tokens: Option<u64>,
    #[serde(deserialize_with = "count")]
    dp_rank: Option<u64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Usage {
    #[serde(deserialize_with = "count")]
    prompt_tokens: Option<u64>,
    #[serde(deserialize_with = "count")]
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct PromptTokensDetails {
    #[serde(deserialize_with = "count")]
    cached_tokens: Option<u64>,
}

/// A count or index another server may write differently (null, negative, a string): read when
/// it is a non-negative integer, ignored otherwise, never failing the event.
fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(<Value as serde::Deserialize>::deserialize(d)?.as_u64())
}

/// Folds SSE lines into an outcome.
struct StreamParser {
    backend: Backend,
    done: bool,
    first_token_s: Option<f64>,
    last_token_s: f64,
    tokens_seen: usize,
    itl_s: Vec<f64>,
    completion_tokens: Option<usize>,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    dp_rank: Option<u32>,
    /// The last `/generate` event's `output_ids`.
    last_ids: Vec<u32>,
}

impl StreamParser {
    fn new(backend: Backend) -> Self {
        StreamParser {
            backend,
            done: false,
            first_token_s: None,
            last_token_s: 0.0,
            tokens_seen: 0,
            itl_s: Vec::new(),
            completion_tokens: None,
            prompt_tokens: None,
            cached_tokens: None,
            dp_rank: None,
            last_ids: Vec::new(),
        }
    }

    fn line(&mut self, line: &[u8], now_s: f64) -> anyhow::Result<()> {
        let line = match std::str::from_utf8(line) {
            Ok(line) => std::borrow::Cow::Borrowed(line),
            Err(_) => String::from_utf8_lossy(line),
        };
        let Some(data) = line.trim().strip_prefix("data:") else {
            return Ok(()); // comments, `event:` lines, blank separators
        };
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let event: Event = serde_json::from_str(data)
            .with_context(|| format!("bad SSE event {}", truncate(data, 200)))?;
        if let Some(err) = event.error.as_ref().filter(|e| !e.is_null()) {
            anyhow::bail!("server error: {}", truncate(&err.to_string(), 300));
        }
        let tokens = match self.backend {
            Backend::Generate => self.generate_event(event),
            Backend::Openai => self.openai_event(event),
        };
        if tokens > 0 {
            match self.first_token_s {
                None => self.first_token_s = Some(now_s),
                Some(_) => self
                    .itl_s
                    .extend(chunk_itl(now_s - self.last_token_s, tokens)),
            }
            self.last_token_s = now_s;
            self.tokens_seen += tokens;
        }
        Ok(())
    }

    /// Tokens a `/generate` event adds, in either stream form (SGLang's default, where each
    /// event carries every id so far, or `--incremental-streaming-output`, where each carries
    /// its own step's): the growth of `meta_info.completion_tokens`, which both forms carry;
    /// without it, the growth of `output_ids` (see [`StreamParser::ids_added`]).
    fn generate_event(&mut self, event: Event) -> usize {
        let meta = event.meta_info.unwrap_or_default();
        if let Some(n) = meta.prompt_tokens {
            self.prompt_tokens = Some(n);
        }
        if let Some(n) = meta.cached_tokens {
            self.cached_tokens = Some(n);
        }
        if let Some(r) = meta.dp_rank {
            self.dp_rank = Some(r as u32);
        }
        match meta.completion_tokens {
            Some(n) => {
                let before = self.completion_tokens.replace(n as usize).unwrap_or(0);
                (n as usize).saturating_sub(before)
            }
            None => event.output_ids.map_or(0, |ids| self.ids_added(ids)),
        }
    }

    /// How many ids `ids` adds: a list that extends the last event's is everything so far
    /// (cumulative); any other is one step's own.
    fn ids_added(&mut self, ids: Vec<u32>) -> usize {
        let cumulative = !self.last_ids.is_empty()
            && ids.len() >= self.last_ids.len()
            && ids.starts_with(&self.last_ids);
        let added = if cumulative {
            ids.len() - self.last_ids.len()
        } else {
            ids.len()
        };
        self.last_ids = ids;
        added
    }

    /// Tokens carried by a `/v1/completions` event: a chunk with a choice is one step (the
    /// API does not say how many tokens it holds; one, as bench_serving assumes); the usage
    /// chunk carries the counts.
    fn openai_event(&mut self, event: Event) -> usize {
        if let Some(usage) = event.usage {
            self.prompt_tokens = usage.prompt_tokens;
            self.completion_tokens = usage.completion_tokens.map(|n| n as usize);
            self.cached_tokens = usage.prompt_tokens_details.and_then(|d| d.cached_tokens);
        }
        if let Some(r) = event.meta_info.and_then(|m| m.dp_rank) {
            self.dp_rank = Some(r as u32);
        }
        match event.choices {
            Some(c) if !c.is_empty() => 1,
            _ => 0,
        }
    }

    fn finish(self, out: &mut RequestOutcome) -> anyhow::Result<()> {
        let Some(first) = self.first_token_s else {
            anyhow::bail!("stream ended without a token");
        };
        out.ttft_s = first;
        out.itl_s = self.itl_s;
        out.output_len = self.completion_tokens.unwrap_or(self.tokens_seen);
        out.server_prompt_tokens = self.prompt_tokens;
        out.cached_tokens = self.cached_tokens;
        out.dp_rank = self.dp_rank;
        out.success = true;
        Ok(())
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(backend: Backend, lines: &[(&str, f64)]) -> anyhow::Result<RequestOutcome> {
        let mut p = StreamParser::new(backend);
        for (l, t) in lines {
            p.line(format!("{l}\n").as_bytes(), *t)?;
        }
        let mut out = RequestOutcome::default();
        p.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn generate_stream_times_token_chunks() {
        let out = feed(
            Backend::Generate,
            &[
                (r#"data: {"text":"","output_ids":[],"meta_info":{"prompt_tokens":10}}"#, 0.05),
                ("", 0.05),
                (r#"data: {"text":"","output_ids":[5],"meta_info":{"completion_tokens":1}}"#, 0.1),
                (r#"data: {"text":"ab","output_ids":[6,7],"meta_info":{"completion_tokens":3}}"#, 0.3),
                (
                    r#"data: {"text":"c","output_ids":[8],"meta_info":{"prompt_tokens":10,"completion_tokens":4,"cached_tokens":6,"dp_rank":1,"finish_reason":{"type":"length"}}}"#,
                    0.4,
                ),
                ("data: [DONE]", 0.4),
            ],
        )
        .unwrap();
        assert_eq!(
            out.ttft_s, 0.1,
            "first chunk carrying a token, even with empty text"
        );
        assert_eq!(out.output_len, 4);
        assert_eq!(out.itl_s.len(), 3);
        assert!((out.itl_s[0] - 0.1).abs() < 1e-12 && (out.itl_s[2] - 0.1).abs() < 1e-12);
        assert_eq!(
            (out.cached_tokens, out.server_prompt_tokens, out.dp_rank),
            (Some(6), Some(10), Some(1))
        );
    }

    #[test]
    fn generate_stream_reads_both_forms() {
        // SGLang's default: every event holds everything so far.
        let cumulative = [
            (
                r#"data: {"text":"a","output_ids":[5],"meta_info":{"completion_tokens":1}}"#,
                0.1,
            ),
            (
                r#"data: {"text":"abc","output_ids":[5,6,7],"meta_info":{"completion_tokens":3}}"#,
                0.3,
            ),
            (
                r#"data: {"text":"abcd","output_ids":[5,6,7,8],"meta_info":{"completion_tokens":4,"finish_reason":{"type":"length"}}}"#,
                0.4,
            ),
            ("data: [DONE]", 0.4),
        ];
        // The same without the counts: the ids alone say it.
        let uncounted = [
            (r#"data: {"text":"a","output_ids":[5]}"#, 0.1),
            (r#"data: {"text":"abc","output_ids":[5,6,7]}"#, 0.3),
            (r#"data: {"text":"abcd","output_ids":[5,6,7,8]}"#, 0.4),
            ("data: [DONE]", 0.4),
        ];
        // --incremental-streaming-output, without the counts.
        let incremental = [
            (r#"data: {"text":"a","output_ids":[5]}"#, 0.1),
            (r#"data: {"text":"bc","output_ids":[6,7]}"#, 0.3),
            (r#"data: {"text":"d","output_ids":[8]}"#, 0.4),
            ("data: [DONE]", 0.4),
        ];
        for lines in [&cumulative, &uncounted, &incremental] {
            let out = feed(Backend::Generate, lines).unwrap();
            assert_eq!((out.ttft_s, out.output_len), (0.1, 4), "{lines:?}");
            assert_eq!(out.itl_s.len(), 3, "{lines:?}");
        }
    }

    #[test]
    fn openai_stream_uses_usage() {
        let out = feed(
            Backend::Openai,
            &[
                (r#"data: {"choices":[{"index":0,"text":"a"}],"usage":null}"#, 0.2),
                (r#"data: {"choices":[{"index":0,"text":"b"}],"usage":null}"#, 0.25),
                (
                    r#"data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
                    0.26,
                ),
                ("data: [DONE]", 0.26),
            ],
        )
        .unwrap();
        assert_eq!(out.ttft_s, 0.2);
        assert_eq!(out.output_len, 2);
        assert_eq!(out.itl_s.len(), 1);
        assert_eq!(out.cached_tokens, Some(4));
    }

    #[test]
    fn odd_meta_values_are_ignored_not_fatal() {
        let out = feed(
            Backend::Generate,
            &[
                (
                    r#"data: {"text":"a","output_ids":[5],"meta_info":{"dp_rank":-1,"cached_tokens":null,"prompt_tokens":"10","completion_tokens":1}}"#,
                    0.1,
                ),
                ("data: [DONE]", 0.1),
            ],
        )
        .unwrap();
        assert_eq!(
            (out.output_len, out.dp_rank, out.cached_tokens),
            (1, None, None)
        );
        assert_eq!(out.server_prompt_tokens, None);
    }

    #[test]
    fn errors_in_the_stream_fail_the_request() {
        let err = feed(
            Backend::Generate,
            &[(r#"data: {"error":{"message":"boom"}}"#, 0.1)],
        )
        .unwrap_err();
        assert!(err.to_string().contains("boom"));
        assert!(
            feed(Backend::Generate, &[("data: [DONE]", 0.1)]).is_err(),
            "no token"
        );
    }
}
