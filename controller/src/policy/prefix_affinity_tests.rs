//! Tests of `prefix_affinity`: key choice, HRW stability, the overload guard, the fallback, and a
//! simulation of how evenly HRW spreads keys.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::policy::{Method, RankLoad};

fn loads(reqs: &[(u32, u64)]) -> RankSet {
    RankSet::new(
        reqs.iter()
            .map(|&(rank, active_requests)| RankLoad {
                rank,
                active_requests,
                active_tokens: 0,
            })
            .collect(),
    )
}

fn keyed(key: &str) -> RouteInput<'_> {
    RouteInput {
        rid: "r",
        input_ids: &[1, 2, 3],
        routing_key: Some(key),
        bootstrap_room: None,
        max_new_tokens: None,
    }
}

fn tokens(ids: &[u32]) -> RouteInput<'_> {
    RouteInput {
        rid: "r",
        input_ids: ids,
        routing_key: None,
        bootstrap_room: None,
        max_new_tokens: None,
    }
}

fn pa() -> PrefixAffinity {
    PrefixAffinity::new(PrefixAffinityConfig::default())
}

/// Scores fixed by a table: rank r scores `table[r]` for every key.
struct FixedScores(Vec<u64>);

impl HrwHasher for FixedScores {
    fn score(&self, _key: &[u8], rank: u32) -> u64 {
        self.0[rank as usize]
    }
    fn token_key(&self, ids: &[u32]) -> [u8; 16] {
        Blake2Hrw.token_key(ids)
    }
    fn digest(&self, _key: &[u8]) -> u64 {
        0
    }
}

#[test]
fn same_key_same_rank_under_balanced_load() {
    let mut m = pa();
    let ranks = loads(&[(0, 2), (1, 2), (2, 2), (3, 2)]);
    let first = m.select(&keyed("user-17"), &ranks);
    assert_eq!(first.branch, Branch::Affinity);
    assert_eq!(first.key_source, KeySource::RoutingKey);
    assert_eq!(first.rank, first.hrw_order[0]);
    for _ in 0..20 {
        assert_eq!(m.select(&keyed("user-17"), &ranks).rank, first.rank);
    }
}

#[test]
fn distinct_keys_with_one_identical_8k_prefix_spread_over_all_8_ranks() {
    // Every prompt is the same 8K tokens (a shared system prompt): only the routing key tells
    // the conversations apart, and it must, or all 256 would land on one rank.
    let prompt: Vec<u32> = (0..8192).map(|i| (i * 31 + 7) % 32000).collect();
    let ranks = RankSet::idle(&(0..8).collect::<Vec<_>>());
    let mut m = pa();
    let mut per_rank = BTreeMap::<u32, usize>::new();
    for k in 0..256 {
        let key = format!("session-{k}");
        let req = RouteInput {
            rid: "r",
            input_ids: &prompt,
            routing_key: Some(&key),
            bootstrap_room: None,
            max_new_tokens: None,
        };
        *per_rank.entry(m.select(&req, &ranks).rank).or_default() += 1;
    }
    assert_eq!(per_rank.len(), 8, "{per_rank:?}");
    // 32 expected per rank; a multinomial spread stays well inside [12, 56].
    assert!(
        per_rank.values().all(|&c| (12..=56).contains(&c)),
        "{per_rank:?}"
    );
}

