//! A worker's KV memory as one thing: the K/V buffers, the slot allocator, the request-to-token
//! rows and the radix cache, with the bookkeeping that keeps them consistent (a request's
//! cached prefix locked while in use, computed tokens shared through the cache, everything given
//! back when it ends). The scheduler decides *what* to run; this decides *where its KV lives*.
//! A prefill/decode split or a device-resident pool extends this type, not the scheduler.
//!
//! Invariants: every slot is exactly one of free (in the allocator), held by a request's row
//! beyond its cached prefix, or owned by the cache (locked while a request uses it, else
//! evictable). `used + free + evictable = total`.

use crate::kv::alloc::KvSlotAllocator;
use crate::kv::radix_cache::RadixCache;
use crate::kv::req_to_token::ReqToTokenPool;
use crate::model::KvBuffers;
use crate::request::Req;

/// Sizes of a [`KvMemory`].
#[derive(Debug, Clone, Copy)]
pub struct KvMemoryConfig {
    /// Token slots in the pool.
    pub max_total_tokens: usize,
    pub max_running_requests: usize,
    /// Extra request-to-token rows (see [`crate::kv::req_to_token`]).
    pub pre_alloc_rows: usize,
    pub context_len: usize,
    /// Share computed prefixes through the radix cache.
    pub radix_cache: bool,
}

pub struct KvMemory {
    kv: KvBuffers,
    alloc: KvSlotAllocator,
    pool: ReqToTokenPool,
    cache: RadixCache,
    radix: bool,
    /// Slots being handed to a request ([`Self::grow`]), kept so a decode step allocates
    /// nothing.
    fresh: Vec<u32>,
}

impl KvMemory {
    /// A memory of `c.max_total_tokens` slots whose KV lives in `kv` (made for that many).
    pub fn new(kv: KvBuffers, c: KvMemoryConfig) -> Self {
        debug_assert_eq!(kv.num_slots(), c.max_total_tokens);
        KvMemory {
            kv,
            alloc: KvSlotAllocator::new(c.max_total_tokens),
            pool: ReqToTokenPool::new(c.max_running_requests, c.pre_alloc_rows, c.context_len),
            cache: RadixCache::new(),
            radix: c.radix_cache,
            fresh: Vec::new(),
        }
    }

    /// Report what the cache stores and evicts as blocks of `block_size` tokens (0: off).
    /// Call before the first request; the cache is empty then.
    pub fn enable_kv_events(&mut self, block_size: usize) {
        debug_assert_eq!(
            self.cache.total_size(),
            0,
            "events start with an empty cache"
        );
        if self.radix && self.cache.total_size() == 0 {
            self.cache = RadixCache::with_kv_events(block_size);
        }
    }

    /// The KV event batches to send now as `rank` (none when off or nothing changed).
    pub fn take_kv_events(&mut self, rank: u32) -> Vec<protocol::KvEvents> {
        self.cache.take_kv_events(rank)
    }

    /// The next KV event batch will be a snapshot of the whole cache.
    pub fn request_kv_snapshot(&mut self) {
        if let Some(log) = self.cache.events_mut() {
            log.request_snapshot();
        }
    }

    /// Slots neither free nor evictable: held by requests or locked in the cache.
    pub fn used_tokens(&self) -> usize {
        self.alloc.total() - self.alloc.available() - self.cache.evictable_size()
    }

    pub fn free_slots(&self) -> usize {
        self.alloc.available()
    }

    pub fn evictable_slots(&self) -> usize {
        self.cache.evictable_size()
    }

    /// Make `n` slots free, evicting from the cache if needed. False if it cannot.
    pub fn ensure_free(&mut self, n: usize) -> bool {
        let have = self.alloc.available();
        if have < n {
            let alloc = &mut self.alloc;
            self.cache.evict(n - have, |slots| alloc.free(slots));
        }
        self.alloc.available() >= n
    }

    /// Tokens of `prompt` the cache holds (without touching its recency).
    pub fn peek_prefix_len(&self, prompt: &[u32]) -> usize {
        if self.radix {
            self.cache.peek_prefix_len(prompt)
        } else {
            0
        }
    }

    /// Gives `req` a row and its cached prefix (at most all but its last token, which must be
    /// computed to get logits), locked while it is in use. Returns the prefix length, or `None`
    /// when no row is free.
    pub fn admit(&mut self, req: &mut Req) -> Option<usize> {
        let row = self.pool.alloc()?;
        req.row = Some(row);
        let mut hit = 0;
        if self.radix {
            let key = req.token_range(0, req.total_len() - 1);
            let m = self.cache.match_prefix(&key);
            hit = m.slots.len();
            self.pool.row_mut(row)[..hit].copy_from_slice(&m.slots);
            self.cache.lock(m.node);
            req.cache_node = Some(m.node);
        }
        req.len = hit;
        req.cached_len = hit;
        Some(hit)
    }

