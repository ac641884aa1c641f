//! Chat templates: turning OpenAI `messages` into the prompt text the model was trained on.
//!
//! Where the template comes from, first match wins: `--chat-template FILE` (a Jinja file, or a
//! JSON file with a `chat_template` field), the model's `tokenizer_config.json` `chat_template`,
//! a small built-in template for the built-in model, and for a model directory without one a
//! plain role-prefixed template (logged once at start, so the operator knows). Templates are
//! Hugging Face Jinja rendered by minijinja with Python string methods (`pycompat`) and
//! `raise_exception`, which HF templates use.

use std::path::{Path, PathBuf};

use minijinja::{Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value;

use crate::error::{Result, TokenizerError};
use crate::tokenizer::ModelFacts;

const TEMPLATE_NAME: &str = "chat";

/// The built-in model's template: role-prefixed lines in words its tokenizer knows.
pub const BUILTIN_TEMPLATE: &str = "{{ bos_token }}\
{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
{% if add_generation_prompt %}assistant:{% endif %}";

/// For a model directory whose `tokenizer_config.json` has no template.
pub const PLAIN_TEMPLATE: &str = "\
{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
{% if add_generation_prompt %}assistant:{% endif %}";

/// Where the template in use came from; shown in server info.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateSource {
    Flag(PathBuf),
    TokenizerConfig,
    Builtin,
    PlainFallback,
}

impl TemplateSource {
    pub fn describe(&self) -> String {
        match self {
            TemplateSource::Flag(p) => format!("--chat-template {}", p.display()),
            TemplateSource::TokenizerConfig => "tokenizer_config.json".to_string(),
            TemplateSource::Builtin => "built-in model template".to_string(),
            TemplateSource::PlainFallback => "plain role-prefixed fallback".to_string(),
        }
    }
}

/// One chat message after its content parts were joined into text (a null content is empty:
/// Qwen3's template reads it as a string); `tool_calls` (the arguments as objects),
/// `tool_call_id` and `name` only where the message has them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// An assistant message's `tool_calls` as chat templates read them (as vLLM hands them to
    /// transformers): each `function.arguments` given as JSON text becomes the object it spells.
    pub fn tool_calls_for_template(tool_calls: &serde_json::Value) -> serde_json::Value {
        let mut calls = tool_calls.clone();
        if let serde_json::Value::Array(list) = &mut calls {
            for call in list {
                if let Some(args) = call.pointer_mut("/function/arguments") {
                    let parsed = args
                        .as_str()
                        .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok());
                    if let Some(parsed) = parsed {
                        *args = parsed;
                    }
                }
            }
        }
        calls
    }

    /// A message of text alone.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    pub source: TemplateSource,
    /// The tool-call format the template writes, found once at load (`--tool-call-parser`
    /// overrides it: [`AppState`](crate::state::AppState)).
    pub tool_format: Option<ToolCallFormat>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The template for this model (see the module doc for the order).
    pub fn load(flag: Option<&Path>, facts: &ModelFacts) -> Result<ChatTemplate> {
        let (text, source) = match flag {
            Some(path) => (read_template_file(path)?, TemplateSource::Flag(path.into())),
            None => match (&facts.chat_template, &facts.model_path) {
                (Some(t), _) => (t.clone(), TemplateSource::TokenizerConfig),
                (None, None) => (BUILTIN_TEMPLATE.to_string(), TemplateSource::Builtin),
                (None, Some(dir)) => {
                    tracing::warn!(
                        model = %dir.display(),
                        "tokenizer_config.json has no chat_template; chat requests use a plain \
                         role-prefixed template (pass --chat-template FILE for the right one)"
                    );
                    (PLAIN_TEMPLATE.to_string(), TemplateSource::PlainFallback)
                }
            },
        };
        let what = source.describe();
        Self::from_source(text, source, facts)
            .map_err(|reason| TokenizerError::ChatTemplate { what, reason })
    }

    fn from_source(
        text: String,
        source: TemplateSource,
        facts: &ModelFacts,
    ) -> std::result::Result<ChatTemplate, String> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_filter("tojson", tojson);
        let tool_format = ToolCallFormat::of_template(&text);
        env.add_template_owned(TEMPLATE_NAME, text)
            .map_err(|e| format!("template does not parse: {e}"))?;
        Ok(ChatTemplate {
            env,
            source,
            tool_format,
            bos_token: facts.bos_token.clone().unwrap_or_default(),
            eos_token: facts.eos_token.clone().unwrap_or_default(),
        })
    }

    /// The prompt text of `messages`, with the request's `tools` (as transformers passes them;
    /// none without). An error is the template's complaint (e.g. roles that do not alternate),
    /// meant for the client.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> std::result::Result<String, String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| e.to_string())?;
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| match e.kind() {
            // raise_exception's message is the template author's words; keep them plain.
            ErrorKind::InvalidOperation => e.detail().unwrap_or("template error").to_string(),
            _ => format!("chat template failed: {e}"),
        })
    }
}

