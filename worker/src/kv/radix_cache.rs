//! Radix cache: a radix tree over token ids whose values are the KV slots holding those tokens'
//! keys and values, so a request whose prompt starts like an earlier one reuses its KV.
//!
//! Design (after SGLang's `RadixCache`):
//! - Each edge holds a run of token ids (`key`) and the slots of those positions (`value`).
//!   Children are indexed by their first token, so a lookup is O(prompt length).
//! - `match_prefix` walks down; a match that ends inside an edge splits it, so the returned node
//!   always covers exactly the matched prefix and can be locked.
//! - `lock`/`unlock` count users along the path to the root. Locked nodes are never evicted.
//!   `evictable` and `protected` track the slots in unlocked and locked nodes.
//! - `evict(n)` frees at least `n` slots from the least recently used unlocked leaves
//!   (O(leaves · log leaves)); a parent whose last child goes becomes a leaf candidate.
//! - The cache owns the slots in the tree. Slots a request allocated but has not inserted yet
//!   belong to the request. Insert returns how much of the key was already present: the caller
//!   frees its own duplicate slots for that part.
//! - KV events (optional, [`RadixCache::with_kv_events`]): each node also keeps the chained
//!   hashes of the token blocks that *end* inside it (see `protocol::kv_events`). A block's
//!   prefix is one path of the tree, so every block lives in exactly one node: a new leaf
//!   reports the blocks ending in it as stored, an evicted leaf its blocks as removed, a split
//!   divides them, a reset clears. Inserting hashes only the new tokens (the chain continues
//!   from the last block on the path), so events cost O(new tokens), not O(prompt).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::kv::events::KvEventLog;

/// Index of a node in the arena. The root is node 0 and is never removed.
pub type NodeId = usize;

const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    parent: NodeId,
    children: HashMap<u32, NodeId>,
    key: Vec<u32>,
    value: Vec<u32>,
    lock_ref: u32,
    last_access: u64,
    /// KV events only: `(end, hash)` of each block whose last token is `key[end - 1]`.
    blocks: Vec<(u32, u64)>,
}

/// Result of a prefix match.
#[derive(Debug, Clone)]
pub struct PrefixMatch {
    /// Slots of the matched prefix, position by position.
    pub slots: Vec<u32>,
    /// The node that ends exactly at the matched prefix (lock it while the slots are in use).
    pub node: NodeId,
}

/// Hit statistics since start.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheStats {
    pub queried_tokens: u64,
    pub hit_tokens: u64,
}

#[derive(Debug)]
pub struct RadixCache {
    nodes: Vec<Option<Node>>,
    free_ids: Vec<NodeId>,
    clock: u64,
    evictable: usize,
    protected: usize,
    pub stats: CacheStats,
    events: Option<KvEventLog>,
}

impl Default for RadixCache {
    fn default() -> Self {
        Self::new()
    }
}

impl RadixCache {
    pub fn new() -> Self {
        RadixCache {
            nodes: vec![Some(Node::default())],
            free_ids: Vec::new(),
            clock: 0,
            evictable: 0,
            protected: 0,
            stats: CacheStats::default(),
            events: None,
        }
    }

    /// A cache that reports what it stores and evicts as blocks of `block_size` tokens.
    pub fn with_kv_events(block_size: usize) -> Self {
        RadixCache {
            events: (block_size > 0).then(|| KvEventLog::new(block_size)),
            ..RadixCache::new()
        }
    }

    /// The KV event log, when events are on.
    pub fn events_mut(&mut self) -> Option<&mut KvEventLog> {
        self.events.as_mut()
    }

    /// The hashes of every block in the tree (a snapshot), in no particular order.
    pub fn all_blocks(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .flatten()
            .flat_map(|n| n.blocks.iter().map(|&(_, h)| h))
            .collect()
    }

    /// The batches of KV events to send now, as `rank` (none when events are off or nothing
    /// changed).
    pub fn take_kv_events(&mut self, rank: u32) -> Vec<protocol::KvEvents> {
        let Some(log) = self.events.as_mut() else {
            return Vec::new();
        };
        if !log.pending() {
            return Vec::new();
        }
        let all = self.all_blocks();
        // Borrow again: `all_blocks` needed the whole tree.
        let log = self.events.as_mut().expect("events are on");
        log.take_batches(rank, || all)
    }

