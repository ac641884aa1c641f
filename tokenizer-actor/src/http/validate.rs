//! Checking a `/generate` body, read into its type by `body`: ranges and the rules between
//! fields, each a 400 naming the field. Unknown fields are ignored (gateways send many). Checks
//! that need the token ids or the cluster view are in [`check_limits`]; what every endpoint
//! shares (rid, routing, sampling ranges) is here too.

use protocol::{Constraint, GenerateReq, SamplingParams};

use super::body;
use super::error::ApiError;
use super::schema::fields::{OneIds, OneText, Prompt};
use super::schema::requests::{DispatchFields, GenerateRequest, GenerateSamplingParams, Routing};
use super::validation_error::ValidationError;

/// A syntactically valid `/generate` request, before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateInput {
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// `sampling_params.stop`: stop strings, applied by the tokenizer.
    pub stop: Vec<String>,
    pub stream: bool,
    pub return_logprob: bool,
    /// With `return_logprob`: alternatives per output token (`top_logprobs_num`).
    pub top_logprobs_num: u32,
    /// Put each token's text in the logprob entries instead of null.
    pub return_text_in_logprobs: bool,
    pub dispatch: Dispatch,
}

/// Where a request goes and what its client learns of it, checked: the same on every
/// endpoint that generates on a rank, read from the body's [`DispatchFields`] and the
/// headers, carried whole by the endpoints and put on the wire by [`Dispatch::write`]. A new
/// field of this kind is added to those two types and to `write`, nowhere else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dispatch {
    /// The client's request id, if it chose one (a batch or `n` > 1 derives its rids from it).
    pub rid: Option<String>,
    pub routing_key: Option<String>,
    pub routed_dp_rank: Option<u32>,
    pub bootstrap_room: Option<u64>,
    /// Answer the routing decision (`meta_info.routing`, an OpenAI choice's `routing`).
    pub return_routing: bool,
}

impl DispatchFields {
    /// The fields checked, the headers over the body.
    pub fn check(self, headers: &HeaderInputs) -> Result<Dispatch, ApiError> {
        let return_routing = return_routing(self.return_routing, headers)?;
        let (routing_key, routed_dp_rank) = self.routing.resolve(headers)?;
        Ok(Dispatch {
            rid: check_rid(self.rid)?,
            routing_key,
            routed_dp_rank,
            bootstrap_room: self.bootstrap_room,
            return_routing,
        })
    }
}

impl Dispatch {
    /// Puts these fields on `req` (whose `rid` is the submission's own).
    pub fn write(self, req: &mut GenerateReq) {
        let Dispatch {
            rid: _,
            routing_key,
            routed_dp_rank,
            bootstrap_room,
            return_routing,
        } = self;
        req.routing_key = routing_key;
        req.routed_dp_rank = routed_dp_rank;
        req.bootstrap_room = bootstrap_room;
        req.return_routing = return_routing;
    }
}

/// The header that asks for the routing decision in the answer.
pub const RETURN_ROUTING_HEADER: &str = "x-dpserve-return-routing";

/// Routing information carried in headers; headers win over the body.
#[derive(Debug, Clone, Default)]
pub struct HeaderInputs {
    /// `x-smg-routing-key`.
    pub routing_key: Option<String>,
    /// `X-Data-Parallel-Rank`, unparsed.
    pub dp_rank: Option<String>,
    /// `x-dpserve-return-routing`, unparsed.
    pub return_routing: Option<String>,
}

/// What a prompt is checked against: the model's facts narrowed by the live ranks' capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub vocab_size: usize,
    pub context_len: usize,
    /// The live ranks per a fresh cluster status; `None` without one (the controller is
    /// unreachable, or not heard from yet), which refuses every request with a 503.
    pub live_ranks: Option<Vec<u32>>,
}

