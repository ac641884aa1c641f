//! Command-line flags of the tokenizer actor. Every flag also reads `DPSERVE_<NAME>`, and every
//! default lives once, in [`Defaults`], so clap, `Default` and the docs cannot disagree.

use std::path::PathBuf;

/// The single source of the defaults below.
pub struct Defaults;

impl Defaults {
    pub const HOST: &'static str = "127.0.0.1";
    pub const PORT: u16 = 30000;
    pub const DP_SIZE: u32 = 1;
    /// Large enough for a long prompt given as `input_ids` in JSON (~8 bytes per id).
    pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;
    pub const REQUEST_TIMEOUT_S: u64 = 600;
    /// Past this many requests in flight a new one is refused at once (429).
    pub const MAX_IN_FLIGHT_REQUESTS: usize = 4096;

    /// The tokenizer's socket in the default runtime directory, shared by every actor's
    /// defaults so processes started alone on one host find each other.
    pub fn tokenizer_addr() -> String {
        protocol::endpoint::default_endpoint("tokenizer").to_string()
    }

    pub fn controller_addr() -> String {
        protocol::endpoint::default_endpoint("controller").to_string()
    }
}

/// Flags of `dpserve tokenizer`.
#[derive(clap::Args, Debug, Clone)]
pub struct TokenizerArgs {
    #[command(flatten)]
    pub http: HttpArgs,

    /// Hugging Face model directory (tokenizer.json, config.json); without it the built-in
    /// word-level tokenizer of the dummy model is used.
    #[arg(long, env = "DPSERVE_MODEL_PATH")]
    pub model_path: Option<PathBuf>,

    /// Endpoint this actor binds (PULL) for token outputs and cluster status.
    #[arg(long, env = "DPSERVE_TOKENIZER_ADDR", default_value_t = Defaults::tokenizer_addr())]
    pub tokenizer_addr: String,

    /// Endpoint of the controller (PUSH) for requests, aborts and cache flushes.
    #[arg(long, env = "DPSERVE_CONTROLLER_ADDR", default_value_t = Defaults::controller_addr())]
    pub controller_addr: String,

    /// Expected number of data-parallel ranks; server info reports it as `dp_size` only while
    /// no rank is live (then it reports the live ranks).
    #[arg(long, env = "DPSERVE_DP_SIZE", default_value_t = Defaults::DP_SIZE)]
    pub dp_size: u32,

    /// Append one JSON line per message sent or received, and per request milestone (first
    /// token, finished), to DIR/tokenizer.jsonl (`dpserve trace DIR --rid R` merges the
    /// actors' files).
    #[arg(long, env = "DPSERVE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// A message-trace file past this many MiB is renamed `<actor>.old.jsonl` (replacing the
    /// previous one) and a new one starts, so traces take at most about twice this per actor.
    #[arg(long, env = "DPSERVE_TRACE_MAX_MB", default_value_t = protocol::msg_trace::DEFAULT_TRACE_MAX_MB)]
    pub trace_max_mb: u64,
    #[command(flatten)]
    pub security: protocol::SecurityArgs,
}

/// The HTTP server's flags (also `dpserve up`'s, which flattens them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct HttpArgs {
    /// Address the HTTP server listens on.
    #[arg(long, env = "DPSERVE_HOST", default_value = Defaults::HOST)]
    pub host: String,

    /// Port the HTTP server listens on (0 picks a free one).
    #[arg(long, env = "DPSERVE_PORT", default_value_t = Defaults::PORT)]
    pub port: u16,

    /// Model name shown by `/v1/models` and server info (default: the model path, or the
    /// built-in model id).
    #[arg(long, env = "DPSERVE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,

    /// Largest accepted HTTP request body, in bytes.
    #[arg(long, env = "DPSERVE_MAX_REQUEST_BYTES", default_value_t = Defaults::MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// A request with no final output within this many seconds ends with a 504 and is aborted.
    #[arg(long, env = "DPSERVE_REQUEST_TIMEOUT_S", default_value_t = Defaults::REQUEST_TIMEOUT_S)]
    pub request_timeout_s: u64,

    /// Require `Authorization: Bearer KEY` on every endpoint except `--open-endpoints`.
    #[arg(long, env = "DPSERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// A file of API keys, one per line (blank lines and `#` comments skipped), each accepted
    /// as `--api-key` is; with `--api-key`, both are. Read once at start: a file that cannot
    /// be read or holds no key stops the start (exit status 78).
    #[arg(long, env = "DPSERVE_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// Endpoints served without a key when keys are set: `health`, `metrics`, both
    /// (comma-separated), or `none`.
    #[arg(
        long,
        env = "DPSERVE_OPEN_ENDPOINTS",
        value_enum,
        value_delimiter = ',',
        default_value = "health"
    )]
    pub open_endpoints: Vec<OpenEndpoint>,

    /// Serve HTTPS with this PEM certificate chain (leaf first); needs `--ssl-keyfile`.
    #[arg(long, env = "DPSERVE_SSL_CERTFILE")]
    pub ssl_certfile: Option<PathBuf>,

    /// The PEM private key (unencrypted) of `--ssl-certfile`; read once at start: a file that
    /// cannot be read, does not match the certificate, or others may read (more than 0600, or
    /// 0640 owned by root) stops the start (exit status 78).
    #[arg(long, env = "DPSERVE_SSL_KEYFILE")]
    pub ssl_keyfile: Option<PathBuf>,

    /// Chat template for `/v1/chat/completions`: a Jinja file, or a JSON file with a
    /// `chat_template` field (default: the model's `tokenizer_config.json`).
    #[arg(long, env = "DPSERVE_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// How the model writes a tool call, read back with `tool_choice: "auto"` (SGLang's names:
    /// `hermes` = `qwen25` = `qwen3`, `llama3`, `mistral`); default: the format the chat
    /// template writes (`<tool_call>`, `<|python_tag|>`/`ipython`, `[TOOL_CALLS]`).
    #[arg(long, env = "DPSERVE_TOOL_CALL_PARSER",
          value_parser = ["hermes", "qwen25", "qwen3", "llama3", "mistral"])]
    pub tool_call_parser: Option<String>,
    /// Most generation and embedding requests in flight at once (admitted and not yet
    /// answered); past it a new one is refused at once with 429 and `Retry-After`, counted in
    /// `dpserve:requests_refused_total`, so a burst cannot grow the server's memory.
    #[arg(long, env = "DPSERVE_MAX_IN_FLIGHT_REQUESTS", default_value_t = Defaults::MAX_IN_FLIGHT_REQUESTS,
          value_parser = at_least_one)]
    pub max_in_flight_requests: usize,
    /// Stream `/generate` as SGLang's `--incremental-streaming-output` does: each chunk
    /// carries only its own text, `output_ids` and log-probabilities. Without it (SGLang's
    /// default) each chunk carries everything so far. The OpenAI endpoints stream deltas
    /// either way, as OpenAI's API has them.
    #[arg(long, env = "DPSERVE_INCREMENTAL_STREAMING_OUTPUT")]
    pub incremental_streaming_output: bool,
}

