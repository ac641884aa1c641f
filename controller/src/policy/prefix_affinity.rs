//! `prefix_affinity`: send each request to the rank whose prefix cache most likely holds its
//! prompt, without letting one hot key swamp that rank.
//!
//! ```text
//! key   = routing_key                                  (x-smg-routing-key / body routing_key)
//!       | blake2b-128(first hash_tokens input ids, LE u32)   unless token fallback is disabled
//!       | none  → the fallback method chooses               (branch: fallback)
//! order = live ranks by HRW score, highest first       (see hrw.rs)
//! T     = max_load_skew × max(mean active requests over live ranks, 1.0)
//! rank  = first r in order with active_requests(r) ≤ T (branch: affinity if first, else spill)
//!       | order[0] if none qualifies                   (keep affinity; unreachable for skew ≥ 1,
//!                                                        since the least-loaded rank ≤ mean ≤ T)
//! ```
//! The guard watches active requests (running + waiting + speculative), never resident tokens:
//! a rank holding one long conversation is busy with that conversation, not overloaded, and
//! spilling it would throw its cache away. A single live rank is never overloaded.
//!
//! Cost per decision: O(hash_tokens) for a token key, then one blake2b of the key (for the HRW
//! scores and the trace digest both) and O(n) expected for n live ranks (see hrw.rs); the
//! scratch vectors are reused so the steady state allocates only the returned HRW order, which
//! the trace records whole (the guard itself stops at the first candidate within the threshold).

use super::hrw::{self, Blake2Hrw, HrwHasher};
use super::{Branch, FallbackMethod, KeySource, LoadBalancer, RankSet, RouteDecision, RouteInput};
use crate::error::{Error, Result};

/// `--prefix-affinity-*` settings. `Default` is the single source of the defaults; clap reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixAffinityConfig {
    /// How many leading input ids make the key of a request without a routing key.
    pub hash_tokens: usize,
    /// Hash the token prefix when there is no routing key (`false` with
    /// `--prefix-affinity-disable-token-fallback`).
    pub token_fallback: bool,
    /// The method for requests without a key.
    pub fallback: FallbackMethod,
    /// Overload threshold as a multiple of the mean active requests (≥ 1.0).
    pub max_load_skew: f64,
}

impl Default for PrefixAffinityConfig {
    fn default() -> Self {
        PrefixAffinityConfig {
            hash_tokens: 4096,
            token_fallback: true,
            fallback: FallbackMethod::default(),
            max_load_skew: 1.5,
        }
    }
}

/// The `--prefix-affinity-*` flags (`dpserve controller` and `up` flatten them).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct PrefixAffinityArgs {
    /// prefix_affinity: how many leading input ids are hashed into the key of a request
    /// without a routing key.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_HASH_TOKENS",
          default_value_t = PrefixAffinityConfig::default().hash_tokens)]
    pub prefix_affinity_hash_tokens: usize,
    /// prefix_affinity: never hash the token prefix; requests without a routing key go to the
    /// fallback method.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_DISABLE_TOKEN_FALLBACK")]
    pub prefix_affinity_disable_token_fallback: bool,
    /// prefix_affinity: method for requests without a key.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_FALLBACK", value_enum,
          default_value_t = PrefixAffinityConfig::default().fallback)]
    pub prefix_affinity_fallback: FallbackMethod,
    /// prefix_affinity: a rank is overloaded when its active requests exceed this multiple
    /// (>= 1.0) of max(mean over live ranks, 1); the key then spills to its next HRW choice.
    #[arg(long, env = "DPSERVE_PREFIX_AFFINITY_MAX_LOAD_SKEW",
          default_value_t = PrefixAffinityConfig::default().max_load_skew)]
    pub prefix_affinity_max_load_skew: f64,
}

impl Default for PrefixAffinityArgs {
    fn default() -> Self {
        let c = PrefixAffinityConfig::default();
        PrefixAffinityArgs {
            prefix_affinity_hash_tokens: c.hash_tokens,
            prefix_affinity_disable_token_fallback: !c.token_fallback,
            prefix_affinity_fallback: c.fallback,
            prefix_affinity_max_load_skew: c.max_load_skew,
        }
    }
}