    pub fn root(&self) -> NodeId {
        ROOT
    }

    /// Slots in unlocked nodes: what eviction can free.
    pub fn evictable_size(&self) -> usize {
        self.evictable
    }

    /// Slots in locked nodes.
    pub fn protected_size(&self) -> usize {
        self.protected
    }

    /// Slots in the tree.
    pub fn total_size(&self) -> usize {
        self.evictable + self.protected
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id].as_ref().expect("live node id")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("live node id")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn alloc_node(&mut self, node: Node) -> NodeId {
        match self.free_ids.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Longest cached prefix of `key`, splitting an edge where the match ends inside it.
    pub fn match_prefix(&mut self, key: &[u32]) -> PrefixMatch {
        let now = self.tick();
        let mut slots = Vec::new();
        let mut node = ROOT;
        let mut rest = key;
        self.node_mut(ROOT).last_access = now;
        while let Some(&first) = rest.first() {
            let Some(&child) = self.node(node).children.get(&first) else {
                break;
            };
            let common = common_prefix(&self.node(child).key, rest);
            let child = if common < self.node(child).key.len() {
                self.split(child, common)
            } else {
                child
            };
            self.node_mut(child).last_access = now;
            slots.extend_from_slice(&self.node(child).value);
            node = child;
            rest = &rest[common..];
        }
        self.stats.queried_tokens += key.len() as u64;
        self.stats.hit_tokens += slots.len() as u64;
        PrefixMatch { slots, node }
    }

    /// Length of the cached prefix of `key`, without splitting or touching LRU (for policies).
    pub fn peek_prefix_len(&self, key: &[u32]) -> usize {
        let mut node = ROOT;
        let mut rest = key;
        let mut len = 0;
        while let Some(&first) = rest.first() {
            let Some(&child) = self.node(node).children.get(&first) else {
                break;
            };
            let common = common_prefix(&self.node(child).key, rest);
            len += common;
            if common < self.node(child).key.len() {
                break;
            }
            node = child;
            rest = &rest[common..];
        }
        len
    }

    /// Split `id` so that its first `at` tokens become a new parent node; returns the parent.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let (parent, key_head, value_head, lock_ref, last_access, blocks_head) = {
            let n = self.node_mut(id);
            let key_tail = n.key.split_off(at);
            let value_tail = n.value.split_off(at);
            // Blocks ending in the first `at` tokens move up; the rest are re-based.
            let cut = n.blocks.partition_point(|&(end, _)| end as usize <= at);
            let mut blocks_tail = n.blocks.split_off(cut);
            for (end, _) in &mut blocks_tail {
                *end -= at as u32;
            }
            (
                n.parent,
                std::mem::replace(&mut n.key, key_tail),
                std::mem::replace(&mut n.value, value_tail),
                n.lock_ref,
                n.last_access,
                std::mem::replace(&mut n.blocks, blocks_tail),
            )
        };
        let first_head = key_head[0];
        let first_tail = self.node(id).key[0];
        let mid = self.alloc_node(Node {
            parent,
            children: HashMap::from([(first_tail, id)]),
            key: key_head,
            value: value_head,
            // Everyone locking the child locked this part too.
            lock_ref,
            last_access,
            blocks: blocks_head,
        });
        self.node_mut(id).parent = mid;
        self.node_mut(parent).children.insert(first_head, mid);
        mid
    }

    /// Insert `key` with its `value` slots. Returns the length of the prefix that was already
    /// cached: the caller's slots for `value[..returned]` are duplicates it must free.
    pub fn insert(&mut self, key: &[u32], value: &[u32]) -> usize {
        debug_assert_eq!(key.len(), value.len());
        let now = self.tick();
        let mut node = ROOT;
        let mut done = 0;
        // The hash of the last whole block on the path so far (the chain continues from it).
        let mut last_block: Option<u64> = None;
        while done < key.len() {
            let first = key[done];
            let Some(&child) = self.node(node).children.get(&first) else {
                let blocks = self.new_blocks(last_block, key, done);
                let leaf = self.alloc_node(Node {
                    parent: node,
                    children: HashMap::new(),
                    key: key[done..].to_vec(),
                    value: value[done..].to_vec(),
                    lock_ref: 0,
                    last_access: now,
                    blocks,
                });
                self.node_mut(node).children.insert(first, leaf);
                self.evictable += key.len() - done;
                return done;
            };
            let common = common_prefix(&self.node(child).key, &key[done..]);
            let child = if common < self.node(child).key.len() {
                self.split(child, common)
            } else {
                child
            };
            self.node_mut(child).last_access = now;
            if let Some(&(_, h)) = self.node(child).blocks.last() {
                last_block = Some(h);
            }
            done += common;
            node = child;
        }
        done
    }

    /// The blocks ending in a new leaf holding `key[from..]` (ends relative to `from`), logged
    /// as stored. `prev` is the hash of the block ending at `from` rounded down to a block.
    fn new_blocks(&mut self, prev: Option<u64>, key: &[u32], from: usize) -> Vec<(u32, u64)> {
        let Some(log) = self.events.as_mut() else {
            return Vec::new();
        };
        let b = log.block_size();
        let start = from / b * b;
        let mut hashes = Vec::new();
        protocol::kv_events::extend_block_hashes(prev, &key[start..], b, &mut hashes);
        let blocks: Vec<(u32, u64)> = hashes
            .into_iter()
            .enumerate()
            .map(|(i, h)| ((start + (i + 1) * b - from) as u32, h))
            .collect();
        for &(_, h) in &blocks {
            log.stored(h);
        }
        blocks
    }

    /// A request starts using the path to `node`.
    pub fn lock(&mut self, mut node: NodeId) {
        while node != ROOT {
            let n = self.node_mut(node);
            if n.lock_ref == 0 {
                let len = n.value.len();
                self.evictable -= len;
                self.protected += len;
            }
            let n = self.node_mut(node);
            n.lock_ref += 1;
            node = n.parent;
        }
    }

    /// A request stops using the path to `node`.
    pub fn unlock(&mut self, mut node: NodeId) {
        while node != ROOT {
            let n = self.node_mut(node);
            debug_assert!(n.lock_ref > 0, "unlock without lock");
            n.lock_ref = n.lock_ref.saturating_sub(1);
            if n.lock_ref == 0 {
                let len = n.value.len();
                self.protected -= len;
                self.evictable += len;
            }
            node = self.node(node).parent;
        }
    }

    /// Free at least `n` slots (fewer if not enough are evictable) from least recently used
    /// unlocked leaves, handing each freed run of slots to `free`. Returns how many were freed.
    pub fn evict(&mut self, n: usize, mut free: impl FnMut(&[u32])) -> usize {
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
            .filter(|(id, n)| *id != ROOT && n.children.is_empty() && n.lock_ref == 0)
            .map(|(id, n)| Reverse((n.last_access, id)))
            .collect();
        let mut freed = 0;
        while freed < n {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let Some(node) = self.nodes[id].take() else {
                continue;
            };
            self.free_ids.push(id);
            if let Some(log) = self.events.as_mut() {
                for &(_, h) in &node.blocks {
                    log.removed(h);
                }
            }
            free(&node.value);
            freed += node.value.len();
            self.evictable -= node.value.len();
            let parent = node.parent;
            if let Some(&first) = node.key.first() {
                self.node_mut(parent).children.remove(&first);
            }
            let p = self.node(parent);
            if parent != ROOT && p.children.is_empty() && p.lock_ref == 0 {
                heap.push(Reverse((p.last_access, parent)));
            }
        }
        freed
    }

    /// Drop every node (only when nothing is locked); hands all slots to `free`.
    pub fn reset(&mut self, mut free: impl FnMut(&[u32])) -> bool {
        if self.protected > 0 {
            return false;
        }
        for node in self.nodes.iter().skip(1).flatten() {
            free(&node.value);
        }
        let mut events = self.events.take();
        if let Some(log) = events.as_mut() {
            log.cleared();
        }
        *self = RadixCache {
            stats: self.stats,
            events,
            ..RadixCache::new()
        };
        true
    }

    /// Every slot in the tree (tests and invariant checks).
    pub fn all_slots(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .skip(1)
            .flatten()
            .flat_map(|n| n.value.iter().copied())
            .collect()
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
#[path = "radix_cache_tests.rs"]
mod tests;
