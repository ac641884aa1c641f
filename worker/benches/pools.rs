//! Criterion benches for the worker's pools: the KV slot allocator (a 4096-token prefill's
//! worth of slots, and one decode token) and the request-to-token pool's rows.
//! Run: `cargo bench -p worker --bench pools`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use worker::kv::alloc::KvSlotAllocator;
use worker::kv::req_to_token::ReqToTokenPool;

fn bench_kv_alloc(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv_slot_allocator");
    let mut alloc = KvSlotAllocator::new(1 << 20);
    let mut out = Vec::with_capacity(4096);
    g.throughput(Throughput::Elements(4096));
    g.bench_function("alloc_free_4096", |b| {
        b.iter(|| {
            out.clear();
            assert!(alloc.alloc_into(black_box(4096), &mut out));
            alloc.free(black_box(&out));
        })
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("alloc_free_1", |b| {
        b.iter(|| {
            out.clear();
            assert!(alloc.alloc_into(black_box(1), &mut out));
            alloc.free(black_box(&out));
        })
    });
    g.finish();
}

fn bench_req_to_token(c: &mut Criterion) {
    let mut g = c.benchmark_group("req_to_token_pool");
    let mut pool = ReqToTokenPool::new(256, 0, 8192);
    g.bench_function("alloc_free_row", |b| {
        b.iter(|| {
            let row = pool.alloc().expect("a free row");
            pool.free(black_box(row)).expect("a held row");
        })
    });
    let slots: Vec<u32> = (0..4096).collect();
    g.throughput(Throughput::Elements(4096));
    g.bench_function("alloc_fill_4096_free_row", |b| {
        b.iter(|| {
            let row = pool.alloc().expect("a free row");
            pool.row_mut(row)[..4096].copy_from_slice(black_box(&slots));
            pool.free(black_box(row)).expect("a held row");
        })
    });
    g.finish();
}

criterion_group!(benches, bench_kv_alloc, bench_req_to_token);
criterion_main!(benches);
