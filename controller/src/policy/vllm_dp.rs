//! `vllm_dp`: vLLM's internal data-parallel load balancer, the rule its API server applies to
//! every request that names no rank.
//!
//! ```text
//! score(r) = 4 × waiting(r) + running(r)
//! rank     = the first r, scanning the live ranks in rank order, with the lowest score
//!            (strictly lower replaces: the lowest rank id wins a tie)
//! waiting  = waiting by the rank's last status + requests dispatched since that it does not
//!            count yet (the budget's speculative entries)
//! running  = running by the rank's last status
//! ```
//! Source: vllm-project/vllm `vllm/v1/engine/core_client.py`, `DPLBAsyncMPClient.
//! get_core_engine_for_request` (commit 364631ab07d2), and `docs/serving/
//! data_parallel_deployment.md` ("based on the running and waiting queues in each of the
//! engines"). No options. The details, as in the code:
//! - A waiting request weighs four running ones: a queued request will need a prefill, and
//!   it is the queue that makes a new request wait.
//! - The scan starts at `eng_start_index = engines × client_index / client_count`, fixed per
//!   API server; with one API server (dpserve's controller) it is rank 0, so ties go to the
//!   lowest rank id. That is vLLM's behaviour (an idle cluster fills from engine 0), kept on
//!   purpose; dpserve's own `total_requests` rotates instead.
//! - After choosing, the client adds `client_count` (1 here) to its copy of that engine's
//!   waiting count, so a burst between two coordinator updates (every 100 ms) spreads. dpserve's
//!   budget already adds each dispatch to the rank's load until a status counts it; this rule
//!   counts those dispatches as waiting, as vLLM's increment does.
//!
//! Not modelled: newer vLLM main (commit 00080ee13c7a) replaced the score with
//! `max(in-flight, waiting + running) + 6 × waiting × max(0, kv_usage − 0.5)` and rotates the
//! scan start per request; this method is the long-standing `4 × waiting + running` rule the
//! issue and vLLM's users compare against.
//!
//! Cost: one pass over the live ranks, O(n).

use super::{Branch, LoadBalancer, RankScore, RankSet, RouteDecision, RouteInput};

/// The balancer; stateless (the speculative increment lives in the budget).
#[derive(Debug, Default, Clone, Copy)]
pub struct VllmDp;

/// The weight of one waiting request against one running one.
pub const WAITING_WEIGHT: u64 = 4;

impl LoadBalancer for VllmDp {
    fn select(&mut self, _req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let scores: Vec<RankScore> = (0..ranks.len())
            .map(|i| {
                let q = ranks.queue(i);
                RankScore::VllmDp {
                    rank: q.rank,
                    waiting: q.waiting_requests,
                    running: q.running_requests,
                    score: WAITING_WEIGHT * q.waiting_requests + q.running_requests,
                }
            })
            .collect();
        let score_of = |s: &RankScore| match *s {
            RankScore::VllmDp { score, .. } => score,
            _ => u64::MAX,
        };
        // `min_by_key` keeps the first of equal minima: the lowest rank id, as vLLM's scan.
        let rank = scores
            .iter()
            .min_by_key(|s| score_of(s))
            .map_or(ranks.loads()[0].rank, RankScore::rank);
        RouteDecision::scored(rank, Branch::LeastLoaded, scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{RankLoad, RankQueue};

    /// Ranks with `(rank, running, waiting)`.
    fn ranks(queues: &[(u32, u64, u64)]) -> RankSet {
        let loads = queues
            .iter()
            .map(|&(rank, running, waiting)| RankLoad {
                rank,
                active_requests: running + waiting,
                active_tokens: 0,
            })
            .collect();
        RankSet::new(loads).with_queues(
            queues
                .iter()
                .map(|&(rank, running, waiting)| RankQueue {
                    rank,
                    running_requests: running,
                    waiting_requests: waiting,
                    max_total_tokens: 1000,
                    ..Default::default()
                })
                .collect(),
        )
    }

    const REQ: RouteInput<'static> = RouteInput {
        rid: "r",
        input_ids: &[],
        routing_key: None,
        bootstrap_room: None,
        max_new_tokens: None,
    };

    #[test]
    fn a_waiting_request_weighs_four_running_ones() {
        // Scores: 0 → 4×1 + 0 = 4, 1 → 4×0 + 3 = 3, 2 → 4×0 + 5 = 5.
        let d = VllmDp.select(&REQ, &ranks(&[(0, 0, 1), (1, 3, 0), (2, 5, 0)]));
        assert_eq!((d.rank, d.branch), (1, Branch::LeastLoaded));
        // Four running equal one waiting: a tie, which the lower rank wins.
        let d = VllmDp.select(&REQ, &ranks(&[(0, 4, 0), (1, 0, 1)]));
        assert_eq!(d.rank, 0);
        let scores: Vec<u64> = d
            .scores
            .iter()
            .map(|s| match s {
                RankScore::VllmDp { score, .. } => *score,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(scores, [4, 4]);
    }

    #[test]
    fn ties_go_to_the_lowest_rank_every_time_as_in_vllm() {
        let idle = ranks(&[(3, 0, 0), (1, 0, 0), (2, 0, 0)]);
        let mut m = VllmDp;
        let got: Vec<u32> = (0..4).map(|_| m.select(&REQ, &idle).rank).collect();
        assert_eq!(
            got,
            [1, 1, 1, 1],
            "no rotation: vLLM's scan starts at engine 0"
        );
    }

    #[test]
    fn dispatches_not_yet_in_a_status_count_as_waiting() {
        use crate::budget::RankBudget;
        use std::time::Instant;
        // Rank 0 reported 2 running; the controller then sent it one more. Rank 1 runs 5.
        let mut b = RankBudget::default();
        let t0 = Instant::now();
        b.on_status(
            &protocol::WorkerStatus {
                rank: 0,
                timestamp: 100.0,
                num_running_reqs: 2,
                max_total_tokens: 1000,
                ..Default::default()
            },
            t0,
        );
        b.on_dispatch("x", 10, 10, 0, t0, 101.0);
        let q = b.queue(0);
        assert_eq!((q.running_requests, q.waiting_requests), (2, 1));
        // 4 × 1 + 2 = 6 > 5: the dispatch alone moves the next request to rank 1.
        let set = ranks(&[(0, 2, 1), (1, 5, 0)]);
        assert_eq!(VllmDp.select(&REQ, &set).rank, 1);
    }

    #[test]
    fn without_a_queue_split_every_active_request_counts_as_running() {
        let set = RankSet::with_loads(&[(0, 3, 0), (1, 2, 0)]);
        assert_eq!(VllmDp.select(&REQ, &set).rank, 1);
    }
}
