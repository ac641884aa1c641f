//! The roofline cost of one model step on a simulated GPU. A step (prefill chunks or one decode
//! token per request) does `flops` of arithmetic and moves `bytes` through device memory; it
//! takes the longer of the two at the device's achieved rates, plus a fixed overhead:
//!
//! ```text
//! flops  = Σ_seq 2·active_params·n                                  (matmuls, per new token)
//!        + Σ_seq 4·kv_layers·q_dim·(n·c + n·(n+1)/2)                (QKᵀ and AV over context)
//! bytes  = total_params·bytes_per_param / weight_shards              (this rank's weights, once)
//!        + Σ_seq kv_bytes_per_token·(c + n)                          (its context's KV, once)
//! time   = step_overhead + max(flops / (peak·flops_eff), bytes / (bandwidth·bw_eff))
//! ```
//!
//! with `n` a sequence's new tokens this step and `c` those before them (cached prefix, earlier
//! chunks, generated tokens). A prefill of thousands of tokens lands on the compute side, a
//! decode step of a small batch on the memory side: one formula covers both. Linear in each
//! input, so a step never gets cheaper by adding work.

use std::time::Duration;

use super::{Result, SimError, SimProfile};

/// A pool larger than this many token slots is cut to it: the slot allocator keeps 4 bytes per
/// slot in host memory, and 64 simulated ranks on one host must stay small.
/// `--max-total-tokens` sets any size.
pub const SIM_MAX_POOL_TOKENS: usize = 1 << 20;

/// One sequence's work in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqWork {
    /// Tokens computed this step.
    pub new_tokens: usize,
    /// Tokens before them whose KV is read (cached prefix, earlier chunks, generated tokens).
    pub context: usize,
}

/// What a step costs, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    pub flops: f64,
    pub bytes: f64,
    pub compute_s: f64,
    pub memory_s: f64,
    /// `step_overhead + max(compute_s, memory_s)`; zero for an empty step.
    pub time: Duration,
}

/// How the KV pool's size came about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSize {
    pub tokens: usize,
    /// `gpu_mem · mem_fraction − weight_bytes`.
    pub budget_bytes: f64,
    /// The budget allowed more than [`SIM_MAX_POOL_TOKENS`].
    pub capped: bool,
}

/// A profile's rates, ready for many steps.
#[derive(Debug, Clone)]
pub struct CostModel {
    profile: SimProfile,
}

impl CostModel {
    pub fn new(profile: SimProfile) -> Self {
        CostModel { profile }
    }

    pub fn profile(&self) -> &SimProfile {
        &self.profile
    }

    /// Weight bytes this rank holds (and reads once per step).
    pub fn weight_bytes(&self) -> f64 {
        let p = &self.profile;
        p.total_params_b * 1e9 * p.bytes_per_param / f64::from(p.weight_shards)
    }

    /// Achieved FLOP/s and bytes/s.
    fn rates(&self) -> (f64, f64) {
        let p = &self.profile;
        (
            p.peak_tflops * 1e12 * p.flops_efficiency,
            p.mem_bandwidth_gbs * 1e9 * p.bandwidth_efficiency,
        )
    }

    /// The cost of one step over `seqs`.
    pub fn step(&self, seqs: &[SeqWork]) -> StepCost {
        let p = &self.profile;
        let new: usize = seqs.iter().map(|s| s.new_tokens).sum();
        if new == 0 {
            return StepCost {
                flops: 0.0,
                bytes: 0.0,
                compute_s: 0.0,
                memory_s: 0.0,
                time: Duration::ZERO,
            };
        }
        let attn_per_pair = 4.0 * f64::from(p.kv_layers) * f64::from(p.q_dim);
        let mut flops = 2.0 * p.active_params_b * 1e9 * new as f64;
        let mut bytes = self.weight_bytes();
        for s in seqs {
            let (n, c) = (s.new_tokens as f64, s.context as f64);
            flops += attn_per_pair * (n * c + n * (n + 1.0) / 2.0);
            bytes += p.kv_bytes_per_token as f64 * (c + n);
        }
        let (flop_rate, byte_rate) = self.rates();
        let (compute_s, memory_s) = (flops / flop_rate, bytes / byte_rate);
        let seconds = p.step_overhead_ms / 1e3 + compute_s.max(memory_s);
        StepCost {
            flops,
            bytes,
            compute_s,
            memory_s,
            time: Duration::from_secs_f64(seconds),
        }
    }

