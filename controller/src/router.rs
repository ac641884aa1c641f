//! The routing decision for one request: an explicit rank first, then the configured method.

use thiserror::Error;

use crate::policy::{Branch, KeySource, LoadBalancer, RankSet, RouteDecision, RouteInput};

/// Why a request could not be routed. Each maps to an HTTP status for the client.
#[derive(Debug, Error, PartialEq)]
pub enum RouteError {
    #[error("data parallel rank {rank} is not live (live ranks: {live:?})")]
    UnknownRank { rank: u32, live: Vec<u32> },
    #[error("no live data parallel rank")]
    NoLiveRank,
}

impl RouteError {
    pub fn http_status(&self) -> u16 {
        match self {
            RouteError::UnknownRank { .. } => 400,
            RouteError::NoLiveRank => 503,
        }
    }
}

/// Route `req`: honour `explicit` if it names a live rank (else refuse, never reroute), otherwise
/// ask the balancer.
pub fn route(
    balancer: &mut dyn LoadBalancer,
    req: &RouteInput<'_>,
    explicit: Option<u32>,
    ranks: &RankSet,
) -> Result<RouteDecision, RouteError> {
    if let Some(rank) = explicit {
        if ranks.contains(rank) {
            return Ok(RouteDecision {
                key_source: KeySource::Explicit,
                ..RouteDecision::plain(rank, Branch::Explicit)
            });
        }
        return Err(RouteError::UnknownRank {
            rank,
            live: ranks.ids(),
        });
    }
    if ranks.is_empty() {
        return Err(RouteError::NoLiveRank);
    }
    Ok(balancer.select(req, ranks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{PrefixAffinity, PrefixAffinityConfig, RoundRobin};

    fn ranks(ids: &[u32]) -> RankSet {
        RankSet::idle(ids)
    }

    const REQ: RouteInput<'static> = RouteInput {
        rid: "r",
        input_ids: &[1, 2],
        routing_key: None,
        bootstrap_room: None,
        max_new_tokens: None,
    };

    #[test]
    fn explicit_rank_wins_over_the_method() {
        let mut rr = RoundRobin::default();
        let d = route(&mut rr, &REQ, Some(1), &ranks(&[0, 1])).unwrap();
        assert_eq!((d.rank, d.branch), (1, Branch::Explicit));
    }

    #[test]
    fn explicit_rank_that_is_not_live_is_refused() {
        let mut rr = RoundRobin::default();
        let err = route(&mut rr, &REQ, Some(5), &ranks(&[0, 1])).unwrap_err();
        assert_eq!(
            err,
            RouteError::UnknownRank {
                rank: 5,
                live: vec![0, 1]
            }
        );
        assert_eq!(err.http_status(), 400);
    }

    #[test]
    fn explicit_rank_bypasses_prefix_affinity() {
        let mut pa = PrefixAffinity::new(PrefixAffinityConfig::default());
        let req = RouteInput {
            routing_key: Some("k"),
            ..REQ
        };
        let ranks = ranks(&[0, 1, 2, 3]);
        let preferred = route(&mut pa, &req, None, &ranks).unwrap().rank;
        let other = (preferred + 1) % 4;
        let d = route(&mut pa, &req, Some(other), &ranks).unwrap();
        assert_eq!((d.rank, d.branch), (other, Branch::Explicit));
        assert_eq!(d.key_source, KeySource::Explicit);
        assert!(d.hrw_order.is_empty());
        assert!(route(&mut pa, &req, Some(9), &ranks).is_err());
    }

    #[test]
    fn no_live_rank_is_503() {
        let mut rr = RoundRobin::default();
        let err = route(&mut rr, &REQ, None, &ranks(&[])).unwrap_err();
        assert_eq!(err.http_status(), 503);
    }
}
