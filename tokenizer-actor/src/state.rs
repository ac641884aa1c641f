//! State shared by every HTTP worker thread: the tokenizer, the model's facts, the socket
//! bridge and the settings requests are served with. Request state lives per request
//! (`http::inflight`), never here.

use std::sync::Arc;

use protocol::builtin::MODEL_ID;

use crate::args::TokenizerArgs;
use crate::bridge::Bridge;
use crate::chat_template::{ChatTemplate, ToolCallFormat};
use crate::error::Result;
use crate::http::validate::Limits;
use crate::metrics::Metrics;
use crate::tokenizer::{LoadedTokenizer, ModelFacts, TextTokenizer};

pub struct AppState {
    pub tokenizer: Box<dyn TextTokenizer>,
    pub facts: ModelFacts,
    pub bridge: Arc<Bridge>,
    pub args: TokenizerArgs,
    pub served_model_name: String,
    pub chat_template: ChatTemplate,
    pub metrics: Metrics,
    /// Accepted API keys (`--api-key`, `--api-key-file`); empty: none asked for.
    pub api_keys: Vec<String>,
    /// Paths served without a key (`--open-endpoints`).
    pub open_paths: Vec<&'static str>,
    /// Structured output: the model's vocabulary, read on the first constrained request.
    pub grammars: Arc<grammar::LazyGrammars>,
}

impl AppState {
    /// Load the tokenizer and open the sockets; fails with a clear error on bad files or
    /// addresses. Must be called inside an actix `System` (the bridge starts actors).
    pub fn start(args: &TokenizerArgs) -> Result<AppState> {
        let api_keys = args.http.api_keys()?;
        let open_paths = args.http.open_paths()?;
        let LoadedTokenizer { tokenizer, facts } =
            LoadedTokenizer::load(args.model_path.as_deref())?;
        let mut chat_template = ChatTemplate::load(args.http.chat_template.as_deref(), &facts)?;
        if let Some(name) = &args.http.tool_call_parser {
            chat_template.tool_format = Some(ToolCallFormat::parse(name).map_err(|reason| {
                crate::error::TokenizerError::Flag {
                    flag: "--tool-call-parser",
                    reason,
                }
            })?);
        }
        let tracer = match &args.trace_dir {
            Some(dir) => protocol::msg_trace::MessageTracer::open_capped(
                dir,
                "tokenizer",
                None,
                args.trace_max_mb << 20,
            )
            .map_err(|error| crate::error::TokenizerError::Io {
                what: format!("--trace-dir {}", dir.display()),
                error,
            })?,
            None => protocol::msg_trace::MessageTracer::disabled(),
        };
        let bridge = Arc::new(Bridge::start(
            &args.tokenizer_addr,
            &args.controller_addr,
            &args.security,
            tracer,
            args.http.max_in_flight_requests,
        )?);
        let served_model_name = args
            .http
            .served_model_name
            .clone()
            .unwrap_or_else(|| model_path_str(&facts));
        tracing::info!(
            model = %served_model_name,
            vocab_size = facts.vocab_size,
            context_len = facts.context_len,
            chat_template = %chat_template.source.describe(),
            api_keys = api_keys.len(),
            open_without_key = ?open_paths,
            "tokenizer loaded"
        );
        let grammars = Arc::new(match &facts.model_path {
            Some(dir) => grammar::LazyGrammars::tokenizer_json(
                dir.join("tokenizer.json"),
                facts.vocab_size,
                facts.eos_token_ids.clone(),
            ),
            None => grammar::LazyGrammars::none(grammar::BUILTIN_HAS_NO_BYTES),
        });
        Ok(AppState {
            grammars,
            tokenizer,
            facts,
            bridge,
            args: args.clone(),
            served_model_name,
            chat_template,
            metrics: Metrics::default(),
            api_keys,
            open_paths,
        })
    }

    /// Live ranks per a fresh cluster status, `None` when there is none.
    pub async fn fresh_cluster(&self) -> Option<protocol::ClusterStatus> {
        let latest = self.bridge.cluster().await;
        latest
            .filter(|snap| snap.is_fresh())
            .map(|snap| snap.status)
    }

    /// The limits the live ranks announce (the shortest context and vocabulary among them: a
    /// worker may run a shorter context than the config allows, and a simulated rank the
    /// context of the model it simulates), the tokenizer's model config where none says.
    pub async fn limits(&self) -> Limits {
        let cluster = self.fresh_cluster().await;
        let mut limits = Limits {
            vocab_size: self.facts.vocab_size,
            context_len: self.facts.context_len,
            live_ranks: None,
        };
        if let Some(status) = cluster {
            let announced = status
                .live_ranks
                .iter()
                .map(|r| r.capacity.context_len as usize)
                .filter(|&c| c > 0)
                .min();
            if let Some(context_len) = announced {
                limits.context_len = context_len;
            }
            for r in &status.live_ranks {
                if r.capacity.vocab_size > 0 {
                    limits.vocab_size = limits.vocab_size.min(r.capacity.vocab_size as usize);
                }
            }
            limits.live_ranks = Some(status.live_ranks.iter().map(|r| r.rank).collect());
        }
        limits
    }
}

/// The model path as shown to clients; the built-in model's id when there is none.
pub fn model_path_str(facts: &ModelFacts) -> String {
    facts
        .model_path
        .as_ref()
        .map_or_else(|| MODEL_ID.to_string(), |p| p.display().to_string())
}
