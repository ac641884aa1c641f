//! End to end on the real stories260k model: `dpserve up --dp-size 2` must reproduce the
//! golden greedy continuation exactly, on every rank, streaming or not.

use crate::common;

use common::{stories_dir, Server};
use serde_json::{json, Value};

fn golden() -> Option<(Vec<u64>, String)> {
    let dir = stories_dir()?;
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).ok()?).ok()?;
    let ids = g["greedy_token_ids"]
        .as_array()?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    Some((ids, g["greedy_text"].as_str()?.to_string()))
}

#[test]
fn golden_continuation_on_every_rank_streaming_and_not() {
    let (Some(dir), Some((ids, text))) = (stories_dir(), golden()) else {
        return;
    };
    let server = Server::up(&["--model-path", dir.to_str().unwrap(), "--dp-size", "2"]);
    for rank in 0..2u64 {
        let body = json!({
            "text": "Once upon a time",
            "sampling_params": {"temperature": 0, "max_new_tokens": 32},
            "routed_dp_rank": rank,
        });
        let (status, resp) = server.post("/generate", &body);
        assert_eq!(status, 200, "{resp}");
        let got: Vec<u64> = resp["output_ids"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert_eq!(got, ids, "rank {rank} ids");
        assert_eq!(resp["text"], text, "rank {rank} text");
        let meta = &resp["meta_info"];
        assert_eq!(meta["dp_rank"], rank);
        assert_eq!(meta["prompt_tokens"], 5);
        assert_eq!(meta["completion_tokens"], 32);
        assert_eq!(meta["finish_reason"]["type"], "length");

        let mut stream_body = body.clone();
        stream_body["stream"] = json!(true);
        let chunks = server.stream("/generate", &stream_body);
        let streamed = common::generate::produced(&chunks, common::generate::Form::Cumulative);
        assert_eq!(streamed.output_ids, ids, "rank {rank} streamed ids");
        assert_eq!(streamed.text, text, "rank {rank} streamed text");
    }

    // The explicit-rank header does the same as the body field.
    let resp = Server::client()
        .post(server.url("/generate"))
        .header("X-Data-Parallel-Rank", "1")
        .json(&json!({"input_ids": [1, 403, 407, 261, 378],
                      "sampling_params": {"temperature": 0, "max_new_tokens": 32}}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let resp: Value = resp.json().unwrap();
    assert_eq!(resp["meta_info"]["dp_rank"], 1);
    assert_eq!(resp["text"], text);
}
