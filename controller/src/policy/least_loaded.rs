//! `total_requests` (argmin active requests) and `total_tokens` (argmin active tokens, ties by
//! requests). Ties left after that are broken by a start index that rotates with every decision,
//! never by the lowest rank id, which would herd an idle cluster onto rank 0.
//!
//! Cost: one pass over the live ranks, O(n).

use super::{Branch, LoadBalancer, RankLoad, RankSet, RouteDecision, RouteInput};

/// Index of the least-loaded rank by `key`, scanning from a rotating start so that equal loads
/// take turns.
fn rotating_argmin<K: Ord>(
    ranks: &RankSet,
    start: &mut usize,
    key: impl Fn(&RankLoad) -> K,
) -> u32 {
    let loads = ranks.loads();
    let n = loads.len();
    let first = *start % n;
    *start = start.wrapping_add(1);
    let mut best = &loads[first];
    let mut best_key = key(best);
    for i in 1..n {
        let candidate = &loads[(first + i) % n];
        let k = key(candidate);
        // Strictly less: the earliest in rotation order wins a tie.
        if k < best_key {
            best = candidate;
            best_key = k;
        }
    }
    best.rank
}

/// `total_requests`: the rank with the fewest running + waiting (+ speculative) requests.
#[derive(Debug, Default)]
pub struct TotalRequests {
    start: usize,
}

impl LoadBalancer for TotalRequests {
    fn select(&mut self, _req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let rank = rotating_argmin(ranks, &mut self.start, |l| l.active_requests);
        RouteDecision::plain(rank, Branch::LeastLoaded)
    }
}

/// `total_tokens`: the rank with the fewest active tokens, then the fewest requests.
#[derive(Debug, Default)]
pub struct TotalTokens {
    start: usize,
}

impl LoadBalancer for TotalTokens {
    fn select(&mut self, _req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let rank = rotating_argmin(ranks, &mut self.start, |l| {
            (l.active_tokens, l.active_requests)
        });
        RouteDecision::plain(rank, Branch::LeastLoaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(loads: &[(u32, u64, u64)]) -> RankSet {
        RankSet::with_loads(loads)
    }

    const REQ: RouteInput<'static> = RouteInput {
        rid: "r",
        input_ids: &[],
        routing_key: None,
        bootstrap_room: None,
        max_new_tokens: None,
    };

    #[test]
    fn total_requests_takes_the_fewest_requests() {
        let ranks = set(&[(0, 5, 0), (1, 2, 900), (2, 7, 0)]);
        let d = TotalRequests::default().select(&REQ, &ranks);
        assert_eq!((d.rank, d.branch), (1, Branch::LeastLoaded));
    }

    #[test]
    fn total_tokens_takes_the_fewest_tokens_then_requests() {
        let ranks = set(&[(0, 1, 100), (1, 3, 50), (2, 2, 50)]);
        assert_eq!(TotalTokens::default().select(&REQ, &ranks).rank, 2);
    }

    #[test]
    fn ties_rotate_instead_of_herding_on_the_lowest_rank() {
        let ranks = set(&[(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)]);
        for mut m in [
            Box::new(TotalRequests::default()) as Box<dyn LoadBalancer>,
            Box::new(TotalTokens::default()),
        ] {
            let got: Vec<u32> = (0..8).map(|_| m.select(&REQ, &ranks).rank).collect();
            assert_eq!(got, vec![0, 1, 2, 3, 0, 1, 2, 3]);
        }
    }

    #[test]
    fn partial_ties_rotate_among_the_tied_only() {
        let ranks = set(&[(0, 1, 0), (1, 0, 0), (2, 0, 0), (3, 4, 0)]);
        let mut m = TotalRequests::default();
        let got: Vec<u32> = (0..4).map(|_| m.select(&REQ, &ranks).rank).collect();
        assert_eq!(got, vec![1, 1, 2, 1]);
    }
}