/// An endpoint `--open-endpoints` can leave open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpenEndpoint {
    /// `/health`, for load balancers and readiness checks.
    Health,
    /// `/metrics`, for a Prometheus scraper without the key.
    Metrics,
    /// None: every endpoint wants the key.
    None,
}

impl HttpArgs {
    /// Every accepted API key: `--api-key` and the lines of `--api-key-file`. Empty: no key
    /// is asked for.
    pub fn api_keys(&self) -> crate::error::Result<Vec<String>> {
        let mut keys: Vec<String> = self.api_key.iter().cloned().collect();
        if let Some(path) = &self.api_key_file {
            let refused = |reason: String| crate::error::TokenizerError::ApiKeyFile {
                path: path.clone(),
                reason,
            };
            let text = std::fs::read_to_string(path).map_err(|e| refused(e.to_string()))?;
            let before = keys.len();
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(String::from),
            );
            if keys.len() == before {
                return Err(refused(
                    "holds no key (one per line; blank lines and # comments are skipped)".into(),
                ));
            }
        }
        Ok(keys)
    }

    /// The server's TLS settings with `--ssl-certfile` and `--ssl-keyfile`; `None` without
    /// them (plain HTTP). One without the other, or a bad file, is refused.
    pub fn tls(&self) -> crate::error::Result<Option<rustls::ServerConfig>> {
        crate::tls::files(self.ssl_certfile.as_ref(), self.ssl_keyfile.as_ref())?
            .map(|(cert, key)| crate::tls::server_config(&cert, &key))
            .transpose()
    }

    /// The paths served without a key; refuses `none` beside another endpoint.
    pub fn open_paths(&self) -> crate::error::Result<Vec<&'static str>> {
        let none = self.open_endpoints.contains(&OpenEndpoint::None);
        if none && self.open_endpoints.len() > 1 {
            return Err(crate::error::TokenizerError::Flag {
                flag: "open-endpoints",
                reason: "`none` cannot be listed beside an endpoint".into(),
            });
        }
        Ok(self
            .open_endpoints
            .iter()
            .filter_map(|e| match e {
                OpenEndpoint::Health => Some("/health"),
                OpenEndpoint::Metrics => Some("/metrics"),
                OpenEndpoint::None => None,
            })
            .collect())
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number >= 1, got {s:?}")),
    }
}

impl Default for HttpArgs {
    fn default() -> Self {
        HttpArgs {
            host: Defaults::HOST.to_string(),
            port: Defaults::PORT,
            served_model_name: None,
            max_request_bytes: Defaults::MAX_REQUEST_BYTES,
            request_timeout_s: Defaults::REQUEST_TIMEOUT_S,
            api_key: None,
            api_key_file: None,
            open_endpoints: vec![OpenEndpoint::Health],
            ssl_certfile: None,
            ssl_keyfile: None,
            chat_template: None,
            tool_call_parser: None,
            max_in_flight_requests: Defaults::MAX_IN_FLIGHT_REQUESTS,
            incremental_streaming_output: false,
        }
    }
}

impl Default for TokenizerArgs {
    fn default() -> Self {
        TokenizerArgs {
            http: HttpArgs::default(),
            model_path: None,
            tokenizer_addr: Defaults::tokenizer_addr(),
            controller_addr: Defaults::controller_addr(),
            dp_size: Defaults::DP_SIZE,
            trace_dir: None,
            trace_max_mb: protocol::msg_trace::DEFAULT_TRACE_MAX_MB,
            security: protocol::SecurityArgs::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TokenizerArgs,
    }

    #[test]
    fn clap_defaults_match_default_impl() {
        let parsed = Cli::parse_from(["x"]).args;
        let def = TokenizerArgs::default();
        assert_eq!(parsed.http, def.http);
        assert_eq!(parsed.dp_size, def.dp_size);
        assert_eq!(parsed.tokenizer_addr, def.tokenizer_addr);
        assert_eq!(parsed.controller_addr, def.controller_addr);
    }
}
