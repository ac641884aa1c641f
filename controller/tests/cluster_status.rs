//! A rank going idle reaches the tokenizer at once: the controller passes a worker's "nothing
//! running" status on without waiting for its cluster-status interval, so the tokenizer's view
//! (what `/flush_cache` reads) is idle as soon as the last answer is out.

mod common;

use std::time::Duration;

use controller::Method;
use protocol::{ClusterStatus, DisaggMode, Message, WorkerStatus};

fn status(seq: u64, running: u32) -> Message {
    Message::WorkerStatus(WorkerStatus {
        rank: 0,
        timestamp: protocol::unix_time(),
        status_seq: Some(seq),
        num_running_reqs: running,
        max_total_tokens: 4096,
        ..Default::default()
    })
}

/// The next `ClusterStatus` the tokenizer's socket receives (5 s receive timeout).
fn next_cluster_status(c: &common::Running) -> ClusterStatus {
    loop {
        let frame = c
            .outputs
            .recv_bytes(0)
            .expect("a cluster status within the timeout");
        if let Ok(Message::ClusterStatus(s)) = protocol::decode(&frame) {
            return s;
        }
    }
}

/// Rank 0's status in `s`, if the view has one.
fn rank0(s: &ClusterStatus) -> Option<&WorkerStatus> {
    s.live_ranks.iter().find(|r| r.rank == 0)?.status.as_ref()
}

#[test]
fn a_rank_going_idle_is_passed_to_the_tokenizer_at_once() {
    // An interval no test waits for: every view below is one pushed on a change.
    let c = common::start_with_status_interval(Method::RoundRobin, Duration::from_secs(600));
    let w = common::Worker::join(&c.ctx, &c.worker_addr, 0, DisaggMode::Null);
    // The join is a change: the view shows the rank.
    while !next_cluster_status(&c)
        .live_ranks
        .iter()
        .any(|r| r.rank == 0)
    {}
    let send = |m: Message| protocol::socket::send(&w.sock, &m).unwrap();
    send(status(1, 1));
    std::thread::sleep(Duration::from_millis(50));
    send(status(2, 0));
    loop {
        let view = next_cluster_status(&c);
        if let Some(s) = rank0(&view).filter(|s| s.status_seq == Some(2)) {
            assert_eq!((s.num_running_reqs, s.num_waiting_reqs), (0, 0));
            break;
        }
    }
    c.stop();
}