#[test]
fn hot_key_spills_to_its_next_hrw_candidate_once_loaded() {
    let mut m = pa();
    let mut reqs: BTreeMap<u32, u64> = (0..4).map(|r| (r, 0)).collect();
    let snapshot =
        |reqs: &BTreeMap<u32, u64>| loads(&reqs.iter().map(|(&r, &l)| (r, l)).collect::<Vec<_>>());
    let first = m.select(&keyed("hot"), &snapshot(&reqs));
    let (preferred, second) = (first.hrw_order[0], first.hrw_order[1]);
    assert_eq!((first.rank, first.branch), (preferred, Branch::Affinity));
    *reqs.get_mut(&first.rank).unwrap() += 1;

    // Threshold is 1.5 × max(mean, 1) = 1.5 while the mean is below 1: the preferred rank takes
    // one more (load 1 ≤ 1.5), then at load 2 the key spills to its second choice, not to an
    // arbitrary idle rank.
    let d = m.select(&keyed("hot"), &snapshot(&reqs));
    assert_eq!((d.rank, d.branch), (preferred, Branch::Affinity));
    *reqs.get_mut(&d.rank).unwrap() += 1;
    let d = m.select(&keyed("hot"), &snapshot(&reqs));
    assert_eq!((d.rank, d.branch), (second, Branch::Spill));
    assert_eq!(d.threshold, Some(1.5));

    // Accumulating load keeps every rank within the skew bound.
    for _ in 0..200 {
        let d = m.select(&keyed("hot"), &snapshot(&reqs));
        *reqs.get_mut(&d.rank).unwrap() += 1;
        let mean = reqs.values().sum::<u64>() as f64 / 4.0;
        assert!(reqs
            .values()
            .all(|&l| l as f64 <= 1.5 * mean.max(1.0) + 1.0));
    }
}

#[test]
fn spill_order_follows_hrw_scores_with_an_injected_hasher() {
    // Rank 2 scores highest, then 0, then 3, then 1.
    let hasher = FixedScores(vec![30, 10, 40, 20]);
    let mut m = PrefixAffinity::with_hasher(PrefixAffinityConfig::default(), Box::new(hasher));
    let d = m.select(&keyed("k"), &loads(&[(0, 0), (1, 0), (2, 0), (3, 0)]));
    assert_eq!(d.hrw_order, vec![2, 0, 3, 1]);
    // Mean 4.5 → threshold 6.75: 2 and 0 are over, 3 qualifies.
    let d = m.select(&keyed("k"), &loads(&[(0, 7), (1, 0), (2, 11), (3, 0)]));
    assert_eq!((d.rank, d.branch), (3, Branch::Spill));
    // Load equal to the threshold still qualifies (≤).
    let d = m.select(&keyed("k"), &loads(&[(0, 0), (1, 0), (2, 3), (3, 1)]));
    assert_eq!(
        (d.threshold, d.rank, d.branch),
        (Some(1.5), 0, Branch::Spill)
    );
    let d = m.select(&keyed("k"), &loads(&[(0, 0), (1, 0), (2, 6), (3, 2)]));
    assert_eq!(
        (d.threshold, d.rank, d.branch),
        (Some(3.0), 0, Branch::Spill)
    );
    let d = m.select(&keyed("k"), &loads(&[(0, 0), (1, 1), (2, 3), (3, 4)]));
    assert_eq!(
        (d.threshold, d.rank, d.branch),
        (Some(3.0), 2, Branch::Affinity)
    );
}

#[test]
fn removing_a_rank_moves_only_its_keys_and_adding_it_back_restores_them() {
    let mut m = pa();
    let all = RankSet::idle(&(0..8).collect::<Vec<_>>());
    let without5 = RankSet::idle(&[0, 1, 2, 3, 4, 6, 7]);
    let keys: Vec<String> = (0..400).map(|k| format!("k{k}")).collect();
    let before: Vec<u32> = keys
        .iter()
        .map(|k| m.select(&keyed(k), &all).rank)
        .collect();
    let during: Vec<u32> = keys
        .iter()
        .map(|k| m.select(&keyed(k), &without5).rank)
        .collect();
    let after: Vec<u32> = keys
        .iter()
        .map(|k| m.select(&keyed(k), &all).rank)
        .collect();
    let mut moved = 0;
    for i in 0..keys.len() {
        if before[i] == 5 {
            assert_ne!(during[i], 5);
            moved += 1;
        } else {
            assert_eq!(
                during[i], before[i],
                "key {} moved though its rank stayed",
                keys[i]
            );
        }
    }
    assert!(moved > 0, "no key was on rank 5");
    assert_eq!(
        after, before,
        "the returning rank gets exactly its keys back"
    );
}

