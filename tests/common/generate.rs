//! What a `/generate` stream produced, read in either of its forms: SGLang's default, where
//! each chunk carries everything so far (`text`, `output_ids`, the log-probability lists), or
//! `--incremental-streaming-output`, where each carries only its own step. Reading a cumulative
//! stream also checks that it is one: every chunk extends the one before.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Cumulative,
    Incremental,
}

#[derive(Debug, Default, PartialEq)]
pub struct Produced {
    pub text: String,
    pub output_ids: Vec<u64>,
}

fn ids(chunk: &Value) -> Vec<u64> {
    chunk["output_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("a chunk without output_ids: {chunk}"))
        .iter()
        .map(|v| v.as_u64().expect("a token id"))
        .collect()
}

/// The whole output of a stream's data chunks (errors and `[DONE]` left out).
pub fn produced(chunks: &[Value], form: Form) -> Produced {
    let mut all = Produced::default();
    for chunk in chunks {
        let text = chunk["text"].as_str().expect("chunk text");
        let ids = ids(chunk);
        match form {
            Form::Incremental => {
                all.text.push_str(text);
                all.output_ids.extend(ids);
            }
            Form::Cumulative => {
                assert!(
                    text.starts_with(&all.text),
                    "chunk text {text:?} does not extend the one before, {:?}",
                    all.text
                );
                assert!(
                    ids.starts_with(&all.output_ids),
                    "chunk output_ids {ids:?} do not extend the ones before, {:?}",
                    all.output_ids
                );
                all = Produced {
                    text: text.to_string(),
                    output_ids: ids,
                };
            }
        }
    }
    all
}

/// `meta_info[key]` (a log-probability list) of the whole stream.
pub fn meta_list(chunks: &[Value], key: &str, form: Form) -> Vec<Value> {
    let list = |c: &Value| c["meta_info"][key].as_array().cloned().unwrap_or_default();
    match form {
        Form::Incremental => chunks.iter().flat_map(list).collect(),
        Form::Cumulative => {
            let mut all: Vec<Value> = Vec::new();
            for chunk in chunks {
                let now = list(chunk);
                assert!(
                    now.starts_with(&all),
                    "{key} of a chunk does not extend the one before: {chunk}"
                );
                all = now;
            }
            all
        }
    }
}