/// Most alternatives per output token on `/generate` (`top_logprobs_num`); OpenAI's chat limit.
pub use protocol::MAX_TOP_LOGPROBS_NUM;

/// `/generate`'s prompt: `text` or `input_ids`, one of them, one prompt.
fn generate_prompt(text: Option<OneText>, ids: Option<OneIds>) -> Result<Prompt, ApiError> {
    let batch = |what: &str| {
        Err(ApiError::bad_request(format!(
            "batch requests ({what}) are not supported; send one request per prompt"
        )))
    };
    let text = match text {
        Some(OneText::Batch) => return batch("text as a list"),
        Some(OneText::One(t)) => Some(t),
        None => None,
    };
    let ids = match ids {
        Some(OneIds::Batch) => return batch("input_ids as a list of lists"),
        Some(OneIds::One(ids)) => Some(ids),
        None => None,
    };
    match (text, ids) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give either text or input_ids, not both",
        )),
        (None, None) => Err(ApiError::bad_request(
            "one of text or input_ids is required",
        )),
        // An empty text is a prompt: a tokenizer that adds BOS makes it one token, as in SGLang
        // and vLLM; one that adds nothing is refused by `check_limits` (no tokens).
        (None, Some(ids)) if ids.is_empty() => Err(ApiError::bad_request("input_ids is empty")),
        (Some(t), None) => Ok(Prompt::Text(t)),
        (None, Some(ids)) => Ok(Prompt::Ids(ids)),
    }
}

pub fn parse_generate(body: &[u8], headers: &HeaderInputs) -> Result<GenerateInput, ApiError> {
    let body: GenerateRequest = body::read(body)?;
    let prompt = generate_prompt(body.text, body.input_ids)?;
    let (sampling, stop) = match body.sampling_params {
        None => (SamplingParams::default(), Vec::new()),
        Some(sp) => {
            if sp.n.is_some_and(|n| n != 1) {
                return Err(ValidationError::GenerateN.into());
            }
            let stop = sp.stop.clone().unwrap_or_default().0;
            (generate_sampling(sp)?, stop)
        }
    };
    let dispatch = body.dispatch.check(headers)?;
    let top_logprobs_num = body.top_logprobs_num.unwrap_or(0);
    if top_logprobs_num > MAX_TOP_LOGPROBS_NUM {
        return Err(ValidationError::TopLogprobsNum {
            max: MAX_TOP_LOGPROBS_NUM,
            got: top_logprobs_num,
        }
        .into());
    }

    Ok(GenerateInput {
        prompt,
        sampling,
        stop,
        stream: body.stream.unwrap_or(false),
        return_logprob: body.return_logprob.unwrap_or(false),
        top_logprobs_num,
        return_text_in_logprobs: body.return_text_in_logprobs.unwrap_or(false),
        dispatch,
    })
}

/// A client-chosen request id (`rid`), if any: 1 to [`protocol::MAX_RID_LEN`] bytes, the one
/// limit the controller and the workers check too.
pub fn check_rid(rid: Option<String>) -> Result<Option<String>, ApiError> {
    if let Some(why) = rid.as_deref().and_then(protocol::rid_problem) {
        return Err(ValidationError::Rid { why }.into());
    }
    // A rid goes into logs, traces and the `-<i>` rids of sub-requests; printable ASCII keeps
    // it one line and its length in bytes the length in characters the API documents.
    if rid
        .as_deref()
        .is_some_and(|r| !r.bytes().all(|b| (0x20..=0x7e).contains(&b)))
    {
        return Err(ValidationError::RidNotPrintable.into());
    }
    Ok(rid)
}

/// The rid of sub-request `index` of a batch or of `n` > 1 (`rid-index`), or of the one
/// request (`None`: `rid` itself).
pub fn child_rid(rid: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("{rid}-{i}"),
        None => rid.to_string(),
    }
}

