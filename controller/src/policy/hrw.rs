//! Rendezvous (highest-random-weight) hashing over stable rank ids, and the token-prefix key.
//!
//! ```text
//! d                = u64::from_le_bytes(blake2b-64(key))     (the key digest traces show)
//! score(key, rank) = splitmix64(d ⊕ splitmix64(d ⊕ rank))      (rank as u64)
//! splitmix64(x)    = z ← x + 0x9e3779b97f4a7c15
//!                    z ← (z ⊕ z ≫ 30) · 0xbf58476d1ce4e5b9
//!                    z ← (z ⊕ z ≫ 27) · 0x94d049bb133111eb
//!                    z ⊕ z ≫ 31                              (wrapping u64 arithmetic)
//! order(key)       = live ranks sorted by score, highest first (ties: lower rank id first)
//! ```
//! A rank's score depends only on the key and its own id, so a rank leaving removes only the
//! keys whose first choice it was (they move to their second), and coming back restores exactly
//! those. `splitmix64` is SplitMix64's output function (Steele, Lea and Flood; Stafford's
//! mix13): a bijection of u64 whose every output bit depends on every input bit. Mixing twice,
//! keyed by the digest both times, makes one key's rank scores look independent (tested: first
//! and second choices are uniform over rank pairs), and since every step is a bijection for a
//! fixed key, two ranks never tie. Fixed-width integer arithmetic on little-endian bytes: the
//! same order on every platform and in any language, and a trace's key digest is enough to
//! recompute the order it records.
//!
//! Cost: one blake2b block per decision (keys up to 128 bytes), shared with the trace digest;
//! then about twenty integer operations per live rank and the sort: a bucket pass on the scores'
//! top bits and an insertion pass, O(n) expected for n live ranks because the scores are
//! uniform (a comparison sort of 64 random scores costs more than all of the hashing). Until
//! issue 17 it was one blake2b per live rank. The token key is O(hash_tokens).

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

    /// [`HrwHasher::scores`] for a key whose [`HrwHasher::digest`] the caller already has: a
    /// hasher whose scores derive from the digest skips hashing the key again. The default
    /// ignores `digest`.
    fn scores_with_digest(
        &self,
        key: &[u8],
        digest: u64,
        ranks: &[u32],
        out: &mut Vec<(u64, u32)>,
    ) {
        let _ = digest;
        self.scores(key, ranks, out);
    }

    /// The key of a keyless request: a digest of its first token ids.
    fn token_key(&self, ids: &[u32]) -> [u8; 16];

    /// A short digest identifying `key` in traces (the key itself may be private).
    fn digest(&self, key: &[u8]) -> u64;
}

/// The production hasher: blake2b for keys, SplitMix64 per rank.
#[derive(Debug, Default, Clone, Copy)]
pub struct Blake2Hrw;

use protocol::hash::splitmix64;

/// The HRW score of `rank` for the key whose 64-bit blake2b digest is `digest`.
///
/// Both rounds are keyed by the digest itself, never by a mix of it: keyed by
/// `splitmix64(digest)`, rank 0 would score `splitmix64(0)` for every key.
#[inline]
pub fn score_of_digest(digest: u64, rank: u32) -> u64 {
    splitmix64(digest ^ splitmix64(digest ^ u64::from(rank)))
}

impl HrwHasher for Blake2Hrw {
    fn score(&self, key: &[u8], rank: u32) -> u64 {
        score_of_digest(self.digest(key), rank)
    }

    fn scores(&self, key: &[u8], ranks: &[u32], out: &mut Vec<(u64, u32)>) {
        self.scores_with_digest(key, self.digest(key), ranks, out);
    }

    fn scores_with_digest(
        &self,
        _key: &[u8],
        digest: u64,
        ranks: &[u32],
        out: &mut Vec<(u64, u32)>,
    ) {
        // The key was hashed once, for the digest; each rank costs two integer mixes.
        out.clear();
        out.extend(ranks.iter().map(|&r| (score_of_digest(digest, r), r)));
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
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&Blake2b64::digest(key));
        u64::from_le_bytes(bytes)
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
    sort_into(scratch, order);
}

/// [`order_into`] that also returns the key's [`HrwHasher::digest`], hashing the key once for
/// both (what a routing decision needs: the order, and the digest for its trace).
pub fn digest_and_order_into(
    hasher: &dyn HrwHasher,
    key: &[u8],
    ranks: &[u32],
    scratch: &mut Vec<(u64, u32)>,
    order: &mut Vec<u32>,
) -> u64 {
    let digest = hasher.digest(key);
    hasher.scores_with_digest(key, digest, ranks, scratch);
    sort_into(scratch, order);
    digest
}

