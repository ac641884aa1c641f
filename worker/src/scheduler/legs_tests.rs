//! Prefill/decode disaggregation between two schedulers in one process: the messages the KV
//! link would carry are handed over directly, so every state and failure is reached on purpose.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use protocol::{DisaggLeg, DisaggMode, FinishReason, KvLayout, Message, TokenOut};

use super::legs::{DecodeSide, PrefillSide, Role, Room};
use super::tests::{assert_pool_whole, config, drain, prompt, req, with_config};
use super::{Scheduler, SchedulerConfig};
use crate::disagg::{DisaggConfig, KvInbound, KvPeer, KvSend};
use crate::model::{BuiltinSize, ModelConfig};

const EP: &str = "ipc:///nowhere/kv-0.sock";

fn layout() -> KvLayout {
    ModelConfig::builtin(BuiltinSize::Tiny).kv_layout()
}

/// Both timeouts of the pairs here; the tests step a clock past them, never sleep.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A moment just past [`TIMEOUT`] from now: what `expire_at` is given to reach a timeout.
fn past_the_timeout() -> Instant {
    Instant::now() + TIMEOUT + Duration::from_millis(1)
}

fn role(mode: DisaggMode, base: SchedulerConfig) -> Scheduler {
    with_config(SchedulerConfig {
        rank: if mode == DisaggMode::Decode { 1 } else { 0 },
        disagg: Some(DisaggConfig {
            mode,
            layout: layout(),
            bootstrap_timeout: TIMEOUT,
            waiting_timeout: TIMEOUT,
        }),
        ..base
    })
}

/// A prefill and a decode scheduler and the wire between them.
struct Pair {
    p: Scheduler,
    d: Scheduler,
    /// Per rid, the concatenated output ids and the final message (from the decode side).
    done: HashMap<String, (Vec<u32>, TokenOut)>,
    streams: HashMap<String, Vec<u32>>,
    /// Most request rows the decode side held beyond its running cap.
    most_rows_beyond: u32,
    /// Messages to lose instead of delivering (by type name), for failure tests.
    lose: Vec<&'static str>,
}

impl Pair {
    fn new(prefill: SchedulerConfig, decode: SchedulerConfig) -> Self {
        Pair {
            p: role(DisaggMode::Prefill, prefill),
            d: role(DisaggMode::Decode, decode),
            done: HashMap::new(),
            streams: HashMap::new(),
            most_rows_beyond: 0,
            lose: Vec::new(),
        }
    }

    /// Both legs of a request, decode first or prefill first.
    fn submit(&mut self, rid: &str, ids: Vec<u32>, max_new: u32, room: u64, decode_first: bool) {
        let r = leg(rid, ids, max_new, room);
        let legs = if decode_first { [1, 0] } else { [0, 1] };
        for side in legs {
            let out = match side {
                0 => self.p.submit(r.clone()),
                _ => self.d.submit(r.clone()),
            };
            self.collect(out.into_iter().collect());
        }
    }

    fn collect(&mut self, outs: Vec<TokenOut>) {
        for out in outs {
            assert!(
                !self.done.contains_key(&out.rid),
                "{} finished twice",
                out.rid
            );
            let ids = self.streams.entry(out.rid.clone()).or_default();
            ids.extend(&out.output_ids);
            if out.finish_reason.is_some() {
                let all = self.streams.remove(&out.rid).unwrap_or_default();
                self.done.insert(out.rid.clone(), (all, out));
            }
        }
    }

    /// Carries every queued KV message across, both ways, until none is left.
    fn carry(&mut self) {
        loop {
            let to_p = self.d.take_kv_out();
            let to_d = self.p.take_kv_out();
            if to_p.is_empty() && to_d.is_empty() {
                return;
            }
            for s in to_p {
                assert_eq!(s.to, KvPeer::Endpoint(EP.into()));
                if !self.lost(&s) {
                    let outs = self.p.on_kv(inbound(s, KvPeer::Identity(b"d1".to_vec())));
                    assert!(outs.is_empty(), "a prefill worker answers no client");
                }
            }
            for s in to_d {
                assert_eq!(s.to, KvPeer::Identity(b"d1".to_vec()));
                if !self.lost(&s) {
                    let outs = self.d.on_kv(inbound(s, KvPeer::Endpoint(EP.into())));
                    self.collect(outs);
                }
            }
        }
    }

