//! An approximate prefix tree of one rank's routing history, in pages of [`PAGE_TOKENS`]
//! tokens (`smg_cache_aware`): which prompt prefixes the router sent there, not what the rank
//! holds. Leaf-first LRU eviction to a size in tokens.
//!
//! ```text
//! node     = one page of a prompt, named by the chained hash of the pages up to it
//!            (page_hashes); its parent is the node of the page before
//! invariant: a node's parent is in the tree (insert adds the whole path, eviction removes
//!            leaves only), so a prompt's match is the run of its leading page hashes present
//! match    = leading whole pages present                                  O(matched pages)
//! insert   = add the missing pages of the path, stamp every page with a new tick   O(pages)
//! evict(m) = while tokens > m: remove the leaf with the oldest stamp     O(n log n)
//! ```
//! Why a map of chained hashes rather than a radix tree of token runs: matching is then one
//! hash lookup per page per rank, the prompt is hashed once for all ranks, and a page is never
//! split. A 64-bit hash collision (two different prefixes, one node) would merge two paths;
//! at 10^7 pages the chance is ~10^-5 per tree lifetime, and the cost a misjudged match.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use protocol::hash::{fnv1a64_word, splitmix64_mix};

/// Tokens per page: SMG's token tree groups prompts in pages of 16 (SGLang's radix-cache page
/// size) and caches only whole pages.
pub const PAGE_TOKENS: usize = 16;

