//! The end-to-end tests, one binary: each `e2e_*.rs` file of this directory is a module (it
//! opens with what it checks), `common/` the harness that starts real `dpserve` processes.
//! One file's tests: `cargo test --test e2e e2e_serving::`. (`e2e_cuda.rs` is its own binary.)

mod common;

mod e2e_bench;
mod e2e_cache_aware;
mod e2e_concurrency;
mod e2e_deploy;
mod e2e_disagg;
mod e2e_doc_examples;
mod e2e_embeddings;
mod e2e_failover;
mod e2e_golden;
mod e2e_openai_python;
mod e2e_operator;
mod e2e_overload;
mod e2e_peer_methods;
mod e2e_schemathesis;
mod e2e_serving;
mod e2e_sglang_bench_serving;
mod e2e_sglang_router;
mod e2e_sim;
mod e2e_smollm2;
mod e2e_soak;
mod e2e_structured;
mod e2e_tls;
mod e2e_wire_fuzz;
