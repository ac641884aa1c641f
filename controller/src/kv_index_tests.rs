//! KV index tests: examples, and a property test against a naive reference (per-rank sets,
//! matched prefixes counted block by block) over random event streams with lost batches,
//! joins, leaves and snapshots.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use protocol::KvEvents;

use super::{Applied, BlockHashes, KvIndex, HASH_BATCH};

fn batch(rank: u32, seq: u64, cleared: bool, removed: &[u64], stored: &[u64]) -> KvEvents {
    KvEvents {
        rank,
        seq,
        block_size: 4,
        cleared,
        removed: removed.to_vec(),
        stored: stored.to_vec(),
    }
}

fn matched(index: &KvIndex, hashes: &[u64], ranks: &[u32]) -> Vec<usize> {
    let mut out = Vec::new();
    index.matched_blocks(hashes.iter().copied(), ranks, &mut out);
    out
}

#[test]
fn a_rank_shows_its_blocks_from_its_snapshot_on_and_drops_out_when_it_leaves() {
    let t = Instant::now();
    let mut index = KvIndex::new();
    index.join(0, t);
    index.join(1, t);
    // Before a snapshot nothing is trusted.
    assert_eq!(
        index.apply(&batch(0, 1, false, &[], &[10]), t),
        Applied::AwaitingSnapshot { ask: false }
    );
    assert_eq!(
        index.apply(&batch(0, 2, true, &[], &[10, 11, 12]), t),
        Applied::Applied
    );
    assert_eq!(
        index.apply(&batch(1, 1, true, &[], &[10, 20]), t),
        Applied::Applied
    );
    assert_eq!(index.block_size(), Some(4));
    assert_eq!(matched(&index, &[10, 11, 12, 13], &[0, 1, 2]), [3, 1, 0]);
    assert_eq!(
        index.apply(&batch(0, 3, false, &[12], &[]), t),
        Applied::Applied
    );
    assert_eq!(matched(&index, &[10, 11, 12], &[0, 1]), [2, 1]);
    index.remove(0);
    assert_eq!(matched(&index, &[10, 11, 12], &[0, 1]), [0, 1]);
    assert_eq!(
        index.apply(&batch(0, 4, false, &[], &[1]), t),
        Applied::UnknownRank
    );
}

#[test]
fn a_missing_batch_drops_the_rank_until_a_snapshot_and_asks_at_most_once_a_second() {
    let t = Instant::now();
    let mut index = KvIndex::new();
    index.join(0, t);
    index.apply(&batch(0, 1, true, &[], &[10, 11]), t);
    assert_eq!(
        index.apply(&batch(0, 3, false, &[], &[12]), t),
        Applied::Gap {
            expected: 2,
            got: 3
        }
    );
    assert_eq!(index.blocks_of(0), 0, "a broken stream shows nothing");
    assert!(index.is_empty());
    let later = t + Duration::from_millis(500);
    assert_eq!(
        index.apply(&batch(0, 4, false, &[], &[13]), later),
        Applied::AwaitingSnapshot { ask: false }
    );
    let much_later = t + Duration::from_secs(2);
    assert_eq!(
        index.apply(&batch(0, 5, false, &[], &[14]), much_later),
        Applied::AwaitingSnapshot { ask: true }
    );
    assert_eq!(
        index.apply(&batch(0, 6, true, &[], &[10, 11, 12]), much_later),
        Applied::Applied
    );
    assert_eq!(matched(&index, &[10, 11, 12], &[0]), [3]);
}

#[test]
fn a_rank_with_another_block_size_is_ignored() {
    let t = Instant::now();
    let mut index = KvIndex::new();
    index.join(0, t);
    index.join(1, t);
    index.apply(&batch(0, 1, true, &[], &[10]), t);
    let mut other = batch(1, 1, true, &[], &[10]);
    other.block_size = 8;
    assert_eq!(
        index.apply(&other, t),
        Applied::WrongBlockSize {
            expected: 4,
            got: 8
        }
    );
    assert_eq!(matched(&index, &[10], &[0, 1]), [1, 0]);
    other.seq = 2;
    assert_eq!(index.apply(&other, t), Applied::UnknownRank, "said once");
    // Registering again starts over; when every rank is gone the size is free again.
    index.remove(0);
    index.remove(1);
    assert_eq!(index.block_size(), None);
}

// ---- property: the index equals a naive reference under any event stream ----