/// `tojson` as transformers defines it for chat templates (`json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`): by default `", "` and `": "`
/// between items (`","` and newlines with `indent`), no HTML escaping, where minijinja's own
/// writes compact, HTML-safe JSON. Tool schemas reach the prompt through it (Qwen3 writes each
/// tool with `tool | tojson`).
fn tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators = match kwargs.get::<Option<minijinja::Value>>("separators")? {
        None => None,
        Some(v) => {
            let pair: Vec<String> = v
                .try_iter()?
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .filter(|p: &Vec<String>| p.len() == 2)
                .ok_or_else(|| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            Some((pair[0].clone(), pair[1].clone()))
        }
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut v = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    if sort_keys == Some(true) {
        sort(&mut v);
    }
    let (item, key) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_string(), ": ".to_string())
    });
    let mut out = String::new();
    python_json(
        &v,
        &Dumps {
            indent,
            item: &item,
            key: &key,
        },
        0,
        &mut out,
    );
    Ok(minijinja::Value::from_safe_string(out))
}

/// Object keys in sorted order, all the way down (`sort_keys=True`).
fn sort(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = std::mem::take(map).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut item) in entries {
                sort(&mut item);
                map.insert(k, item);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort),
        _ => {}
    }
}

/// How `json.dumps` was asked to write.
struct Dumps<'a> {
    indent: Option<usize>,
    item: &'a str,
    key: &'a str,
}

