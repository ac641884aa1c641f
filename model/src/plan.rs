//! A step's batch plan: the one description of a forward pass that every device executes. The
//! scheduler hands the model its sequences ([`SeqInput`]: new tokens, the position they start
//! at, the KV slot of every position); the plan checks them against the model and the pool
//! once and flattens them into per-token arrays. The CPU pass (`forward.rs`) and the CUDA pass
//! (`cuda.rs`) read the same plan, so neither validates on its own and the scheduler never asks
//! which device it drives.

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::SeqInput;

/// All new tokens of one step, flattened in sequence order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPlan<'a> {
    /// Token id of each new token.
    pub ids: Vec<u32>,
    /// Position of each new token in its sequence.
    pub positions: Vec<usize>,
    /// The slot each new token's K/V is written to.
    pub write_slots: Vec<u32>,
    /// For each new token, the slots of its sequence's positions `0..=p`: the cached prefix,
    /// the earlier tokens of its chunk, itself; with a sliding window only the last
    /// `sliding_window` of them (every position's K/V stays in its slot, so a window is only
    /// which slots a token reads: prefix caching and chunking are unaffected).
    pub attend: Vec<&'a [u32]>,
    /// Row (in the flat token list) of each sequence's last new token: the rows whose logits
    /// (or hidden state) the step returns, one per sequence, in sequence order.
    pub logit_rows: Vec<usize>,
    /// The pool size every slot was checked against: a device executes the plan only on a pool
    /// at least this large.
    pub num_slots: usize,
}

fn bad(reason: String) -> ModelError {
    ModelError::BadInput { reason }
}

impl<'a> BatchPlan<'a> {
    /// Checks every sequence against the model and a pool of `num_slots` slots, then flattens
    /// them. A sequence with no new tokens, slots that do not cover its positions, a position
    /// past the model's context, a slot outside the pool or a token outside the vocabulary is
    /// refused with the sequence's index.
    pub fn new(cfg: &ModelConfig, num_slots: usize, seqs: &[SeqInput<'a>]) -> Result<Self> {
        let total: usize = seqs.iter().map(|s| s.new_tokens.len()).sum();
        let mut plan = BatchPlan {
            ids: Vec::with_capacity(total),
            positions: Vec::with_capacity(total),
            write_slots: Vec::with_capacity(total),
            attend: Vec::with_capacity(total),
            logit_rows: Vec::with_capacity(seqs.len()),
            num_slots,
        };
        for (i, s) in seqs.iter().enumerate() {
            let end = s.start_pos + s.new_tokens.len();
            if s.new_tokens.is_empty() {
                return Err(bad(format!("seq {i}: no new tokens")));
            }
            if s.slots.len() != end {
                return Err(bad(format!(
                    "seq {i}: {} slots for start_pos {} + {} new tokens",
                    s.slots.len(),
                    s.start_pos,
                    s.new_tokens.len()
                )));
            }
            if end > cfg.max_position_embeddings {
                return Err(bad(format!(
                    "seq {i}: position {} >= max_position_embeddings {}",
                    end - 1,
                    cfg.max_position_embeddings
                )));
            }
            if let Some(&slot) = s.slots.iter().find(|&&x| x as usize >= num_slots) {
                return Err(bad(format!(
                    "seq {i}: slot {slot} >= num_slots {num_slots}"
                )));
            }
            if let Some(&t) = s.new_tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(bad(format!(
                    "seq {i}: token id {t} >= vocab_size {}",
                    cfg.vocab_size
                )));
            }
            for (j, &t) in s.new_tokens.iter().enumerate() {
                let p = s.start_pos + j;
                plan.ids.push(t);
                plan.positions.push(p);
                plan.write_slots.push(s.slots[p]);
                plan.attend.push(&s.slots[cfg.attend_from(p)..=p]);
            }
            plan.logit_rows.push(plan.ids.len() - 1);
        }
        Ok(plan)
    }

    /// New tokens in the step.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Sequences in the step (rows of its result).
    pub fn seqs(&self) -> usize {
        self.logit_rows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BuiltinSize;

    #[test]
    fn a_plan_flattens_prefix_chunks_and_decodes_in_sequence_order() {
        let cfg = ModelConfig::builtin(BuiltinSize::Tiny);
        // A chunk of 2 new tokens after 3 cached positions, and one decode token.
        let a_slots = [7u32, 8, 9, 10, 11];
        let b_slots = [3u32, 4];
        let seqs = [
            SeqInput {
                new_tokens: &[5, 6],
                start_pos: 3,
                slots: &a_slots,
            },
            SeqInput {
                new_tokens: &[1],
                start_pos: 1,
                slots: &b_slots,
            },
        ];
        let plan = BatchPlan::new(&cfg, 16, &seqs).unwrap();
        assert_eq!(plan.ids, [5, 6, 1]);
        assert_eq!(plan.positions, [3, 4, 1]);
        assert_eq!(plan.write_slots, [10, 11, 4]);
        assert_eq!(plan.attend, [&a_slots[..4], &a_slots[..], &b_slots[..]]);
        assert_eq!(plan.logit_rows, [1, 2]);
        assert_eq!((plan.tokens(), plan.seqs()), (3, 2));
    }

    #[test]
    fn a_bad_sequence_is_refused_with_its_index() {
        let cfg = ModelConfig::builtin(BuiltinSize::Tiny);
        let ok = SeqInput {
            new_tokens: &[1],
            start_pos: 0,
            slots: &[0],
        };
        let vocab = cfg.vocab_size as u32;
        for (bad, want) in [
            (
                SeqInput {
                    new_tokens: &[],
                    start_pos: 0,
                    slots: &[],
                },
                "seq 1: no new tokens",
            ),
            (
                SeqInput {
                    new_tokens: &[1, 2],
                    start_pos: 0,
                    slots: &[0],
                },
                "seq 1: 1 slots for start_pos 0 + 2 new tokens",
            ),
            (
                SeqInput {
                    new_tokens: &[1],
                    start_pos: 0,
                    slots: &[16],
                },
                "seq 1: slot 16 >= num_slots 16",
            ),
            (
                SeqInput {
                    new_tokens: &[vocab],
                    start_pos: 0,
                    slots: &[1],
                },
                "seq 1: token id",
            ),
        ] {
            let e = BatchPlan::new(&cfg, 16, &[ok, bad])
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
