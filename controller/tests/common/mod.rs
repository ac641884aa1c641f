//! A real controller on ipc sockets in a temporary directory, with the tokenizer's two sockets
//! played by the test (requests in, outputs out); stopped and joined when dropped.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use controller::{CacheAwareConfig, Controller, ControllerConfig, Method, PrefixAffinityConfig};
use protocol::socket::worker_identity;
use protocol::{Capacity, DisaggMode, Endpoint, GenerateReq, Hello, Message, TokenOut};

pub struct Running {
    pub ctx: zmq::Context,
    /// The tokenizer's output socket (PULL; 5 s receive timeout).
    pub outputs: zmq::Socket,
    /// The tokenizer's request socket (PUSH).
    pub requests: zmq::Socket,
    pub worker_addr: Endpoint,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<controller::Result<()>>>,
    _dir: tempfile::TempDir,
}

/// A controller routing whole requests (and prefill legs) by `method`.
pub fn start(method: Method) -> Running {
    start_with(method, CacheAwareConfig::default())
}

/// [`start`] with `cache_aware`'s settings.
pub fn start_with(method: Method, cache_aware: CacheAwareConfig) -> Running {
    start_config(method, cache_aware, Duration::from_millis(500))
}

/// [`start`] pushing the cluster status on its own only every `interval` (on changes at once).
pub fn start_with_status_interval(method: Method, interval: Duration) -> Running {
    start_config(method, CacheAwareConfig::default(), interval)
}

fn start_config(
    method: Method,
    cache_aware: CacheAwareConfig,
    cluster_status_interval: Duration,
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let ep = |name: &str| Endpoint::Ipc(dir.path().join(name));
    let config = ControllerConfig {
        controller_addr: ep("c.sock"),
        worker_addr: ep("w.sock"),
        tokenizer_addr: ep("t.sock"),
        transport: Default::default(),
        method,
        decode_method: Method::TotalTokens,
        prefix_affinity: PrefixAffinityConfig::default(),
        cache_aware,
        peers: Default::default(),
        trace_file: None,
        trace_dir: None,
        trace_max_bytes: 1 << 20,
        worker_timeout: Duration::from_secs(30),
        model_id: None,
        cluster_status_interval,
    };
    let ctx = zmq::Context::new();
    let outputs = protocol::socket::bind(&ctx, zmq::PULL, &config.tokenizer_addr).unwrap();
    outputs.set_rcvtimeo(5000).unwrap();
    let requests =
        protocol::socket::connect(&ctx, zmq::PUSH, &config.controller_addr, None).unwrap();
    let worker_addr = config.worker_addr.clone();
    let controller = Controller::bind(&ctx, config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || controller.run(stop))
    };
    Running {
        ctx,
        outputs,
        requests,
        worker_addr,
        stop,
        thread: Some(thread),
        _dir: dir,
    }
}

impl Running {
    /// Sends `msg` as the tokenizer would.
    pub fn send(&self, msg: &Message) {
        self.requests
            .send(protocol::encode(msg).unwrap(), 0)
            .unwrap();
    }

    /// The next `TokenOut` the controller sends the tokenizer.
    pub fn next_out(&self) -> TokenOut {
        loop {
            let frame = self
                .outputs
                .recv_bytes(0)
                .expect("an output within the timeout");
            if let Ok(Message::TokenOut(out)) = protocol::decode(&frame) {
                return out;
            }
        }
    }

    /// Stops the controller and checks it ended cleanly.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A worker played by a DEALER socket: registered with a `Hello`, reading what it is sent.
pub struct Worker {
    pub rank: u32,
    pub sock: zmq::Socket,
}

impl Worker {
    pub fn join(
        ctx: &zmq::Context,
        addr: &protocol::Endpoint,
        rank: u32,
        mode: DisaggMode,
    ) -> Self {
        Self::join_with(ctx, addr, rank, mode, false)
    }

    /// As [`Worker::join`], saying whether it enforces structured-output constraints.
    pub fn join_with(
        ctx: &zmq::Context,
        addr: &protocol::Endpoint,
        rank: u32,
        mode: DisaggMode,
        constraints: bool,
    ) -> Self {
        let sock = protocol::socket::connect(ctx, zmq::DEALER, addr, Some(&worker_identity(rank)))
            .unwrap();
        sock.set_rcvtimeo(5000).unwrap();
        let hello = Hello {
            rank,
            capacity: Capacity {
                max_total_tokens: 4096,
                max_running_requests: 8,
                context_len: 512,
                vocab_size: 512,
            },
            model_id: "m".into(),
            protocol_version: protocol::PROTOCOL_VERSION,
            pid: 1000 + rank,
            held_rids: Vec::new(),
            disaggregation_mode: mode,
            kv_endpoint: (mode == DisaggMode::Prefill).then(|| format!("ipc:///kv-{rank}.sock")),
            kv_public_key: None,
            kv_layout: None,
            gpu: None,
            taken_seq: None,
            constraints,
            finish_first_tokens: 0,
        };
        protocol::socket::send(&sock, &Message::Hello(hello)).unwrap();
        let w = Worker { rank, sock };
        match w.next() {
            Message::HelloAck(ack) => assert!(ack.accepted, "{ack:?}"),
            other => panic!("rank {rank}: {other:?}"),
        }
        w
    }

    /// The next message other than a `ClusterStatus`-style echo (there is none to a worker).
    pub fn next(&self) -> Message {
        let frame = self
            .sock
            .recv_bytes(0)
            .expect("a message within the timeout");
        protocol::decode(&frame).unwrap()
    }

    pub fn next_request(&self) -> GenerateReq {
        loop {
            match self.next() {
                Message::GenerateReq(r) => return r,
                Message::HelloAck(_) | Message::KvSnapshotReq(_) | Message::Heartbeat(_) => {
                    continue
                }
                other => panic!("rank {}: expected a request, got {other:?}", self.rank),
            }
        }
    }
}