/// Checks, before anything is sent, that the longest rid [`child_rid`] makes (that of
/// `last_index`) fits [`protocol::MAX_RID_LEN`].
pub fn check_child_rids(rid: &str, last_index: Option<usize>) -> Result<(), ApiError> {
    match protocol::rid_problem(&child_rid(rid, last_index)) {
        Some(why) => Err(match last_index {
            Some(index) => ValidationError::ChildRid { why, index },
            None => ValidationError::Rid { why },
        }
        .into()),
        None => Ok(()),
    }
}

/// Whether the client asked for the routing decision: the `x-dpserve-return-routing` header
/// (`1`/`true` or `0`/`false`) over the body's `return_routing`.
pub fn return_routing(body: Option<bool>, headers: &HeaderInputs) -> Result<bool, ApiError> {
    match headers.return_routing.as_deref().map(str::trim) {
        None => Ok(body.unwrap_or(false)),
        Some("1" | "true") => Ok(true),
        Some("0" | "false") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "{RETURN_ROUTING_HEADER} header must be 1, 0, true or false, got {other:?}"
        ))),
    }
}

/// An endpoint that cannot answer the routing decision (embeddings) refuses the header that
/// asks for it (its bodies have no such field).
pub fn refuse_return_routing(headers: &HeaderInputs) -> Result<(), ApiError> {
    if return_routing(None, headers)? {
        return Err(ApiError::bad_request(format!(
            "{RETURN_ROUTING_HEADER} is not supported on embeddings"
        )));
    }
    Ok(())
}

impl Routing {
    /// Routing key and explicit rank: headers win over the body (an empty routing key header
    /// does not); the rank may be given as `routed_dp_rank` or SGLang's `data_parallel_rank`.
    pub fn resolve(
        self,
        headers: &HeaderInputs,
    ) -> Result<(Option<String>, Option<u32>), ApiError> {
        let body_rank = self.routed_dp_rank.or(self.data_parallel_rank);
        let header_rank = match &headers.dp_rank {
            Some(h) => Some(h.trim().parse::<u32>().map_err(|_| {
                ApiError::bad_request(format!(
                    "X-Data-Parallel-Rank header must be a non-negative integer, got {h:?}"
                ))
            })?),
            None => None,
        };
        // An empty header is no key (a proxy that always sets it, empty when its client gave
        // none): it must not hide the body's key and send the request to token hashing.
        let header_key = headers.routing_key.clone().filter(|k| !k.trim().is_empty());
        Ok((header_key.or(self.routing_key), header_rank.or(body_rank)))
    }
}

/// `/generate`'s sampling parameters, with SGLang's defaults, in range.
fn generate_sampling(sp: GenerateSamplingParams) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    let s = SamplingParams {
        max_new_tokens: sp.max_new_tokens.unwrap_or(d.max_new_tokens),
        temperature: sp.temperature.unwrap_or(d.temperature),
        top_p: sp.top_p.unwrap_or(d.top_p),
        top_k: sp.top_k.unwrap_or(d.top_k),
        min_p: sp.min_p.unwrap_or(d.min_p),
        seed: sp.seed,
        repetition_penalty: sp.repetition_penalty.unwrap_or(d.repetition_penalty),
        frequency_penalty: sp.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: sp.presence_penalty.unwrap_or(d.presence_penalty),
        stop_token_ids: sp.stop_token_ids.unwrap_or_default(),
        ignore_eos: sp.ignore_eos.unwrap_or(d.ignore_eos),
        logit_bias: sp.logit_bias.unwrap_or_default().0,
        constraint: generate_constraint(sp.json_schema, sp.regex, sp.ebnf)?,
    };
    check_sampling(&s, "sampling_params.")?;
    Ok(s)
}

