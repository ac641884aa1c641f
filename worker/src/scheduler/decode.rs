//! A decode step: make room for one more token per running request (evict, retract), run them
//! in one forward pass, sample each, and keep those that go on.

use protocol::{FinishReason, TokenOut};

use super::Scheduler;
use crate::model::SeqInput;
use crate::request::Req;
use crate::sampling::{sample_reporting, Report};
use grammar::{GrammarError, Guide, LazyGrammars, Mask};

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
        // The constrained requests' masks depend only on their tokens so far: computed on a
        // thread of their own while the forward pass runs.
        let (grammars, running, model) = (&self.grammars, &mut self.running, &self.model);
        let constrained = running.iter().any(|r| r.params.constraint.is_some());
        let (result, masks) = std::thread::scope(|s| {
            let masks = constrained.then(|| s.spawn(|| next_masks(grammars, running)));
            let result = model.forward(kv, &seqs);
            let masks = masks.map(|m| m.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (result, masks)
        });
        match result {
            Ok(logits) => self.sample_running(&logits, masks),
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

    /// Every running request takes its next token from its row of `logits` (masked by its
    /// constraint's mask of this step, in `masks`, when it has one).
    fn sample_running(
        &mut self,
        logits: &[f32],
        masks: Option<Vec<Option<Masked>>>,
    ) -> Vec<TokenOut> {
        let vocab = self.model.config().vocab_size;
        let mut outs = Vec::with_capacity(self.running.len());
        let mut still = Vec::with_capacity(self.running.len());
        let mut masks = masks.unwrap_or_default().into_iter();
        for (n, mut req) in std::mem::take(&mut self.running).into_iter().enumerate() {
            req.len += 1;
            let mut row = logits[n * vocab..(n + 1) * vocab].to_vec();
            let mask = masks.next().flatten();
            match self.sample_and_check(&mut req, &mut row, mask) {
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
    /// constraint cannot be served or continued (the request fails with it, a 400). `mask`:
    /// its constraint's mask for this step, computed already (else it is computed here).
    pub(super) fn sample_and_check(
        &mut self,
        req: &mut Req,
        logits: &mut [f32],
        mask: Option<Masked>,
    ) -> Result<Option<(FinishReason, Option<u32>)>, String> {
        let mask = mask.or_else(|| mask_of(&self.grammars, req));
        if let Some(mask) = mask {
            mask.map_err(|e| e.to_string())?.apply(logits);
        }
        let report = Report {
            logprob: req.return_logprob,
            top: req.top_logprobs_num as usize,
        };
        let picked = sample_reporting(
            logits,
            &req.params,
            &mut req.rng,
            &req.prompt,
            &req.output,
            report,
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
}

/// A constrained request's mask for one step, or why there is none.
type Masked = Result<Mask, GrammarError>;

/// `req`'s guide, if it has a constraint. The first time this worker samples for the request
/// it compiles the constraint and follows the tokens generated before (a disaggregated
/// request's first token, sampled by its prefill worker).
fn guide<'r>(
    grammars: &LazyGrammars,
    req: &'r mut Req,
) -> Result<Option<&'r mut Guide>, GrammarError> {
    let Some(constraint) = &req.params.constraint else {
        return Ok(None);
    };
    if req.guide.is_none() {
        let mut guide = grammars.compile(constraint)?;
        guide.advance_all(&req.output)?;
        req.guide = Some(guide);
    }
    Ok(req.guide.as_mut())
}

/// `req`'s mask for its next step (`None` when it has no constraint).
fn mask_of(grammars: &LazyGrammars, req: &mut Req) -> Option<Masked> {
    guide(grammars, req)
        .and_then(|g| g.map(Guide::next_mask).transpose())
        .transpose()
}

/// Every running request's mask for the next step (`None` for the unconstrained).
fn next_masks(grammars: &LazyGrammars, running: &mut [Req]) -> Vec<Option<Masked>> {
    running
        .iter_mut()
        .map(|req| mask_of(grammars, req))
        .collect()
}
