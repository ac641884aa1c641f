//! What a model directory's `tokenizer_config.json` says beside the tokenizer itself: its chat
//! template and its special tokens (read by the Hugging Face loader and by `--chat-template`).

use serde_json::Value;

/// `chat_template` of a tokenizer config: a string, or a list of named templates (the one
/// named `default` is used).
pub fn template_of(tok_config: &Value) -> Option<String> {
    match tok_config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or(items.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// A special token of a tokenizer config: a string or `{"content": ...}`.
pub fn special_token(tok_config: &Value, name: &str) -> Option<String> {
    match tok_config.get(name)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_tokens_as_strings_or_objects() {
        let v: Value =
            serde_json::from_str(r#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}}"#)
                .unwrap();
        assert_eq!(special_token(&v, "bos_token").as_deref(), Some("<s>"));
        assert_eq!(special_token(&v, "eos_token").as_deref(), Some("</s>"));
        assert_eq!(special_token(&v, "pad_token"), None);
    }
}