/// SGLang's structured output fields, at most one of them.
fn generate_constraint(
    json_schema: Option<serde_json::Value>,
    regex: Option<String>,
    ebnf: Option<String>,
) -> Result<Option<Constraint>, ApiError> {
    let given = [json_schema.is_some(), regex.is_some(), ebnf.is_some()];
    if given.iter().filter(|&&g| g).count() > 1 {
        return Err(ApiError::bad_request(
            "give at most one of sampling_params.json_schema, regex and ebnf",
        ));
    }
    if let Some(schema) = json_schema {
        return json_schema_constraint(schema, "sampling_params.json_schema").map(Some);
    }
    let ebnf = match ebnf {
        Some(g) => Some(lark_grammar(g, "sampling_params.ebnf")?),
        None => None,
    };
    Ok(regex.map(Constraint::Regex).or(ebnf.map(Constraint::Lark)))
}

/// A JSON Schema given as JSON text or as the document itself.
pub fn json_schema_constraint(
    schema: serde_json::Value,
    field: &'static str,
) -> Result<Constraint, ApiError> {
    match schema {
        serde_json::Value::String(text) => Ok(Constraint::JsonSchema(text)),
        v @ (serde_json::Value::Object(_) | serde_json::Value::Bool(_)) => {
            Ok(Constraint::JsonSchema(v.to_string()))
        }
        got => Err(ValidationError::NotJsonSchema { field, got }.into()),
    }
}

/// A grammar in GBNF (`root ::= …`: llama.cpp's format, which SGLang's `ebnf` takes),
/// rewritten as llguidance's Lark; one without `::=` rules is Lark already (`start: …`).
fn lark_grammar(g: String, field: &'static str) -> Result<String, ApiError> {
    if !g.contains("::=") {
        return Ok(g);
    }
    grammar::gbnf::to_lark(&g).map_err(|e| {
        let error = e.to_string();
        ValidationError::Gbnf { field, error }.into()
    })
}

/// Range checks shared by every endpoint; `prefix` is how the client spelled the parent.
pub fn check_sampling(s: &SamplingParams, prefix: &'static str) -> Result<(), ApiError> {
    let finite = [
        ("temperature", s.temperature),
        ("top_p", s.top_p),
        ("min_p", s.min_p),
        ("repetition_penalty", s.repetition_penalty),
        ("frequency_penalty", s.frequency_penalty),
        ("presence_penalty", s.presence_penalty),
    ];
    if let Some(&(name, _)) = finite.iter().find(|(_, v)| !v.is_finite()) {
        return Err(ValidationError::NotFinite { prefix, name }.into());
    }
    if s.temperature < 0.0 {
        let got = s.temperature;
        return Err(ValidationError::NegativeTemperature { prefix, got }.into());
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        let got = s.top_p;
        return Err(ValidationError::TopP { prefix, got }.into());
    }
    if !(0.0..=1.0).contains(&s.min_p) {
        let got = s.min_p;
        return Err(ValidationError::MinP { prefix, got }.into());
    }
    if s.top_k == 0 || s.top_k < -1 {
        let got = s.top_k;
        return Err(ValidationError::TopK { prefix, got }.into());
    }
    if !(s.repetition_penalty > 0.0 && s.repetition_penalty <= 2.0) {
        let got = s.repetition_penalty;
        return Err(ValidationError::RepetitionPenalty { prefix, got }.into());
    }
    for (name, got) in [
        ("frequency_penalty", s.frequency_penalty),
        ("presence_penalty", s.presence_penalty),
    ] {
        if !(-2.0..=2.0).contains(&got) {
            return Err(ValidationError::Penalty { prefix, name, got }.into());
        }
    }
    Ok(())
}

