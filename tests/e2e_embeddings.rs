//! End to end with the built-in model: `/encode` and `/v1/embeddings` through the real
//! controller and workers (shape, unit norm, batch order, routing, base64, bad input), and the
//! native `/generate` top log-probabilities in SGLang's shape, streaming or not.

use crate::common;

use common::Server;
use serde_json::{json, Value};

fn tiny() -> Server {
    Server::tiny(&[])
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// Standard base64 decoding, enough for the server's padded output.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let n = quad
            .iter()
            .take_while(|&&c| c != b'=')
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | u32::from(val(c)) << (18 - 6 * i));
        let bytes = quad.iter().filter(|&&c| c != b'=').count() - 1;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + bytes]);
    }
    out
}

#[test]
fn encode_and_embeddings_serve_unit_vectors_in_input_order() {
    let server = tiny();
    let texts = [
        "the little dog ran home",
        "a cat sat in the sun",
        "once upon a time",
    ];

    let (status, one) = server.post("/encode", &json!({"text": texts[0], "rid": "enc-1"}));
    assert_eq!(status, 200, "{one}");
    let v0 = floats(&one["embedding"]);
    assert!(v0.len() >= 8);
    assert!((norm(&v0) - 1.0).abs() < 1e-4, "norm {}", norm(&v0));
    assert_eq!(one["meta_info"]["id"], "enc-1");
    assert!(one["meta_info"]["prompt_tokens"].as_u64().unwrap() >= 5);
    let rank = one["meta_info"]["dp_rank"].as_u64().unwrap();
    assert!(rank < 2);
    // Without a key, the token-prefix hash sends the same input to the same rank. (Asked
    // right away: one unsettled request on that rank is still under the overload guard.)
    let (_, again) = server.post("/encode", &json!({"text": texts[0]}));
    assert_eq!(again["meta_info"]["dp_rank"], rank);

    // A batch answers a list in input order; each equals its input embedded alone.
    let (status, batch) = server.post("/encode", &json!({"text": texts, "rid": "enc-b"}));
    assert_eq!(status, 200, "{batch}");
    let batch = batch.as_array().unwrap();
    assert_eq!(batch.len(), 3);
    assert_eq!(floats(&batch[0]["embedding"]), v0);
    for (i, item) in batch.iter().enumerate() {
        assert_eq!(item["meta_info"]["id"], format!("enc-b-{i}"));
        let (_, alone) = server.post("/encode", &json!({"text": texts[i]}));
        assert_eq!(floats(&item["embedding"]), floats(&alone["embedding"]));
    }
    assert_ne!(floats(&batch[1]["embedding"]), v0);
    let (status, ids) = server.post("/encode", &json!({"input_ids": [[1, 50, 60], [1, 70]]}));
    assert_eq!(status, 200, "{ids}");
    assert_eq!(ids[1]["meta_info"]["prompt_tokens"], 2);

    // An explicit rank is honoured, and both ranks compute the same vector.
    for r in [0, 1] {
        let (status, pinned) = server.post(
            "/encode",
            &json!({"text": texts[0], "data_parallel_rank": r}),
        );
        assert_eq!(status, 200, "{pinned}");
        assert_eq!(pinned["meta_info"]["dp_rank"], r);
        assert_eq!(floats(&pinned["embedding"]), v0);
    }
    let resp = Server::client()
        .post(server.url("/encode"))
        .header("X-Data-Parallel-Rank", "1")
        .header("x-smg-routing-key", "conv-1")
        .json(&json!({"text": texts[0]}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.json::<Value>().unwrap()["meta_info"]["dp_rank"], 1);

    // OpenAI shape, float and base64 (little-endian f32).
    let (status, r) = server.post(
        "/v1/embeddings",
        &json!({"input": texts, "model": "m", "user": "u"}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "list");
    assert_eq!(r["model"], "m");
    let data = r["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        assert_eq!(floats(&d["embedding"]), floats(&batch[i]["embedding"]));
    }
    let total: u64 = batch
        .iter()
        .map(|b| b["meta_info"]["prompt_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        r["usage"],
        json!({"prompt_tokens": total, "total_tokens": total})
    );
    let (status, b64) = server.post(
        "/v1/embeddings",
        &json!({"input": texts[0], "encoding_format": "base64"}),
    );
    assert_eq!(status, 200, "{b64}");
    let raw = base64_decode(b64["data"][0]["embedding"].as_str().unwrap());
    let decoded: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, v0);
}

#[test]
fn bad_embedding_requests_are_400_and_the_server_keeps_serving() {
    let server = tiny();
    let (_, info) = server.get("/get_server_info");
    let context = info["context_length"].as_u64().unwrap() as usize;
    let too_long = vec![5u32; context + 1];
    let cases = [
        (
            "/v1/embeddings",
            json!({"input": "hi", "dimensions": 8}),
            "dimensions",
        ),
        (
            "/v1/embeddings",
            json!({"input": "hi", "encoding_format": "int8"}),
            "encoding_format",
        ),
        ("/v1/embeddings", json!({"input": ""}), "input"),
        ("/v1/embeddings", json!({"input": []}), "input"),
        ("/v1/embeddings", json!({"input": [1, 99999]}), "input"),
        ("/v1/embeddings", json!({"input": too_long}), "input"),
        ("/v1/embeddings", json!({"input": {"text": "hi"}}), "input"),
        ("/encode", json!({"text": 5}), "text"),
        ("/encode", json!({"input_ids": [[1], []]}), "input_ids"),
        ("/encode", json!({"input_ids": too_long}), "input_ids"),
        (
            "/encode",
            json!({"text": ["a", "b"], "input_ids": null, "routed_dp_rank": "x"}),
            "routed_dp_rank",
        ),
    ];
    for (path, body, param) in cases {
        let (status, v) = server.post(path, &body);
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], param, "{path}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    for body in [json!({}), json!({"text": "a", "input_ids": [1]})] {
        let (status, v) = server.post("/encode", &body);
        assert_eq!(status, 400, "{body}: {v}");
    }
    let (status, v) = server.post("/encode", &json!({"text": "hi", "routed_dp_rank": 5}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("rank 5 is not live"));
    let (status, v) = server.post_raw("/v1/embeddings", "{not json");
    assert_eq!(status, 400, "{v}");
    let (status, v) = server.post("/v1/embeddings", &json!({"input": "still serving"}));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn generate_returns_top_logprobs_in_sglang_shape() {
    let server = tiny();
    let body = |stream: bool, text: bool| {
        json!({"text": "once upon a time there was", "stream": stream,
               "return_logprob": true, "top_logprobs_num": 3, "return_text_in_logprobs": text,
               "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}})
    };
    let (status, r) = server.post("/generate", &body(false, true));
    assert_eq!(status, 200, "{r}");
    let ids = r["output_ids"].as_array().unwrap().clone();
    let meta = &r["meta_info"];
    let chosen = meta["output_token_logprobs"].as_array().unwrap();
    let tops = meta["output_top_logprobs"].as_array().unwrap();
    assert_eq!((ids.len(), chosen.len(), tops.len()), (6, 6, 6));
    for ((id, c), top) in ids.iter().zip(chosen).zip(tops) {
        // [logprob, token_id, text]
        assert_eq!(&c[1], id);
        assert!(c[0].as_f64().unwrap() <= 0.0);
        assert!(c[2].is_string(), "{c}");
        let top = top.as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top.iter().map(|t| t[0].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        assert!(lps.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-6);
        // Greedy: the chosen token is the most likely, with the same logprob and text.
        assert_eq!(&top[0], c);
    }

    // Streaming: each chunk carries the entries of every token so far (as SGLang); the last
    // ones are the same.
    let chunks = server.stream("/generate", &body(true, true));
    let gather =
        |key: &str| common::generate::meta_list(&chunks, key, common::generate::Form::Cumulative);
    assert_eq!(&gather("output_token_logprobs"), chosen);
    assert_eq!(&gather("output_top_logprobs"), tops);

    // Without return_text_in_logprobs the text slot is null; without return_logprob nothing.
    let (_, r) = server.post("/generate", &body(false, false));
    assert!(r["meta_info"]["output_top_logprobs"][0][0][2].is_null());
    assert_eq!(
        r["meta_info"]["output_top_logprobs"][0][0][1],
        tops[0][0][1]
    );
    let mut plain = body(false, false);
    plain["return_logprob"] = json!(false);
    let (_, r) = server.post("/generate", &plain);
    assert!(r["meta_info"].get("output_top_logprobs").is_none());
    assert!(r["meta_info"].get("output_token_logprobs").is_none());
    let mut bad = body(false, false);
    bad["top_logprobs_num"] = json!(21);
    let (status, v) = server.post("/generate", &bad);
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("top_logprobs_num"))
    );
}
