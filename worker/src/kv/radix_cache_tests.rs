//! Radix cache tests: examples, and property tests of the slot accounting over random
//! operation sequences (free + evictable + locked = total; no slot referenced twice).

use std::collections::HashSet;

use proptest::prelude::*;

use super::RadixCache;
use crate::kv::alloc::KvSlotAllocator;

#[test]
fn match_insert_split_and_evict() {
    let mut cache = RadixCache::new();
    assert_eq!(cache.insert(&[1, 2, 3, 4], &[10, 11, 12, 13]), 0);
    let m = cache.match_prefix(&[1, 2, 9]);
    assert_eq!(m.slots, vec![10, 11]);
    // The edge was split at the match; inserting a sibling shares the head.
    assert_eq!(cache.insert(&[1, 2, 7], &[20, 21, 22]), 2);
    assert_eq!(cache.match_prefix(&[1, 2, 7, 8]).slots, vec![10, 11, 22]);
    assert_eq!(cache.total_size(), 5);
    assert_eq!(cache.peek_prefix_len(&[1, 2, 3, 4, 5]), 4);

    cache.lock(m.node);
    assert_eq!(cache.protected_size(), 2);
    let mut freed = Vec::new();
    let n = cache.evict(100, |s| freed.extend_from_slice(s));
    assert_eq!(n, 3, "only the unlocked leaves go");
    freed.sort();
    assert_eq!(freed, vec![12, 13, 22]);
    cache.unlock(m.node);
    assert_eq!(cache.evictable_size(), 2);
    assert_eq!(cache.evict(1, |_| {}), 2);
    assert_eq!(cache.total_size(), 0);
}

#[test]
fn lru_leaf_goes_first() {
    let mut cache = RadixCache::new();
    cache.insert(&[1, 1], &[0, 1]);
    cache.insert(&[2, 2], &[2, 3]);
    cache.match_prefix(&[1, 1]); // touch the first
    let mut freed = Vec::new();
    cache.evict(2, |s| freed.extend_from_slice(s));
    assert_eq!(freed, vec![2, 3]);
}

#[test]
fn reset_refuses_while_locked() {
    let mut cache = RadixCache::new();
    cache.insert(&[1, 2], &[0, 1]);
    let m = cache.match_prefix(&[1, 2]);
    cache.lock(m.node);
    assert!(!cache.reset(|_| {}));
    cache.unlock(m.node);
    let mut n = 0;
    assert!(cache.reset(|s| n += s.len()));
    assert_eq!(n, 2);
    assert_eq!(cache.total_size(), 0);
}

/// A request in flight in the model: the slots it holds outside the tree and its lock.
struct Held {
    own: Vec<u32>,
    lock: Option<usize>,
}

#[derive(Debug, Clone)]
enum Op {
    /// A request with this prompt arrives: match, lock, allocate the rest.
    Start(Vec<u32>),
    /// Request `i` finishes: insert its tokens, free duplicates, unlock.
    Finish(usize),
    /// Request `i` is aborted without inserting: free its own slots, unlock.
    Abort(usize),
    Evict(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(0u32..4, 1..12).prop_map(Op::Start),
        3 => (0usize..8).prop_map(Op::Finish),
        1 => (0usize..8).prop_map(Op::Abort),
        1 => (1usize..20).prop_map(Op::Evict),
    ]
}

