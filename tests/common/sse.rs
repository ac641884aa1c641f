//! A streaming `/generate` read on its own thread: each SSE event arrives on a channel, so a
//! test can watch a stream while it kills or restarts actors.

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// What one SSE stream delivered.
#[derive(Debug)]
pub enum Sse {
    Data(Value),
    Done,
    /// The body ended (or failed) without `[DONE]`, or the request was refused.
    Closed(String),
}

/// POSTs `body` to `{base}/generate` with `headers`; the stream's events arrive on the channel.
pub fn stream(base: &str, headers: &[(&str, &str)], body: Value) -> mpsc::Receiver<Sse> {
    let (tx, rx) = mpsc::channel();
    let url = format!("{base}/generate");
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    std::thread::spawn(move || {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .expect("client");
        let mut req = client.post(url).json(&body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let resp = match req.send() {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Sse::Closed(format!("request failed: {e}")));
                return;
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            let text = resp.text().unwrap_or_default();
            let _ = tx.send(Sse::Closed(format!("status {status}: {text}")));
            return;
        }
        for line in BufReader::new(resp).lines() {
            let line = match line {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Sse::Closed(format!("read failed: {e}")));
                    return;
                }
            };
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            let event = if data == "[DONE]" {
                Sse::Done
            } else {
                Sse::Data(serde_json::from_str(data).expect("SSE chunk is JSON"))
            };
            if tx.send(event).is_err() {
                return;
            }
        }
        let _ = tx.send(Sse::Closed("body ended".into()));
    });
    rx
}