#[test]
fn huge_resident_tokens_with_few_requests_keep_affinity() {
    let mut m = pa();
    let idle = RankSet::idle(&[0, 1, 2, 3]);
    let preferred = m.select(&keyed("long-conversation"), &idle).rank;
    let ranks = RankSet::new(
        (0..4)
            .map(|rank| RankLoad {
                rank,
                active_requests: 1,
                active_tokens: if rank == preferred { 5_000_000 } else { 10 },
            })
            .collect(),
    );
    let d = m.select(&keyed("long-conversation"), &ranks);
    assert_eq!((d.rank, d.branch), (preferred, Branch::Affinity));
}

#[test]
fn a_single_live_rank_is_never_overloaded() {
    let mut m = pa();
    let d = m.select(&keyed("k"), &loads(&[(3, 10_000)]));
    assert_eq!((d.rank, d.branch), (3, Branch::Affinity));
}

#[test]
fn no_key_with_token_fallback_disabled_uses_the_fallback_method() {
    let config = PrefixAffinityConfig {
        token_fallback: false,
        ..PrefixAffinityConfig::default()
    };
    let mut m = PrefixAffinity::new(config);
    let ranks = RankSet::new(vec![
        RankLoad {
            rank: 0,
            active_requests: 1,
            active_tokens: 500,
        },
        RankLoad {
            rank: 1,
            active_requests: 3,
            active_tokens: 20,
        },
        RankLoad {
            rank: 2,
            active_requests: 0,
            active_tokens: 900,
        },
    ]);
    let d = m.select(&tokens(&[5, 6, 7]), &ranks);
    assert_eq!(
        (d.rank, d.branch),
        (1, Branch::Fallback),
        "total_tokens picks rank 1"
    );
    assert_eq!(d.fallback, Some(Method::TotalTokens));
    assert_eq!(d.key_source, KeySource::None);
    assert!(d.hrw_order.is_empty() && d.key_digest.is_none());

    let mut m = PrefixAffinity::new(PrefixAffinityConfig {
        token_fallback: false,
        fallback: FallbackMethod::TotalRequests,
        ..PrefixAffinityConfig::default()
    });
    assert_eq!(m.select(&tokens(&[5]), &ranks).rank, 2);
    // A routing key is still honoured with the token fallback disabled.
    assert_eq!(m.select(&keyed("k"), &ranks).branch, Branch::Affinity);
}

#[test]
fn no_routing_key_and_empty_input_falls_through_without_error() {
    let mut m = pa();
    let ranks = RankSet::idle(&[0, 1]);
    let d = m.select(&tokens(&[]), &ranks);
    assert_eq!(d.branch, Branch::Fallback);
    assert!(ranks.contains(d.rank));
    // An empty routing key is no key either.
    let req = RouteInput {
        routing_key: Some(""),
        ..tokens(&[])
    };
    assert_eq!(m.select(&req, &ranks).branch, Branch::Fallback);
}

#[test]
fn token_key_uses_only_the_first_hash_tokens_ids() {
    let mut m = PrefixAffinity::new(PrefixAffinityConfig {
        hash_tokens: 4,
        ..PrefixAffinityConfig::default()
    });
    let ranks = RankSet::idle(&(0..64).collect::<Vec<_>>());
    let a = m.select(&tokens(&[1, 2, 3, 4, 100, 200]), &ranks);
    let b = m.select(&tokens(&[1, 2, 3, 4, 999]), &ranks);
    assert_eq!(a.key_source, KeySource::TokenPrefix);
    assert_eq!((a.rank, a.key_digest), (b.rank, b.key_digest));
    let c = m.select(&tokens(&[1, 2, 3, 5]), &ranks);
    assert_ne!(a.key_digest, c.key_digest);
}