    fn lost(&self, s: &KvSend) -> bool {
        self.lose.contains(&s.msg.type_name())
    }

    /// One round of each worker, as the actor's loop runs them.
    fn round(&mut self) {
        if self.p.has_work() {
            let outs = self.p.step();
            assert!(
                outs.is_empty(),
                "a prefill worker answers no client: {outs:?}"
            );
        }
        self.p.expire();
        self.carry();
        if self.d.has_work() {
            let outs = self.d.step();
            self.collect(outs);
        }
        let outs = self.d.expire();
        self.collect(outs);
        self.carry();
        if let Some(s) = self.d.disagg_status() {
            self.most_rows_beyond = self.most_rows_beyond.max(s.rows_beyond_running);
        }
    }

    fn run(&mut self, expected: usize) {
        for _ in 0..100_000 {
            if self.done.len() == expected {
                return;
            }
            self.round();
        }
        panic!("did not finish: {} of {expected}", self.done.len());
    }

    /// After everything ended: both pools whole, every row free, nothing queued.
    fn assert_whole(&self) {
        for s in [&self.p, &self.d] {
            assert_pool_whole(s);
            assert_eq!(s.mem.rows_in_use(), 0, "rows still held");
            assert_eq!(s.legs.queued(), 0, "legs still queued");
            assert!(!s.has_work());
        }
    }
}

/// A `KvReady` from the decode worker `d1` for `room`, handed to the prefill worker `p`
/// outside a pair's rounds; what `p` sends back (it answers no client).
fn late_kv_ready(p: &mut Scheduler, room: u64, rid: &str, prompt_len: u64) -> Vec<KvSend> {
    let ready = Message::KvReady(protocol::KvReady {
        room,
        rid: rid.into(),
        decode_rank: 1,
        layout: layout(),
        prompt_len,
    });
    let outs = p.on_kv(KvInbound {
        from: KvPeer::Identity(b"d1".to_vec()),
        msg: ready,
        payload: None,
    });
    assert!(outs.is_empty(), "a prefill worker answers no client");
    p.take_kv_out()
}

/// A prefill worker's own rooms.
fn prefill(s: &Scheduler) -> &PrefillSide {
    match &s.legs.role {
        Role::Prefill(p) => p,
        _ => panic!("a prefill worker"),
    }
}

/// A decode worker's own queues.
fn decode(s: &Scheduler) -> &DecodeSide {
    match &s.legs.role {
        Role::Decode(d) => d,
        _ => panic!("a decode worker"),
    }
}

fn inbound(s: KvSend, from: KvPeer) -> KvInbound {
    KvInbound {
        from,
        msg: s.msg,
        payload: s.payload,
    }
}

fn unified(reqs: &[(String, Vec<u32>, u32)], base: SchedulerConfig) -> HashMap<String, Vec<u32>> {
    let mut s = with_config(base);
    for (rid, ids, n) in reqs {
        s.submit(req(rid, ids.clone(), *n));
    }
    drain(&mut s)
        .into_iter()
        .map(|(k, (ids, _))| (k, ids))
        .collect()
}

