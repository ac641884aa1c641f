//! The radix cache's KV events as the worker sends them: the net change since the last batch
//! (blocks stored, blocks evicted, whether the cache was emptied), cut into numbered
//! [`protocol::KvEvents`] batches of at most [`MAX_KV_EVENT_HASHES`] hashes. See `WIRE.md`.
//!
//! Why a net change and not a log: between two statuses a block may be stored, evicted and
//! stored again; the controller needs only where the cache ended up. A block stored and then
//! evicted cancels out, so a batch is never larger than the cache before plus the cache after,
//! whatever happened in between. Not here: which blocks a node holds (the radix cache keeps
//! them) and when batches go out (the actor, with its status).

use std::collections::HashSet;

use protocol::kv_events::MAX_KV_EVENT_HASHES;
use protocol::KvEvents;

/// Changes not yet sent, and the batch numbering of this process.
#[derive(Debug)]
pub struct KvEventLog {
    block_size: usize,
    /// The last batch number sent (0: none yet).
    seq: u64,
    /// The next batch must be a snapshot: the first of the process, or one the controller
    /// asked for.
    snapshot_due: bool,
    cleared: bool,
    stored: HashSet<u64>,
    removed: HashSet<u64>,
}

impl KvEventLog {
    pub fn new(block_size: usize) -> Self {
        KvEventLog {
            block_size,
            seq: 0,
            snapshot_due: true,
            cleared: false,
            stored: HashSet::new(),
            removed: HashSet::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn stored(&mut self, hash: u64) {
        // Evicted since the last batch and back: the controller's view already has it.
        if !self.removed.remove(&hash) {
            self.stored.insert(hash);
        }
    }

    pub fn removed(&mut self, hash: u64) {
        // Stored since the last batch and gone: the controller never needs to hear of it.
        if !self.stored.remove(&hash) {
            self.removed.insert(hash);
        }
    }

    /// The cache was emptied: nothing before it matters.
    pub fn cleared(&mut self) {
        self.cleared = true;
        self.stored.clear();
        self.removed.clear();
    }

    /// Make the next batch a snapshot (the controller lost track, or just registered us).
    pub fn request_snapshot(&mut self) {
        self.snapshot_due = true;
    }

    /// Whether [`Self::take_batches`] would send anything.
    pub fn pending(&self) -> bool {
        self.snapshot_due || self.cleared || !self.stored.is_empty() || !self.removed.is_empty()
    }

    /// The batches to send now (none when nothing changed). `all_blocks` lists every block the
    /// cache holds; it is called only for a snapshot.
    pub fn take_batches(
        &mut self,
        rank: u32,
        all_blocks: impl FnOnce() -> Vec<u64>,
    ) -> Vec<KvEvents> {
        if !self.pending() {
            return Vec::new();
        }
        let (cleared, mut removed, mut stored) = if self.snapshot_due {
            self.cleared(); // what was pending is inside the snapshot
            (true, Vec::new(), all_blocks())
        } else {
            (
                self.cleared,
                self.removed.drain().collect::<Vec<_>>(),
                self.stored.drain().collect::<Vec<_>>(),
            )
        };
        self.snapshot_due = false;
        self.cleared = false;
        self.stored.clear();
        self.removed.clear();
        // Sorted: the same cache gives the same frames (tests, traces).
        removed.sort_unstable();
        stored.sort_unstable();

        let mut batches = Vec::new();
        let mut first = true;
        let (mut removed, mut stored) = (&removed[..], &stored[..]);
        while first || !removed.is_empty() || !stored.is_empty() {
            let r = removed.len().min(MAX_KV_EVENT_HASHES);
            let s = stored.len().min(MAX_KV_EVENT_HASHES - r);
            self.seq += 1;
            batches.push(KvEvents {
                rank,
                seq: self.seq,
                block_size: self.block_size as u32,
                cleared: cleared && first,
                removed: removed[..r].to_vec(),
                stored: stored[..s].to_vec(),
            });
            removed = &removed[r..];
            stored = &stored[s..];
            first = false;
        }
        batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_batch_is_a_snapshot_then_net_changes_follow() {
        let mut log = KvEventLog::new(4);
        let b = log.take_batches(0, || vec![3, 1]);
        assert_eq!(b.len(), 1);
        assert_eq!(
            (b[0].seq, b[0].cleared, &b[0].stored[..]),
            (1, true, &[1, 3][..])
        );
        assert!(log.take_batches(0, Vec::new).is_empty(), "nothing changed");

        log.stored(5);
        log.removed(5); // cancels out
        log.removed(1);
        log.stored(1); // evicted and back: no change
        log.removed(3);
        log.stored(7);
        let b = log.take_batches(0, || unreachable!("not a snapshot"));
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].seq, b[0].cleared), (2, false));
        assert_eq!((&b[0].removed[..], &b[0].stored[..]), (&[3][..], &[7][..]));
    }

    #[test]
    fn a_flush_clears_and_a_requested_snapshot_lists_everything() {
        let mut log = KvEventLog::new(4);
        log.take_batches(0, Vec::new);
        log.stored(1);
        log.cleared();
        log.stored(2);
        let b = log.take_batches(0, || unreachable!());
        assert_eq!(
            (b[0].cleared, &b[0].removed[..], &b[0].stored[..]),
            (true, &[][..], &[2][..])
        );
        log.stored(9);
        log.request_snapshot();
        let b = log.take_batches(0, || vec![2, 9]);
        assert_eq!(
            (b[0].seq, b[0].cleared, &b[0].stored[..]),
            (3, true, &[2, 9][..])
        );
    }

    #[test]
    fn large_changes_are_cut_into_bounded_consecutive_batches() {
        let mut log = KvEventLog::new(4);
        let n = MAX_KV_EVENT_HASHES as u64 * 2 + 5;
        let b = log.take_batches(3, || (0..n).collect());
        assert_eq!(b.len(), 3);
        assert!(b
            .iter()
            .all(|e| e.len() <= MAX_KV_EVENT_HASHES && e.rank == 3));
        assert_eq!(b.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            b.iter().map(|e| e.cleared).collect::<Vec<_>>(),
            [true, false, false]
        );
        assert_eq!(b.iter().map(KvEvents::len).sum::<usize>() as u64, n);
    }
}
