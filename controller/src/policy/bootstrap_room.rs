//! `follow_bootstrap_room`: `bootstrap_room % live ranks` over the live rank ids in ascending
//! order, so a prefill/decode pair that shares a room meets on the same rank. A request without
//! a room falls back to round robin (branch `fallback`) rather than failing.

use super::{Branch, LoadBalancer, Method, RankSet, RoundRobin, RouteDecision, RouteInput};

#[derive(Debug, Default)]
pub struct FollowBootstrapRoom {
    fallback: RoundRobin,
}

impl LoadBalancer for FollowBootstrapRoom {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        match req.bootstrap_room {
            Some(room) => {
                // `RankSet` is sorted by id, so index i is the i-th smallest live rank id.
                let idx = (room % ranks.len() as u64) as usize;
                RouteDecision::plain(ranks.loads()[idx].rank, Branch::Room)
            }
            None => {
                let mut d = self.fallback.select(req, ranks);
                d.branch = Branch::Fallback;
                d.fallback = Some(Method::RoundRobin);
                d
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(room: Option<u64>) -> RouteInput<'static> {
        RouteInput {
            rid: "r",
            input_ids: &[],
            routing_key: None,
            bootstrap_room: room,
            max_new_tokens: None,
        }
    }

    #[test]
    fn room_modulo_sorted_live_ids() {
        let ranks = RankSet::idle(&[7, 2, 5]);
        let mut m = FollowBootstrapRoom::default();
        // Sorted ids are [2, 5, 7].
        assert_eq!(m.select(&req(Some(0)), &ranks).rank, 2);
        assert_eq!(m.select(&req(Some(4)), &ranks).rank, 5);
        let d = m.select(&req(Some(5)), &ranks);
        assert_eq!((d.rank, d.branch), (7, Branch::Room));
        // 2^64 - 1 is divisible by 3.
        assert_eq!(m.select(&req(Some(u64::MAX)), &ranks).rank, 2);
    }

    #[test]
    fn no_room_falls_back_to_round_robin() {
        let ranks = RankSet::idle(&[0, 1]);
        let mut m = FollowBootstrapRoom::default();
        let a = m.select(&req(None), &ranks);
        let b = m.select(&req(None), &ranks);
        assert_eq!(a.branch, Branch::Fallback);
        assert_eq!(a.fallback, Some(Method::RoundRobin));
        assert_ne!(a.rank, b.rank);
    }
}