#[test]
fn greedy_output_through_a_prefill_and_a_decode_worker_is_the_unified_workers() {
    // Long prompts over several 16-token chunks, a shared prefix (reused on the prefill side),
    // and a request whose prompt is all its output (max_new_tokens 1).
    let shared = prompt(9, 40);
    let reqs: Vec<(String, Vec<u32>, u32)> = vec![
        ("long".into(), prompt(1, 150), 12),
        ("short".into(), prompt(2, 3), 8),
        ("one".into(), prompt(3, 20), 1),
        ("a".into(), shared.clone(), 6),
        (
            "b".into(),
            shared.iter().copied().chain(prompt(4, 9)).collect(),
            6,
        ),
    ];
    let want = unified(&reqs, config(4096, 16));
    let mut pair = Pair::new(config(4096, 16), config(4096, 16));
    for (i, (rid, ids, n)) in reqs.iter().enumerate() {
        // "a" finishes before "b" arrives, so "b" finds its prefix in the prefill cache.
        if rid == "b" {
            pair.run(i);
        }
        pair.submit(rid, ids.clone(), *n, 1000 + i as u64, i % 2 == 0);
    }
    pair.run(reqs.len());
    for (rid, ids, n) in &reqs {
        let (got, last) = &pair.done[rid];
        assert_eq!(got, &want[rid], "{rid}");
        assert_eq!(got.len(), *n as usize, "{rid}");
        assert_eq!(last.finish_reason, Some(FinishReason::Length), "{rid}");
        assert_eq!(last.prompt_tokens as usize, ids.len());
    }
    assert_eq!(
        pair.done["b"].1.cached_tokens, 40,
        "prefix reused on the prefill side"
    );
    let s = pair.d.disagg_status().unwrap();
    assert_eq!(
        (s.transfers, s.transfers_failed, s.frames_dropped),
        (5, 0, 0)
    );
    let per_token = layout().bytes_per_token();
    let prompts: u64 = reqs.iter().map(|r| r.1.len() as u64).sum();
    assert_eq!(s.transfer_bytes, prompts * per_token);
    assert_eq!(
        pair.p.disagg_status().unwrap().transfer_bytes,
        s.transfer_bytes
    );
    pair.assert_whole();
    let finished = pair.p.take_finished_rids();
    assert_eq!(
        finished.len(),
        5,
        "the prefill legs end for the controller too"
    );
}

#[test]
fn transfers_hold_pre_allocation_rows_beyond_the_running_cap() {
    let decode = SchedulerConfig {
        max_running_requests: 4,
        pre_alloc_rows: 8,
        ..config(8192, 64)
    };
    let reqs: Vec<(String, Vec<u32>, u32)> = (0..12)
        .map(|i| (format!("r{i}"), prompt(20 + i, 60), 24))
        .collect();
    let want = unified(&reqs, config(8192, 64));
    let mut pair = Pair::new(config(8192, 64), decode);
    for (i, (rid, ids, n)) in reqs.iter().enumerate() {
        pair.submit(rid, ids.clone(), *n, 7 + i as u64, true);
    }
    pair.run(12);
    assert!(
        pair.most_rows_beyond > 0,
        "transfers waited in rows beyond the running cap of 4"
    );
    let status = pair.d.disagg_status().unwrap();
    assert_eq!(status.peak_rows_beyond_running, pair.most_rows_beyond);
    assert_eq!(status.rows_beyond_running, 0);
    for (rid, _, _) in &reqs {
        assert_eq!(pair.done[rid].0, want[rid], "{rid}");
    }
    pair.assert_whole();
}

#[test]
fn an_abort_on_the_decode_side_ends_both_legs_and_frees_everything() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.submit("gone", prompt(5, 100), 8, 1, true);
    pair.submit("stays", prompt(6, 30), 4, 2, true);
    // A few rounds: "gone" is mid-transfer (100 tokens in chunks of 8).
    for _ in 0..3 {
        pair.round();
    }
    assert!(decode(&pair.d).transfers.contains_key(&1), "mid-transfer");
    let outs = pair.d.abort(Some("gone"));
    pair.collect(outs);
    // The client's abort reaches the prefill worker too (the controller sends it to every
    // rank); it must not answer.
    assert!(pair.p.abort(Some("gone")).is_empty());
    pair.run(2);
    assert_eq!(pair.done["gone"].1.finish_reason, Some(FinishReason::Abort));
    assert_eq!(
        pair.done["stays"].1.finish_reason,
        Some(FinishReason::Length)
    );
    pair.assert_whole();
}