#[derive(Debug, Clone)]
enum Op {
    /// A worker's cache stores or evicts a block (hash from a small range, so ranks share).
    Store(u32, u64),
    Evict(u32, u64),
    Flush(u32),
    /// The worker sends its pending change; `lost`: it never arrives.
    Send {
        rank: u32,
        lost: bool,
    },
    /// The worker answers a snapshot request.
    Snapshot(u32),
    Join(u32),
    Leave(u32),
    Lookup(Vec<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    let rank = 0u32..4;
    let hash = 0u64..12;
    prop_oneof![
        6 => (rank.clone(), hash.clone()).prop_map(|(r, h)| Op::Store(r, h)),
        3 => (rank.clone(), hash.clone()).prop_map(|(r, h)| Op::Evict(r, h)),
        1 => rank.clone().prop_map(Op::Flush),
        5 => (rank.clone(), prop::bool::weighted(0.15)).prop_map(|(rank, lost)| Op::Send { rank, lost }),
        2 => rank.clone().prop_map(Op::Snapshot),
        1 => rank.clone().prop_map(Op::Join),
        1 => rank.prop_map(Op::Leave),
        3 => prop::collection::vec(hash, 0..8).prop_map(Op::Lookup),
    ]
}

/// One worker process as the test drives it: its cache and what it has told the controller.
#[derive(Default)]
struct Worker {
    truth: HashSet<u64>,
    told: HashSet<u64>,
    cleared: bool,
    seq: u64,
}

impl Worker {
    fn diff(&mut self, snapshot: bool) -> KvEvents {
        self.seq += 1;
        let cleared = snapshot || self.cleared;
        let (removed, stored) = if cleared {
            (Vec::new(), self.truth.iter().copied().collect())
        } else {
            (
                self.told.difference(&self.truth).copied().collect(),
                self.truth.difference(&self.told).copied().collect(),
            )
        };
        self.told = self.truth.clone();
        self.cleared = false;
        KvEvents {
            rank: 0,
            seq: self.seq,
            block_size: 4,
            cleared,
            removed,
            stored,
        }
    }
}

/// The reference: what the controller may believe of each registered rank (`None`: nothing,
/// awaiting a snapshot), with the next batch number it accepts.
#[derive(Default)]
struct Reference {
    views: BTreeMap<u32, (Option<HashSet<u64>>, u64)>,
}

impl Reference {
    fn apply(&mut self, ev: &KvEvents) {
        let Some((view, next)) = self.views.get_mut(&ev.rank) else {
            return;
        };
        let in_order = view.is_some() && ev.seq == *next;
        if ev.cleared {
            *view = Some(HashSet::new());
        } else if !in_order {
            *view = None;
            return;
        }
        let set = view.as_mut().expect("set above");
        for h in &ev.removed {
            set.remove(h);
        }
        set.extend(ev.stored.iter().copied());
        *next = ev.seq + 1;
    }

    fn matched(&self, hashes: &[u64], rank: u32) -> usize {
        let Some((Some(set), _)) = self.views.get(&rank) else {
            return 0;
        };
        hashes.iter().take_while(|h| set.contains(h)).count()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_index_matches_a_naive_reference(ops in prop::collection::vec(op(), 1..120)) {
        let t = Instant::now();
        let mut index = KvIndex::new();
        let mut reference = Reference::default();
        let mut workers: BTreeMap<u32, Worker> = BTreeMap::new();
        let all_ranks = [0u32, 1, 2, 3];
        for op in ops {
            match op {
                Op::Store(r, h) => { workers.entry(r).or_default().truth.insert(h); }
                Op::Evict(r, h) => { workers.entry(r).or_default().truth.remove(&h); }
                Op::Flush(r) => {
                    let w = workers.entry(r).or_default();
                    w.truth.clear();
                    w.cleared = true;
                }
                Op::Send { rank, lost } => {
                    let mut ev = workers.entry(rank).or_default().diff(false);
                    ev.rank = rank;
                    if !lost {
                        index.apply(&ev, t);
                        reference.apply(&ev);
                    }
                }
                Op::Snapshot(rank) => {
                    let mut ev = workers.entry(rank).or_default().diff(true);
                    ev.rank = rank;
                    index.apply(&ev, t);
                    reference.apply(&ev);
                }
                Op::Join(r) => {
                    index.join(r, t);
                    reference.views.insert(r, (None, 0));
                }
                Op::Leave(r) => {
                    index.remove(r);
                    reference.views.remove(&r);
                }
                Op::Lookup(hashes) => {
                    let got = matched(&index, &hashes, &all_ranks);
                    let want: Vec<usize> =
                        all_ranks.iter().map(|&r| reference.matched(&hashes, r)).collect();
                    prop_assert_eq!(got, want);
                }
            }
            // Every rank shows exactly the reference's view, and the owners map agrees.
            for &r in &all_ranks {
                let want = match reference.views.get(&r) {
                    Some((Some(set), _)) => set.len(),
                    _ => 0,
                };
                prop_assert_eq!(index.blocks_of(r), want, "rank {}", r);
            }
            let distinct: HashSet<u64> = reference
                .views
                .values()
                .filter_map(|(v, _)| v.as_ref())
                .flatten()
                .copied()
                .collect();
            prop_assert_eq!(index.len(), distinct.len());
        }
    }
}

#[test]
fn block_hashes_in_batches_are_the_chained_hashes() {
    for block in [1usize, 4, 32] {
        for len in 0..(3 * HASH_BATCH * block + 5) {
            let ids: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(2_654_435_761))
                .collect();
            let lazy: Vec<u64> = BlockHashes {
                ids: &ids,
                block,
                prev: None,
                batch: Vec::new(),
                next: 0,
            }
            .collect();
            assert_eq!(
                lazy,
                protocol::kv_events::block_hashes(&ids, block),
                "block {block}, {len} ids"
            );
        }
    }
}

#[test]
fn cached_prefix_counts_whole_blocks_each_rank_holds() {
    let ids: Vec<u32> = (0..40).collect();
    let hashes = protocol::kv_events::block_hashes(&ids, 4);
    let mut index = KvIndex::new();
    let now = Instant::now();
    for (rank, depth) in [(0u32, 10usize), (1, 3), (2, 0)] {
        index.join(rank, now);
        index.apply(&batch(rank, 1, true, &[], &hashes[..depth]), now);
    }
    let set = crate::policy::RankSet::idle(&[0, 1, 2, 3]);
    let c = index.cached_prefix(&ids, &set);
    assert_eq!(c.matched_tokens, vec![40, 12, 0, 0]);
    assert_eq!(c.first_block, hashes[0]);
    // Past what any rank holds, the prompt's tail does not matter.
    let mut longer = ids.clone();
    longer.extend(1000..1100);
    assert_eq!(
        index.cached_prefix(&longer, &set).matched_tokens,
        vec![40, 12, 0, 0]
    );
}
