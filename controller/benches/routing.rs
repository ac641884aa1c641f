//! Routing decisions per second: prefix_affinity with a routing key and with the 4096-token
//! fallback hash, over 2, 8 and 64 live ranks; round_robin as the floor. Measurement time is
//! kept short so `cargo bench -p controller` finishes in well under a minute.

use std::time::Duration;

use controller::policy::{
    LoadBalancer, PrefixAffinity, PrefixAffinityConfig, RankLoad, RankSet, RoundRobin, RouteInput,
};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn ranks(n: u32) -> RankSet {
    RankSet::new(
        (0..n)
            .map(|rank| RankLoad {
                rank,
                active_requests: u64::from(rank % 3),
                active_tokens: u64::from(rank) * 1000,
            })
            .collect(),
    )
}

fn routing(c: &mut Criterion) {
    let mut group = c.benchmark_group("route");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .throughput(Throughput::Elements(1));
    let prompt: Vec<u32> = (0..4096u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 32_000)
        .collect();
    let keys: Vec<String> = (0..1024).map(|k| format!("conversation-{k:06}")).collect();
    for n in [2u32, 8, 64] {
        let set = ranks(n);
        let mut pa = PrefixAffinity::new(PrefixAffinityConfig::default());
        let mut i = 0usize;
        group.bench_with_input(BenchmarkId::new("routing_key", n), &set, |b, set| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                let req = RouteInput {
                    rid: "r",
                    input_ids: &prompt[..16],
                    routing_key: Some(&keys[i]),
                    bootstrap_room: None,
                };
                black_box(pa.select(&req, set).rank)
            })
        });
        group.bench_with_input(BenchmarkId::new("token_hash_4096", n), &set, |b, set| {
            b.iter(|| {
                let req = RouteInput {
                    rid: "r",
                    input_ids: &prompt,
                    routing_key: None,
                    bootstrap_room: None,
                };
                black_box(pa.select(&req, set).rank)
            })
        });
        let mut rr = RoundRobin::default();
        group.bench_with_input(BenchmarkId::new("round_robin", n), &set, |b, set| {
            b.iter(|| {
                let req = RouteInput {
                    rid: "r",
                    input_ids: &prompt[..16],
                    routing_key: None,
                    bootstrap_room: None,
                };
                black_box(rr.select(&req, set).rank)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