#[test]
fn a_prefill_worker_that_stops_answers_no_client_and_its_decode_worker_fails_the_request() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.submit("mid", prompt(5, 100), 8, 1, true);
    for _ in 0..3 {
        pair.round();
    }
    assert!(decode(&pair.d).transfers.contains_key(&1), "mid-transfer");
    let outs = pair.p.fail_all(503, "the worker is stopping");
    assert!(
        outs.is_empty(),
        "a prefill worker answers no client: {outs:?}"
    );
    pair.carry();
    let err = pair.done["mid"].1.error.clone().expect("failed");
    assert_eq!(
        (err.status, err.message.as_str()),
        (503, "the worker is stopping")
    );
    assert!(pair.p.ledger_violations(&[], true).is_empty());
    let failed = |s: &Scheduler| s.disagg_status().map(|d| d.transfers_failed);
    assert_eq!((failed(&pair.p), failed(&pair.d)), (Some(1), Some(1)));
    // A KvReady for the room crossing the abort is answered at once, not paired.
    let sent = late_kv_ready(&mut pair.p, 1, "mid", 100);
    assert!(!pair.p.has_work());
    assert!(
        matches!(sent.as_slice(), [KvSend { msg: Message::KvAbort(a), .. }] if a.room == 1),
        "{sent:?}"
    );
    pair.assert_whole();
}

#[test]
fn a_prefill_rank_that_leaves_fails_its_transfers_at_once() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.submit("x", prompt(7, 80), 8, 1, true);
    pair.submit("y", prompt(8, 80), 8, 2, true);
    pair.round();
    // The prefill worker dies: nothing more arrives from it.
    pair.lose = vec!["KvChunk", "KvDone", "KvAbort"];
    let outs = pair.d.peer_gone(0, "killed");
    pair.collect(outs);
    for rid in ["x", "y"] {
        let err = pair.done[rid].1.error.clone().expect("an error");
        assert_eq!(err.status, 503, "{rid}");
        assert!(err.message.contains("prefill rank 0"), "{}", err.message);
    }
    assert_pool_whole(&pair.d);
    assert_eq!(pair.d.mem.rows_in_use(), 0);
    assert_eq!(pair.d.disagg_status().unwrap().transfers_failed, 2);
}

#[test]
fn a_decode_rank_that_leaves_is_dropped_by_the_prefill_worker() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.submit("x", prompt(7, 80), 8, 1, true);
    pair.round();
    assert!(pair.p.has_work());
    pair.p.peer_gone(1, "killed");
    assert!(!pair.p.has_work());
    assert_pool_whole(&pair.p);
    assert_eq!(pair.p.mem.rows_in_use(), 0);
    assert_eq!(pair.p.take_finished_rids(), ["x"]);
}

#[test]
fn a_transfer_that_stalls_times_out_and_frees_its_slots() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.lose = vec!["KvReady"]; // the prefill worker never hears of the decode side
    pair.submit("slow", prompt(3, 40), 4, 5, true);
    pair.round();
    assert_eq!(decode(&pair.d).transfers.len(), 1, "slots held, KV awaited");
    let outs = pair.d.expire_at(Instant::now() + TIMEOUT / 2);
    assert!(outs.is_empty(), "not before its timeout");
    let outs = pair.d.expire_at(past_the_timeout());
    pair.collect(outs);
    let err = pair.done["slow"].1.error.clone().expect("timed out");
    assert_eq!(err.status, 503);
    assert!(err.message.contains("timed out"), "{}", err.message);
    assert_pool_whole(&pair.d);
    assert_eq!(pair.d.mem.rows_in_use(), 0);
}

