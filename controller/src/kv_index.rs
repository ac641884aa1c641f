//! Which ranks hold which KV blocks, from the workers' `KvEvents` (see `protocol::kv_events`),
//! so `cache_aware` can tell, for a prompt, how many of its leading tokens each rank has cached.
//!
//! ```text
//! owners : chained block hash → ranks holding it        (what a decision reads)
//! ranks  : rank → { its blocks, where its stream stands } (what events and departures change)
//! matched(prompt, r) = #leading blocks of the prompt whose hash r holds
//! ```
//! A chained hash names its whole prefix, so the leading run of held blocks is the cached prefix.
//!
//! Predictions: when the controller sends a prompt to a rank, that rank will hold the prompt's
//! blocks once it has computed them, but its events say so only then, seconds later under
//! load. Until they do, the blocks are *predicted* on that rank (`predict`), for
//! [`PREDICTION_TTL`]: a lookup counts a predicted block as held, so the siblings of a burst
//! meet the rank their first member went to instead of scattering. An event storing the block
//! confirms it (the prediction gives way to the fact); one removing it, a snapshot, or the
//! rank's departure contradicts it (dropped); otherwise it expires.
//!
//! Trust: a rank's blocks are applied batch by batch in `seq` order from the registration on.
//! A rank starts (and restarts) *awaiting a snapshot*: it shows nothing until a batch with
//! `cleared` arrives. A missing batch (a gap in `seq`) drops everything the rank showed and
//! waits for a snapshot again, so a decision never reads a stream known to be broken; the
//! caller asks the worker for one (`KvSnapshotReq`). The first snapshot fixes the deployment's
//! block size; a rank reporting another is ignored (it shows nothing).
//!
//! Cost: a batch is O(hashes in it); a departure O(blocks of the rank); a lookup O(b · k) for
//! b leading blocks held somewhere and k live ranks (it stops at the first block no live rank
//! holds).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use protocol::kv_events::{block_hash, extend_block_hashes, DEFAULT_KV_BLOCK_SIZE};
use protocol::KvEvents;

use crate::policy::{CachedPrefix, RankSet};

/// How long a block sent to a rank counts as held there before its events confirm it: longer
/// than a loaded rank's wait for its first token, short enough that a request that failed or
/// was aborted does not attract its prefix's traffic for long.
pub const PREDICTION_TTL: Duration = Duration::from_secs(30);

/// How often a rank still awaiting a snapshot is asked again (its batches keep arriving).
pub const SNAPSHOT_RETRY: Duration = Duration::from_secs(1);

/// Where a rank's event stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// Registered (or broken): nothing shown until a batch with `cleared`.
    AwaitingSnapshot,
    /// Applied up to `next - 1`.
    Synced { next: u64 },
    /// Reports another block size than the deployment's: never shown.
    WrongBlockSize,
}

#[derive(Debug)]
struct RankBlocks {
    stream: Stream,
    blocks: HashSet<u64>,
    last_ask: Option<Instant>,
}

/// What one `KvEvents` batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Applied in order.
    Applied,
    /// From a rank not registered here (or already gone): dropped.
    UnknownRank,
    /// A batch is missing (`expected`, `got`): the rank's blocks were dropped; ask for a
    /// snapshot.
    Gap { expected: u64, got: u64 },
    /// The rank is awaiting a snapshot and this is not one; `ask`: time to ask again.
    AwaitingSnapshot { ask: bool },
    /// The rank reports blocks of `got` tokens, the deployment's are `expected`: it shows
    /// nothing until it registers again (this is said once; its later batches are
    /// [`Applied::UnknownRank`]).
    WrongBlockSize { expected: u32, got: u32 },
}

/// The controller's index of cached blocks.
#[derive(Debug, Default)]
pub struct KvIndex {
    block_size: Option<u32>,
    owners: HashMap<u64, Vec<u32>>,
    ranks: HashMap<u32, RankBlocks>,
    /// Blocks sent to ranks and not yet confirmed: hash → (rank, until).
    predicted: HashMap<u64, Vec<(u32, Instant)>>,
    /// When expired predictions are next swept out.
    next_sweep: Option<Instant>,
}

impl KvIndex {
    pub fn new() -> Self {
        KvIndex::default()
    }

    /// Tokens per block, once a rank's first snapshot said it.
    pub fn block_size(&self) -> Option<u32> {
        self.block_size
    }

    /// `rank` registered (again): forget what it showed, and await its snapshot.
    pub fn join(&mut self, rank: u32, now: Instant) {
        self.remove(rank);
        self.ranks.insert(
            rank,
            RankBlocks {
                stream: Stream::AwaitingSnapshot,
                blocks: HashSet::new(),
                last_ask: Some(now),
            },
        );
    }

