//! Late binding (`cache_aware` with `--cache-aware-hold-ms`): while every rank would make a new
//! prompt wait longer than the hold, the controller keeps requests here instead of committing
//! each to a queue, and dispatches them, shortest prompt first, as soon as some rank is about
//! to free, choosing with the cache and the loads of that moment. A gateway in front of engines
//! cannot do this: it does not see the engines' queues as they drain; dpserve owns admission.
//!
//! ```text
//! hold a request    when late binding is on, it names no rank, and some request is held
//!                   already or earliest_start_s(live ranks) > hold
//! release, each tick and after the workers' frames:
//!                   a request held for --cache-aware-max-hold-ms, whatever the waits; else,
//!                   while earliest_start_s <= hold, the shortest prompt held
//! ```
//! A held request is in flight for everyone: `ClusterStatus.num_inflight` counts it, `Reconcile`
//! does not fail it, an `Abort` naming it (or every request) ends it here with finish reason
//! `abort`, and a controller that stops answers it 503.

use std::time::Instant;

use protocol::{DisaggMode, GenerateReq, Message, TokenOut};

use super::Controller;
use crate::policy::{earliest_start_s, Method};

/// A request the controller holds.
#[derive(Debug)]
pub(super) struct Held {
    req: GenerateReq,
    since: Instant,
}

impl Controller {
    /// Whether late binding is on (`cache_aware` with a hold).
    fn late_binding(&self) -> bool {
        self.config.method == Method::CacheAware && !self.config.cache_aware.hold_wait.is_zero()
    }

    /// The soonest a live rank that computes prompts could start one (seconds), if known.
    fn earliest_start(&mut self) -> Option<f64> {
        self.ranks.refresh();
        let ranks = self.ranks.rank_set_where(|m| m != DisaggMode::Decode);
        earliest_start_s(&ranks)
    }

    /// Holds `req` when late binding says so, else hands it back to be routed now.
    pub(super) fn hold_or_pass(&mut self, req: GenerateReq) -> Option<GenerateReq> {
        if !self.late_binding() || req.routed_dp_rank.is_some() {
            return Some(req);
        }
        let wait = self.config.cache_aware.hold_wait.as_secs_f64();
        if self.held.is_empty() && self.earliest_start().is_none_or(|s| s <= wait) {
            return Some(req);
        }
        tracing::debug!(
            rid = req.rid,
            held = self.held.len() + 1,
            "held: every rank is busy"
        );
        self.held.push(Held {
            req,
            since: Instant::now(),
        });
        None
    }

    /// Dispatches the held requests whose turn has come (see the module doc).
    pub(super) fn release_held(&mut self) {
        let wait = self.config.cache_aware.hold_wait.as_secs_f64();
        let max_hold = self.config.cache_aware.max_hold;
        while !self.held.is_empty() {
            let overdue = self.held.iter().position(|h| h.since.elapsed() >= max_hold);
            let next = match overdue {
                Some(i) => i,
                None if self.earliest_start().is_none_or(|s| s <= wait) => {
                    let shortest = self.held.iter().enumerate();
                    shortest
                        .min_by_key(|(_, h)| (h.req.input_ids.len(), h.since))
                        .map_or(0, |(i, _)| i)
                }
                None => return,
            };
            let held = self.held.swap_remove(next);
            self.releasing = Some(held.since.elapsed());
            self.route_unified(held.req);
            self.releasing = None;
        }
    }

    /// Ends the held requests an `Abort` names (`None`: all) with finish reason `abort`.
    pub(super) fn abort_held(&mut self, rid: Option<&str>) {
        let (gone, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| rid.is_none_or(|r| h.req.rid == r));
        self.held = keep;
        for h in gone {
            self.send_to_tokenizer(&Message::TokenOut(TokenOut::aborted(h.req.rid)));
        }
    }

    /// Whether `rid` is held here.
    pub(super) fn holds(&self, rid: &str) -> bool {
        self.held.iter().any(|h| h.req.rid == rid)
    }

    /// Answers every held request 503 (the controller is stopping).
    pub(super) fn fail_held(&mut self) {
        for h in std::mem::take(&mut self.held) {
            self.send_to_tokenizer(&Message::TokenOut(TokenOut::error(
                h.req.rid,
                503,
                "the controller stopped before a rank could take the request; retry it",
            )));
        }
    }
}