#[test]
fn bad_frames_are_counted_and_never_applied() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    // A chunk for a room nobody holds.
    let stray = Message::KvChunk(protocol::KvChunk {
        room: 99,
        seq: 0,
        start: 0,
        tokens: 1,
        bytes: 4,
    });
    let from = KvPeer::Endpoint(EP.into());
    let outs = pair.d.on_kv(KvInbound {
        from: from.clone(),
        msg: stray,
        payload: Some(vec![0; 4]),
    });
    assert!(outs.is_empty());
    assert_eq!(pair.d.disagg_status().unwrap().frames_dropped, 1);
    // A chunk of the wrong size for a room being received fails that transfer.
    pair.submit("r", prompt(4, 20), 4, 3, true);
    pair.carry();
    let bad = Message::KvChunk(protocol::KvChunk {
        room: 3,
        seq: 0,
        start: 0,
        tokens: 2,
        bytes: 8,
    });
    let outs = pair.d.on_kv(KvInbound {
        from,
        msg: bad,
        payload: Some(vec![0; 8]),
    });
    pair.collect(outs);
    let err = pair.done["r"].1.error.clone().expect("failed");
    assert_eq!(err.status, 500);
    assert!(err.message.contains("bytes"), "{}", err.message);
    assert_eq!(pair.d.disagg_status().unwrap().frames_dropped, 2);
    // The prefill worker heard the abort and dropped its leg.
    pair.carry();
    while pair.p.has_work() {
        pair.p.step();
        pair.carry();
    }
    pair.assert_whole();
}

#[test]
fn a_decode_worker_with_another_layout_is_refused() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    let Role::Decode(d) = &mut pair.d.legs.role else {
        panic!("a decode worker")
    };
    d.config.layout.num_layers += 1;
    pair.submit("r", prompt(4, 20), 4, 3, false);
    pair.run(1);
    let err = pair.done["r"].1.error.clone().expect("refused");
    assert_eq!(err.status, 500);
    assert!(err.message.contains("KV layouts differ"), "{}", err.message);
    pair.assert_whole();
}

#[test]
fn a_leg_the_decode_side_refuses_is_dropped_on_the_prefill_side_whichever_came_first() {
    for decode_first in [true, false] {
        // The decode worker's context is shorter: it refuses, the prefill worker would accept.
        let decode = SchedulerConfig {
            context_len: 64,
            ..config(4096, 8)
        };
        let mut pair = Pair::new(config(4096, 8), decode);
        pair.submit("long", prompt(1, 80), 4, 9, decode_first);
        pair.carry();
        let err = pair.done["long"].1.error.clone().expect("refused");
        assert_eq!(err.status, 400, "{}", err.message);
        assert!(
            !pair.p.has_work() && pair.p.legs.queued() == 0,
            "decode first: {decode_first}"
        );
        assert_eq!(pair.p.take_finished_rids(), ["long"]);
        pair.assert_whole();
    }
}

#[test]
fn a_draining_decode_worker_still_holds_requests_whose_kv_is_on_its_way() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.lose = vec!["KvReady"];
    pair.submit("r", prompt(2, 30), 4, 4, true);
    pair.carry();
    assert!(!pair.d.has_work(), "nothing to compute");
    assert!(pair.d.holds_requests(), "but a request is held");
}

#[test]
fn a_leg_refused_before_it_is_taken_in_is_answered_through_the_other_side() {
    // The prefill worker refuses its leg (it is draining): the decode worker's KvReady gets the
    // refusal, and the client hears it from the decode side only.
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    let mut r = req("p-refused", prompt(1, 20), 4);
    r.disagg = Some(DisaggLeg {
        room: 11,
        prefill_rank: 0,
        decode_rank: 1,
        prefill_kv_endpoint: EP.into(),
        prefill_kv_key: None,
    });
    let draining = TokenOut::error("p-refused", 503, "rank 0 is draining");
    assert!(
        pair.p.refuse(r.clone(), draining).is_none(),
        "no answer from a prefill leg"
    );
    let out = pair.d.submit(r.clone());
    pair.collect(out.into_iter().collect());
    pair.carry();
    let err = pair.done["p-refused"].1.error.clone().expect("refused");
    assert_eq!(
        (err.status, err.message.as_str()),
        (503, "rank 0 is draining")
    );
    pair.assert_whole();

    // The decode worker refuses its leg: the prefill worker drops its own at once.
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    r.rid = "d-refused".into();
    assert!(pair.p.submit(r.clone()).is_none());
    let draining = TokenOut::error("d-refused", 503, "rank 1 is draining");
    let out = pair.d.refuse(r, draining).expect("the decode side answers");
    assert_eq!(out.error.map(|e| e.status), Some(503));
    pair.carry();
    assert_eq!(pair.p.legs.queued(), 0, "the prefill leg is gone");
    pair.assert_whole();
}