/// Checks that need the token ids and the cluster view.
pub fn check_limits(
    input_ids: &[u32],
    sampling: &SamplingParams,
    routed_dp_rank: Option<u32>,
    limits: &Limits,
) -> Result<(), ApiError> {
    if input_ids.is_empty() {
        return Err(ApiError::bad_request("prompt encodes to no tokens"));
    }
    let vocab = limits.vocab_size;
    if let Some((index, &id)) = input_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        return Err(ValidationError::InputIdOutOfVocab { index, id, vocab }.into());
    }
    if let Some(&id) = sampling
        .stop_token_ids
        .iter()
        .find(|&&id| id as usize >= vocab)
    {
        return Err(ValidationError::StopTokenIdOutOfVocab { id, vocab }.into());
    }
    if let Some(&(id, _)) = sampling
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= vocab)
    {
        return Err(ValidationError::LogitBiasOutOfVocab { id, vocab }.into());
    }
    let total = input_ids.len() + sampling.max_new_tokens as usize;
    if total > limits.context_len {
        return Err(ValidationError::ContextExceeded {
            prompt_tokens: input_ids.len(),
            max_new_tokens: sampling.max_new_tokens,
            context_len: limits.context_len,
        }
        .into());
    }
    check_rank(routed_dp_rank, limits)
}

/// Against a fresh cluster view: the controller is reachable and some rank is live (else 503),
/// and an explicit rank is one of them (else 400, never a silent reroute).
pub fn check_rank(routed_dp_rank: Option<u32>, limits: &Limits) -> Result<(), ApiError> {
    let Some(live) = &limits.live_ranks else {
        return Err(ApiError::unavailable(CONTROLLER_UNREACHABLE));
    };
    if live.is_empty() {
        return Err(ApiError::unavailable("no live rank"));
    }
    if let Some(rank) = routed_dp_rank {
        if !live.contains(&rank) {
            return Err(ApiError::bad_request(format!(
                "rank {rank} is not live (live ranks: {live:?})"
            )));
        }
    }
    Ok(())
}

