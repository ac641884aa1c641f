//! The controller's half of the ledger check (the worker's is `worker::scheduler::ledger`): for
//! each rid, the controller and the worker that holds it agree on whether it is in flight. Not
//! a repair: a disagreement is reported (`RankInfo.invariant_violations`, an error log line),
//! never settled silently, so the soak fails on the first one with the rid that broke.
//!
//! The check runs at the worker's quiet points, where the answer is exact without any rid list
//! on the wire: a status that holds no request and has taken every dispatch this controller
//! sent (`taken_seq` = the rank's last `dispatch_seq`) has settled every one of them, in its
//! own `finished_rids` or an earlier status's, so nothing may remain in flight on that rank.
//! O(1) when it holds (the in-flight map is empty); O(in flight) only when it reports.

use std::collections::HashMap;

use protocol::WorkerStatus;

/// The rids `inflight` still counts on `rank` though `status` (already applied: its finished
/// rids removed) says the rank holds nothing and has taken every dispatch up to `last_seq`.
/// Sorted, one line each naming the rid and the two maps that disagree.
pub fn quiet_disagreements(
    rank: u32,
    status: &WorkerStatus,
    last_seq: u64,
    inflight: &HashMap<String, u64>,
) -> Vec<String> {
    let quiet = status.num_running_reqs == 0 && status.num_waiting_reqs == 0;
    if inflight.is_empty() || !quiet || status.taken_seq != Some(last_seq) {
        return Vec::new();
    }
    let mut rids: Vec<&String> = inflight.keys().collect();
    rids.sort();
    rids.into_iter()
        .map(|rid| {
            format!(
                "rid {rid}: in flight on rank {rank} at the controller, but the rank's worker \
                 holds no request and has taken every dispatch (through dispatch_seq {last_seq})"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{note_violations as note, MAX_INVARIANT_VIOLATIONS as MAX_VIOLATIONS};

    fn quiet(taken_seq: u64) -> WorkerStatus {
        WorkerStatus {
            taken_seq: Some(taken_seq),
            ..Default::default()
        }
    }

    fn inflight(rids: &[&str]) -> HashMap<String, u64> {
        rids.iter().map(|r| (r.to_string(), 1)).collect()
    }

    #[test]
    fn a_rid_left_in_flight_on_a_quiet_rank_that_took_everything_is_named() {
        let v = quiet_disagreements(2, &quiet(9), 9, &inflight(&["b", "a"]));
        assert_eq!(v.len(), 2);
        assert!(v[0].starts_with("rid a: in flight on rank 2"), "{v:?}");
        assert!(v[1].starts_with("rid b:"), "{v:?}");
    }

    #[test]
    fn no_disagreement_while_the_rank_holds_requests_or_has_dispatches_to_take() {
        let busy = WorkerStatus {
            num_waiting_reqs: 1,
            ..quiet(9)
        };
        let cases = [
            ("holds one", busy, 9, inflight(&["a"])),
            ("a dispatch not yet taken", quiet(8), 9, inflight(&["a"])),
            (
                "a worker that does not number",
                WorkerStatus::default(),
                9,
                inflight(&["a"]),
            ),
            ("nothing in flight", quiet(9), 9, inflight(&[])),
        ];
        for (what, status, last_seq, map) in cases {
            assert!(
                quiet_disagreements(0, &status, last_seq, &map).is_empty(),
                "{what}"
            );
        }
    }

    #[test]
    fn each_violation_is_kept_once_and_only_the_first_few() {
        let mut kept = Vec::new();
        assert_eq!(note(&mut kept, vec!["x".into()]), vec!["x".to_string()]);
        assert!(note(&mut kept, vec!["x".into()]).is_empty());
        let many: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
        note(&mut kept, many);
        assert_eq!(kept.len(), MAX_VIOLATIONS);
        assert_eq!(kept[0], "x");
    }
}
