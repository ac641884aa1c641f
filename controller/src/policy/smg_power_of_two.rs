//! `smg_power_of_two`: SGLang's model gateway's (SMG, `sgl-router`) power-of-two-choices policy.
//!
//! ```text
//! a, b  = two different live ranks drawn uniformly at random
//! rank  = a if load(a) <= load(b), else b        (a tie goes to the first drawn)
//! load  = the rank's active requests (its last status plus the dispatches since)
//! ```
//! Source: sgl-project/sglang `sgl-router/src/policies/power_of_two.rs`,
//! `PowerOfTwoPolicy::select_worker` (commit b6f20641ad6b): with one healthy worker, that one;
//! else two indices drawn until they differ, and `load1 <= load2` keeps the first. The
//! gateway's load is its per-worker in-flight counter (or the loads its optional monitor last
//! polled); dpserve's analogue is the rank's active requests as the budget counts them, every
//! dispatch counted at once. The draws come from a seeded generator, so a run replays.
//!
//! The decision records the two drawn ranks' terms as data ([`RankTerms`]): this method is the
//! example of one the routing vocabulary and the trace tools did not have to learn.
//!
//! Cost: O(1) per decision (the two draws; a redraw while they coincide, expected < 2).

use super::{
    Branch, LoadBalancer, RankLoad, RankScore, RankSet, RankTerms, RouteDecision, RouteInput,
};
use protocol::hash::SplitMix64;

/// The method's name, as its records carry it.
const RULE: &str = "smg_power_of_two";
/// The draws' seed.
const SEED: u64 = 0x2c40;

/// The balancer: its generator of draws.
#[derive(Debug, Clone)]
pub struct SmgPowerOfTwo {
    rng: SplitMix64,
}

impl Default for SmgPowerOfTwo {
    fn default() -> Self {
        SmgPowerOfTwo {
            rng: SplitMix64::new(SEED),
        }
    }
}

impl LoadBalancer for SmgPowerOfTwo {
    fn select(&mut self, _req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let loads = ranks.loads();
        if loads.len() == 1 {
            return RouteDecision::plain(loads[0].rank, Branch::LeastLoaded);
        }
        let a = self.rng.below(loads.len());
        let mut b = self.rng.below(loads.len());
        while b == a {
            b = self.rng.below(loads.len());
        }
        let (la, lb) = (loads[a], loads[b]);
        let chosen = if la.active_requests <= lb.active_requests {
            la.rank
        } else {
            lb.rank
        };
        let terms = |l: RankLoad, order: f64| {
            let load = l.active_requests as f64;
            RankScore::Terms(RankTerms::new(
                RULE,
                l.rank,
                &[("drawn", order), ("active_requests", load)],
                load,
            ))
        };
        RouteDecision::scored(
            chosen,
            Branch::LeastLoaded,
            vec![terms(la, 1.0), terms(lb, 2.0)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(active: &[u64]) -> RankSet {
        RankSet::new(
            active
                .iter()
                .enumerate()
                .map(|(r, &a)| RankLoad {
                    rank: r as u32,
                    active_requests: a,
                    active_tokens: 0,
                })
                .collect(),
        )
    }

    fn req() -> RouteInput<'static> {
        RouteInput::prompt(&[])
    }

    #[test]
    fn the_less_loaded_of_the_two_drawn_wins_and_a_tie_keeps_the_first() {
        let mut m = SmgPowerOfTwo::default();
        let set = ranks(&[9, 4, 0, 4]);
        for _ in 0..200 {
            let d = m.select(&req(), &set);
            assert_eq!(d.branch, Branch::LeastLoaded);
            let drawn: Vec<(u32, f64, f64)> = d
                .scores
                .iter()
                .map(|s| match s {
                    RankScore::Terms(t) => (t.rank, t.terms[0].1, t.cost),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(drawn.len(), 2);
            assert_ne!(drawn[0].0, drawn[1].0, "two different ranks");
            assert_eq!((drawn[0].1, drawn[1].1), (1.0, 2.0));
            let want = if drawn[0].2 <= drawn[1].2 {
                drawn[0].0
            } else {
                drawn[1].0
            };
            assert_eq!(d.rank, want, "{drawn:?}");
            assert_eq!(
                drawn[0].2,
                set.loads()[drawn[0].0 as usize].active_requests as f64
            );
        }
    }

    #[test]
    fn loads_bias_the_choice_as_in_the_gateway_s_own_test() {
        // SMG's test: loads 10, 5, 0 over 100 selections: the idle worker most often, the
        // busiest least. Here the rule's exact odds: rank 2 wins both pairs it is drawn in
        // (2/3), rank 1 one pair (1/3), rank 0 none.
        let mut m = SmgPowerOfTwo::default();
        let set = ranks(&[10, 5, 0]);
        let mut won = [0u32; 3];
        for _ in 0..3000 {
            won[m.select(&req(), &set).rank as usize] += 1;
        }
        assert_eq!(won[0], 0);
        assert!(won[2] > won[1] && won[1] > 800, "{won:?}");
    }

    #[test]
    fn one_live_rank_is_taken_without_a_draw_and_draws_replay() {
        let mut m = SmgPowerOfTwo::default();
        let d = m.select(&req(), &ranks(&[7]));
        assert_eq!((d.rank, d.scores.len()), (0, 0));
        let set = ranks(&[1, 1, 1, 1, 1, 1, 1, 1]);
        let run = |mut m: SmgPowerOfTwo| -> Vec<u32> {
            (0..50).map(|_| m.select(&req(), &set).rank).collect()
        };
        let first = run(SmgPowerOfTwo::default());
        assert_eq!(first, run(SmgPowerOfTwo::default()));
        assert!(
            first.iter().any(|&r| r != first[0]),
            "ties spread: {first:?}"
        );
    }
}
