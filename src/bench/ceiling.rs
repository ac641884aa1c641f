//! The workload's own cache-hit ceilings, computed from the prompts alone, to read a server's
//! hit rate against: what share of prompt tokens any router could have served from cache.
//!
//! ```text
//! matched(i)   = longest prefix of prompt i, in whole chunks of g tokens, that an earlier
//!                prompt (send order) also began with; at most len(i) − 1 (a server computes
//!                at least the last prompt token)
//! unlimited    = Σ matched / Σ len            every prefix ever seen stays cached
//! pooled LRU   = the same through one LRU cache of C tokens (C = every rank's KV pool added
//!                up): after each prompt, its chunks are the most recent; least recent first out
//! ```
//! The unlimited ceiling is a true bound: no router and no cache serves a prefix never sent
//! before. The pooled one is a reference, not a bound: it is what the plainest cache the size
//! of the whole deployment keeps (prompt KV only, no running requests). A router can pass it,
//! because LRU is not the best eviction and ranks with their own LRUs can keep what one pooled
//! LRU would have evicted; far below it, the router is duplicating prefixes across ranks or
//! the ranks' running requests crowd the cache. Chunks, not tokens, bound the memory this
//! costs (one hash per chunk seen).
//! The granularity `g` is stated with the numbers: 1 for generated workloads (exact), the trace
//! block for a trace (where prompts share whole blocks; a shared partial last block is missed).
//!
//! LRU order without a tree: a prompt's chunks are touched deepest first, so a chunk is always
//! more recent than every chunk that extends it, and the least recent chunk is a leaf.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// The ceilings of one workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ceilings {
    /// Chunk size the prefixes were matched in.
    pub granularity: usize,
    /// Hit rate with an unlimited cache.
    pub unlimited: f64,
    /// Hit rate through one LRU pool of `pooled_tokens` (absent when the capacity is unknown).
    pub pooled_lru: Option<f64>,
    pub pooled_tokens: Option<u64>,
}

/// The ceilings of `prompts` (in send order) at granularity `g`, pooled over `capacity` tokens.
pub fn compute<'a>(
    prompts: impl IntoIterator<Item = &'a [u32]> + Clone,
    granularity: usize,
    capacity: Option<u64>,
) -> Ceilings {
    let g = granularity.max(1);
    let unlimited = replay(prompts.clone(), g, None);
    let pooled_lru = capacity.map(|c| replay(prompts, g, Some((c / g as u64).max(1))));
    Ceilings {
        granularity: g,
        unlimited,
        pooled_lru,
        pooled_tokens: capacity,
    }
}

/// Hit rate of `prompts` through a cache of at most `capacity_chunks` chunks (unbounded: None).
fn replay<'a>(
    prompts: impl IntoIterator<Item = &'a [u32]>,
    g: usize,
    capacity_chunks: Option<u64>,
) -> f64 {
    // chunk chain hash → its last-use stamp; stamp → chunk (LRU order).
    let mut stamp_of: HashMap<u64, u64> = HashMap::new();
    let mut by_stamp: BTreeMap<u64, u64> = BTreeMap::new();
    let mut clock = 0u64;
    let (mut matched_total, mut len_total) = (0u64, 0u64);
    let mut chain: Vec<u64> = Vec::new();
    for prompt in prompts {
        chain.clear();
        let mut h = 0x6a09_e667_f3bc_c908u64;
        for chunk in prompt.chunks_exact(g) {
            h = mix(h, chunk);
            chain.push(h);
        }
        let hit_chunks = chain
            .iter()
            .take_while(|c| stamp_of.contains_key(c))
            .count();
        let len = prompt.len() as u64;
        matched_total += ((hit_chunks * g) as u64).min(len.saturating_sub(1));
        len_total += len;
        for &c in chain.iter().rev() {
            clock += 1;
            if let Some(old) = stamp_of.insert(c, clock) {
                by_stamp.remove(&old);
            }
            by_stamp.insert(clock, c);
        }
        if let Some(cap) = capacity_chunks {
            while stamp_of.len() as u64 > cap {
                let Some((_, c)) = by_stamp.pop_first() else {
                    break;
                };
                stamp_of.remove(&c);
            }
        }
    }
    if len_total == 0 {
        0.0
    } else {
        matched_total as f64 / len_total as f64
    }
}

/// The chain hash of a chunk after `h` (splitmix64 steps over its ids).
fn mix(mut h: u64, chunk: &[u32]) -> u64 {
    for &t in chunk {
        h = protocol::hash::splitmix64(h ^ u64::from(t));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceil(prompts: &[Vec<u32>], g: usize, cap: Option<u64>) -> Ceilings {
        compute(prompts.iter().map(Vec::as_slice), g, cap)
    }

    #[test]
    fn unlimited_counts_every_prefix_seen_before() {
        let a: Vec<u32> = (0..100).collect();
        let mut b = a[..60].to_vec();
        b.extend(1000..1040); // shares 60 tokens with a
        let c: Vec<u32> = (5000..5100).collect(); // shares nothing
        let got = ceil(&[a.clone(), b.clone(), c.clone()], 1, None);
        assert!((got.unlimited - 60.0 / 300.0).abs() < 1e-12, "{got:?}");
        // Whole chunks only: at 16 tokens, 60 shared tokens are 3 chunks = 48.
        let got = ceil(&[a.clone(), b, c], 16, None);
        assert!((got.unlimited - 48.0 / 300.0).abs() < 1e-12, "{got:?}");
        // An identical prompt matches all but its last token.
        let got = ceil(&[a.clone(), a], 1, None);
        assert!((got.unlimited - 99.0 / 200.0).abs() < 1e-12, "{got:?}");
        assert_eq!(got.pooled_lru, None);
    }

    #[test]
    fn the_pool_forgets_the_least_recent_prefix() {
        let p = |base: u32| -> Vec<u32> { (base..base + 10).collect() };
        // Pool of 20 tokens: two prompts fit. a, b, a (hit), c (evicts b, the least recent), b (miss).
        let order = [p(0), p(100), p(0), p(200), p(100)];
        let got = ceil(&order, 1, Some(20));
        assert!(
            (got.pooled_lru.unwrap() - 9.0 / 50.0).abs() < 1e-12,
            "{got:?}"
        );
        assert!((got.unlimited - 18.0 / 50.0).abs() < 1e-12, "{got:?}");
        assert_eq!(got.pooled_tokens, Some(20));
        // A pool as large as everything equals the unlimited ceiling.
        let big = ceil(&order, 1, Some(1000));
        assert_eq!(big.pooled_lru, Some(big.unlimited));
    }

    #[test]
    fn a_shared_prefix_outlives_its_leaves() {
        // Every prompt = the same 8-token system prompt + 4 own tokens; a pool of 16 tokens
        // keeps the system prompt (touched by each) while the questions come and go.
        let prompts: Vec<Vec<u32>> = (0..10)
            .map(|i| {
                let mut v: Vec<u32> = (0..8).collect();
                v.extend((0..4).map(|j| 100 + i * 4 + j));
                v
            })
            .collect();
        let got = ceil(&prompts, 4, Some(16));
        assert!(
            (got.pooled_lru.unwrap() - 9.0 * 8.0 / 120.0).abs() < 1e-12,
            "{got:?}"
        );
    }
}