use crate::cluster_view::CONTROLLER_UNREACHABLE;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<GenerateInput, ApiError> {
        parse_generate(body.as_bytes(), &HeaderInputs::default())
    }

    #[test]
    fn an_empty_text_is_a_prompt_and_no_tokens_is_a_400() {
        assert!(
            matches!(parse(r#"{"text": ""}"#).unwrap().prompt, Prompt::Text(t) if t.is_empty())
        );
        let limits = Limits {
            vocab_size: 100,
            context_len: 4096,
            live_ranks: Some(vec![0]),
        };
        let sampling = SamplingParams::default();
        let err = check_limits(&[], &sampling, None, &limits).unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.message.contains("no tokens"), "{}", err.message);
        // BOS alone is a prompt.
        check_limits(&[1], &sampling, None, &limits).unwrap();
    }

    #[test]
    fn sglang_s_structured_output_fields_are_one_constraint() {
        let constraint = |sp: &str| {
            let body = format!(r#"{{"text": "a", "sampling_params": {sp}}}"#);
            parse(&body).map(|i| i.sampling.constraint)
        };
        assert_eq!(
            constraint(r#"{"json_schema": "{\"type\": \"string\"}"}"#).unwrap(),
            Some(Constraint::JsonSchema(r#"{"type": "string"}"#.into()))
        );
        assert_eq!(
            constraint(r#"{"json_schema": {"type": "string"}}"#).unwrap(),
            Some(Constraint::JsonSchema(r#"{"type":"string"}"#.into()))
        );
        assert_eq!(
            constraint(r#"{"regex": "[ab]+"}"#).unwrap(),
            Some(Constraint::Regex("[ab]+".into()))
        );
        assert_eq!(
            constraint(r#"{"ebnf": "start: \"a\""}"#).unwrap(),
            Some(Constraint::Lark(r#"start: "a""#.into()))
        );
        assert_eq!(constraint("{}").unwrap(), None);
        let err = constraint(r#"{"regex": "a", "ebnf": "start: \"a\""}"#).unwrap_err();
        assert!(err.message.contains("at most one"), "{}", err.message);
        // GBNF (what SGLang's ebnf takes) becomes Lark; what it cannot say is named.
        let Some(Constraint::Lark(lark)) =
            constraint(r#"{"ebnf": "root ::= \"a\" [0-9]"}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(lark, "%llguidance {}\nstart: \"a\" /[0-9]/\n");
        let err = constraint(r#"{"ebnf": "root ::= <think>"}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("sampling_params.ebnf"));
        assert!(
            err.message.contains("GBNF: token references"),
            "{}",
            err.message
        );
        let err = constraint(r#"{"json_schema": 3}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("sampling_params.json_schema"));
    }

    #[test]
    fn the_rid_limit_is_protocol_s_with_the_suffix_of_sub_requests() {
        let max = protocol::MAX_RID_LEN;
        let body = |rid: &str| format!(r#"{{"text": "a", "rid": "{rid}"}}"#);
        assert!(parse(&body(&"r".repeat(max))).is_ok());
        let err = parse(&body(&"r".repeat(max + 1))).unwrap_err();
        assert!(err.message.contains(&max.to_string()), "{}", err.message);
        let rid = "r".repeat(max - 2);
        assert_eq!(child_rid(&rid, None), rid);
        assert_eq!(child_rid("a", Some(3)), "a-3");
        assert!(check_child_rids(&rid, Some(9)).is_ok());
        let err = check_child_rids(&rid, Some(10)).unwrap_err();
        assert!(err.message.contains("-10"), "{}", err.message);
    }

    #[test]
    fn bad_bodies_are_400_with_a_message() {
        let cases: &[(&str, &str)] = &[
            ("{", "malformed JSON"),
            ("[1]", "must be a JSON object"),
            ("{}", "one of text or input_ids"),
            (r#"{"text": "a", "input_ids": [1]}"#, "not both"),
            (r#"{"input_ids": []}"#, "input_ids is empty"),
            (r#"{"text": 5}"#, "text: expected a string"),
            (r#"{"text": ["a", "b"]}"#, "batch requests"),
            (r#"{"input_ids": [[1], [2]]}"#, "batch requests"),
            (r#"{"input_ids": [1, -2]}"#, "input_ids:"),
            (r#"{"input_ids": "12"}"#, "input_ids:"),
            (
                r#"{"text": "a", "sampling_params": 3}"#,
                "expected an object",
            ),
            (
                r#"{"text": "a", "sampling_params": {"max_new_tokens": "x"}}"#,
                "sampling_params.max_new_tokens",
            ),
            (
                r#"{"text": "a", "sampling_params": {"max_new_tokens": -1}}"#,
                "sampling_params.max_new_tokens",
            ),
            (
                r#"{"text": "a", "sampling_params": {"temperature": -0.5}}"#,
                "temperature must be >= 0",
            ),
            (
                r#"{"text": "a", "sampling_params": {"top_p": 0}}"#,
                "top_p must be in (0, 1]",
            ),
            (
                r#"{"text": "a", "sampling_params": {"top_p": 1.5}}"#,
                "top_p must be in (0, 1]",
            ),
            (r#"{"text": "a", "sampling_params": {"top_k": 0}}"#, "top_k"),
            (r#"{"text": "a", "sampling_params": {"min_p": 2}}"#, "min_p"),
            (
                r#"{"text": "a", "sampling_params": {"repetition_penalty": 0}}"#,
                "repetition_penalty",
            ),
            (
                r#"{"text": "a", "sampling_params": {"presence_penalty": 3}}"#,
                "presence_penalty",
            ),
            (
                r#"{"text": "a", "sampling_params": {"ignore_eos": "yes"}}"#,
                "ignore_eos",
            ),
            (r#"{"text": "a", "stream": "yes"}"#, "stream:"),
            (r#"{"text": "a", "routed_dp_rank": -1}"#, "routed_dp_rank:"),
            (
                r#"{"text": "a", "data_parallel_rank": "x"}"#,
                "data_parallel_rank:",
            ),
            (r#"{"text": "a", "rid": ""}"#, "rid must be"),
            (r#"{"text": "a", "rid": "r\u00e9"}"#, "printable ASCII"),
            (r#"{"text": "a", "rid": "a\nb"}"#, "printable ASCII"),
            (
                r#"{"text": "a", "sampling_params": {"stop": 5}}"#,
                "sampling_params.stop",
            ),
            (
                r#"{"text": "a", "sampling_params": {"stop": ["a", "b", "c", "d", "e"]}}"#,
                "at most 4",
            ),
            (
                r#"{"text": "a", "sampling_params": {"stop": [""]}}"#,
                "must not be empty",
            ),
            (
                r#"{"text": "a", "sampling_params": {"n": 2}}"#,
                "n > 1 is not supported",
            ),
            (
                r#"{"text": "a", "sampling_params": {"logit_bias": {"x": 1}}}"#,
                "not a token id",
            ),
            (
                r#"{"text": "a", "sampling_params": {"logit_bias": {"5": 101}}}"#,
                "[-100, 100]",
            ),
            (
                r#"{"text": "a", "return_logprob": true, "top_logprobs_num": 21}"#,
                "top_logprobs_num must be in [0, 20]",
            ),
            (
                r#"{"text": "a", "top_logprobs_num": -1}"#,
                "top_logprobs_num",
            ),
            (
                r#"{"text": "a", "return_text_in_logprobs": 1}"#,
                "return_text_in_logprobs",
            ),
        ];
        for (body, want) in cases {
            let err = parse(body).expect_err(body);
            assert_eq!(err.status, 400, "{body}");
            assert!(err.message.contains(want), "{body}: {:?}", err.message);
        }
    }

    #[test]
    fn unknown_fields_and_nulls_are_ignored() {
        let input = parse(
            r#"{"text": "hi", "return_hidden_states": false, "log_metrics": true, "rid": null,
                "sampling_params": {"max_new_tokens": 4, "stop": null, "n": 1, "top_k": null},
                "data_parallel_rank": null, "stream": true}"#,
        )
        .unwrap();
        assert_eq!(input.prompt, Prompt::Text("hi".into()));
        assert_eq!(input.sampling.max_new_tokens, 4);
        assert_eq!(input.sampling.top_k, -1);
        assert!(input.stream);
        assert_eq!(input.dispatch.routed_dp_rank, None);
        let input =
            parse(r#"{"text": "hi", "sampling_params": {"stop": "x", "logit_bias": {"7": -100}}}"#)
                .unwrap();
        assert_eq!(input.stop, vec!["x".to_string()]);
        assert_eq!(input.sampling.logit_bias, vec![(7, -100.0)]);
    }

    #[test]
    fn return_routing_comes_from_the_body_or_the_header_which_wins() {
        let with = |header: Option<&str>, body: &str| {
            let headers = HeaderInputs {
                return_routing: header.map(str::to_string),
                ..Default::default()
            };
            parse_generate(body.as_bytes(), &headers).map(|i| i.dispatch.return_routing)
        };
        assert_eq!(with(None, r#"{"text": "a"}"#), Ok(false));
        assert_eq!(
            with(None, r#"{"text": "a", "return_routing": true}"#),
            Ok(true)
        );
        assert_eq!(with(Some("1"), r#"{"text": "a"}"#), Ok(true));
        assert_eq!(with(Some("true"), r#"{"text": "a"}"#), Ok(true));
        assert_eq!(
            with(Some("0"), r#"{"text": "a", "return_routing": true}"#),
            Ok(false)
        );
        let err = with(Some("yes"), r#"{"text": "a"}"#).unwrap_err();
        assert!(err.message.contains("x-dpserve-return-routing"), "{err:?}");
        let err = with(None, r#"{"text": "a", "return_routing": 1}"#).unwrap_err();
        assert!(err.message.contains("return_routing"), "{err:?}");
    }

    #[test]
    fn headers_win_over_body() {
        let headers = HeaderInputs {
            routing_key: Some("h".into()),
            dp_rank: Some("3".into()),
            ..Default::default()
        };
        let body = r#"{"input_ids": [1, 2], "routing_key": "b", "routed_dp_rank": 1}"#;
        let input = parse_generate(body.as_bytes(), &headers).unwrap();
        assert_eq!(input.dispatch.routing_key.as_deref(), Some("h"));
        assert_eq!(input.dispatch.routed_dp_rank, Some(3));
        let input = parse(r#"{"input_ids": [1], "data_parallel_rank": 2}"#).unwrap();
        assert_eq!(input.dispatch.routed_dp_rank, Some(2));
        let bad = HeaderInputs {
            dp_rank: Some("two".into()),
            ..Default::default()
        };
        let err = parse_generate(body.as_bytes(), &bad).unwrap_err();
        assert!(err.message.contains("X-Data-Parallel-Rank"));
    }

    #[test]
    fn an_empty_routing_key_header_leaves_the_body_key_in_force() {
        // A proxy that always sets the header, empty when its client gave none, must not turn
        // a body key into token hashing (the policy treats an empty key as no key).
        for empty in ["", "  "] {
            let headers = HeaderInputs {
                routing_key: Some(empty.into()),
                ..Default::default()
            };
            let body = r#"{"input_ids": [1, 2], "routing_key": "b"}"#;
            let input = parse_generate(body.as_bytes(), &headers).unwrap();
            assert_eq!(
                input.dispatch.routing_key.as_deref(),
                Some("b"),
                "header {empty:?}"
            );
        }
    }

    #[test]
    fn limits_are_checked() {
        let limits = Limits {
            vocab_size: 100,
            context_len: 10,
            live_ranks: Some(vec![0, 1]),
        };
        let input = |body: &str| parse(body).unwrap();
        let cases: &[(&str, &[u32], u16, &str)] = &[
            (
                r#"{"input_ids": [1]}"#,
                &[1, 100],
                400,
                "input_ids[1] = 100 is out of range",
            ),
            (
                r#"{"input_ids": [1], "sampling_params": {"stop_token_ids": [200]}}"#,
                &[1],
                400,
                "stop_token_ids",
            ),
            (
                r#"{"input_ids": [1], "sampling_params": {"max_new_tokens": 8}}"#,
                &[1, 2, 3],
                400,
                "exceeds the context length 10",
            ),
            (
                r#"{"input_ids": [1], "routed_dp_rank": 5, "sampling_params": {"max_new_tokens": 1}}"#,
                &[1],
                400,
                "rank 5 is not live (live ranks: [0, 1])",
            ),
        ];
        for (body, ids, status, want) in cases {
            let input = input(body);
            let err = check_limits(ids, &input.sampling, input.dispatch.routed_dp_rank, &limits)
                .expect_err(body);
            assert_eq!(err.status, *status, "{body}");
            assert!(err.message.contains(want), "{body}: {}", err.message);
        }
        let ok = input(
            r#"{"input_ids": [1], "routed_dp_rank": 1, "sampling_params": {"max_new_tokens": 7}}"#,
        );
        let check = |ids: &[u32], limits: &Limits| {
            check_limits(ids, &ok.sampling, ok.dispatch.routed_dp_rank, limits)
        };
        assert!(check(&[1, 2, 3], &limits).is_ok());
        let none_live = Limits {
            live_ranks: Some(vec![]),
            ..limits.clone()
        };
        assert_eq!(check(&[1], &none_live).unwrap_err().status, 503);
        let unreachable = Limits {
            live_ranks: None,
            ..limits
        };
        let err = check(&[1], &unreachable).unwrap_err();
        assert_eq!(err.status, 503);
        assert!(err.message.contains("controller is unreachable"), "{err}");
    }
}
