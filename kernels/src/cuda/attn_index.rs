//! The slots each query token attends to, in the form the attention kernel reads: the CPU's
//! `token_slots: &[&[u32]]` as one flat slot array with a (start, length) per token. Tokens of
//! one prefill chunk attend to growing prefixes of the same request row, so the row is stored
//! once and shared (a chunk of `n` new tokens after `p` cached ones uploads `p + n` slots, not
//! `O(n · (p + n))`). Host-side only: built and checked without a GPU.

/// `token_slots` flattened: token `t` attends to `slots[start[t] as usize..][..len[t] as usize]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttnIndex {
    pub slots: Vec<u32>,
    pub start: Vec<u32>,
    pub len: Vec<u32>,
}

impl AttnIndex {
    /// The index of `token_slots` (as `kernels::attention` takes them). A token whose slots
    /// begin at the same address as the previous token's reuses its row (extending it when
    /// longer), as `kernels::attention` groups a sequence's tokens.
    ///
    /// # Panics
    /// If more than `u32::MAX` slots would be stored (a batch no pool can hold).
    pub fn from_token_slots(token_slots: &[&[u32]]) -> Self {
        let mut index = AttnIndex::default();
        index.fill(token_slots);
        index
    }

    /// [`Self::from_token_slots`] into this index's buffers (cleared first).
    pub fn fill(&mut self, token_slots: &[&[u32]]) {
        self.slots.clear();
        self.start.clear();
        self.len.clear();
        // The last row stored: its source address, where it starts and how long it is.
        let mut last: Option<(*const u32, usize, usize)> = None;
        let offset = |v: usize| u32::try_from(v).expect("attention index past u32");
        for s in token_slots {
            let (start, stored) = match last {
                Some((ptr, start, stored)) if ptr == s.as_ptr() => (start, stored),
                _ => (self.slots.len(), 0),
            };
            if s.len() > stored {
                // The shared row is the last one stored, so it can grow in place.
                debug_assert_eq!(start + stored, self.slots.len());
                self.slots.extend_from_slice(&s[stored..]);
            }
            last = Some((s.as_ptr(), start, stored.max(s.len())));
            self.start.push(offset(start));
            self.len.push(offset(s.len()));
        }
    }

    /// Query tokens.
    pub fn tokens(&self) -> usize {
        self.start.len()
    }

    /// The slots of token `t`.
    pub fn token(&self, t: usize) -> &[u32] {
        &self.slots[self.start[t] as usize..][..self.len[t] as usize]
    }

    /// This index with each token cut to its last `window` slots (a sliding window's layers):
    /// the same shared rows, each token's start moved up, so the window costs no slots per
    /// token.
    pub fn windowed(&self, window: usize) -> Self {
        let mut w = self.clone();
        for (start, len) in w.start.iter_mut().zip(w.len.iter_mut()) {
            let cut = len.saturating_sub(u32::try_from(window).unwrap_or(u32::MAX));
            *start += cut;
            *len -= cut;
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_shared_within_a_sequence_and_every_token_reads_its_own_slots() {
        // Request A: 3 cached + a chunk of 3 new tokens; request B: one decode token;
        // request C: a prefix shorter than an earlier token of its row (out of order).
        let a: Vec<u32> = vec![10, 11, 12, 13, 14, 15];
        let b: Vec<u32> = vec![40, 41, 42, 43, 44];
        let c: Vec<u32> = vec![7, 8, 9];
        let token_slots: Vec<&[u32]> = vec![&a[..4], &a[..5], &a[..6], &b[..], &c[..3], &c[..1]];
        let index = AttnIndex::from_token_slots(&token_slots);
        assert_eq!(index.tokens(), 6);
        for (t, want) in token_slots.iter().enumerate() {
            assert_eq!(index.token(t), *want, "token {t}");
        }
        // Each row stored once.
        assert_eq!(index.slots.len(), a.len() + b.len() + c.len());
        assert_eq!(index.start, [0, 0, 0, 6, 11, 11]);
        let mut again = index.clone();
        again.fill(&token_slots[3..4]);
        assert_eq!((again.slots, again.start, again.len), (b, vec![0], vec![5]));
    }

    #[test]
    fn a_window_keeps_each_tokens_last_slots_of_the_shared_rows() {
        let a: Vec<u32> = (10..20).collect();
        let token_slots: Vec<&[u32]> = vec![&a[..2], &a[..7], &a[..10], &a[..3]];
        let index = AttnIndex::from_token_slots(&token_slots).windowed(4);
        for (t, s) in token_slots.iter().enumerate() {
            assert_eq!(index.token(t), &s[s.len().saturating_sub(4)..], "token {t}");
        }
        assert_eq!(index.slots.len(), a.len());
    }

    #[test]
    fn equal_slots_in_different_rows_are_not_merged() {
        let x = vec![1u32, 2, 3];
        let y = x.clone();
        let index = AttnIndex::from_token_slots(&[&x, &y]);
        assert_eq!(index.start, [0, 3]);
    }
}