#[test]
fn a_kv_ready_for_a_leg_that_already_ended_is_answered_at_once() {
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    pair.lose = vec!["KvReady"]; // held back: it arrives after the prefill leg ended
    pair.submit("late", prompt(5, 20), 4, 21, false);
    pair.carry();
    // The client's abort reaches the prefill worker first.
    assert!(pair.p.abort(Some("late")).is_empty());
    pair.lose.clear();
    let sent = late_kv_ready(&mut pair.p, 21, "late", 20);
    assert!(
        matches!(sent.as_slice(), [KvSend { msg: Message::KvAbort(a), .. }] if a.room == 21),
        "{sent:?}"
    );
}

/// A decode worker with one request row: a second request waits in the pre-allocation queue
/// while the first holds it.
fn one_row() -> SchedulerConfig {
    SchedulerConfig {
        max_running_requests: 1,
        pre_alloc_rows: 0,
        ..config(4096, 8)
    }
}

#[test]
fn a_request_waiting_for_a_row_times_out_and_its_prefill_worker_is_told() {
    let mut pair = Pair::new(config(4096, 8), one_row());
    pair.lose = vec!["KvChunk", "KvDone"]; // "holder" keeps the only row
    pair.submit("holder", prompt(1, 20), 4, 1, true);
    pair.submit("queued", prompt(2, 20), 4, 2, true);
    pair.carry();
    assert_eq!(decode(&pair.d).prealloc.len(), 1, "no row for \"queued\"");
    assert!(pair.d.expire_at(Instant::now() + TIMEOUT / 2).is_empty());
    let outs = pair.d.expire_at(past_the_timeout());
    pair.collect(outs);
    let err = pair.done["queued"].1.error.clone().expect("timed out");
    assert_eq!(err.status, 503);
    assert!(err.message.contains("request row"), "{}", err.message);
    assert!(decode(&pair.d).prealloc.is_empty());
    // The prefill worker hears it and drops the leg it held for the room.
    pair.carry();
    assert!(
        prefill(&pair.p)
            .bootstrap
            .get(&2)
            .is_none_or(|b| b.request().is_none()),
        "the prefill leg of room 2 is gone"
    );
    assert!(pair.p.take_finished_rids().contains(&"queued".to_string()));
}

#[test]
fn a_prefill_bootstrap_timeout_fails_the_decode_request_at_once() {
    let mut pair = Pair::new(config(4096, 8), one_row());
    pair.lose = vec!["KvChunk", "KvDone"]; // "holder" keeps the only row
    pair.submit("holder", prompt(1, 20), 4, 1, true);
    pair.submit("queued", prompt(2, 20), 4, 2, true);
    pair.carry();
    pair.p.expire_at(past_the_timeout());
    pair.carry();
    // The prefill worker knows rank 1 from "holder"'s KvReady: it says so at once, and the
    // decode worker fails the request without waiting for a row it no longer needs.
    let err = pair.done["queued"].1.error.clone().expect("told at once");
    assert_eq!(err.status, 503);
    assert!(
        err.message.contains("bootstrap timed out"),
        "{}",
        err.message
    );
    assert!(decode(&pair.d).prealloc.is_empty());
}

#[test]
fn a_kv_ready_for_a_room_whose_bootstrap_timed_out_is_refused_at_once() {
    let mut pair = Pair::new(config(4096, 8), one_row());
    // No KvReady reaches the prefill worker in time: it never learns the decode worker.
    pair.lose = vec!["KvReady"];
    pair.submit("holder", prompt(1, 20), 4, 1, true);
    pair.submit("queued", prompt(2, 20), 4, 2, true);
    pair.carry();
    pair.p.expire_at(past_the_timeout());
    pair.lose.clear();
    // The row frees, "queued" says KvReady for a room the prefill worker gave up: it is
    // answered at once, not after a second bootstrap (or waiting) timeout.
    let outs = pair.d.abort(Some("holder"));
    pair.collect(outs);
    let outs = pair.d.expire(); // the actor's round: pre-allocation for what freed up
    pair.collect(outs);
    pair.carry();
    let err = pair.done["queued"]
        .1
        .error
        .clone()
        .expect("refused at once");
    assert_eq!(err.status, 503);
    assert!(
        err.message.contains("bootstrap timed out"),
        "{}",
        err.message
    );
    assert!(decode(&pair.d).transfers.is_empty() && decode(&pair.d).prealloc.is_empty());
    assert!(
        !prefill(&pair.p).bootstrap.values().any(|b| matches!(
            b,
            Room::Pairing { ready: Some(_), .. }
                | Room::Pairing {
                    request: Some(_),
                    ..
                }
        )),
        "no fresh bootstrap entry opened for the late KvReady"
    );
    pair.assert_whole();
}

