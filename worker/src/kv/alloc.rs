//! KV slot allocator: hands out indices into the KV pool's `max_total_tokens` slots.
//!
//! A free list kept as a stack: alloc and free are O(1) per slot, a batched free is one
//! `extend`. It does not know which request holds a slot; its callers do.

/// Free list over slots `0..total`.
#[derive(Debug)]
pub struct KvSlotAllocator {
    free: Vec<u32>,
    total: usize,
}

impl KvSlotAllocator {
    pub fn new(total: usize) -> Self {
        // Reversed so the first allocations get the low slots: easier to read in a debugger.
        KvSlotAllocator {
            free: (0..total as u32).rev().collect(),
            total,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    pub fn used(&self) -> usize {
        self.total - self.free.len()
    }

    /// Append `n` slots to `out`, or none if fewer than `n` are free.
    pub fn alloc_into(&mut self, n: usize, out: &mut Vec<u32>) -> bool {
        if n > self.free.len() {
            return false;
        }
        let at = self.free.len() - n;
        out.extend(self.free.drain(at..).rev());
        true
    }

    /// Return slots to the pool.
    pub fn free(&mut self, slots: &[u32]) {
        debug_assert!(self.free.len() + slots.len() <= self.total);
        self.free.extend_from_slice(slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_and_free_round_trip() {
        let mut a = KvSlotAllocator::new(8);
        let mut got = Vec::new();
        assert!(a.alloc_into(5, &mut got));
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert!(!a.alloc_into(4, &mut got), "only 3 left");
        assert_eq!(got.len(), 5, "a failed alloc appends nothing");
        a.free(&got[..2]);
        assert_eq!(a.available(), 5);
        let mut more = Vec::new();
        assert!(a.alloc_into(5, &mut more));
        let mut all: Vec<u32> = got[2..].iter().chain(&more).copied().collect();
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>(), "no slot handed out twice");
    }
}
