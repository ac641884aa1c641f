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
    index.matched_blocks(hashes.iter().copied(), ranks, Instant::now(), &mut out);
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
    let c = index.cached_prefix(&ids, &set, now);
    assert_eq!(c.matched_tokens, vec![40, 12, 0, 0]);
    assert_eq!(c.first_block, hashes[0]);
    // Past what any rank holds, the prompt's tail does not matter.
    let mut longer = ids.clone();
    longer.extend(1000..1100);
    assert_eq!(
        index.cached_prefix(&longer, &set, now).matched_tokens,
        vec![40, 12, 0, 0]
    );
}

/// Ranks 0..n joined and synced (an empty snapshot each), blocks of 4 tokens.
fn synced(n: u32, t: Instant) -> KvIndex {
    let mut index = KvIndex::new();
    for rank in 0..n {
        index.join(rank, t);
        index.apply(&batch(rank, 1, true, &[], &[]), t);
    }
    index
}

#[test]
fn a_prompt_sent_to_a_rank_counts_there_until_its_events_confirm_it_or_it_expires() {
    let t = Instant::now();
    let ids: Vec<u32> = (0..16).collect();
    let hashes = protocol::kv_events::block_hashes(&ids, 4);
    let set = crate::policy::RankSet::idle(&[0, 1]);
    let mut index = synced(2, t);
    index.predict(1, &ids, t);
    assert_eq!(index.cached_prefix(&ids, &set, t).matched_tokens, [0, 16]);
    // A longer prompt with the same beginning matches the sent part.
    let longer: Vec<u32> = (0..24).collect();
    assert_eq!(
        index.cached_prefix(&longer, &set, t).matched_tokens,
        [0, 16]
    );
    // Expired: nothing shown, whether swept or not.
    let late = t + super::PREDICTION_TTL + Duration::from_millis(1);
    assert_eq!(index.cached_prefix(&ids, &set, late).matched_tokens, [0, 0]);
    // Events confirm the first two blocks: they are facts from then on, the rest predicted.
    index.apply(&batch(1, 2, false, &[], &hashes[..2]), t);
    assert_eq!(index.predicted_len(), 2);
    assert_eq!(index.cached_prefix(&ids, &set, late).matched_tokens, [0, 8]);
    assert_eq!(index.cached_prefix(&ids, &set, t).matched_tokens, [0, 16]);
    // An event removing a block it was predicted to hold contradicts the prediction.
    index.apply(&batch(1, 3, false, &[hashes[2]], &[]), t);
    assert_eq!(index.cached_prefix(&ids, &set, t).matched_tokens, [0, 8]);
    // A snapshot, or the rank leaving, drops its predictions.
    index.predict(1, &ids, t);
    index.apply(&batch(1, 4, true, &[], &hashes[..1]), t);
    assert_eq!(index.cached_prefix(&ids, &set, t).matched_tokens, [0, 4]);
    index.predict(1, &ids, t);
    index.remove(1);
    assert_eq!(index.predicted_len(), 0);
}

#[test]
fn a_rank_awaiting_its_snapshot_is_not_predicted() {
    let t = Instant::now();
    let mut index = synced(1, t);
    index.join(1, t);
    let ids: Vec<u32> = (0..16).collect();
    index.predict(1, &ids, t);
    assert_eq!(index.predicted_len(), 0);
    // Nor is anything before the block size is known.
    let mut fresh = KvIndex::new();
    fresh.join(0, t);
    fresh.predict(0, &ids, t);
    assert_eq!(fresh.predicted_len(), 0);
}

/// `cache_aware` over the index, as the controller drives it: decide, then predict the
/// prompt on the chosen rank.
fn route_and_predict(
    m: &mut crate::policy::CacheAware,
    index: &mut KvIndex,
    set: &crate::policy::RankSet,
    ids: &[u32],
    t: Instant,
) -> crate::policy::RouteDecision {
    use crate::policy::LoadBalancer;
    let with = set
        .clone()
        .with_cached_prefix(index.cached_prefix(ids, set, t));
    let d = m.select(&crate::policy::RouteInput::prompt(ids), &with);
    index.predict(d.rank, ids, t);
    d
}

