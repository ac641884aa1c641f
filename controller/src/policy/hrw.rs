//! Rendezvous (highest-random-weight) hashing over stable rank ids, and the token-prefix key.
//!
//! ```text
//! score(key, rank) = u64::from_le_bytes(blake2b-64(key ‖ 0x00 ‖ rank.to_le_bytes()))
//! order(key)       = live ranks sorted by score, highest first (ties: lower rank id first)
//! ```
//! A rank's score depends only on the key and its own id, so a rank leaving removes only the
//! keys whose first choice it was (they move to their second), and coming back restores exactly
//! those. The rank is hashed as its 4 little-endian `u32` bytes, not as a decimal string.
//!
//! Cost: one blake2b block per live rank (the `key ‖ 0x00` prefix is absorbed once and the state
//! cloned), then a sort: O(n log n) for n live ranks; the token key is O(hash_tokens).

use blake2::digest::consts::{U16, U8};
use blake2::{Blake2b, Digest};

type Blake2b64 = Blake2b<U8>;
type Blake2b128 = Blake2b<U16>;

/// The hashes prefix affinity uses; injectable so tests can pin scores.
pub trait HrwHasher: Send {
    /// HRW score of `rank` for `key`.
    fn score(&self, key: &[u8], rank: u32) -> u64;

    /// Scores of every rank in `ranks`, same order. The default calls [`HrwHasher::score`].
    fn scores(&self, key: &[u8], ranks: &[u32], out: &mut Vec<(u64, u32)>) {
        out.clear();
        out.extend(ranks.iter().map(|&r| (self.score(key, r), r)));
    }

    /// The key of a keyless request: a digest of its first token ids.
    fn token_key(&self, ids: &[u32]) -> [u8; 16];

    /// A short digest identifying `key` in traces (the key itself may be private).
    fn digest(&self, key: &[u8]) -> u64;
}

/// The production hasher: blake2b throughout.
#[derive(Debug, Default, Clone, Copy)]
pub struct Blake2Hrw;

fn finish64(h: Blake2b64) -> u64 {
    let out = h.finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&out);
    u64::from_le_bytes(bytes)
}

impl HrwHasher for Blake2Hrw {
    fn score(&self, key: &[u8], rank: u32) -> u64 {
        let mut h = Blake2b64::new();
        h.update(key);
        h.update([0u8]);
        h.update(rank.to_le_bytes());
        finish64(h)
    }

    fn scores(&self, key: &[u8], ranks: &[u32], out: &mut Vec<(u64, u32)>) {
        // Absorb the key once; long routing keys then cost one block per rank, not one pass.
        let mut base = Blake2b64::new();
        base.update(key);
        base.update([0u8]);
        out.clear();
        out.extend(ranks.iter().map(|&r| {
            let mut h = base.clone();
            h.update(r.to_le_bytes());
            (finish64(h), r)
        }));
    }

    fn token_key(&self, ids: &[u32]) -> [u8; 16] {
        // Little-endian u32 bytes, converted through a stack buffer: no allocation, and the
        // same key on every platform.
        let mut h = Blake2b128::new();
        let mut buf = [0u8; 1024];
        for chunk in ids.chunks(buf.len() / 4) {
            for (dst, id) in buf.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&id.to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 4]);
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&h.finalize());
        key
    }

    fn digest(&self, key: &[u8]) -> u64 {
        let mut h = Blake2b64::new();
        h.update(key);
        finish64(h)
    }
}

/// The ranks in HRW order for `key`, preferred first, written into `order`; `scratch` is reused
/// between calls to avoid an allocation per decision.
pub fn order_into(
    hasher: &dyn HrwHasher,
    key: &[u8],
    ranks: &[u32],
    scratch: &mut Vec<(u64, u32)>,
    order: &mut Vec<u32>,
) {
    hasher.scores(key, ranks, scratch);
    // Highest score first; equal scores (vanishingly rare with 64 bits) by rank id so the order
    // is still a pure function of the key and the live set.
    scratch.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    order.clear();
    order.extend(scratch.iter().map(|&(_, r)| r));
}

/// Convenience: the HRW order as a new vector.
pub fn order(hasher: &dyn HrwHasher, key: &[u8], ranks: &[u32]) -> Vec<u32> {
    let mut scratch = Vec::with_capacity(ranks.len());
    let mut out = Vec::with_capacity(ranks.len());
    order_into(hasher, key, ranks, &mut scratch, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_scores_equal_single_scores() {
        let h = Blake2Hrw;
        let ranks: Vec<u32> = (0..16).collect();
        let mut out = Vec::new();
        h.scores(b"conversation-42", &ranks, &mut out);
        for (score, rank) in out {
            assert_eq!(score, h.score(b"conversation-42", rank));
        }
    }

    #[test]
    fn score_is_blake2b64_of_key_zero_rank_le() {
        // Pins the contract in DESIGN.md so other implementations can reproduce the order.
        let mut h = Blake2b64::new();
        h.update(b"k\x00\x03\x00\x00\x00");
        assert_eq!(Blake2Hrw.score(b"k", 3), finish64(h));
    }

    #[test]
    fn token_key_is_blake2b128_of_le_u32_bytes() {
        let ids: Vec<u32> = (0..1000).map(|i| i * 7919).collect();
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut key = [0u8; 16];
        key.copy_from_slice(&Blake2b128::digest(&bytes));
        assert_eq!(Blake2Hrw.token_key(&ids), key);
    }

    #[test]
    fn removing_a_rank_keeps_the_relative_order_of_the_rest() {
        let all: Vec<u32> = (0..8).collect();
        for k in 0..50u32 {
            let key = k.to_le_bytes();
            let full = order(&Blake2Hrw, &key, &all);
            let without: Vec<u32> = all.iter().copied().filter(|&r| r != 3).collect();
            let expect: Vec<u32> = full.iter().copied().filter(|&r| r != 3).collect();
            assert_eq!(order(&Blake2Hrw, &key, &without), expect);
        }
    }
}
