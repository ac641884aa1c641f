//! Tool calling on `/v1/chat/completions`: the request's `tools`, `tool_choice` and
//! `parallel_tool_calls` checked, the constraint a forced choice puts on the output, and the
//! finished text read back into `tool_calls`.
//!
//! - `tool_choice: "required"` or a named function: the output is **constrained** (as vLLM
//!   does), to a JSON array of `{"name", "arguments"}` objects, one per call (one at most
//!   without `parallel_tool_calls`), each function's `arguments` its `parameters` schema; or,
//!   named, to that function's arguments alone. Even a weak model then returns arguments that
//!   validate.
//! - `"auto"` (the default with tools): the model writes a call in its own format, read back by
//!   [`Format`]: Hermes `<tool_call>{"name", "arguments"}</tool_call>` (Qwen2.5, Qwen3), Llama
//!   3.1's JSON `{"name", "parameters"}` (after `<|python_tag|>`), Mistral's `[TOOL_CALLS]` list.
//!   Text that does not parse as calls is the answer's content.
//! - `"none"`: the tools are shown to the template, nothing is read back.

use protocol::Constraint;
use serde_json::{json, Value};

pub use crate::chat_template::ToolCallFormat as Format;
use crate::http::error::ApiError;
use crate::http::validation_error::ValidationError;

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its arguments' JSON Schema (an empty object schema when none was given).
    pub parameters: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A chat request's tools and what it asks of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    /// The `tools` list as the client sent it: what the chat template is given (as
    /// transformers passes `tools=`).
    pub spec: Value,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// One call as the answer carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A finished text read as an answer: its content and its calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

/// `tools`, `tool_choice` and `parallel_tool_calls` checked; `None` without tools.
pub fn parse(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ApiError> {
    let list = match tools.filter(|v| !v.is_null()) {
        None => &[][..],
        Some(Value::Array(list)) => &list[..],
        Some(_) => return Err(ValidationError::ToolsNotList.into()),
    };
    let mut parsed: Vec<Tool> = Vec::with_capacity(list.len());
    for (index, t) in list.iter().enumerate() {
        let tool = tool(t, index)?;
        if parsed.iter().any(|p| p.name == tool.name) {
            let name = tool.name;
            return Err(ValidationError::ToolNameTwice { index, name }.into());
        }
        parsed.push(tool);
    }
    let choice = tool_choice(choice.filter(|v| !v.is_null()), &parsed)?;
    if parsed.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tools {
        tools: parsed,
        spec: Value::Array(list.to_vec()),
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

fn tool(t: &Value, index: usize) -> Result<Tool, ApiError> {
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ValidationError::ToolType { index }.into());
    }
    let Some(f) = t.get("function").filter(|f| f.is_object()) else {
        return Err(ValidationError::ToolFunction { index }.into());
    };
    let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
        let name = name.to_string();
        return Err(ValidationError::ToolName { index, name }.into());
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(ValidationError::ToolParameters { index }.into()),
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
    })
}

fn tool_choice(choice: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match choice {
        None => {
            return Ok(if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            })
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(ToolChoice::None),
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                let got = other.to_string();
                return Err(ValidationError::ToolChoiceWord { got }.into());
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"));
            let Some(name) = name else {
                return Err(ValidationError::ToolChoiceShape.into());
            };
            if !tools.iter().any(|t| t.name == name) {
                let name = name.to_string();
                return Err(ValidationError::ToolChoiceUnknown { name }.into());
            }
            ToolChoice::Named(name.to_string())
        }
    };
    if tools.is_empty() {
        return Err(ValidationError::ToolChoiceWithoutTools.into());
    }
    Ok(choice)
}