    /// Gives `req` a row and nothing from the cache: a decode worker's request whose whole
    /// prompt KV comes from a prefill worker. False when no row is free.
    pub fn admit_blank(&mut self, req: &mut Req) -> bool {
        let Some(row) = self.pool.alloc() else {
            return false;
        };
        req.row = Some(row);
        req.len = 0;
        req.cached_len = 0;
        true
    }

    /// Request rows in use (running, prefilling, or holding KV that is arriving).
    pub fn rows_in_use(&self) -> usize {
        self.pool.rows() - self.pool.available()
    }

    /// Request rows in all.
    pub fn rows(&self) -> usize {
        self.pool.rows()
    }

    /// Frees of a row that was not handed out, refused since start (0 unless the bookkeeping
    /// that owns rows is wrong; see [`ReqToTokenPool::free`]).
    pub fn refused_row_frees(&self) -> u64 {
        self.pool.refused_frees()
    }

    /// The KV of `req`'s positions `start..start + n`, as it travels to another worker.
    pub fn read_kv(&self, req: &Req, start: usize, n: usize) -> Vec<u8> {
        let row = req.row.expect("an admitted request holds a row");
        self.kv.read_slots(&self.pool.row(row)[start..start + n])
    }

    /// Writes KV that arrived for `req`'s positions `start..start + n` (slots taken by
    /// [`Self::grow`]); false when the payload does not fit.
    pub fn write_kv(&mut self, req: &Req, start: usize, n: usize, payload: &[u8]) -> bool {
        let row = req.row.expect("an admitted request holds a row");
        let slots = &self.pool.row(row)[start..start + n];
        self.kv.write_slots(slots, payload)
    }

    /// Fresh slots for `req`'s next `n` tokens (`req.len..req.len + n`); the caller made room
    /// first ([`Self::ensure_free`]).
    ///
    /// # Panics
    /// If `req` holds no row or fewer than `n` slots are free.
    pub fn grow(&mut self, req: &Req, n: usize) {
        let row = req.row.expect("an admitted request holds a row");
        self.fresh.clear();
        assert!(
            self.alloc.alloc_into(n, &mut self.fresh),
            "{n} slots are free"
        );
        self.pool.row_mut(row)[req.len..req.len + n].copy_from_slice(&self.fresh);
    }

    /// Gives back the `n` slots [`Self::grow`] took for `req` when they hold no valid KV (the
    /// forward pass failed): to the allocator, never into the cache.
    pub fn shrink(&mut self, req: &Req, n: usize) {
        if let Some(row) = req.row {
            let slots = self.pool.row(row)[req.len..req.len + n].to_vec();
            self.alloc.free(&slots);
        }
    }

    /// Gives back a request whose positions `req.len..req.len + n` hold slots without valid
    /// KV (a transfer that did not complete): those slots to the allocator, the rest as
    /// [`Self::release`].
    pub fn release_partial(&mut self, req: &mut Req, n: usize) {
        self.shrink(req, n);
        self.release(req);
    }

    /// Inserts the request's computed tokens into the cache and makes the tree's copy its
    /// prefix: its own duplicate slots are freed, the lock moves to the new node.
    pub fn share_computed(&mut self, req: &mut Req) {
        let (Some(row), true) = (req.row, self.radix) else {
            return;
        };
        if req.len == req.cached_len {
            return;
        }
        let key = req.token_range(0, req.len);
        let value = self.pool.row(row)[..req.len].to_vec();
        let present = self.cache.insert(&key, &value);
        if present > req.cached_len {
            self.alloc.free(&value[req.cached_len..present]);
        }
        let m = self.cache.match_prefix(&key);
        debug_assert_eq!(m.slots.len(), req.len);
        self.pool.row_mut(row)[..m.slots.len()].copy_from_slice(&m.slots);
        self.cache.lock(m.node);
        if let Some(old) = req.cache_node.replace(m.node) {
            self.cache.unlock(old);
        }
        req.cached_len = req.len;
    }

