//! What CURVE costs on the ZeroMQ path, plain against CURVE in one invocation over TCP
//! loopback, each case run alternately: one-way throughput of small frames (a `TokenOut`'s
//! size) and of 1 MiB frames (a KV chunk's), and the round trip of a small frame (a request
//! out, its answer back). Sockets as the actors make them (`Transport::bind` / `connect`).
//!
//! `cargo bench -p protocol --bench transport` prints each case's median of several runs and
//! the ratio CURVE / plain.

use std::time::Instant;

use protocol::curve::{AllowList, Keypair};
use protocol::{Endpoint, Transport};

const REPS: usize = 7;

fn free_endpoint() -> Endpoint {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    format!("tcp://127.0.0.1:{port}").parse().unwrap()
}

/// A server and a client transport: both plain, or CURVE with the client listed.
fn transports(curve: bool) -> (Transport, Transport) {
    if !curve {
        return (Transport::default(), Transport::default());
    }
    let server = Keypair::generate().unwrap();
    let client = Keypair::generate().unwrap();
    let allow = AllowList::new(None, vec![client.public()]).unwrap();
    let no_one = AllowList::new(None, vec![]).unwrap();
    (
        Transport::curve(server.clone(), server.public(), allow),
        Transport::curve(client, server.public(), no_one),
    )
}

/// Seconds to push `count` frames of `size` bytes and receive them all.
fn one_way(curve: bool, size: usize, count: usize) -> f64 {
    let (server, client) = transports(curve);
    let (sctx, cctx) = (zmq::Context::new(), zmq::Context::new());
    let endpoint = free_endpoint();
    let pull = server.bind(&sctx, zmq::PULL, &endpoint).unwrap();
    let push = client.connect(&cctx, zmq::PUSH, &endpoint, None).unwrap();
    // One frame first, so the handshake is not timed.
    push.send("warm", 0).unwrap();
    pull.recv_bytes(0).unwrap();
    let frame = vec![7u8; size];
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        for _ in 0..count {
            push.send(&frame[..], 0).unwrap();
        }
        push
    });
    for _ in 0..count {
        pull.recv_bytes(0).unwrap();
    }
    let took = start.elapsed().as_secs_f64();
    drop(sender.join().unwrap());
    took
}

/// Seconds for `count` round trips of a `size`-byte frame (DEALER → ROUTER → back).
fn round_trips(curve: bool, size: usize, count: usize) -> f64 {
    let (server, client) = transports(curve);
    let (sctx, cctx) = (zmq::Context::new(), zmq::Context::new());
    let endpoint = free_endpoint();
    let router = server.bind(&sctx, zmq::ROUTER, &endpoint).unwrap();
    let dealer = client
        .connect(&cctx, zmq::DEALER, &endpoint, Some(b"bench"))
        .unwrap();
    let echo = std::thread::spawn(move || {
        for _ in 0..=count {
            let parts = router.recv_multipart(0).unwrap();
            router.send_multipart(parts, 0).unwrap();
        }
    });
    let frame = vec![7u8; size];
    dealer.send(&frame[..], 0).unwrap();
    dealer.recv_bytes(0).unwrap();
    let start = Instant::now();
    for _ in 0..count {
        dealer.send(&frame[..], 0).unwrap();
        dealer.recv_bytes(0).unwrap();
    }
    let took = start.elapsed().as_secs_f64();
    echo.join().unwrap();
    took
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` runs bench targets without `--bench`: a twentieth of the work.
    let scale = if std::env::args().any(|a| a == "--bench") {
        1
    } else {
        20
    };
    type Case = (
        &'static str,
        fn(bool, usize) -> f64,
        usize,
        f64,
        &'static str,
    );
    let cases: [Case; 3] = [
        (
            "one-way 256 B",
            |c, n| one_way(c, 256, n),
            50_000,
            1.0,
            "frames/s",
        ),
        (
            "one-way 1 MiB",
            |c, n| one_way(c, 1 << 20, n),
            400,
            1.048_576,
            "MB/s",
        ),
        (
            "round trip 256 B",
            |c, n| round_trips(c, 256, n),
            5_000,
            1.0,
            "round trips/s",
        ),
    ];
    println!(
        "CURVE against plain ZeroMQ over TCP loopback, median of {REPS} runs each (alternating)"
    );
    println!("| case | count | plain | CURVE | CURVE / plain time |");
    println!("|---|---|---|---|---|");
    for (name, run, count, per_item, unit) in cases {
        let count = count / scale;
        let (mut plain, mut curve) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            plain.push(run(false, count));
            curve.push(run(true, count));
        }
        let (p, c) = (median(plain), median(curve));
        let work = count as f64 * per_item;
        println!(
            "| {name} | {count} | {:.0} {unit} | {:.0} {unit} | {:.2} |",
            work / p,
            work / c,
            c / p
        );
    }
}
