//! Routing decisions per second: prefix_affinity with a routing key and with the 4096-token
//! fallback hash, cache_aware on a 4096-token prompt (the KV index lookup included) that half
//! the ranks hold at various depths and that no rank holds, over 2, 8 and 64 live ranks;
//! round_robin as the floor. Measurement time is kept short so `cargo bench -p controller`
//! finishes in about a minute.

use std::time::{Duration, Instant};

use controller::kv_index::KvIndex;
use controller::policy::{
    CacheAware, CacheAwareConfig, LoadBalancer, PrefixAffinity, PrefixAffinityConfig, RankLoad,
    RankSet, RoundRobin, RouteInput,
};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use protocol::kv_events::{block_hashes, DEFAULT_KV_BLOCK_SIZE};
use protocol::KvEvents;

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

/// A KV index where rank r < n/2 holds the first (r + 1) / (n/2) of `prompt`'s blocks (rank
/// n/2 − 1 all of it) and the other ranks hold nothing of it.
fn index_holding(prompt: &[u32], n: u32) -> KvIndex {
    let mut index = KvIndex::new();
    let blocks = block_hashes(prompt, DEFAULT_KV_BLOCK_SIZE);
    let holders = (n / 2).max(1);
    for rank in 0..n {
        index.join(rank, Instant::now());
        let depth = if rank < holders {
            blocks.len() * (rank as usize + 1) / holders as usize
        } else {
            0
        };
        index.apply(
            &KvEvents {
                rank,
                seq: 1,
                block_size: DEFAULT_KV_BLOCK_SIZE as u32,
                cleared: true,
                removed: vec![],
                stored: blocks[..depth].to_vec(),
            },
            Instant::now(),
        );
    }
    index
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
                    max_new_tokens: None,
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
                    max_new_tokens: None,
                };
                black_box(pa.select(&req, set).rank)
            })
        });
        let index = index_holding(&prompt, n);
        let now = Instant::now();
        let cold: Vec<u32> = prompt.iter().map(|t| t ^ 1).collect();
        let mut ca = CacheAware::new(CacheAwareConfig::default());
        for (name, ids) in [
            ("cache_aware_4096", &prompt),
            ("cache_aware_4096_cold", &cold),
        ] {
            group.bench_with_input(BenchmarkId::new(name, n), &set, |b, set| {
                b.iter(|| {
                    let req = RouteInput {
                        rid: "r",
                        input_ids: ids,
                        routing_key: None,
                        bootstrap_room: None,
                        max_new_tokens: None,
                    };
                    let set = set
                        .clone()
                        .with_cached_prefix(index.cached_prefix(ids, set, now));
                    black_box(ca.select(&req, &set).rank)
                })
            });
        }
        let mut rr = RoundRobin::default();
        group.bench_with_input(BenchmarkId::new("round_robin", n), &set, |b, set| {
            b.iter(|| {
                let req = RouteInput {
                    rid: "r",
                    input_ids: &prompt[..16],
                    routing_key: None,
                    bootstrap_room: None,
                    max_new_tokens: None,
                };
                black_box(rr.select(&req, set).rank)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