#[test]
fn the_siblings_of_a_burst_meet_before_any_event() {
    use crate::policy::{CacheAware, CacheAwareConfig};
    let t = Instant::now();
    let mut index = synced(4, t);
    let mut m = CacheAware::new(CacheAwareConfig::default());
    let set = crate::policy::RankSet::idle(&[0, 1, 2, 3]);
    let prefix: Vec<u32> = (0..64).collect();
    let mut ranks = Vec::new();
    for tail in 0..6u32 {
        let mut ids = prefix.clone();
        ids.extend([1000 + tail, 2000 + tail]);
        ranks.push(route_and_predict(&mut m, &mut index, &set, &ids, t).rank);
    }
    assert!(ranks.iter().all(|&r| r == ranks[0]), "{ranks:?}");
}

#[test]
fn a_hot_prefix_gains_a_second_holder_and_keeps_both() {
    use crate::policy::{CacheAware, CacheAwareConfig, RankSet};
    let t = Instant::now();
    let mut index = synced(3, t);
    let mut m = CacheAware::new(CacheAwareConfig::default());
    // Ranks with these prefill lines (tokens queued), equally fast and equally busy.
    let lines = |backlog: [u64; 3]| {
        RankSet::with_prefill_lines(&[
            (0, backlog[0], Some(1000.0)),
            (1, backlog[1], Some(1000.0)),
            (2, backlog[2], Some(1000.0)),
        ])
    };
    let hot: Vec<u32> = (0..96).collect();
    let asking = |tail: u32| {
        let mut ids = hot.clone();
        ids.extend([5000 + tail; 4]);
        ids
    };
    let first = route_and_predict(&mut m, &mut index, &lines([0; 3]), &asking(0), t).rank;
    // The holder's line grows past what the prefix saves: the next request spills.
    let mut busy = [0u64; 3];
    busy[first as usize] = 400;
    let second = route_and_predict(&mut m, &mut index, &lines(busy), &asking(1), t).rank;
    assert_ne!(second, first);
    // Both now hold the prefix; each later request goes to the holder with the shorter line,
    // never to the third rank.
    let third = (0..3).find(|r| *r != first && *r != second).unwrap();
    for (i, (a, b)) in [(400, 0), (0, 400), (150, 100), (100, 180)]
        .into_iter()
        .enumerate()
    {
        let mut busy = [0u64; 3];
        busy[first as usize] = a;
        busy[second as usize] = b;
        busy[third as usize] = 0;
        let d = route_and_predict(&mut m, &mut index, &lines(busy), &asking(2 + i as u32), t);
        let want = if a <= b { first } else { second };
        assert_eq!(d.rank, want, "lines {a} / {b}");
        assert_eq!(
            d.cached_tokens, None,
            "set by the controller, not the balancer"
        );
        let held = d.costs.iter().filter(|c| c.matched_tokens >= 96).count();
        assert_eq!(held, 2);
    }
}

#[test]
fn a_conversation_stays_on_the_rank_of_its_previous_turn() {
    use crate::policy::{CacheAware, CacheAwareConfig, RankSet};
    let t = Instant::now();
    let mut index = synced(4, t);
    let mut m = CacheAware::new(CacheAwareConfig::default());
    let set = RankSet::idle(&[0, 1, 2, 3]);
    let mut convo: Vec<u32> = (0..40).collect();
    let first = route_and_predict(&mut m, &mut index, &set, &convo, t).rank;
    for turn in 0..5u32 {
        convo.extend((0..12).map(|i| 100 * (turn + 1) + i));
        let d = route_and_predict(&mut m, &mut index, &set, &convo, t);
        assert_eq!(d.rank, first, "turn {turn}");
    }
}