impl Tools {
    /// What a forced choice constrains the output to (none for `auto` and `none`).
    pub fn constraint(&self) -> Option<Constraint> {
        let schema = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Named(name) => self
                .tools
                .iter()
                .find(|t| &t.name == name)?
                .parameters
                .clone(),
            ToolChoice::Required => {
                let calls: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        json!({"type": "object",
                               "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                               "required": ["name", "arguments"], "additionalProperties": false})
                    })
                    .collect();
                let mut list = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if !self.parallel {
                    list["maxItems"] = json!(1);
                }
                list
            }
        };
        Some(Constraint::JsonSchema(schema.to_string()))
    }

    /// How much of a stream's text so far may go out as content now: none of a forced call;
    /// with `auto`, all of it until a call may be starting (Hermes: up to a `<tool_call>` or
    /// what could be its beginning; Llama 3.1 and Mistral: an answer that opens with `{` or `[`
    /// is held whole).
    pub fn streamable(&self, text: &str, format: Option<Format>) -> usize {
        match (&self.choice, format) {
            (ToolChoice::None, _) | (ToolChoice::Auto, None) => text.len(),
            (ToolChoice::Named(_) | ToolChoice::Required, _) => 0,
            (ToolChoice::Auto, Some(Format::Hermes)) => {
                const OPEN: &str = "<tool_call>";
                if let Some(at) = text.find(OPEN) {
                    return at;
                }
                // A tail that could grow into the marker waits for the next chunk.
                (0..=text.len())
                    .filter(|&i| text.is_char_boundary(i))
                    .find(|&i| OPEN.starts_with(&text[i..]))
                    .unwrap_or(text.len())
            }
            (ToolChoice::Auto, Some(Format::Llama3 | Format::Mistral)) => {
                let opener = if format == Some(Format::Llama3) {
                    '{'
                } else {
                    '['
                };
                match text.trim_start().chars().next() {
                    None => 0,
                    Some(c) if c == opener => 0,
                    Some(_) => text.len(),
                }
            }
        }
    }

    /// Whether answers are read back for calls (not with `tool_choice: "none"`).
    pub fn reads_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// A finished text as an answer. `complete`: the text ended by itself (not at a length
    /// limit); a forced call is only read from a complete text.
    pub fn read(&self, text: &str, complete: bool, format: Option<Format>) -> Reply {
        let plain = || Reply {
            content: Some(text.to_string()),
            calls: Vec::new(),
        };
        let calls = match &self.choice {
            ToolChoice::None => return plain(),
            ToolChoice::Named(name) if complete => Some(vec![Call {
                name: name.clone(),
                arguments: text.trim().to_string(),
            }]),
            ToolChoice::Required if complete => calls_in(text.trim(), "arguments"),
            ToolChoice::Named(_) | ToolChoice::Required => None,
            ToolChoice::Auto => match format {
                Some(f) => return read_format(text, f).unwrap_or_else(plain),
                None => None,
            },
        };
        match calls {
            Some(calls) if !calls.is_empty() => Reply {
                content: None,
                calls,
            },
            _ => plain(),
        }
    }
}

/// Calls in `text`: JSON objects `{"name", <args_key>}` (a list of them, or one after another
/// separated by whitespace or `;`). `None` unless all of it is calls.
fn calls_in(text: &str, args_key: &str) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = values.next()?.ok()?;
        rest = rest[values.byte_offset()..]
            .trim_start()
            .trim_start_matches(';')
            .trim_start();
        let items = match v {
            Value::Array(items) => items,
            one => vec![one],
        };
        for item in items {
            let name = item.get("name")?.as_str()?.to_string();
            let args = item.get(args_key).or_else(|| item.get("arguments"))?;
            if !args.is_object() {
                return None;
            }
            calls.push(Call {
                name,
                arguments: args.to_string(),
            });
        }
    }
    Some(calls)
}

/// An `auto` answer in the model's own format; `None` when it holds no call (or one that does
/// not parse: then it is all content).
fn read_format(text: &str, format: Format) -> Option<Reply> {
    let (content, calls) = match format {
        Format::Hermes => {
            let start = text.find("<tool_call>")?;
            let mut calls = Vec::new();
            let mut rest = &text[start..];
            while let Some(open) = rest.find("<tool_call>") {
                let body = &rest[open + "<tool_call>".len()..];
                let (call, after) = body.split_once("</tool_call>").unwrap_or((body, ""));
                calls.extend(calls_in(call, "arguments")?);
                rest = after;
            }
            (&text[..start], calls)
        }
        Format::Llama3 => {
            let t = text.trim_start();
            let t = t.strip_prefix("<|python_tag|>").unwrap_or(t);
            if !t.trim_start().starts_with('{') {
                return None;
            }
            ("", calls_in(t, "parameters")?)
        }
        Format::Mistral => {
            let t = text.trim_start();
            let t = t.strip_prefix("[TOOL_CALLS]").unwrap_or(t);
            if !t.trim_start().starts_with('[') {
                return None;
            }
            ("", calls_in(t, "arguments")?)
        }
    };
    if calls.is_empty() {
        return None;
    }
    let content = content.trim();
    Some(Reply {
        content: (!content.is_empty()).then(|| content.to_string()),
        calls,
    })
}

/// The `tool_calls` of an answer, each with a fresh id; `index` for a stream's delta.
pub fn calls_json(calls: &[Call], with_index: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = json!({
                    "id": format!("call_{}", &crate::http::generate::random_rid()[..24]),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if with_index {
                    v["index"] = json!(i);
                }
                v
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
