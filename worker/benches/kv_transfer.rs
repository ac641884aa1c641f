//! KV transfer throughput between a prefill and a decode worker's KV links, as they run in a
//! disaggregated deployment: the prefill side gathers a prompt's KV out of its pool
//! (`KvBuffers::read_slots`), its link thread sends it on the ROUTER, the decode side's link
//! thread receives it on its DEALER and hands it over, and the decode side scatters it into its
//! own slots (`write_slots`). Over ipc, tcp and tcp with CURVE (docs/SECURITY.md), for 1k- and
//! 4k-token prompts of the built-in
//! base model (16 KiB of KV per token), in chunks of the default `--chunked-prefill-size`, each
//! sent as the worker sends it (frames of at most `KV_FRAME_BYTES`).
//!
//! `cargo bench -p worker --bench kv_transfer` prints the median of several transfers per case.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{KvChunk, KvLayout, KvReady, Message};
use worker::disagg::link::{self, KvLink};
use worker::disagg::{kv_frames, KvPeer, KvSend, PrefillEndpoint};
use worker::model::{BuiltinSize, KvBuffers, ModelConfig};

const REPS: usize = 7;
const CHUNK: usize = 2048;

struct Side {
    outbox: zmq::Socket,
    inbound: mpsc::Receiver<worker::disagg::KvInbound>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<worker::error::Result<()>>,
}

fn side(
    ctx: &zmq::Context,
    name: &str,
    router: Option<zmq::Socket>,
    transport: protocol::Transport,
) -> Side {
    let inproc = format!("inproc://bench-{name}");
    let outbox_rx = ctx.socket(zmq::PULL).unwrap();
    outbox_rx.bind(&inproc).unwrap();
    let outbox = ctx.socket(zmq::PUSH).unwrap();
    outbox.connect(&inproc).unwrap();
    let (tx, inbound) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let kv = KvLink {
        ctx: ctx.clone(),
        outbox: outbox_rx,
        router,
        identity: format!("decode-{name}").into_bytes(),
        transport,
        deliver: Box::new(move |kv| {
            tx.send(kv).ok();
        }),
        stop: Arc::clone(&stop),
        max_frame: protocol::socket::MAX_FRAME_BYTES,
    };
    let thread = std::thread::spawn(move || link::run(kv));
    Side {
        outbox,
        inbound,
        stop,
        thread,
    }
}

fn next_kv(side: &Side) -> worker::disagg::KvInbound {
    match side.inbound.recv_timeout(Duration::from_secs(30)) {
        Ok(kv) => kv,
        Err(e) => panic!("expected a KV message: {e}"),
    }
}

/// Seconds for one prompt of `tokens` tokens to move from `src` to `dst`.
fn transfer(
    p: &Side,
    d: &Side,
    endpoint: &PrefillEndpoint,
    src: &KvBuffers,
    dst: &mut KvBuffers,
    tokens: usize,
) -> f64 {
    let slots: Vec<u32> = (0..tokens as u32).collect();
    let started = Instant::now();
    // The decode side speaks first, so the prefill side knows where to send.
    link::send(
        &d.outbox,
        KvSend {
            to: KvPeer::Endpoint(endpoint.clone()),
            msg: Message::KvReady(KvReady {
                room: 1,
                rid: "bench".into(),
                decode_rank: 1,
                layout: layout(),
                prompt_len: tokens as u64,
            }),
            payload: None,
        },
    );
    let ready = next_kv(p);
    let per_token = src.read_slots(&slots[..1]).len();
    let mut frames = Vec::new();
    for chunk in (0..tokens).step_by(CHUNK) {
        frames.extend(kv_frames(chunk, CHUNK.min(tokens - chunk), per_token));
    }
    for (seq, &(start, n)) in frames.iter().enumerate() {
        let payload = src.read_slots(&slots[start..start + n]);
        let chunk = KvChunk {
            room: 1,
            seq: seq as u32,
            start: start as u64,
            tokens: n as u64,
            bytes: payload.len() as u64,
        };
        link::send(
            &p.outbox,
            KvSend {
                to: ready.from.clone(),
                msg: Message::KvChunk(chunk),
                payload: Some(payload),
            },
        );
    }
    for &(start, n) in &frames {
        let kv = next_kv(d);
        let payload = kv.payload.expect("a payload");
        assert!(dst.write_slots(&slots[start..start + n], &payload));
    }
    started.elapsed().as_secs_f64()
}

fn layout() -> KvLayout {
    ModelConfig::builtin(BuiltinSize::Base).kv_layout()
}

fn main() {
    let mc = ModelConfig::builtin(BuiltinSize::Base);
    let per_token = KvBuffers::bytes_per_slot(&mc);
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "ipc",
            format!("ipc://{}/kv.sock", dir.path().display()),
            false,
        ),
        ("tcp", format!("tcp://127.0.0.1:{}", free_port()), false),
        (
            "tcp+curve",
            format!("tcp://127.0.0.1:{}", free_port()),
            true,
        ),
    ];
    println!(
        "KV transfer, built-in base model ({per_token} B of KV per token), chunks of {CHUNK} \
         tokens, median of {REPS}"
    );
    println!("| transport | prompt tokens | MiB | ms | GB/s |");
    println!("|---|---:|---:|---:|---:|");
    for (name, endpoint, curve) in &cases {
        let ctx = zmq::Context::new();
        let (prefill, decode, server_key) = transports(*curve);
        let (router, _) = link::bind(&ctx, &prefill, &endpoint.parse().unwrap()).unwrap();
        let p = side(&ctx, &format!("p-{name}"), Some(router), prefill);
        let d = side(&ctx, &format!("d-{name}"), None, decode);
        let endpoint = PrefillEndpoint {
            endpoint: endpoint.clone(),
            server_key,
        };
        for tokens in [1024, 4096] {
            let mut src = KvBuffers::new(&mc, tokens);
            let mut dst = KvBuffers::new(&mc, tokens);
            let fill: Vec<u8> = (0..tokens * per_token)
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let slots: Vec<u32> = (0..tokens as u32).collect();
            assert!(src.write_slots(&slots, &fill));
            let mut times: Vec<f64> = (0..REPS)
                .map(|_| transfer(&p, &d, &endpoint, &src, &mut dst, tokens))
                .collect();
            assert_eq!(dst.read_slots(&slots), fill, "the KV arrived intact");
            times.sort_by(f64::total_cmp);
            let t = times[REPS / 2];
            let bytes = (tokens * per_token) as f64;
            println!(
                "| {name} | {tokens} | {:.0} | {:.1} | {:.2} |",
                bytes / (1 << 20) as f64,
                t * 1e3,
                bytes / t / 1e9
            );
        }
        for s in [p, d] {
            s.stop.store(true, Ordering::Relaxed);
            s.thread.join().unwrap().unwrap();
        }
    }
}

/// The prefill and decode workers' transports, and the key the decode worker names: plain, or
/// CURVE with the decode worker's key listed by the prefill worker.
fn transports(curve: bool) -> (protocol::Transport, protocol::Transport, Option<String>) {
    if !curve {
        return (Default::default(), Default::default(), None);
    }
    use protocol::curve::{AllowList, Keypair};
    let (p, d) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let prefill = AllowList::new(None, vec![d.public()]).unwrap();
    let decode = AllowList::new(None, vec![]).unwrap();
    let key = p.public().z85();
    (
        protocol::Transport::curve(p.clone(), p.public(), prefill),
        protocol::Transport::curve(d, p.public(), decode),
        Some(key),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}
