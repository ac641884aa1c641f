//! Overload is refused early and cheaply: with `--max-in-flight-requests 16`, a burst of 200
//! concurrent requests gets 429 with `Retry-After` at once for the excess, the admitted ones
//! finish with all their tokens, the refusals are counted in `/metrics`, and the server then
//! serves normally.

use crate::common;

use std::time::Duration;

use common::{Reply, Server};
use serde_json::json;

#[test]
fn a_burst_past_the_in_flight_cap_is_refused_at_once_and_the_rest_finish() {
    let server = Server::up(&[
        "--builtin-size",
        "tiny",
        "--dp-size",
        "1",
        "--max-in-flight-requests",
        "16",
        "--max-running-requests",
        "4",
    ]);
    let body = json!({"text": "once upon a time", "sampling_params":
                      {"max_new_tokens": 64, "temperature": 0, "ignore_eos": true}});
    let handles = server.post_concurrently("/generate", vec![body.clone(); 200]);
    let (mut ok, mut refused) = (0, 0);
    for h in handles {
        let Reply {
            status,
            retry_after: retry,
            body: json,
            took,
        } = h.join().unwrap();
        match status {
            200 => {
                ok += 1;
                assert_eq!(
                    json["output_ids"].as_array().map(Vec::len),
                    Some(64),
                    "{json}"
                );
            }
            429 => {
                refused += 1;
                assert_eq!(retry.as_deref(), Some("1"), "Retry-After on a 429");
                assert!(
                    json["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("16 requests in flight"),
                    "{json}"
                );
                // Refused without waiting for anything: well under a second on any machine
                // (the admitted requests take far longer).
                assert!(took < Duration::from_secs(5), "a refusal took {took:?}");
            }
            other => panic!("unexpected status {other}: {json}"),
        }
    }
    assert_eq!(ok + refused, 200);
    assert!(ok >= 16, "at least the cap's worth admitted ({ok})");
    assert!(refused > 0, "a burst of 200 over a cap of 16 refuses some");
    let counted = server.metric("dpserve:requests_refused_total{reason=\"overloaded\"}");
    assert_eq!(counted, refused as f64);
    // After the burst, the server serves as before.
    let (status, resp) = server.post("/generate", &body);
    assert_eq!(status, 200, "{resp}");
}

#[test]
fn past_a_workers_max_queued_requests_a_request_gets_503_with_retry_after() {
    let server = Server::up(&[
        "--builtin-size",
        "tiny",
        "--dp-size",
        "1",
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "2",
    ]);
    let body = json!({"text": "once upon a time", "sampling_params":
                      {"max_new_tokens": 128, "temperature": 0, "ignore_eos": true}});
    let handles = server.post_concurrently("/generate", vec![body; 20]);
    let mut full = 0;
    for h in handles {
        let Reply {
            status,
            retry_after,
            body: json,
            ..
        } = h.join().unwrap();
        match status {
            200 => assert_eq!(json["output_ids"].as_array().map(Vec::len), Some(128)),
            503 => {
                full += 1;
                assert!(retry_after.is_some(), "Retry-After on a 503");
                let message = json["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("max-queued-requests"), "{json}");
            }
            other => panic!("unexpected status {other}: {json}"),
        }
    }
    assert!(
        full > 0,
        "20 at once over 1 running + 2 queued refuses some"
    );
}
