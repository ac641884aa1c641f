//! A decode step: make room for one more token per running request (evict, retract), run them
//! in one forward pass, sample each, and keep those that go on.

use protocol::{FinishReason, TokenOut};

use super::Scheduler;
use crate::model::SeqInput;
use crate::request::Req;
use crate::sampling::sample;

impl Scheduler {
    pub(super) fn decode_step(&mut self) -> Vec<TokenOut> {
        if !self.make_room() {
            // One request that fills the whole pool: it cannot grow further.
            let running = std::mem::take(&mut self.running);
            return running
                .into_iter()
                .map(|req| self.finish(req, FinishReason::Length, None))
                .collect();
        }
        for req in &self.running {
            self.mem.grow(req, 1);
        }
        let (kv, rows) = self.mem.split();
        let tokens: Vec<Vec<u32>> = self
            .running
            .iter()
            .map(|req| req.token_range(req.len, req.len + 1))
            .collect();
        let seqs: Vec<SeqInput<'_>> = self
            .running
            .iter()
            .zip(&tokens)
            .map(|(req, t)| SeqInput {
                new_tokens: t,
                start_pos: req.len,
                slots: rows.slots(req, req.len + 1),
            })
            .collect();
        match self.model.forward(kv, &seqs) {
            Ok(logits) => self.sample_running(&logits),
            Err(e) => {
                tracing::error!(%e, "decode forward failed");
                let running = std::mem::take(&mut self.running);
                running
                    .into_iter()
                    .map(|req| {
                        // The new slot holds no valid KV: back to the allocator, never into
                        // the cache.
                        self.mem.shrink(&req, 1);
                        self.fail(req, 500, format!("model forward failed: {e}"))
                    })
                    .collect()
            }
        }
    }

    /// Frees one slot per running request: evicts from the cache, then sends back
    /// half-prefilled requests (their KV goes to the cache, evictable), then retracts the
    /// running requests with the fewest generated tokens (cheapest to redo). False when even
    /// one request alone cannot grow.
    fn make_room(&mut self) -> bool {
        while !self.mem.ensure_free(self.running.len()) {
            let Some(req) = self.prefilling.pop_back() else {
                break;
            };
            self.retract(req);
        }
        while !self.mem.ensure_free(self.running.len()) && self.running.len() > 1 {
            let victim = (0..self.running.len())
                .min_by_key(|&i| {
                    (
                        self.running[i].output.len(),
                        std::cmp::Reverse(self.running[i].arrived),
                    )
                })
                .unwrap_or(0);
            let req = self.running.swap_remove(victim);
            tracing::debug!(rid = %req.rid, "retracting request: KV pool is full");
            self.retract(req);
        }
        self.mem.free_slots() >= self.running.len()
    }

    /// Every running request takes its next token from its row of `logits`.
    fn sample_running(&mut self, logits: &[f32]) -> Vec<TokenOut> {
        let vocab = self.model.config().vocab_size;
        let mut outs = Vec::with_capacity(self.running.len());
        let mut still = Vec::with_capacity(self.running.len());
        for (n, mut req) in std::mem::take(&mut self.running).into_iter().enumerate() {
            req.len += 1;
            let mut row = logits[n * vocab..(n + 1) * vocab].to_vec();
            match self.sample_and_check(&mut req, &mut row) {
                Ok(Some((reason, matched))) => outs.push(self.finish(req, reason, matched)),
                Ok(None) => {
                    outs.push(self.progress(&mut req));
                    still.push(req);
                }
                Err(e) => outs.push(self.fail(req, 400, e)),
            }
        }
        self.running = still;
        outs
    }

    /// Put a request back in the queue; its KV stays in the cache (evictable) so resuming it
    /// may be cheap, and its output so far is kept.
    pub(super) fn retract(&mut self, mut req: Req) {
        self.mem.release(&mut req);
        self.waiting.push_front(req);
    }

    /// Sample the next token into `req` and say whether it ends the request; an error when its
    /// constraint cannot be served or continued (the request fails with it, a 400).
    pub(super) fn sample_and_check(
        &mut self,
        req: &mut Req,
        logits: &mut [f32],
    ) -> Result<Option<(FinishReason, Option<u32>)>, String> {
        self.constrain(req, logits).map_err(|e| e.to_string())?;
        let picked = sample(
            logits,
            &req.params,
            &mut req.rng,
            &req.prompt,
            &req.output,
            req.top_logprobs_num as usize,
        );
        let token = picked.token;
        req.output.push(token);
        if req.return_logprob {
            req.logprobs.push(picked.logprob);
        }
        if req.top_logprobs_num > 0 {
            req.top_logprobs.push(picked.top_logprobs);
        }
        self.stats.generated_tokens += 1;
        let eos = &self.model.config().eos_token_ids;
        if !req.params.ignore_eos && eos.contains(&token) {
            return Ok(Some((FinishReason::Stop, Some(token))));
        }
        if req.params.stop_token_ids.contains(&token) {
            return Ok(Some((FinishReason::Stop, Some(token))));
        }
        if let Some(guide) = &mut req.guide {
            // The text is complete and nothing can follow: the constraint ends it, as an EOS.
            if guide.advance(token).map_err(|e| e.to_string())? {
                return Ok(Some((FinishReason::Stop, None)));
            }
        }
        if req.output.len() >= req.params.max_new_tokens as usize
            || req.total_len() >= self.config.context_len
        {
            return Ok(Some((FinishReason::Length, None)));
        }
        Ok(None)
    }

    /// Masks `logits` to the tokens `req`'s constraint allows next. The first time this worker
    /// samples for the request it compiles the constraint and follows the tokens generated
    /// before (a disaggregated request's first token, sampled by its prefill worker).
    fn constrain(&self, req: &mut Req, logits: &mut [f32]) -> Result<(), grammar::GrammarError> {
        let Some(constraint) = &req.params.constraint else {
            return Ok(());
        };
        let guide = match &mut req.guide {
            Some(guide) => guide,
            None => {
                let mut guide = self.grammars.compile(constraint)?;
                guide.advance_all(&req.output)?;
                req.guide.insert(guide)
            }
        };
        guide.mask(logits)
    }
}