    /// Gives back everything the request holds: its KV goes into the cache (or back to the
    /// allocator with the cache disabled), its lock and its row are released.
    pub fn release(&mut self, req: &mut Req) {
        if let Some(row) = req.row {
            if self.radix {
                self.share_computed(req);
            } else {
                let slots = self.pool.row(row)[..req.len].to_vec();
                self.alloc.free(&slots);
            }
            if let Some(node) = req.cache_node.take() {
                self.cache.unlock(node);
            }
            if let Err(e) = self.pool.free(row) {
                // Refused, so no request shares the row; loud, since a caller's books are wrong.
                tracing::error!(rid = %req.rid, %e, "request row not freed");
            }
        }
        req.row = None;
        req.len = 0;
        req.cached_len = 0;
    }

    /// Drops the whole cache (no request may hold any of it); returns the slots freed.
    pub fn flush(&mut self) -> usize {
        let mut freed = 0;
        let alloc = &mut self.alloc;
        self.cache.reset(|slots| {
            freed += slots.len();
            alloc.free(slots)
        });
        freed
    }

    /// The K/V buffers (written by the forward pass) and the rows (read by it), borrowed at
    /// once.
    pub fn split(&mut self) -> (&mut KvBuffers, Rows<'_>) {
        (&mut self.kv, Rows(&self.pool))
    }
}

/// Read access to the request-to-token rows while the K/V buffers are borrowed for a forward
/// pass.
#[derive(Clone, Copy)]
pub struct Rows<'a>(&'a ReqToTokenPool);

impl<'a> Rows<'a> {
    /// The slots of `req`'s positions `0..len`.
    pub fn slots(self, req: &Req, len: usize) -> &'a [u32] {
        &self
            .0
            .row(req.row.expect("an admitted request holds a row"))[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BuiltinSize, ModelConfig};

    fn memory(slots: usize, radix_cache: bool) -> KvMemory {
        KvMemory::new(
            KvBuffers::new(&ModelConfig::builtin(BuiltinSize::Tiny), slots),
            KvMemoryConfig {
                max_total_tokens: slots,
                max_running_requests: 4,
                pre_alloc_rows: 0,
                context_len: 64,
                radix_cache,
            },
        )
    }

    /// Every slot is free, evictable or used, whatever happened.
    fn accounted(m: &KvMemory) {
        assert_eq!(
            m.used_tokens() + m.free_slots() + m.evictable_slots(),
            m.alloc.total()
        );
    }

    /// Admit, compute the whole prompt in two chunks, share it, release.
    fn run(m: &mut KvMemory, prompt: Vec<u32>) -> usize {
        let mut req = Req::embed("r".into(), prompt);
        let hit = m.admit(&mut req).expect("a free row");
        let half = req.pending() / 2;
        for n in [half, req.pending() - half] {
            assert!(m.ensure_free(n));
            m.grow(&req, n);
            req.len += n;
            m.share_computed(&mut req);
            accounted(m);
        }
        m.release(&mut req);
        accounted(m);
        assert!(req.row.is_none() && req.cache_node.is_none());
        hit
    }

    #[test]
    fn a_shared_prefix_is_reused_and_every_slot_stays_accounted_for() {
        let mut m = memory(64, true);
        let a: Vec<u32> = (1..=20).collect();
        assert_eq!(run(&mut m, a.clone()), 0);
        assert_eq!((m.used_tokens(), m.evictable_slots()), (0, 20));
        // Same first 12 tokens: the prefix comes from the cache.
        let b: Vec<u32> = a[..12].iter().copied().chain(100..108).collect();
        assert_eq!(run(&mut m, b), 12);
        assert_eq!(m.peek_prefix_len(&a), 20);
        assert_eq!(m.flush(), 28);
        assert_eq!(m.free_slots(), 64);
    }

    #[test]
    fn without_the_cache_slots_go_back_to_the_allocator() {
        let mut m = memory(32, false);
        let a: Vec<u32> = (1..=20).collect();
        assert_eq!(run(&mut m, a.clone()), 0);
        assert_eq!(run(&mut m, a.clone()), 0);
        assert_eq!(m.peek_prefix_len(&a), 0);
        assert_eq!(m.free_slots(), 32);
    }

    #[test]
    fn a_failed_chunk_gives_its_slots_back_and_eviction_makes_room() {
        let mut m = memory(24, true);
        run(&mut m, (1..=20).collect());
        let mut req = Req::embed("r".into(), (50..70).collect());
        assert_eq!(m.admit(&mut req), Some(0));
        assert!(m.ensure_free(20), "evicts the first prompt's cached tokens");
        m.grow(&req, 20);
        m.shrink(&req, 20);
        accounted(&m);
        m.release(&mut req);
        assert_eq!(m.free_slots() + m.evictable_slots(), 24);
    }
}
