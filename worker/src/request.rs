//! One request inside the worker: its tokens, where their KV lives, and how far it has come.

use std::time::Instant;

use protocol::{GenerateReq, SamplingParams};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// What the request wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    Generate,
    Embed,
}

#[derive(Debug)]
pub struct Req {
    pub rid: String,
    pub kind: ReqKind,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub params: SamplingParams,
    pub return_logprob: bool,
    /// Alternatives to report per output token (0: none).
    pub top_logprobs_num: u32,
    pub rng: StdRng,
    /// Row of the request-to-token pool while admitted: column `p` is the KV slot of position
    /// `p` of `prompt ++ output`.
    pub row: Option<usize>,
    /// Positions whose K/V are computed (in `row[..len]`). While decoding, the last sampled
    /// token is not computed yet, so `len == total_len() - 1`.
    pub len: usize,
    /// `row[..cached_len]` belongs to the radix cache (and is locked through `cache_node`);
    /// `row[cached_len..len]` belongs to the request.
    pub cached_len: usize,
    pub cache_node: Option<crate::kv::radix_cache::NodeId>,
    /// Prompt tokens whose KV came from the prefix cache at admission.
    pub cached_tokens: u32,
    /// Admitted at least once (prefix matched and counted).
    pub admitted_once: bool,
    /// Output tokens already sent to the tokenizer.
    pub sent: usize,
    pub logprobs: Vec<f32>,
    /// Per output token, when `top_logprobs_num` > 0.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    pub arrived: Instant,
    /// On a prefill worker, once paired: the decode worker this request's KV goes to. (A
    /// decode worker keeps its transfers beside their requests, in its own queues.)
    pub leg: Option<crate::disagg::PrefillLeg>,
    /// The controller's routing records, when the client asked for them: handed back, once,
    /// in the request's first `TokenOut`.
    pub routing: Vec<protocol::route_record::RouteRecord>,
    /// The request's constraint (`params.constraint`) as far as its output: compiled on the
    /// first token this worker samples for it, and kept through retraction.
    pub guide: Option<grammar::Guide>,
}

impl Req {
    pub fn generate(req: GenerateReq) -> Self {
        let seed = req.sampling.seed.unwrap_or_else(rand::random);
        let mut r = Req::new(
            req.rid,
            ReqKind::Generate,
            req.input_ids,
            req.sampling,
            req.return_logprob,
            seed,
        );
        // Alternatives come with the chosen tokens' logprobs, never alone (as SGLang).
        if req.return_logprob {
            // Clamped: any peer on the wire could otherwise ask for the whole vocabulary.
            r.top_logprobs_num = req.top_logprobs_num.min(protocol::MAX_TOP_LOGPROBS_NUM);
        }
        r.routing = req.routing;
        r
    }

    pub fn embed(rid: String, input_ids: Vec<u32>) -> Self {
        let params = SamplingParams {
            max_new_tokens: 0,
            ..SamplingParams::default()
        };
        Req::new(rid, ReqKind::Embed, input_ids, params, false, 0)
    }

    /// A request not yet admitted: no row, nothing computed or sent.
    fn new(
        rid: String,
        kind: ReqKind,
        prompt: Vec<u32>,
        params: SamplingParams,
        return_logprob: bool,
        seed: u64,
    ) -> Self {
        Req {
            rid,
            kind,
            prompt,
            output: Vec::new(),
            params,
            return_logprob,
            top_logprobs_num: 0,
            rng: StdRng::seed_from_u64(seed),
            row: None,
            len: 0,
            cached_len: 0,
            cache_node: None,
            cached_tokens: 0,
            admitted_once: false,
            sent: 0,
            logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            arrived: Instant::now(),
            leg: None,
            routing: Vec::new(),
            guide: None,
        }
    }

    /// Length of `prompt ++ output`.
    pub fn total_len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Tokens at positions `from..to` of `prompt ++ output`.
    pub fn token_range(&self, from: usize, to: usize) -> Vec<u32> {
        self.prompt
            .iter()
            .chain(&self.output)
            .skip(from)
            .take(to - from)
            .copied()
            .collect()
    }

    /// Positions still to compute before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.total_len() - self.len
    }
}
