//! KV events in the controller: keeping [`crate::kv_index::KvIndex`] in step with each rank's
//! stream (a snapshot asked for on registration and after a missing batch), and reading it for
//! a prompt before a `cache_aware` decision.

use std::time::Instant;

use protocol::{KvEvents, KvSnapshotReq, Message};

use super::Controller;
use crate::kv_index::{Applied, KvIndex};
use crate::policy::RankSet;

impl Controller {
    /// A rank registered (first `Hello`, a restart, a rejoin): what the index knew of it is
    /// void, and its worker sends a snapshot.
    pub(super) fn kv_joined(&mut self, identity: &[u8], rank: u32) {
        self.kv_index.join(rank, Instant::now());
        self.send_to_peer(
            identity,
            rank,
            &Message::KvSnapshotReq(KvSnapshotReq { rank }),
        );
    }

    /// A `KvEvents` batch from the holder of `events.rank`.
    pub(super) fn on_kv_events(&mut self, identity: &[u8], events: &KvEvents) {
        let rank = events.rank;
        match self.kv_index.apply(events, Instant::now()) {
            Applied::Applied | Applied::UnknownRank => {}
            Applied::AwaitingSnapshot { ask: false } => {}
            Applied::AwaitingSnapshot { ask: true } => {
                tracing::debug!(
                    rank,
                    seq = events.seq,
                    "still waiting for a KV snapshot; asking again"
                );
                self.send_to_peer(
                    identity,
                    rank,
                    &Message::KvSnapshotReq(KvSnapshotReq { rank }),
                );
            }
            Applied::Gap { expected, got } => {
                tracing::warn!(
                    rank,
                    expected,
                    got,
                    "a KV event batch is missing; the rank's cached blocks are ignored until its \
                     snapshot arrives"
                );
                self.send_to_peer(
                    identity,
                    rank,
                    &Message::KvSnapshotReq(KvSnapshotReq { rank }),
                );
            }
            Applied::WrongBlockSize { expected, got } => tracing::warn!(
                rank,
                expected,
                got,
                "this rank reports KV blocks of another size than the other ranks \
                 (--kv-event-block-size); cache_aware ignores its cache until it registers again"
            ),
        }
    }
}

/// `ranks` with what `index` says of the prompt `ids` on each of them now.
pub(super) fn with_cached_prefix(index: &KvIndex, ids: &[u32], ranks: &RankSet) -> RankSet {
    ranks
        .clone()
        .with_cached_prefix(index.cached_prefix(ids, ranks, Instant::now()))
}
