//! KV events: what a worker's radix cache holds, told to the controller as chained hashes of
//! fixed-size token blocks, so `cache_aware` routing can see which rank holds a prompt's prefix.
//!
//! ```text
//! block i of a token sequence = tokens[i·B .. (i+1)·B]          (B = block_size; a partial
//!                                                                trailing block has no hash)
//! hash(block 0) = xxh3_64(LE u32 bytes of block 0, seed = 0)
//! hash(block i) = xxh3_64(LE u32 bytes of block i, seed = hash(block i−1))
//! ```
//! A block's hash names the whole prefix that ends with it, so "rank r holds hash(block k)"
//! means "rank r's cache holds the first (k+1)·B tokens". xxh3-64 (XXH3_64bits_withSeed of
//! xxHash ≥ 0.8) is fixed by its specification, so every process, platform and language
//! (Python: `xxhash.xxh3_64_intdigest(data, seed)`) computes the same hashes.
//!
//! A [`KvEvents`] batch is a net change since the previous batch (`cleared`, then `removed`,
//! then `stored`), numbered per worker process (`seq`); a batch with `cleared` is a snapshot of
//! the whole cache when it starts a series. This is not for authenticating anything: a
//! collision only misroutes a request.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The most hashes (`removed` plus `stored`) one [`KvEvents`] frame carries: 8192 × 9 bytes of
/// MessagePack ≈ 74 KiB. A larger change goes out as several batches with consecutive `seq`.
pub const MAX_KV_EVENT_HASHES: usize = 8192;

/// `--kv-event-block-size` when not given: 32 tokens. Smaller blocks see shorter shared
/// prefixes (a prefix is seen to the last whole block, so up to B − 1 tokens go unseen) and cost
/// more hashes per prompt and per cached token (a 4096-token prompt is 128 hashes at 32);
/// system prompts of a few hundred tokens are the case that matters, and at 32 they are 90 %+
/// visible while a decision hashes and looks up 128 blocks of a 4k prompt in a few microseconds.
pub const DEFAULT_KV_BLOCK_SIZE: usize = 32;

/// The largest block size a worker may report with (`--kv-event-block-size`).
pub const MAX_KV_BLOCK_SIZE: usize = 4096;

/// The hash of the block `tokens` that follows the block hashed `prev` (`None`: the first).
pub fn block_hash(prev: Option<u64>, tokens: &[u32]) -> u64 {
    let mut bytes = [0u8; 4 * 256];
    if tokens.len() <= 256 {
        for (dst, t) in bytes.chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        return xxh3_64_with_seed(&bytes[..tokens.len() * 4], prev.unwrap_or(0));
    }
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, prev.unwrap_or(0))
}

/// Appends the chained hashes of the whole blocks of `tokens` to `out`, continuing the chain
/// after `prev` (the hash of the block before `tokens[0]`, or `None` at the start).
pub fn extend_block_hashes(
    prev: Option<u64>,
    tokens: &[u32],
    block_size: usize,
    out: &mut Vec<u64>,
) {
    if block_size == 0 {
        return;
    }
    let mut prev = prev;
    for block in tokens.chunks_exact(block_size) {
        let h = block_hash(prev, block);
        out.push(h);
        prev = Some(h);
    }
}

/// The chained hashes of the whole blocks of `tokens`.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    extend_block_hashes(None, tokens, block_size, &mut out);
    out
}

/// What changed in a worker's radix cache since its previous batch: worker → controller.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KvEvents {
    pub rank: u32,
    /// 1, 2, … per worker process: the controller applies batch `n + 1` only after batch `n`,
    /// and asks for a snapshot ([`KvSnapshotReq`]) when one is missing.
    pub seq: u64,
    /// Tokens per block (`--kv-event-block-size`); the controller ignores a rank whose block
    /// size is not its own.
    pub block_size: u32,
    /// The cache was emptied (a flush) before what follows; with `seq` after a gap, or as the
    /// first batch of a process, it makes this batch (and those that follow it at once, when a
    /// snapshot is larger than [`MAX_KV_EVENT_HASHES`]) a snapshot.
    #[serde(default)]
    pub cleared: bool,
    /// Blocks evicted, as chained hashes (none of them also in `stored`).
    #[serde(default)]
    pub removed: Vec<u64>,
    /// Blocks now held, as chained hashes.
    #[serde(default)]
    pub stored: Vec<u64>,
}

impl KvEvents {
    /// Hashes carried (what [`MAX_KV_EVENT_HASHES`] bounds).
    pub fn len(&self) -> usize {
        self.removed.len() + self.stored.len()
    }

    pub fn is_empty(&self) -> bool {
        !self.cleared && self.removed.is_empty() && self.stored.is_empty()
    }
}

/// Send a snapshot of the whole cache (a `KvEvents` with `cleared`) with the next status: the
/// controller lost track (a missing batch) or just registered the rank. controller → worker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KvSnapshotReq {
    pub rank: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_ignore_a_partial_block() {
        let tokens: Vec<u32> = (0..10).collect();
        let h = block_hashes(&tokens, 4);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0], block_hash(None, &[0, 1, 2, 3]));
        assert_eq!(h[1], block_hash(Some(h[0]), &[4, 5, 6, 7]));
        // The same block after a different prefix hashes differently.
        assert_ne!(block_hash(None, &[4, 5, 6, 7]), h[1]);
        let mut more = vec![h[0]];
        extend_block_hashes(Some(h[0]), &tokens[4..], 4, &mut more);
        assert_eq!(more, h);
        assert!(block_hashes(&tokens, 0).is_empty());
    }

    #[test]
    fn hashes_are_the_documented_xxh3_values() {
        // Pinned from Python's `xxhash.xxh3_64_intdigest(struct.pack('<4I', 1, 2, 3, 4), seed=0)`
        // (the C library): a change here breaks every mixed deployment (see WIRE.md).
        let h0 = block_hash(None, &[1, 2, 3, 4]);
        assert_eq!(h0, 0x6fc1_ebd4_f4d6_ea31);
        assert_eq!(block_hash(Some(h0), &[5, 6, 7, 8]), 0xe313_56ba_2da6_54a2);
        assert_eq!(
            block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4),
            [h0, 0xe313_56ba_2da6_54a2]
        );
        // Blocks longer than the stack buffer hash the same bytes.
        let long: Vec<u32> = (0..300).collect();
        let bytes: Vec<u8> = long.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(block_hash(Some(9), &long), xxh3_64_with_seed(&bytes, 9));
    }
}
