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
    pub rng: StdRng,
    /// KV slot of each computed position: `slots.len()` positions of `prompt ++ output` have
    /// their K/V in the pool. While decoding, the last sampled token is not computed yet.
    pub slots: Vec<u32>,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: u32,
    /// Output tokens already sent to the tokenizer.
    pub sent: usize,
    pub logprobs: Vec<f32>,
    pub arrived: Instant,
}

impl Req {
    pub fn generate(req: GenerateReq) -> Self {
        let seed = req.sampling.seed.unwrap_or_else(rand::random);
        Req {
            rid: req.rid,
            kind: ReqKind::Generate,
            prompt: req.input_ids,
            output: Vec::new(),
            params: req.sampling,
            return_logprob: req.return_logprob,
            rng: StdRng::seed_from_u64(seed),
            slots: Vec::new(),
            cached_tokens: 0,
            sent: 0,
            logprobs: Vec::new(),
            arrived: Instant::now(),
        }
    }

    pub fn embed(rid: String, input_ids: Vec<u32>) -> Self {
        Req {
            rid,
            kind: ReqKind::Embed,
            prompt: input_ids,
            output: Vec::new(),
            params: SamplingParams {
                max_new_tokens: 0,
                ..SamplingParams::default()
            },
            return_logprob: false,
            rng: StdRng::seed_from_u64(0),
            slots: Vec::new(),
            cached_tokens: 0,
            sent: 0,
            logprobs: Vec::new(),
            arrived: Instant::now(),
        }
    }

    /// Length of `prompt ++ output`.
    pub fn total_len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Token at position `pos` of `prompt ++ output`.
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
        self.total_len() - self.slots.len()
    }
}
