//! What `dpserve bench` learns about a server before it runs: the vocabulary size the workload
//! draws token ids from and the model name the OpenAI API wants, each with where it came from.
//! dpserve (and SGLang) answer `GET /get_server_info`; other OpenAI-compatible servers
//! (llama.cpp's llama-server, vLLM) do not, and then flags or `GET /v1/models` supply them.
//! Not for the run's results: a server without `/get_server_info` leaves the server-side
//! numbers (method, per-rank cache hit rates) unknown, and the report says so.

use std::fmt;

use anyhow::Context;
use serde_json::Value;

use super::client::BenchClient;

/// Where a value the bench runs with came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag (its name).
    Flag(&'static str),
    /// dpserve's `GET /get_server_info`.
    ServerInfo,
    /// `GET /v1/models`.
    Models,
    /// Nothing said: the client's default.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Flag(name) => name,
            Source::ServerInfo => "/get_server_info",
            Source::Models => "/v1/models",
            Source::Default => "default",
        })
    }
}

/// What the bench knows about the server it is about to measure.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    pub vocab_size: u32,
    pub vocab_from: Source,
    /// The OpenAI `model` to send; `None` leaves the client's default.
    pub model: Option<String>,
    pub model_from: Source,
    /// `/get_server_info`'s answer, or why there is none (e.g. `HTTP 404 Not Found`).
    pub server_info: Result<Value, String>,
}

impl ServerFacts {
    /// One sentence per thing the run assumed instead of reading it from `/get_server_info`;
    /// empty against dpserve with no flags.
    pub fn notes(&self, backend_uses_model: bool) -> Vec<String> {
        let mut notes = Vec::new();
        if let Err(why) = &self.server_info {
            notes.push(format!(
                "GET /get_server_info: {why}: not a dpserve server, so the load-balance method, \
                 DP size and per-rank cache hit rates are unknown (and the cache hit rate and \
                 requests per rank too, unless the server reports them per request)"
            ));
        }
        if self.vocab_from != Source::ServerInfo {
            notes.push(format!(
                "token ids drawn from a vocabulary of {} (from {})",
                self.vocab_size, self.vocab_from
            ));
        }
        if backend_uses_model && self.model_from != Source::ServerInfo {
            notes.push(match &self.model {
                Some(m) => format!("model {m:?} (from {})", self.model_from),
                None => "model \"default\" (the server named none; pass --model)".to_string(),
            });
        }
        notes
    }
}

/// The vocabulary size `/v1/models` reports for `model` (or its only/first entry), where the
/// server says it: llama.cpp's llama-server puts it in `data[].meta.n_vocab`.
pub fn models_vocab_size(models: &Value, model: Option<&str>) -> Option<u32> {
    let entry = model_entry(models, model)?;
    entry["meta"]["n_vocab"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
}

/// The id of the first model `/v1/models` lists.
pub fn models_first_id(models: &Value) -> Option<String> {
    models["data"]
        .as_array()?
        .iter()
        .find_map(|m| m["id"].as_str())
        .map(str::to_string)
}

fn model_entry<'a>(models: &'a Value, model: Option<&str>) -> Option<&'a Value> {
    let data = models["data"].as_array()?;
    match model {
        Some(id) => data.iter().find(|m| m["id"].as_str() == Some(id)),
        None => data.first(),
    }
}

/// Asks the server what it can tell; flags win over what it says.
pub async fn probe(
    client: &BenchClient,
    vocab_flag: Option<u32>,
    model_flag: Option<&str>,
) -> anyhow::Result<ServerFacts> {
    let server_info = client.get_optional("/get_server_info").await?;
    let info = server_info.as_ref().ok();

    let (mut model, mut model_from) = match model_flag {
        Some(m) => (Some(m.to_string()), Source::Flag("--model")),
        None => match info.and_then(|i| i["served_model_name"].as_str()) {
            Some(m) => (Some(m.to_string()), Source::ServerInfo),
            None => (None, Source::Default),
        },
    };
    let mut vocab = match vocab_flag {
        Some(v) => Some((v, Source::Flag("--vocab-size"))),
        None => info
            .and_then(|i| i["vocab_size"].as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .map(|v| (v, Source::ServerInfo)),
    };

    // Only a server without /get_server_info (or one that left something out) is asked more.
    let mut models_said = String::new();
    if vocab.is_none() || model.is_none() {
        match client.get_optional("/v1/models").await? {
            Ok(models) => {
                if model.is_none() {
                    if let Some(id) = models_first_id(&models) {
                        (model, model_from) = (Some(id), Source::Models);
                    }
                }
                if vocab.is_none() {
                    vocab =
                        models_vocab_size(&models, model.as_deref()).map(|v| (v, Source::Models));
                }
                models_said = "/v1/models does not say it (llama.cpp's data[].meta.n_vocab)".into();
            }
            Err(why) => models_said = format!("GET /v1/models: {why}"),
        }
    }
    let (vocab_size, vocab_from) = vocab.with_context(|| {
        format!(
            "the server does not say its vocabulary size ({}; {models_said}): pass \
                 --vocab-size (the model's vocab_size, e.g. from its config.json)",
            match &server_info {
                Ok(_) => "/get_server_info has no vocab_size".to_string(),
                Err(why) => format!("GET /get_server_info: {why}"),
            }
        )
    })?;
    Ok(ServerFacts {
        vocab_size,
        vocab_from,
        model,
        model_from,
        server_info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llama_server_models_carry_the_vocabulary() {
        let models = json!({"object": "list", "data": [
            {"id": "a.gguf", "object": "model", "meta": {"n_vocab": 32000, "n_ctx_train": 4096}},
            {"id": "b.gguf", "object": "model", "meta": {"n_vocab": 128256}},
        ]});
        assert_eq!(models_first_id(&models).as_deref(), Some("a.gguf"));
        assert_eq!(models_vocab_size(&models, None), Some(32000));
        assert_eq!(models_vocab_size(&models, Some("b.gguf")), Some(128256));
        assert_eq!(models_vocab_size(&models, Some("c")), None);
        // vLLM's entries have no vocabulary size.
        let vllm = json!({"data": [{"id": "m", "object": "model", "max_model_len": 2048}]});
        assert_eq!(models_vocab_size(&vllm, None), None);
        assert_eq!(models_first_id(&json!({"data": []})), None);
    }

    #[test]
    fn notes_say_what_was_assumed() {
        let facts = ServerFacts {
            vocab_size: 300,
            vocab_from: Source::Flag("--vocab-size"),
            model: Some("m".into()),
            model_from: Source::Models,
            server_info: Err("HTTP 404 Not Found".into()),
        };
        let notes = facts.notes(true).join("\n");
        for needle in [
            "GET /get_server_info: HTTP 404 Not Found",
            "unknown",
            "vocabulary of 300 (from --vocab-size)",
            "model \"m\" (from /v1/models)",
        ] {
            assert!(notes.contains(needle), "{needle} in {notes}");
        }
        let dpserve = ServerFacts {
            vocab_from: Source::ServerInfo,
            model_from: Source::ServerInfo,
            server_info: Ok(json!({})),
            ..facts
        };
        assert!(dpserve.notes(true).is_empty());
    }
}