    /// `rank` left: none of its blocks count any more.
    pub fn remove(&mut self, rank: u32) {
        self.forget_predictions(rank);
        let Some(mut r) = self.ranks.remove(&rank) else {
            return;
        };
        self.forget_blocks(rank, &mut r);
        if self.ranks.is_empty() {
            // A redeployed fleet may use another block size.
            self.block_size = None;
        }
    }

    /// Blocks `rank` is shown to hold (0 for an unknown rank).
    pub fn blocks_of(&self, rank: u32) -> usize {
        self.ranks.get(&rank).map_or(0, |r| r.blocks.len())
    }

    /// Distinct blocks held anywhere.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Apply one batch from `ev.rank`'s registered holder.
    pub fn apply(&mut self, ev: &KvEvents, now: Instant) -> Applied {
        let Some(mut r) = self.ranks.remove(&ev.rank) else {
            return Applied::UnknownRank;
        };
        let outcome = self.apply_to(&mut r, ev, now);
        self.ranks.insert(ev.rank, r);
        outcome
    }

    fn apply_to(&mut self, r: &mut RankBlocks, ev: &KvEvents, now: Instant) -> Applied {
        let rank = ev.rank;
        match r.stream {
            Stream::WrongBlockSize => return Applied::UnknownRank,
            Stream::AwaitingSnapshot if !ev.cleared => {
                let ask = match r.last_ask {
                    Some(t) => now.duration_since(t) >= SNAPSHOT_RETRY,
                    None => true,
                };
                if ask {
                    r.last_ask = Some(now);
                }
                return Applied::AwaitingSnapshot { ask };
            }
            Stream::Synced { next } if ev.seq != next && !ev.cleared => {
                // A snapshot is a fresh start whatever its number; anything else must follow.
                self.forget_blocks(rank, r);
                r.stream = Stream::AwaitingSnapshot;
                r.last_ask = Some(now);
                return Applied::Gap {
                    expected: next,
                    got: ev.seq,
                };
            }
            _ => {}
        }
        let expected = *self.block_size.get_or_insert(ev.block_size);
        if ev.block_size != expected {
            self.forget_blocks(rank, r);
            r.stream = Stream::WrongBlockSize;
            return Applied::WrongBlockSize {
                expected,
                got: ev.block_size,
            };
        }
        if ev.cleared {
            self.forget_blocks(rank, r);
            self.forget_predictions(rank);
        }
        for h in &ev.removed {
            if r.blocks.remove(h) {
                self.drop_owner(*h, rank);
            }
            self.drop_prediction(*h, rank);
        }
        for &h in &ev.stored {
            if r.blocks.insert(h) {
                self.owners.entry(h).or_default().push(rank);
            }
            self.drop_prediction(h, rank);
        }
        r.stream = Stream::Synced { next: ev.seq + 1 };
        Applied::Applied
    }

    /// The prompt `ids` was sent to `rank`: its blocks count as held there until its events
    /// confirm or contradict them, or until `now + PREDICTION_TTL`. Only a rank whose stream
    /// is synced is predicted (one awaiting a snapshot shows nothing at all).
    pub fn predict(&mut self, rank: u32, ids: &[u32], now: Instant) {
        let (Some(block), Some(r)) = (self.block_size, self.ranks.get(&rank)) else {
            return;
        };
        if !matches!(r.stream, Stream::Synced { .. }) {
            return;
        }
        let until = now + PREDICTION_TTL;
        let mut hashes = Vec::with_capacity(ids.len() / block as usize);
        extend_block_hashes(None, ids, block as usize, &mut hashes);
        for h in hashes {
            if r.blocks.contains(&h) {
                continue;
            }
            let entry = self.predicted.entry(h).or_default();
            match entry.iter_mut().find(|(o, _)| *o == rank) {
                Some(p) => p.1 = until,
                None => entry.push((rank, until)),
            }
        }
        self.sweep_predictions(now);
    }

    /// Predicted blocks not yet confirmed, expired or not (tests, metrics).
    pub fn predicted_len(&self) -> usize {
        self.predicted.values().map(Vec::len).sum()
    }

    fn drop_prediction(&mut self, hash: u64, rank: u32) {
        if let Some(p) = self.predicted.get_mut(&hash) {
            p.retain(|&(o, _)| o != rank);
            if p.is_empty() {
                self.predicted.remove(&hash);
            }
        }
    }