/// Request `rid`'s generation request as the controller sends it to both legs, in `room`.
fn leg(rid: &str, ids: Vec<u32>, max_new: u32, room: u64) -> protocol::GenerateReq {
    let mut r = req(rid, ids, max_new);
    r.disagg = Some(DisaggLeg {
        room,
        prefill_rank: 0,
        decode_rank: 1,
        prefill_kv_endpoint: EP.into(),
        prefill_kv_key: None,
    });
    r
}

#[test]
fn two_requests_naming_one_room_never_share_a_transfer() {
    // The controller names every transfer afresh; a faulty or hostile peer may not. The second
    // request into a held room is refused on both sides, and the first finishes as alone.
    for decode_first in [true, false] {
        let expected = unified(&[("a".into(), prompt(5, 40), 6)], config(4096, 8));
        let mut pair = Pair::new(config(4096, 8), config(4096, 8));
        pair.submit("a", prompt(5, 40), 6, 7, decode_first);
        pair.submit("b", prompt(6, 40), 6, 7, decode_first);
        pair.run(2);
        assert_eq!(pair.done["a"].0, expected["a"], "a's own tokens");
        assert!(pair.done["a"].1.error.is_none());
        let err = pair.done["b"].1.error.clone().expect("b refused");
        assert_eq!(err.status, 500, "{}", err.message);
        assert!(err.message.contains("already in use"), "{}", err.message);
        assert!(pair.done["b"].0.is_empty(), "b got no tokens");
        let mut ended = pair.p.take_finished_rids();
        ended.sort();
        assert_eq!(ended, ["a", "b"], "the prefill worker ends both legs");
        pair.assert_whole();
    }
}

#[test]
fn a_room_paired_with_another_request_fails_rather_than_crossing_answers() {
    // The prefill worker holds "b" in room 7, the decode worker "a": the KvReady names "a",
    // so the pairing is refused and neither client gets the other's continuation.
    let mut pair = Pair::new(config(4096, 8), config(4096, 8));
    assert!(pair.p.submit(leg("b", prompt(6, 40), 6, 7)).is_none());
    assert!(pair.d.submit(leg("a", prompt(5, 40), 6, 7)).is_none());
    assert!(pair.p.submit(leg("a", prompt(5, 40), 6, 7)).is_none());
    let refused = pair.d.submit(leg("b", prompt(6, 40), 6, 7));
    pair.collect(refused.into_iter().collect());
    pair.run(2);
    for rid in ["a", "b"] {
        let (ids, out) = &pair.done[rid];
        assert!(ids.is_empty(), "{rid} got tokens: {ids:?}");
        let err = out.error.clone().unwrap_or_else(|| panic!("{rid} failed"));
        assert_eq!(err.status, 500, "{rid}: {}", err.message);
    }
    assert!(pair.done["a"]
        .1
        .error
        .as_ref()
        .unwrap()
        .message
        .contains("holds request"));
    let mut ended = pair.p.take_finished_rids();
    ended.sort();
    assert_eq!(ended, ["a", "b"]);
    assert_eq!(pair.p.disagg_status().unwrap().transfers_failed, 2);
    pair.assert_whole();
}

fn ready_for(rid: &str, room: u64, rank: u32) -> Message {
    Message::KvReady(protocol::KvReady {
        room,
        rid: rid.into(),
        decode_rank: rank,
        layout: layout(),
        prompt_len: 10,
    })
}