fn check(alloc: &KvSlotAllocator, cache: &RadixCache, inflight: &[(Vec<u32>, Held)]) {
    let own: usize = inflight.iter().map(|(_, h)| h.own.len()).sum();
    assert_eq!(
        alloc.available() + cache.evictable_size() + cache.protected_size() + own,
        alloc.total(),
        "free + evictable + locked (tree + request-owned) = total"
    );
    let mut seen = HashSet::new();
    for s in cache
        .all_slots()
        .into_iter()
        .chain(inflight.iter().flat_map(|(_, h)| h.own.iter().copied()))
    {
        assert!(seen.insert(s), "slot {s} referenced twice");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn slot_accounting_holds_under_random_operations(ops in prop::collection::vec(op(), 1..60)) {
        let total = 48;
        let mut alloc = KvSlotAllocator::new(total);
        let mut cache = RadixCache::new();
        let mut inflight: Vec<(Vec<u32>, Held)> = Vec::new();
        for op in ops {
            match op {
                Op::Start(tokens) => {
                    let m = cache.match_prefix(&tokens);
                    cache.lock(m.node);
                    let need = tokens.len() - m.slots.len();
                    if alloc.available() < need {
                        cache.evict(need - alloc.available(), |s| alloc.free(s));
                    }
                    let mut own = Vec::new();
                    if alloc.alloc_into(need, &mut own) {
                        inflight.push((tokens, Held { own, lock: Some(m.node) }));
                    } else {
                        cache.unlock(m.node);
                    }
                }
                Op::Finish(i) if i < inflight.len() => {
                    let (tokens, held) = inflight.swap_remove(i);
                    // The tree's prefix slots plus the request's own suffix.
                    let prefix = tokens.len() - held.own.len();
                    let mut value = cache.match_prefix(&tokens[..prefix]).slots;
                    value.extend(&held.own);
                    let dup = cache.insert(&tokens, &value);
                    if dup > prefix {
                        alloc.free(&value[prefix..dup]);
                    }
                    if let Some(node) = held.lock {
                        cache.unlock(node);
                    }
                }
                Op::Abort(i) if i < inflight.len() => {
                    let (_, held) = inflight.swap_remove(i);
                    alloc.free(&held.own);
                    if let Some(node) = held.lock {
                        cache.unlock(node);
                    }
                }
                Op::Evict(n) => {
                    cache.evict(n, |s| alloc.free(s));
                }
                _ => {}
            }
            check(&alloc, &cache, &inflight);
        }
        for (_, held) in inflight.drain(..) {
            alloc.free(&held.own);
            if let Some(node) = held.lock {
                cache.unlock(node);
            }
        }
        check(&alloc, &cache, &[]);
        prop_assert_eq!(cache.protected_size(), 0);
        cache.evict(usize::MAX, |s| alloc.free(s));
        prop_assert_eq!(alloc.available(), total);
    }
}

// ---- KV events: the blocks the tree reports are the blocks it holds ----

#[derive(Debug, Clone)]
enum EventOp {
    Insert(Vec<u32>),
    Match(Vec<u32>),
    Evict(usize),
    Reset,
    Send,
    AskSnapshot,
}

fn event_op() -> impl Strategy<Value = EventOp> {
    // A 3-token alphabet makes shared prefixes, splits and re-inserts common.
    let seq = || prop::collection::vec(0u32..3, 0..14);
    prop_oneof![
        4 => seq().prop_map(EventOp::Insert),
        2 => seq().prop_map(EventOp::Match),
        2 => (1usize..12).prop_map(EventOp::Evict),
        1 => Just(EventOp::Reset),
        2 => Just(EventOp::Send),
        1 => Just(EventOp::AskSnapshot),
    ]
}

/// Every token path from the root to a leaf.
fn leaf_paths(cache: &RadixCache) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut stack = vec![(super::ROOT, Vec::new())];
    while let Some((id, path)) = stack.pop() {
        let node = cache.node(id);
        if node.children.is_empty() && id != super::ROOT {
            out.push(path.clone());
        }
        for &child in node.children.values() {
            let mut p = path.clone();
            p.extend_from_slice(&cache.node(child).key);
            stack.push((child, p));
        }
    }
    out
}

/// The controller's side: a set rebuilt from the batches, in order.
fn replay(view: &mut HashSet<u64>, batches: Vec<protocol::KvEvents>, next_seq: &mut u64) {
    for b in batches {
        assert_eq!(b.seq, *next_seq, "batches are numbered without gaps");
        *next_seq += 1;
        if b.cleared {
            view.clear();
        }
        for h in &b.removed {
            assert!(view.remove(h), "removed a block that was never stored");
        }
        for h in b.stored {
            assert!(view.insert(h), "stored a block twice");
        }
    }
}

#[test]
fn a_leaf_reports_its_blocks_and_an_eviction_takes_them_back() {
    let mut cache = RadixCache::with_kv_events(2);
    let b = protocol::kv_events::block_hashes;
    let mut view = HashSet::new();
    let mut seq = 1;
    replay(&mut view, cache.take_kv_events(0), &mut seq); // the first batch: an empty snapshot
    cache.insert(&[1, 2, 3, 4, 5], &[0; 5]);
    // A split inside block 1, then a sibling: only the sibling's own block is new.
    cache.insert(&[1, 2, 3, 9, 9], &[0; 5]);
    let batches = cache.take_kv_events(0);
    assert_eq!(batches[0].stored.len(), 3);
    replay(&mut view, batches, &mut seq);
    let want: HashSet<u64> = b(&[1, 2, 3, 4], 2)
        .into_iter()
        .chain(b(&[1, 2, 3, 9], 2))
        .collect();
    assert_eq!(view, want);
    cache.evict(100, |_| {});
    replay(&mut view, cache.take_kv_events(0), &mut seq);
    assert!(view.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn kv_events_replay_to_the_blocks_the_tree_holds(
        ops in prop::collection::vec(event_op(), 1..60),
        block_size in 1usize..5,
    ) {
        let mut cache = RadixCache::with_kv_events(block_size);
        let mut view = HashSet::new();
        let mut next_seq = 1;
        for op in ops {
            match op {
                EventOp::Insert(key) => {
                    let value = vec![0; key.len()];
                    cache.insert(&key, &value);
                }
                EventOp::Match(key) => {
                    cache.match_prefix(&key);
                }
                EventOp::Evict(n) => {
                    cache.evict(n, |_| {});
                }
                EventOp::Reset => {
                    cache.reset(|_| {});
                }
                EventOp::Send => replay(&mut view, cache.take_kv_events(0), &mut next_seq),
                EventOp::AskSnapshot => {
                    if let Some(log) = cache.events_mut() {
                        log.request_snapshot();
                    }
                }
            }
            let truth: HashSet<u64> = leaf_paths(&cache)
                .iter()
                .flat_map(|p| protocol::kv_events::block_hashes(p, block_size))
                .collect();
            let held: Vec<u64> = cache.all_blocks();
            prop_assert_eq!(held.len(), truth.len(), "each block lives in one node");
            prop_assert_eq!(held.into_iter().collect::<HashSet<u64>>(), truth.clone());
        }
        replay(&mut view, cache.take_kv_events(0), &mut next_seq);
        let truth: HashSet<u64> = leaf_paths(&cache)
            .iter()
            .flat_map(|p| protocol::kv_events::block_hashes(p, block_size))
            .collect();
        prop_assert_eq!(view, truth);
    }
}
