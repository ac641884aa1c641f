//! Load-balance methods. Each method is a type behind [`LoadBalancer`]: given a request and the
//! live ranks with their loads, it returns a [`RouteDecision`] that names the rank *and* the branch
//! taken, so every decision can be traced, counted and unit-tested without a process.

mod round_robin;

pub use round_robin::RoundRobin;

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// What the router knows about a request when it picks a rank.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    pub rid: &'a str,
    pub input_ids: &'a [u32],
    pub routing_key: Option<&'a str>,
    pub bootstrap_room: Option<u64>,
}

/// One live rank and its load as the budget sees it (status plus speculative increments).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RankLoad {
    pub rank: u32,
    /// Running + waiting requests.
    pub active_requests: u64,
    /// Tokens resident or reserved on the rank.
    pub active_tokens: u64,
}

/// The live ranks, sorted by rank id. Never empty when handed to a balancer.
#[derive(Debug, Clone, Default)]
pub struct RankSet {
    ranks: Vec<RankLoad>,
}

impl RankSet {
    pub fn new(mut ranks: Vec<RankLoad>) -> Self {
        ranks.sort_by_key(|r| r.rank);
        RankSet { ranks }
    }

    pub fn loads(&self) -> &[RankLoad] {
        &self.ranks
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    pub fn contains(&self, rank: u32) -> bool {
        self.ranks.iter().any(|r| r.rank == rank)
    }

    pub fn ids(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.rank).collect()
    }
}

/// Which branch of a method produced the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Branch {
    /// The client named the rank.
    Explicit,
    /// Round-robin rotation.
    Rotate,
    /// Least-loaded choice.
    LeastLoaded,
    /// The preferred (affinity) rank was taken.
    Affinity,
    /// The preferred rank was overloaded; the next candidate was taken.
    Spill,
    /// No key; the fallback method chose.
    Fallback,
}

/// A routing decision: the rank and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteDecision {
    pub rank: u32,
    pub branch: Branch,
}

/// One load-balance method.
pub trait LoadBalancer: Send {
    /// Pick a rank from `ranks` (non-empty) for `req`.
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision;
}

/// The `--load-balance-method` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    RoundRobin,
}

impl Method {
    pub const ALL: &'static [&'static str] = &["round_robin"];

    pub fn balancer(self) -> Box<dyn LoadBalancer> {
        match self {
            Method::RoundRobin => Box::new(RoundRobin::default()),
        }
    }
}

impl FromStr for Method {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round_robin" => Ok(Method::RoundRobin),
            "total_requests" | "total_tokens" | "follow_bootstrap_room" | "prefix_affinity" => {
                Err(format!(
                    "load-balance method {s:?} is not implemented yet; available: {}",
                    Method::ALL.join(", ")
                ))
            }
            other => Err(format!(
                "unknown load-balance method {other:?}; expected one of: {}",
                Method::ALL.join(", ")
            )),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::RoundRobin => f.write_str("round_robin"),
        }
    }
}