/// Hands `msg` from the decode worker `id` to the prefill worker `p`; what `p` sends back.
fn deliver(p: &mut Scheduler, msg: Message, id: &[u8]) -> Vec<KvSend> {
    let outs = p.on_kv(KvInbound {
        from: KvPeer::Identity(id.to_vec()),
        msg,
        payload: None,
    });
    assert!(outs.is_empty(), "a prefill worker answers no client");
    p.take_kv_out()
}

fn aborts(sent: &[KvSend], room: u64, to: &[u8]) -> bool {
    matches!(sent, [s] if s.to == KvPeer::Identity(to.to_vec())
        && matches!(&s.msg, Message::KvAbort(a) if a.room == room))
}

#[test]
fn a_second_kv_ready_for_a_held_room_is_refused_without_touching_the_first() {
    let mut p = role(DisaggMode::Prefill, config(4096, 8));
    assert!(deliver(&mut p, ready_for("a", 3, 1), b"d1").is_empty());
    // Another decode worker claims the room for another request: refused, to it alone.
    assert!(aborts(
        &deliver(&mut p, ready_for("x", 3, 2), b"d2"),
        3,
        b"d2"
    ));
    // "a" arrives and pairs with its own KvReady.
    assert!(p.submit(leg("a", prompt(5, 10), 4, 3)).is_none());
    assert!(p.has_work(), "a is queued for its prefill");
    assert!(p.take_finished_rids().is_empty());
}

#[test]
fn a_kv_ready_naming_another_request_ends_the_room_for_both() {
    let mut p = role(DisaggMode::Prefill, config(4096, 8));
    assert!(p.submit(leg("a", prompt(5, 10), 4, 3)).is_none());
    let sent = deliver(&mut p, ready_for("x", 3, 2), b"d2");
    assert!(aborts(&sent, 3, b"d2"));
    let Message::KvAbort(a) = &sent[0].msg else {
        unreachable!()
    };
    assert!(a.reason.contains("holds request"), "{}", a.reason);
    // The room was given up with "a": its own KvReady, late, is answered at once.
    assert!(aborts(
        &deliver(&mut p, ready_for("a", 3, 1), b"d1"),
        3,
        b"d1"
    ));
    assert_eq!(p.take_finished_rids(), ["a"]);
    assert!(!p.has_work() && p.legs.queued() == 0);
}

#[test]
fn a_constraint_holds_across_the_transfer_the_decode_worker_follows_the_first_token() {
    use super::constraint_tests::{byte_grammars, constrained, text};
    use protocol::Constraint;
    let mut pair = Pair::new(config(4096, 16), config(4096, 16));
    pair.p.set_grammars(byte_grammars());
    pair.d.set_grammars(byte_grammars());
    // The regex's first byte is forced to 'x' or 'y': the prefill worker samples it, the decode
    // worker must follow it before its own first mask.
    let c = Constraint::Regex(r"[xy]-[0-9]{2,4}!".into());
    for seed in 0..6u64 {
        let mut r = constrained(&format!("r{seed}"), c.clone(), seed, 40);
        r.disagg = leg("", Vec::new(), 0, 2000 + seed).disagg;
        let (p, d) = (pair.p.submit(r.clone()), pair.d.submit(r));
        pair.collect(p.into_iter().chain(d).collect());
    }
    pair.run(6);
    for seed in 0..6u64 {
        let (ids, last) = &pair.done[&format!("r{seed}")];
        assert_eq!(
            last.finish_reason,
            Some(FinishReason::Stop),
            "r{seed}: {last:?}"
        );
        let t = text(ids);
        let digits = t
            .strip_prefix(['x', 'y'])
            .and_then(|t| t.strip_prefix('-'))
            .and_then(|t| t.strip_suffix('!'))
            .unwrap_or_else(|| panic!("{t:?}"));
        assert!((2..=4).contains(&digits.len()), "{t:?}");
        assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{t:?}");
    }
    pair.assert_whole();
}