/// The chained hashes of the whole pages of `ids` (a trailing partial page is dropped).
pub fn page_hashes(ids: &[u32]) -> Vec<u64> {
    let mut out = Vec::with_capacity(ids.len() / PAGE_TOKENS);
    let mut h: u64 = 0x6a09_e667_f3bc_c908;
    for page in ids.chunks_exact(PAGE_TOKENS) {
        for &t in page {
            // FNV-1a over the token ids, seeded with the previous page's hash...
            h = fnv1a64_word(h, u64::from(t));
        }
        // ...and a SplitMix finaliser, so nearby prefixes spread over all 64 bits.
        h = splitmix64_mix(h);
        out.push(h);
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Node {
    parent: Option<u64>,
    children: u32,
    /// The tick of the last insert through this page.
    stamp: u64,
}

/// One rank's tree.
#[derive(Debug, Default, Clone)]
pub struct PageTree {
    nodes: HashMap<u64, Node>,
}

impl PageTree {
    /// Tokens in the tree (whole pages).
    pub fn tokens(&self) -> u64 {
        (self.nodes.len() * PAGE_TOKENS) as u64
    }

    /// Leading pages of `hashes` in the tree, and the stamp of the last one (0 for none).
    pub fn matched(&self, hashes: &[u64]) -> (usize, u64) {
        let mut stamp = 0;
        for (depth, h) in hashes.iter().enumerate() {
            match self.nodes.get(h) {
                Some(n) => stamp = n.stamp,
                None => return (depth, stamp),
            }
        }
        (hashes.len(), stamp)
    }

    /// Add the path `hashes`, stamping each page with `tick`.
    pub fn insert(&mut self, hashes: &[u64], tick: u64) {
        let mut parent = None;
        for &h in hashes {
            match self.nodes.get_mut(&h) {
                Some(n) => n.stamp = tick,
                None => {
                    self.nodes.insert(
                        h,
                        Node {
                            parent,
                            children: 0,
                            stamp: tick,
                        },
                    );
                    if let Some(p) = parent.and_then(|p| self.nodes.get_mut(&p)) {
                        p.children += 1;
                    }
                }
            }
            parent = Some(h);
        }
    }

    /// Remove least recently stamped leaves until the tree holds at most `max_tokens`.
    pub fn evict_to(&mut self, max_tokens: u64) {
        if self.tokens() <= max_tokens {
            return;
        }
        let mut leaves: BinaryHeap<Reverse<(u64, u64)>> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.children == 0)
            .map(|(&h, n)| Reverse((n.stamp, h)))
            .collect();
        while self.tokens() > max_tokens {
            let Some(Reverse((_, h))) = leaves.pop() else {
                break;
            };
            let Some(node) = self.nodes.remove(&h) else {
                continue;
            };
            if let Some(p) = node.parent {
                if let Some(parent) = self.nodes.get_mut(&p) {
                    parent.children -= 1;
                    if parent.children == 0 {
                        leaves.push(Reverse((parent.stamp, p)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(pages: &[u32]) -> Vec<u32> {
        pages
            .iter()
            .flat_map(|&p| std::iter::repeat_n(p, PAGE_TOKENS))
            .collect()
    }

    #[test]
    fn only_whole_pages_are_hashed_and_a_prefix_shares_its_hashes() {
        let mut ids = prompt(&[1, 2, 3]);
        ids.extend([9; 5]);
        let h = page_hashes(&ids);
        assert_eq!(h.len(), 3);
        assert_eq!(page_hashes(&prompt(&[1, 2])), h[..2]);
        assert_ne!(page_hashes(&prompt(&[2, 1]))[1], h[1], "order matters");
    }

    #[test]
    fn a_match_is_the_run_of_leading_pages_present() {
        let mut t = PageTree::default();
        t.insert(&page_hashes(&prompt(&[1, 2, 3])), 1);
        assert_eq!(t.tokens(), 48);
        assert_eq!(t.matched(&page_hashes(&prompt(&[1, 2, 7]))), (2, 1));
        assert_eq!(t.matched(&page_hashes(&prompt(&[7, 2, 3]))), (0, 0));
        t.insert(&page_hashes(&prompt(&[1, 2, 4])), 2);
        assert_eq!(t.tokens(), 64, "the shared pages are stored once");
    }

    impl PageTree {
        /// Every node's parent is in the tree and counts it among its children.
        fn check(&self) {
            let mut children: HashMap<u64, u32> = HashMap::new();
            for n in self.nodes.values() {
                if let Some(p) = n.parent {
                    assert!(self.nodes.contains_key(&p), "orphan page");
                    *children.entry(p).or_default() += 1;
                }
            }
            for (h, n) in &self.nodes {
                assert_eq!(n.children, children.get(h).copied().unwrap_or(0));
            }
        }
    }

    proptest::proptest! {
        /// Any mix of inserts (prompts drawn from a few shared prefixes) and evictions keeps
        /// paths whole and evicts to the size asked, least recently routed first: the prompt
        /// inserted last still matches whole after every eviction that leaves room for it.
        #[test]
        fn paths_stay_whole_and_eviction_keeps_to_its_size(
            ops in proptest::collection::vec((0u8..4, 0u32..4, 1usize..6), 1..80)
        ) {
            let mut t = PageTree::default();
            let mut tick = 0;
            let mut last: Option<Vec<u64>> = None;
            for (op, group, len) in ops {
                if op == 0 {
                    let max = (len * PAGE_TOKENS) as u64;
                    t.evict_to(max);
                    proptest::prop_assert!(t.tokens() <= max);
                    match &last {
                        Some(h) if (h.len() * PAGE_TOKENS) as u64 <= max => {
                            proptest::prop_assert_eq!(t.matched(h).0, h.len());
                        }
                        // No room for it: it may be cut, and is no longer the one to watch.
                        _ => last = None,
                    }
                } else {
                    tick += 1;
                    let pages: Vec<u32> = (0..len as u32).map(|i| group * 10 + i.min(op as u32)).collect();
                    let h = page_hashes(&prompt(&pages));
                    t.insert(&h, tick);
                    proptest::prop_assert_eq!(t.matched(&h).0, h.len());
                    last = Some(h);
                }
                t.check();
            }
        }
    }

    #[test]
    fn eviction_removes_the_oldest_leaves_first_and_keeps_paths_whole() {
        let mut t = PageTree::default();
        let old = page_hashes(&prompt(&[1, 2, 3]));
        let new = page_hashes(&prompt(&[1, 5, 6]));
        t.insert(&old, 1);
        t.insert(&new, 2); // stamps the shared page 1 too
        assert_eq!(t.tokens(), 80);
        t.evict_to(48);
        // The old branch went leaf first (3, then 2); page 1 is shared and recent.
        assert_eq!(t.tokens(), 48);
        assert_eq!(t.matched(&old), (1, 2));
        assert_eq!(t.matched(&new), (3, 2));
        t.evict_to(0);
        assert_eq!((t.tokens(), t.matched(&new).0), (0, 0));
    }
}
