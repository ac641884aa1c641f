//! `round_robin`: rotate over the live ranks by rank id, skipping dead ones.

use super::{Branch, LoadBalancer, RankSet, RouteDecision, RouteInput};

/// Remembers the last rank chosen and takes the next live rank id after it, so a rank leaving
/// or joining does not reset the rotation.
#[derive(Debug, Default)]
pub struct RoundRobin {
    last: Option<u32>,
}

impl LoadBalancer for RoundRobin {
    fn select(&mut self, _req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let ids = ranks.ids();
        let rank = match self.last {
            Some(last) => ids.iter().copied().find(|&r| r > last).unwrap_or(ids[0]),
            None => ids[0],
        };
        self.last = Some(rank);
        RouteDecision::plain(rank, Branch::Rotate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u32]) -> RankSet {
        RankSet::idle(ids)
    }

    fn input() -> RouteInput<'static> {
        RouteInput {
            rid: "r",
            input_ids: &[],
            routing_key: None,
            bootstrap_room: None,
            max_new_tokens: None,
        }
    }

    #[test]
    fn rotates_over_live_ranks() {
        let mut rr = RoundRobin::default();
        let ranks = set(&[0, 1, 2]);
        let got: Vec<u32> = (0..6).map(|_| rr.select(&input(), &ranks).rank).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn skips_dead_ranks_without_resetting() {
        let mut rr = RoundRobin::default();
        assert_eq!(rr.select(&input(), &set(&[0, 1, 2])).rank, 0);
        // Rank 1 died: the rotation continues after 0 with 2.
        assert_eq!(rr.select(&input(), &set(&[0, 2])).rank, 2);
        assert_eq!(rr.select(&input(), &set(&[0, 2])).rank, 0);
        // Rank 1 is back.
        assert_eq!(rr.select(&input(), &set(&[0, 1, 2])).rank, 1);
    }
}