    fn forget_predictions(&mut self, rank: u32) {
        self.predicted.retain(|_, p| {
            p.retain(|&(o, _)| o != rank);
            !p.is_empty()
        });
    }

    /// Drops expired predictions, at most once per [`PREDICTION_TTL`] (O(predictions)).
    fn sweep_predictions(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + PREDICTION_TTL);
        self.predicted.retain(|_, p| {
            p.retain(|&(_, until)| until > now);
            !p.is_empty()
        });
    }

    fn forget_blocks(&mut self, rank: u32, r: &mut RankBlocks) {
        for h in r.blocks.drain() {
            self.drop_owner(h, rank);
        }
    }

    fn drop_owner(&mut self, hash: u64, rank: u32) {
        if let Some(owners) = self.owners.get_mut(&hash) {
            owners.retain(|&o| o != rank);
            if owners.is_empty() {
                self.owners.remove(&hash);
            }
        }
    }

    /// For each rank of `ranks`, how many leading blocks of `hashes` (a prompt's chained block
    /// hashes) it holds or is predicted to hold at `now`, into `out` (same order as `ranks`).
    /// Reads `hashes` only as far as some rank still matches, so a lazy iterator hashes no
    /// more of the prompt than that.
    pub fn matched_blocks(
        &self,
        hashes: impl IntoIterator<Item = u64>,
        ranks: &[u32],
        now: Instant,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        out.resize(ranks.len(), 0);
        // Ranks still matching, as indices into `ranks`.
        let mut alive: Vec<usize> = (0..ranks.len()).collect();
        for (depth, h) in hashes.into_iter().enumerate() {
            let (owners, predicted) = (self.owners.get(&h), self.predicted.get(&h));
            if owners.is_none() && predicted.is_none() {
                break;
            }
            alive.retain(|&i| {
                let rank = ranks[i];
                let holds = owners.is_some_and(|o| o.contains(&rank))
                    || predicted
                        .is_some_and(|p| p.iter().any(|&(o, until)| o == rank && until > now));
                if holds {
                    out[i] = depth + 1;
                }
                holds
            });
            if alive.is_empty() {
                break;
            }
        }
    }
}

impl KvIndex {
    /// What the index says of the prompt `ids` on each of `ranks`: the leading tokens each
    /// holds (whole blocks) and the hash of its first block. The prompt is hashed block by
    /// block only while some rank still holds the chain, not to its end.
    pub fn cached_prefix(&self, ids: &[u32], ranks: &RankSet, now: Instant) -> CachedPrefix {
        let block = self
            .block_size()
            .map_or(DEFAULT_KV_BLOCK_SIZE, |b| b as usize);
        let first_block = block_hash(None, &ids[..ids.len().min(block)]);
        let mut matched = Vec::new();
        if !self.is_empty() || !self.predicted.is_empty() {
            let hashes = BlockHashes {
                ids,
                block,
                prev: None,
                batch: Vec::new(),
                next: 0,
            };
            self.matched_blocks(hashes, &ranks.ids(), now, &mut matched);
        }
        matched.resize(ranks.len(), 0);
        CachedPrefix {
            matched_tokens: matched.iter().map(|&b| (b * block) as u64).collect(),
            first_block,
            block_size: block,
        }
    }
}

/// Blocks hashed at a time by [`BlockHashes`]. Hashing a run of blocks and then looking them
/// up is faster than alternating one hash and one lookup, and a prompt that no rank holds past
/// its first blocks is hashed no further than the batch (a cache_aware decision on a 4096-token
/// prompt at 8 ranks, `cargo bench -p controller --bench routing`: held whole 4.9 µs batched,
/// 6.0 µs one block at a time, 4.8 µs all blocks first; held nowhere 0.48, 0.34 and 2.8 µs).
const HASH_BATCH: usize = 8;

/// A prompt's chained block hashes, computed [`HASH_BATCH`] blocks at a time as they are read.
struct BlockHashes<'a> {
    ids: &'a [u32],
    block: usize,
    prev: Option<u64>,
    batch: Vec<u64>,
    next: usize,
}

impl Iterator for BlockHashes<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.next == self.batch.len() {
            let take = (HASH_BATCH * self.block).min(self.ids.len());
            let (head, rest) = self.ids.split_at(take - take % self.block);
            self.batch.clear();
            self.next = 0;
            extend_block_hashes(self.prev, head, self.block, &mut self.batch);
            self.prev = self.batch.last().copied().or(self.prev);
            self.ids = rest;
        }
        let h = self.batch.get(self.next).copied();
        self.next += 1;
        h
    }
}

#[cfg(test)]
#[path = "kv_index_tests.rs"]
mod tests;