/// `v` as Python's `json.dumps(v, ensure_ascii=False, …)` writes it.
fn python_json(v: &serde_json::Value, how: &Dumps<'_>, level: usize, out: &mut String) {
    use serde_json::Value;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = how.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(how.item);
                }
                newline(out, level + 1);
                python_json(item, how, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(how.item);
                }
                newline(out, level + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(how.key);
                python_json(item, how, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// How a model writes a tool call when it chooses to (`--tool-call-parser`, or what its chat
/// template writes): read back from `tool_choice: "auto"` answers (`http/openai/tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block per call.
    Hermes,
    /// `{"name": …, "parameters": {…}}` (after `<|python_tag|>`), several separated by `;`.
    Llama3,
    /// `[TOOL_CALLS] [{"name": …, "arguments": {…}}, …]`.
    Mistral,
}

impl ToolCallFormat {
    /// SGLang's `--tool-call-parser` names (with `qwen25` and `qwen3` for Hermes).
    pub fn parse(name: &str) -> std::result::Result<ToolCallFormat, String> {
        match name {
            "hermes" | "qwen25" | "qwen3" => Ok(ToolCallFormat::Hermes),
            "llama3" => Ok(ToolCallFormat::Llama3),
            "mistral" => Ok(ToolCallFormat::Mistral),
            other => Err(format!(
                "unknown tool-call parser {other:?} (hermes, qwen25, qwen3, llama3, mistral)"
            )),
        }
    }

    /// The format a chat template writes calls in, when it names one.
    pub fn of_template(template: &str) -> Option<ToolCallFormat> {
        if template.contains("<tool_call>") {
            Some(ToolCallFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolCallFormat::Mistral)
        } else if template.contains("<|python_tag|>") || template.contains("ipython") {
            Some(ToolCallFormat::Llama3)
        } else {
            None
        }
    }
}

/// The token ids of a rendered chat prompt, as `/v1/chat/completions` sends them: `text`
/// encoded as any prompt is (special tokens added as the tokenizer's post-processor says), with
/// a doubled BOS (a template that writes `{{ bos_token }}` and an encoder that adds BOS) kept
/// once.
pub fn prompt_ids(
    tokenizer: &dyn crate::tokenizer::TextTokenizer,
    facts: &ModelFacts,
    text: &str,
) -> Result<Vec<u32>> {
    let mut ids = tokenizer.encode(text)?;
    if let Some(bos) = facts.bos_token_id {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

/// A Jinja file, or a JSON file (`tokenizer_config.json` style) with `chat_template`.
fn read_template_file(path: &Path) -> Result<String> {
    let bad = |reason: String| TokenizerError::ChatTemplate {
        what: format!("--chat-template {}", path.display()),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    if path.extension().is_some_and(|e| e == "json") {
        let v: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("malformed JSON: {e}")))?;
        return crate::tokenizer::config::template_of(&v)
            .ok_or_else(|| bad("no chat_template field".into()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::BuiltinTokenizer;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::text(*r, *c))
            .collect()
    }

    fn hf_facts(template: Option<&str>) -> ModelFacts {
        ModelFacts {
            model_path: Some("/m".into()),
            chat_template: template.map(str::to_string),
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..BuiltinTokenizer::facts()
        }
    }

    #[test]
    fn tojson_writes_what_python_s_json_dumps_writes() {
        // The expected strings are Python 3.11's json.dumps(v, ensure_ascii=False, …).
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t.jinja");
        std::fs::write(
            &t,
            "{{ messages[0].tool_calls | tojson }}|{{ messages[0].tool_calls | tojson(indent=2) }}|\
             {{ messages[0].tool_calls | tojson(separators=(',', ':'), sort_keys=true) }}",
        )
        .unwrap();
        let t = ChatTemplate::load(Some(&t), &hf_facts(None)).unwrap();
        let mut m = ChatMessage::text("user", "x");
        m.tool_calls = Some(serde_json::json!(
            {"b": [1, 2.5, {"z": null, "a": "é<>&"}], "a": {}, "c": [], "d": true}
        ));
        let out = t.render(&[m], false, None).unwrap();
        let parts: Vec<&str> = out.split('|').collect();
        assert_eq!(
            parts[0],
            r#"{"b": [1, 2.5, {"z": null, "a": "é<>&"}], "a": {}, "c": [], "d": true}"#
        );
        assert_eq!(
            parts[1],
            "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"z\": null,\n      \"a\": \"é<>&\"\n    }\n  ],\n  \"a\": {},\n  \"c\": [],\n  \"d\": true\n}"
        );
        assert_eq!(
            parts[2],
            r#"{"a":{},"b":[1,2.5,{"a":"é<>&","z":null}],"c":[],"d":true}"#
        );
    }

    #[test]
    fn builtin_and_plain_templates() {
        let t = ChatTemplate::load(None, &BuiltinTokenizer::facts()).unwrap();
        assert_eq!(t.source, TemplateSource::Builtin);
        let m = msgs(&[("system", "be brief"), ("user", "hi")]);
        assert_eq!(
            t.render(&m, true, None).unwrap(),
            "<s>system: be brief\nuser: hi\nassistant:"
        );
        let t = ChatTemplate::load(None, &hf_facts(None)).unwrap();
        assert_eq!(t.source, TemplateSource::PlainFallback);
        assert_eq!(
            t.render(&m, false, None).unwrap(),
            "system: be brief\nuser: hi\n"
        );
    }

    #[test]
    fn hf_llama2_style_template_with_pycompat_and_raise() {
        let llama2 = "{{ bos_token }}{% for message in messages %}\
            {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
            {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
            {% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}\
            {% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}\
            {% endfor %}";
        let t = ChatTemplate::load(None, &hf_facts(Some(llama2))).unwrap();
        assert_eq!(t.source, TemplateSource::TokenizerConfig);
        let out = t
            .render(
                &msgs(&[("user", " hi "), ("assistant", "yo"), ("user", "ok")]),
                true,
                None,
            )
            .unwrap();
        assert_eq!(out, "<s>[INST] hi [/INST] yo </s>[INST] ok [/INST]");
        let err = t
            .render(&msgs(&[("assistant", "x")]), true, None)
            .unwrap_err();
        assert_eq!(
            err,
            "Conversation roles must alternate user/assistant/user/assistant/..."
        );
    }

    #[test]
    fn template_file_flag_jinja_and_json() {
        let dir = tempfile::tempdir().unwrap();
        let jinja = dir.path().join("t.jinja");
        std::fs::write(
            &jinja,
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
        )
        .unwrap();
        let t = ChatTemplate::load(Some(&jinja), &hf_facts(Some("ignored"))).unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "a")]), true, None).unwrap(),
            "<user>a"
        );
        let json = dir.path().join("tokenizer_config.json");
        std::fs::write(
            &json,
            r#"{"chat_template": [{"name": "default", "template": "D{{ messages|length }}"}]}"#,
        )
        .unwrap();
        let t = ChatTemplate::load(Some(&json), &hf_facts(None)).unwrap();
        assert_eq!(t.render(&msgs(&[("user", "a")]), true, None).unwrap(), "D1");
        let broken = dir.path().join("bad.jinja");
        std::fs::write(&broken, "{% for %}").unwrap();
        let err = ChatTemplate::load(Some(&broken), &hf_facts(None))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("bad.jinja") && err.contains("does not parse"),
            "{err}"
        );
        let missing = ChatTemplate::load(Some(&dir.path().join("nope")), &hf_facts(None));
        assert!(missing.is_err());
    }
}