    /// KV pool slots: what is left of the device's share once the weights are in, per token's
    /// KV, at most [`SIM_MAX_POOL_TOKENS`]. An error when the weights alone do not fit.
    pub fn pool_size(&self) -> Result<PoolSize> {
        let p = &self.profile;
        let budget_bytes = p.gpu_mem_gb * 1e9 * p.mem_fraction - self.weight_bytes();
        let tokens = (budget_bytes / p.kv_bytes_per_token as f64).floor();
        if tokens < 1.0 {
            return Err(SimError::Invalid {
                field: "gpu_mem_gb".into(),
                reason: format!(
                    "{} GB × mem_fraction {} holds no KV beside {:.1} GB of weights",
                    p.gpu_mem_gb,
                    p.mem_fraction,
                    self.weight_bytes() / 1e9
                ),
            });
        }
        let capped = tokens > SIM_MAX_POOL_TOKENS as f64;
        Ok(PoolSize {
            tokens: if capped {
                SIM_MAX_POOL_TOKENS
            } else {
                tokens as usize
            },
            budget_bytes,
            capped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round numbers: 1 TFLOP/s and 1 GB/s achieved, 1 ms overhead, a dense 1B model in
    /// 1-byte weights, 2 KV layers of width 100, 1000 KV bytes per token.
    fn round() -> CostModel {
        CostModel::new(SimProfile {
            peak_tflops: 2.0,
            flops_efficiency: 0.5,
            mem_bandwidth_gbs: 4.0,
            bandwidth_efficiency: 0.25,
            step_overhead_ms: 1.0,
            gpu_mem_gb: 2.0,
            mem_fraction: 1.0,
            total_params_b: 1.0,
            active_params_b: 1.0,
            bytes_per_param: 1.0,
            weight_shards: 1,
            kv_layers: 2,
            q_dim: 100,
            kv_bytes_per_token: 1000,
            ..SimProfile::cpu_calibrated()
        })
    }

    fn seq(new_tokens: usize, context: usize) -> SeqWork {
        SeqWork {
            new_tokens,
            context,
        }
    }

    #[test]
    fn the_formulas_on_round_numbers() {
        let m = round();
        // Prefill of 1000 tokens after 500 cached: 2e12 matmul FLOPs plus
        // 4·2·100·(1000·500 + 1000·1001/2) = 8.004e8 attention FLOPs → 2.0008 s of compute;
        // 1e9 weight bytes + 1000·1500 KV bytes → 1.0015 s of memory.
        let c = m.step(&[seq(1000, 500)]);
        assert_eq!(c.flops, 2e12 + 800.0 * (500_000.0 + 500_500.0));
        assert_eq!(c.bytes, 1e9 + 1.5e6);
        assert!((c.compute_s - 2.0008004).abs() < 1e-9, "{c:?}");
        assert!((c.memory_s - 1.0015).abs() < 1e-9, "{c:?}");
        assert!((c.time.as_secs_f64() - 2.0018004).abs() < 1e-6, "{c:?}");
        // Decode of 4 sequences at 100 tokens of context: memory-bound, 1e9 + 4·1000·101 bytes.
        let c = m.step(&[seq(1, 100); 4]);
        assert!(c.memory_s > c.compute_s);
        assert!(
            (c.time.as_secs_f64() - (0.001 + 1.000404)).abs() < 1e-6,
            "{c:?}"
        );
        assert_eq!(m.step(&[]).time, Duration::ZERO);
        assert_eq!(m.step(&[seq(0, 100)]).time, Duration::ZERO);
    }

    #[test]
    fn more_work_never_costs_less() {
        let m = CostModel::new(SimProfile::h100_qwen35_122b_a10b_fp8());
        let t = |seqs: &[SeqWork]| m.step(seqs).time;
        for n in [1, 16, 128, 1024, 4096] {
            for c in [0, 100, 4096] {
                assert!(t(&[seq(n + 1, c)]) >= t(&[seq(n, c)]), "n={n} c={c}");
                assert!(t(&[seq(n, c + 1)]) >= t(&[seq(n, c)]), "n={n} c={c}");
                assert!(t(&[seq(n, c), seq(1, c)]) >= t(&[seq(n, c)]), "n={n} c={c}");
            }
        }
        // A cached prefix makes a prompt cheaper than computing it.
        assert!(t(&[seq(128, 4096)]) < t(&[seq(4224, 0)]) / 4);
    }

    #[test]
    fn the_h100_profile_lands_where_its_roofline_says() {
        let m = CostModel::new(SimProfile::h100_qwen35_122b_a10b_fp8());
        // 15.25 GB of weights per GPU at 0.75 × 3.35 TB/s: a decode step of 8 short
        // requests is about 6.1 ms of memory plus 4 ms of overhead.
        assert!((m.weight_bytes() - 15.25e9).abs() < 1.0);
        let decode = m.step(&[seq(1, 500); 8]);
        assert!(decode.memory_s > decode.compute_s);
        let ms = decode.time.as_secs_f64() * 1e3;
        assert!((10.0..10.3).contains(&ms), "{ms} ms");
        // A 4224-token prompt is compute-bound: 2·10e9·4224 FLOPs at 0.4 × 1979 TFLOP/s.
        let prefill = m.step(&[seq(4224, 0)]);
        assert!(prefill.compute_s > prefill.memory_s);
        let ms = prefill.time.as_secs_f64() * 1e3;
        assert!((110.0..120.0).contains(&ms), "{ms} ms");
        // (80 GB · 0.85 − 15.25 GB) / 24 KiB per token = 2.15M slots, cut to the cap.
        let pool = m.pool_size().unwrap();
        assert!((pool.budget_bytes - 52.75e9).abs() < 1.0);
        assert_eq!((pool.tokens, pool.capped), (SIM_MAX_POOL_TOKENS, true));
    }

    #[test]
    fn the_pool_is_what_the_weights_leave() {
        // (2 GB − 1 GB of weights) / 1000 bytes per token.
        let pool = round().pool_size().unwrap();
        assert_eq!((pool.tokens, pool.capped), (1_000_000, false));
        let mut p = round().profile().clone();
        p.gpu_mem_gb = 1.0;
        let err = CostModel::new(p).pool_size().unwrap_err().to_string();
        assert!(err.contains("holds no KV"), "{err}");
    }
}