#[test]
fn routing_key_wins_over_the_token_prefix() {
    let mut m = pa();
    let ranks = RankSet::idle(&(0..64).collect::<Vec<_>>());
    let req = RouteInput {
        routing_key: Some("k"),
        ..tokens(&[1, 2, 3])
    };
    let d = m.select(&req, &ranks);
    assert_eq!(d.key_source, KeySource::RoutingKey);
    assert_eq!(d.key_digest, Some(Blake2Hrw.digest(b"k")));
}

/// Simulation: how evenly does HRW spread 512 keys over 8 ranks? For an ideal uniform hash the
/// coefficient of variation of keys per rank is about sqrt((1 - 1/8) / 64) ≈ 0.117. One draw of
/// 512 keys varies a lot around that, so 32 independent key sets are measured and the mean and
/// worst CV printed (`cargo test -p controller hrw_key_balance -- --nocapture`).
#[test]
fn hrw_key_balance_simulation_512_keys_over_8_ranks() {
    let mut m = pa();
    let ranks = RankSet::idle(&(0..8).collect::<Vec<_>>());
    let mut cvs = Vec::new();
    for trial in 0..32 {
        let mut counts = [0f64; 8];
        for k in 0..512 {
            let key = format!("trial-{trial}/conversation-{k}");
            counts[m.select(&keyed(&key), &ranks).rank as usize] += 1.0;
        }
        let mean = 512.0 / 8.0;
        let var = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / 8.0;
        cvs.push(var.sqrt() / mean);
        if trial == 0 {
            println!("HRW keys per rank, 512 keys over 8 ranks: {counts:?}");
        }
    }
    let mean_cv = cvs.iter().sum::<f64>() / cvs.len() as f64;
    let worst = cvs.iter().copied().fold(0.0, f64::max);
    println!(
        "HRW key balance: mean CV {mean_cv:.3}, worst {worst:.3} over 32 trials (ideal ≈ 0.117)"
    );
    assert!(
        mean_cv < 0.16,
        "mean CV {mean_cv} is above a uniform hash's"
    );
    assert!(worst < 0.3, "worst CV {worst}");
}

#[test]
fn the_decision_reports_what_the_trace_needs() {
    let mut m = pa();
    let d = m.select(&keyed("k"), &loads(&[(0, 1), (1, 1), (2, 1)]));
    assert_eq!(d.hrw_order.len(), 3);
    assert_eq!(
        d.hrw_order.iter().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([0, 1, 2])
    );
    assert_eq!(d.threshold, Some(1.5));
    assert!(d.key_digest.is_some());
}

proptest! {
    /// Whatever the loads, the chosen rank is live, and it is the first HRW candidate within
    /// the threshold (or the first candidate when none is).
    #[test]
    fn chosen_rank_is_the_first_candidate_within_the_threshold(
        raw in proptest::collection::btree_map(0u32..32, 0u64..50, 1..12),
        key in "[a-z]{1,12}",
        skew in 1.0f64..4.0,
    ) {
        let ranks = loads(&raw.iter().map(|(&r, &l)| (r, l)).collect::<Vec<_>>());
        let mut m = PrefixAffinity::new(PrefixAffinityConfig {
            max_load_skew: skew,
            ..PrefixAffinityConfig::default()
        });
        let d = m.select(&keyed(&key), &ranks);
        prop_assert!(ranks.contains(d.rank));
        let t = d.threshold.unwrap();
        let pos = d.hrw_order.iter().position(|&r| r == d.rank).unwrap();
        for &r in &d.hrw_order[..pos] {
            prop_assert!(raw[&r] as f64 > t);
        }
        if ranks.len() > 1 {
            // With skew ≥ 1 the least-loaded rank always qualifies.
            prop_assert!(raw[&d.rank] as f64 <= t);
        }
        prop_assert_eq!(d.branch == Branch::Spill, pos > 0);
    }
}
