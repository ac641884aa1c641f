//! The worker's half of the ledger check (the controller's is `controller::ledger`): the pools
//! and the request maps agree with each other and with the rids this worker owes an answer
//! (the actor's held set, which `Hello.held_rids` reports to a restarted controller). Not a
//! repair: what it finds is reported (`WorkerStatus.invariant_violations`, an error log line),
//! never settled silently.
//!
//! - Always (O(1)): no free of a row that was not handed out was refused (a double free).
//! - At a quiet point, no request in any queue (O(1) but for what it names): every KV slot is
//!   free or evictable, every request row free, no rid owed an answer.
//! - Per rid (O(requests); the actor runs it in debug builds): every rid owed an answer is in
//!   exactly one queue, and every queued request answered here is owed one.

use std::collections::BTreeMap;

use super::Scheduler;
use crate::request::Req;

impl Scheduler {
    /// What is broken now, one line each naming the rid or the pool and the maps that
    /// disagree. `held`: the rids this worker owes an answer, sorted (the actor's set as
    /// [`crate::link::HeldRids::snapshot`] lists it); `per_rid`: run the per-rid check.
    pub fn ledger_violations(&self, held: &[String], per_rid: bool) -> Vec<String> {
        let mut found = Vec::new();
        let refused = self.mem.refused_row_frees();
        if refused > 0 {
            found.push(format!(
                "request rows: {refused} frees of a row not handed out were refused (a double free)"
            ));
        }
        if !self.holds_requests() {
            self.quiet_violations(held, &mut found);
        } else if per_rid {
            self.per_rid_violations(held, &mut found);
        }
        found
    }

    fn quiet_violations(&self, held: &[String], found: &mut Vec<String>) {
        let (used, total) = (self.mem.used_tokens(), self.config.max_total_tokens);
        if used > 0 {
            found.push(format!(
                "kv pool: {used} of {total} slots held with no request in any queue (free {}, \
                 evictable {})",
                self.mem.free_slots(),
                self.mem.evictable_slots()
            ));
        }
        let rows = self.mem.rows_in_use();
        if rows > 0 {
            found.push(format!(
                "request rows: {rows} of {} in use with no request in any queue",
                self.mem.rows()
            ));
        }
        for rid in held {
            found.push(format!(
                "rid {rid}: owed an answer (held) but in no queue of the scheduler"
            ));
        }
    }

    fn per_rid_violations(&self, held: &[String], found: &mut Vec<String>) {
        let mut queues: BTreeMap<&str, Vec<&'static str>> = BTreeMap::new();
        for (name, req) in self.queued() {
            // A prefill leg is answered by its decode worker, so it is owed nothing here.
            if req.leg.is_none() {
                queues.entry(req.rid.as_str()).or_default().push(name);
            }
        }
        for rid in held {
            if !queues.contains_key(rid.as_str()) {
                found.push(format!(
                    "rid {rid}: owed an answer (held) but in no queue of the scheduler"
                ));
            }
        }
        for (rid, names) in queues {
            if names.len() > 1 {
                found.push(format!("rid {rid}: in {} at once", names.join(" and ")));
            }
            if held.binary_search_by(|h| h.as_str().cmp(rid)).is_err() {
                found.push(format!(
                    "rid {rid}: in {} but not owed an answer (not held)",
                    names[0]
                ));
            }
        }
    }

    /// Every request in a queue, with the queue's name.
    fn queued(&self) -> Vec<(&'static str, &Req)> {
        let mut all: Vec<(&'static str, &Req)> = Vec::new();
        all.extend(self.waiting.iter().map(|r| ("waiting", r)));
        all.extend(self.prefilling.iter().map(|r| ("prefilling", r)));
        all.extend(self.running.iter().map(|r| ("running", r)));
        all.extend(self.legs.requests());
        all
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config, drain, prompt, req, with_config};
    use super::super::Scheduler;

    fn scheduler_for_tests() -> Scheduler {
        with_config(config(4096, 2048))
    }

    fn held(rids: &[&str]) -> Vec<String> {
        rids.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn a_quiet_worker_with_whole_pools_and_nothing_owed_is_silent() {
        let mut s = scheduler_for_tests();
        assert!(s.ledger_violations(&[], true).is_empty());
        s.submit(req("a", prompt(1, 20), 4));
        assert!(s.ledger_violations(&held(&["a"]), true).is_empty());
        drain(&mut s);
        assert!(
            s.ledger_violations(&[], true).is_empty(),
            "pools whole again"
        );
    }

    #[test]
    fn a_rid_owed_an_answer_that_no_queue_holds_is_named() {
        let mut s = scheduler_for_tests();
        let quiet = s.ledger_violations(&held(&["lost"]), false);
        assert_eq!(
            quiet,
            ["rid lost: owed an answer (held) but in no queue of the scheduler"]
        );
        s.submit(req("a", prompt(1, 20), 4));
        let busy = s.ledger_violations(&held(&["a", "lost"]), true);
        assert_eq!(
            busy,
            ["rid lost: owed an answer (held) but in no queue of the scheduler"]
        );
        let unowed = s.ledger_violations(&[], true);
        assert_eq!(
            unowed,
            ["rid a: in waiting but not owed an answer (not held)"]
        );
    }

    #[test]
    fn slots_or_rows_held_with_no_request_are_named_with_the_pool() {
        let mut s = scheduler_for_tests();
        s.submit(req("a", prompt(1, 20), 4));
        s.step();
        // Forget the running request without giving back what it holds: a leak.
        s.running.clear();
        s.prefilling.clear();
        let v = s.ledger_violations(&[], true);
        assert!(v.iter().any(|l| l.starts_with("kv pool: ")), "{v:?}");
        assert!(
            v.iter().any(|l| l.starts_with("request rows: 1 of")),
            "{v:?}"
        );
    }
}