impl PrefixAffinityArgs {
    /// The settings, checked.
    pub fn config(&self) -> Result<PrefixAffinityConfig> {
        let skew = self.prefix_affinity_max_load_skew;
        if !(skew.is_finite() && skew >= 1.0) {
            return Err(Error::LoadSkew { got: skew });
        }
        if self.prefix_affinity_hash_tokens == 0 {
            return Err(Error::HashTokens {
                got: self.prefix_affinity_hash_tokens,
            });
        }
        Ok(PrefixAffinityConfig {
            hash_tokens: self.prefix_affinity_hash_tokens,
            token_fallback: !self.prefix_affinity_disable_token_fallback,
            fallback: self.prefix_affinity_fallback,
            max_load_skew: skew,
        })
    }
}

pub struct PrefixAffinity {
    config: PrefixAffinityConfig,
    hasher: Box<dyn HrwHasher>,
    fallback: Box<dyn LoadBalancer>,
    scratch: Vec<(u64, u32)>,
    ids: Vec<u32>,
}

impl std::fmt::Debug for PrefixAffinity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixAffinity")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The key bytes of one request: borrowed from the routing key, or the token digest.
enum Key<'a> {
    Routing(&'a [u8]),
    Tokens([u8; 16]),
}

impl Key<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Key::Routing(b) => b,
            Key::Tokens(d) => d,
        }
    }

    fn source(&self) -> KeySource {
        match self {
            Key::Routing(_) => KeySource::RoutingKey,
            Key::Tokens(_) => KeySource::TokenPrefix,
        }
    }
}

impl PrefixAffinity {
    pub fn new(config: PrefixAffinityConfig) -> Self {
        PrefixAffinity::with_hasher(config, Box::new(Blake2Hrw))
    }

    /// With an injected hasher (tests pin HRW scores with it).
    pub fn with_hasher(config: PrefixAffinityConfig, hasher: Box<dyn HrwHasher>) -> Self {
        PrefixAffinity {
            fallback: config.fallback.balancer(),
            config,
            hasher,
            scratch: Vec::new(),
            ids: Vec::new(),
        }
    }

    pub fn config(&self) -> &PrefixAffinityConfig {
        &self.config
    }

    fn key<'a>(&self, req: &RouteInput<'a>) -> Option<Key<'a>> {
        // An empty routing key (an empty header) says nothing about the prefix: treat it as
        // absent rather than sending every such request to one rank.
        if let Some(k) = req.routing_key.filter(|k| !k.is_empty()) {
            return Some(Key::Routing(k.as_bytes()));
        }
        if !self.config.token_fallback || req.input_ids.is_empty() {
            return None;
        }
        let n = req.input_ids.len().min(self.config.hash_tokens);
        Some(Key::Tokens(self.hasher.token_key(&req.input_ids[..n])))
    }
}

impl LoadBalancer for PrefixAffinity {
    fn select(&mut self, req: &RouteInput<'_>, ranks: &RankSet) -> RouteDecision {
        let Some(key) = self.key(req) else {
            let mut d = self.fallback.select(req, ranks);
            d.branch = Branch::Fallback;
            d.fallback = Some(self.config.fallback.method());
            return d;
        };
        self.ids.clear();
        self.ids.extend(ranks.loads().iter().map(|l| l.rank));
        // The order is returned in the decision (the trace records it), so it is the one
        // allocation per decision; the key is hashed once, for the order and the trace digest.
        let mut order = Vec::with_capacity(self.ids.len());
        let key_digest = hrw::digest_and_order_into(
            self.hasher.as_ref(),
            key.bytes(),
            &self.ids,
            &mut self.scratch,
            &mut order,
        );

        let loads = ranks.loads();
        let total: u64 = loads.iter().map(|l| l.active_requests).sum();
        let mean = total as f64 / loads.len() as f64;
        let threshold = self.config.max_load_skew * mean.max(1.0);
        let load_of = |rank: u32| ranks.get(rank).map_or(0, |l| l.active_requests);

        let (rank, branch) = if order.len() == 1 {
            (order[0], Branch::Affinity)
        } else {
            match order.iter().position(|&r| load_of(r) as f64 <= threshold) {
                Some(0) | None => (order[0], Branch::Affinity),
                Some(i) => (order[i], Branch::Spill),
            }
        };
        RouteDecision {
            rank,
            branch,
            key_source: key.source(),
            key_digest: Some(key_digest),
            hrw_order: order,
            threshold: Some(threshold),
            fallback: None,
            costs: Vec::new(),
            scores: Vec::new(),
            cached_tokens: None,
        }
    }
}

#[cfg(test)]
#[path = "prefix_affinity_tests.rs"]
mod tests;
