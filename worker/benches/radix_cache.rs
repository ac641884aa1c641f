//! Criterion benches for the radix cache on long prompts: `match_prefix` and `insert` of
//! 4096-token prompts (the shared-system-prompt case), `peek_prefix_len` (what a policy calls),
//! and LRU eviction. Run: `cargo bench -p worker --bench radix_cache`.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use worker::kv::radix_cache::RadixCache;

const PROMPT_LEN: usize = 4096;
const QUESTION_LEN: usize = 128;
const GROUPS: usize = 16;

fn ids(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.gen_range(3..32_000)).collect()
}

/// A cache holding `GROUPS` distinct 4096-token prefixes, each with its own slot run, plus the
/// prefixes (to build queries from) and the next free slot number.
fn populated() -> (RadixCache, Vec<Vec<u32>>, u32) {
    let mut rng = StdRng::seed_from_u64(1);
    let mut cache = RadixCache::new();
    let mut prefixes = Vec::new();
    let mut next_slot = 0u32;
    for _ in 0..GROUPS {
        let key = ids(&mut rng, PROMPT_LEN);
        let slots: Vec<u32> = (next_slot..next_slot + PROMPT_LEN as u32).collect();
        next_slot += PROMPT_LEN as u32;
        cache.insert(&key, &slots);
        prefixes.push(key);
    }
    (cache, prefixes, next_slot)
}

fn bench_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("radix_cache/match_prefix");
    g.throughput(Throughput::Elements(PROMPT_LEN as u64));
    let (mut cache, prefixes, _) = populated();
    let mut rng = StdRng::seed_from_u64(2);

    // Full hit: the prompt is a cached 4K prefix.
    let hit = prefixes[3].clone();
    g.bench_function("hit_4096", |b| {
        b.iter(|| black_box(cache.match_prefix(black_box(&hit)).slots.len()))
    });

    // The GSP request shape: cached 4K system prompt + an uncached 128-token question.
    let mut gsp = prefixes[5].clone();
    gsp.extend(ids(&mut rng, QUESTION_LEN));
    g.bench_function("hit_4096_plus_miss_128", |b| {
        b.iter(|| black_box(cache.match_prefix(black_box(&gsp)).slots.len()))
    });

    // A miss at the first token.
    let miss = ids(&mut rng, PROMPT_LEN);
    g.bench_function("miss_4096", |b| {
        b.iter(|| black_box(cache.match_prefix(black_box(&miss)).slots.len()))
    });

    g.bench_function("peek_prefix_len_4096", |b| {
        b.iter(|| black_box(cache.peek_prefix_len(black_box(&gsp))))
    });
    g.finish();
}

fn bench_insert(c: &mut Criterion) {
    let mut g = c.benchmark_group("radix_cache/insert");
    g.throughput(Throughput::Elements(PROMPT_LEN as u64));
    let mut rng = StdRng::seed_from_u64(3);
    let (_, prefixes, next_slot) = populated();

    // A new 4K prompt sharing nothing: one new leaf holding 4096 slots.
    let fresh = ids(&mut rng, PROMPT_LEN);
    let fresh_slots: Vec<u32> = (next_slot..next_slot + PROMPT_LEN as u32).collect();
    g.bench_function("new_4096", |b| {
        b.iter_batched(
            || populated().0,
            |mut cache| black_box(cache.insert(&fresh, &fresh_slots)),
            BatchSize::SmallInput,
        )
    });

    // A finished GSP request: 4K cached prefix + 128 new tokens (walk 4K, split, add a leaf).
    let mut gsp = prefixes[7].clone();
    gsp.extend(ids(&mut rng, QUESTION_LEN));
    let gsp_slots: Vec<u32> = (next_slot..next_slot + gsp.len() as u32).collect();
    g.bench_function("shared_4096_plus_new_128", |b| {
        b.iter_batched(
            || populated().0,
            |mut cache| black_box(cache.insert(&gsp, &gsp_slots)),
            BatchSize::SmallInput,
        )
    });

    // Re-inserting a fully cached prompt: the walk only.
    let (mut cache, _, _) = populated();
    let again = prefixes[2].clone();
    let again_slots: Vec<u32> = (0..PROMPT_LEN as u32).collect();
    g.bench_function("already_cached_4096", |b| {
        b.iter(|| black_box(cache.insert(black_box(&again), &again_slots)))
    });
    g.finish();
}

fn bench_evict(c: &mut Criterion) {
    let mut g = c.benchmark_group("radix_cache/evict");
    g.throughput(Throughput::Elements(PROMPT_LEN as u64));
    g.bench_function("lru_4096_of_16x4096", |b| {
        b.iter_batched(
            || populated().0,
            |mut cache| {
                black_box(cache.evict(PROMPT_LEN, |s| {
                    black_box(s);
                }))
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench_match, bench_insert, bench_evict);
criterion_main!(benches);