/// Convenience: the HRW order as a new vector.
pub fn order(hasher: &dyn HrwHasher, key: &[u8], ranks: &[u32]) -> Vec<u32> {
    let mut scratch = Vec::with_capacity(ranks.len());
    let mut out = Vec::with_capacity(ranks.len());
    order_into(hasher, key, ranks, &mut scratch, &mut out);
    out
}

/// `a` comes before `b` in HRW order: higher score first; equal scores (impossible for
/// Blake2Hrw, possible for an injected hasher) by lower rank id, so the order is still a pure
/// function of the key and the live set.
#[inline]
fn precedes(a: (u64, u32), b: (u64, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

fn insertion_sort(v: &mut [(u64, u32)]) {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && precedes(x, v[j - 1]) {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

/// A bucket holding more than this many scores means they are not uniform (an injected
/// hasher): the insertion pass would go quadratic, so a comparison sort takes over.
const MAX_BUCKET: u32 = 8;

/// Writes the ranks of `scored` (`(score, rank)` pairs) into `order` in HRW order. `scored` is
/// scratch: its contents and length change.
///
/// Scores are uniform 64-bit values, so placing them by their top bits (about two buckets per
/// score, highest bucket first) leaves each within a few places of its final position, and an
/// insertion pass finishes the order: O(n) expected and few mispredicted branches, against
/// O(n log n) mostly mispredicted comparisons for a comparison sort (about 0.8 µs for 64 ranks
/// on the 2-core VM, more than the hashing). Up to 16 scores, insertion alone.
fn sort_into(scored: &mut Vec<(u64, u32)>, order: &mut Vec<u32>) {
    let n = scored.len();
    order.clear();
    if n <= 16 {
        insertion_sort(scored);
        order.extend(scored.iter().map(|&(_, r)| r));
        return;
    }
    let bits = (usize::BITS - (n - 1).leading_zeros() + 1).min(8);
    let shift = 64 - bits;
    let top = (1usize << bits) - 1;
    // Bucket k holds the scores whose top bits are `top - k`: highest scores in bucket 0.
    let bucket = |score: u64| top - (score >> shift) as usize;
    let mut starts = [0u32; 256];
    let mut fullest = 0;
    for &(score, _) in scored.iter() {
        let b = bucket(score);
        starts[b] += 1;
        fullest = fullest.max(starts[b]);
    }
    if fullest > MAX_BUCKET {
        scored.sort_unstable_by(|&a, &b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        order.extend(scored.iter().map(|&(_, r)| r));
        return;
    }
    let mut sum = 0;
    for s in &mut starts[..=top] {
        (*s, sum) = (sum, sum + *s);
    }
    // Scatter into the second half of the scratch, then order that half.
    scored.resize(2 * n, (0, 0));
    let (src, dst) = scored.split_at_mut(n);
    for &pair in src.iter() {
        let b = bucket(pair.0);
        dst[starts[b] as usize] = pair;
        starts[b] += 1;
    }
    insertion_sort(dst);
    order.extend(dst.iter().map(|&(_, r)| r));
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
    fn score_is_splitmix64_of_digest_xor_splitmix64_of_digest_xor_rank() {
        // Pins the contract (module doc, docs/ARCHITECTURE.md) so other implementations can
        // reproduce the order: computed from the formula, and golden values from an independent
        // Python implementation (hashlib.blake2b(key, digest_size=8), little-endian).
        let d = Blake2Hrw.digest(b"k");
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&Blake2b64::digest(b"k"));
        assert_eq!(d, u64::from_le_bytes(bytes));
        assert_eq!(d, 0x63d4_85f9_5fcb_52ac);
        assert_eq!(Blake2Hrw.score(b"k", 3), splitmix64(d ^ splitmix64(d ^ 3)));
        assert_eq!(Blake2Hrw.score(b"k", 3), 0xce1d_6503_bc5c_9a46);
        assert_eq!(Blake2Hrw.score(b"k", 0), 0xa3e9_0d16_18be_ea0f);
        assert_eq!(
            Blake2Hrw.score(b"conversation-000042", 7),
            0x4576_1735_e37b_a3aa
        );
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(
            order(&Blake2Hrw, b"conversation-000042", &all),
            [0, 5, 6, 4, 2, 7, 3, 1]
        );
        let all: Vec<u32> = (0..64).collect();
        assert_eq!(
            order(&Blake2Hrw, b"k", &all)[..8],
            [53, 28, 14, 31, 27, 6, 26, 25]
        );
    }

    #[test]
    fn the_digest_in_the_trace_is_enough_to_recompute_the_order() {
        let ranks = [4u32, 0, 9, 2, 7];
        let (mut scratch, mut got) = (Vec::new(), Vec::new());
        let d = digest_and_order_into(&Blake2Hrw, b"user-9", &ranks, &mut scratch, &mut got);
        assert_eq!(d, Blake2Hrw.digest(b"user-9"));
        assert_eq!(got, order(&Blake2Hrw, b"user-9", &ranks));
        let mut by_digest: Vec<u32> = ranks.to_vec();
        by_digest.sort_by_key(|&r| std::cmp::Reverse(score_of_digest(d, r)));
        assert_eq!(got, by_digest);
    }

    /// Chi-square of observed counts against a uniform expectation.
    fn chi_square(counts: impl Iterator<Item = usize>, cells: usize, total: usize) -> f64 {
        let expected = total as f64 / cells as f64;
        counts
            .map(|c| (c as f64 - expected).powi(2) / expected)
            .sum()
    }

    #[test]
    fn first_and_second_choices_are_uniform_over_rank_pairs() {
        // Spill goes to a key's second choice, so the (first, second) pair must be uniform
        // over the 56 ordered pairs of 8 ranks, not only the first choice: one mixing round
        // keyed weakly (or rank 0 scoring a constant) shows here. 55 degrees of freedom:
        // mean 55, and 100 is p ≈ 1e-4 (the keys are fixed, so the result is too).
        let all: Vec<u32> = (0..8).collect();
        let mut pairs = [[0usize; 8]; 8];
        let keys = 56_000;
        for k in 0..keys {
            let o = order(&Blake2Hrw, format!("key-{k}").as_bytes(), &all);
            pairs[o[0] as usize][o[1] as usize] += 1;
        }
        let counts = (0..8).flat_map(|a| (0..8).filter(move |&b| b != a).map(move |b| (a, b)));
        let chi = chi_square(counts.map(|(a, b)| pairs[a][b]), 56, keys);
        assert!(chi < 100.0, "chi-square {chi:.1} over 55 dof: {pairs:?}");

        // First choices over 64 ranks: 63 dof, 110 is p ≈ 1e-4.
        let all: Vec<u32> = (0..64).collect();
        let mut first = [0usize; 64];
        let keys = 64 * 500;
        for k in 0..keys {
            first[order(&Blake2Hrw, format!("key-{k}").as_bytes(), &all)[0] as usize] += 1;
        }
        let chi = chi_square(first.iter().copied(), 64, keys);
        assert!(chi < 110.0, "chi-square {chi:.1} over 63 dof: {first:?}");
    }

    #[test]
    fn one_key_never_ties_two_ranks() {
        // Every step of the mix is a bijection for a fixed key, so 10k ranks score 10k values.
        let ranks: Vec<u32> = (0..10_000).collect();
        let mut scores = Vec::new();
        Blake2Hrw.scores(b"k", &ranks, &mut scores);
        let distinct: std::collections::BTreeSet<u64> = scores.iter().map(|s| s.0).collect();
        assert_eq!(distinct.len(), ranks.len());
    }

    #[test]
    fn the_bucket_sort_orders_like_a_comparison_sort() {
        // Uniform scores (the bucket path), skewed ones (the fallback) and ties (lower rank
        // first), at every size around the thresholds.
        let reference = |pairs: &[(u64, u32)]| {
            let mut v = pairs.to_vec();
            v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            v.into_iter().map(|(_, r)| r).collect::<Vec<u32>>()
        };
        for n in [0usize, 1, 2, 15, 16, 17, 33, 64, 100, 300, 1000] {
            for (name, score) in [
                ("uniform", (|i: u64| splitmix64(i)) as fn(u64) -> u64),
                ("skewed", |i| splitmix64(i) >> 20),
                ("ties", |i| splitmix64(i % 5) | (1 << 63)),
            ] {
                let pairs: Vec<(u64, u32)> = (0..n as u32)
                    .map(|r| (score(u64::from(r) + n as u64), r * 3 % 1009))
                    .collect();
                let (mut scratch, mut got) = (pairs.clone(), Vec::new());
                sort_into(&mut scratch, &mut got);
                assert_eq!(got, reference(&pairs), "{name}, n = {n}");
            }
        }
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
