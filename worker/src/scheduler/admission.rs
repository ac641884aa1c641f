//! Admission: which waiting requests enter the prefill line this step, in what order, and with
//! which cached prefix.

use std::collections::VecDeque;

use super::{SchedulePolicy, Scheduler};
use crate::request::Req;

/// Past this queue length `lpm` behaves as `fcfs`: sorting by prefix costs a tree walk per
/// waiting request per step.
const LPM_MAX_QUEUE: usize = 128;
/// Shared uncached prefix (tokens) from which `lpm` makes a request wait for another.
const LPM_DEDUP_MIN_TOKENS: usize = 32;

impl Scheduler {
    /// Move waiting requests into the prefill line while the running cap and the pool allow.
    pub(super) fn admit(&mut self) {
        if self.waiting.is_empty() || self.num_running() >= self.config.max_running_requests {
            return;
        }
        let lpm = self.config.policy == SchedulePolicy::Lpm
            && !self.config.disable_radix_cache
            && self.waiting.len() <= LPM_MAX_QUEUE;
        if lpm {
            self.order_by_cached_prefix();
        }
        let mut deferred = VecDeque::new();
        while self.num_running() < self.config.max_running_requests {
            let Some(mut req) = self.waiting.pop_front() else {
                break;
            };
            if lpm && self.shares_uncached_prefix_with_prefilling(&req) {
                deferred.push_back(req);
                continue;
            }
            let Some(hit) = self.mem.admit(&mut req) else {
                self.waiting.push_front(req); // no free row
                break;
            };
            self.admitted(&mut req, hit);
            self.prefilling.push_back(req);
        }
        // Deferred requests keep their place ahead of the rest.
        while let Some(req) = deferred.pop_back() {
            self.waiting.push_front(req);
        }
    }

    /// Longest cached prefix first; the sort is stable, so ties stay first come.
    fn order_by_cached_prefix(&mut self) {
        let mut queue: Vec<(usize, Req)> = self
            .waiting
            .drain(..)
            .map(|r| (self.mem.peek_prefix_len(&r.prompt), r))
            .collect();
        queue.sort_by_key(|(hit, _)| std::cmp::Reverse(*hit));
        self.waiting = queue.into_iter().map(|(_, r)| r).collect();
    }

    /// Whether `req` would recompute, uncached, a prefix that a request being prefilled is about
    /// to put into the cache.
    fn shares_uncached_prefix_with_prefilling(&self, req: &Req) -> bool {
        let cached = self.mem.peek_prefix_len(&req.prompt);
        self.prefilling.iter().any(|other| {
            let shared = req
                .prompt
                .iter()
                .zip(&other.prompt)
                .take_while(|(a, b)| a == b)
                .count();
            shared >= cached + LPM_DEDUP_MIN_TOKENS
        })
    }

    /// Records an admission (trace milestone; prompt and cache counters on the first one).
    fn admitted(&mut self, req: &mut Req, hit: usize) {
        self.tracer.milestone(
            &req.rid,
            protocol::trace_event::Milestone::Admitted {
                prefix_hit_tokens: hit,
                prompt_tokens: req.prompt.len(),
            },
        );
        if !req.admitted_once {
            req.admitted_once = true;
            req.cached_tokens = hit.min(req.prompt.len()) as u32;
            self.stats.prompt_tokens += req.prompt.len() as u64;
            self.stats.cached_tokens += u64::from(req.cached_tokens);
        }
    }
}
