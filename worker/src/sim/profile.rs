//! What a simulated rank pretends to be: one GPU and the model it serves, as the handful of
//! numbers a roofline needs. Built-in profiles by name, and a TOML file whose keys override the
//! chosen profile's (`--sim-config`). Not the cost model itself ([`super::cost`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Result, SimError};

/// `--sim-profile` when not given.
pub const DEFAULT_SIM_PROFILE: &str = "h100-qwen3.5-122b-a10b-fp8";

/// The fastest [`SimProfile::speed`]: beyond it a step's modelled time nears the host's own
/// time per step, which does not scale.
pub const MAX_SPEED: f64 = 16.0;

/// A GPU and a model, in the units their data sheets use. Every field is required in a profile
/// and may be overridden one by one in a `--sim-config` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimProfile {
    /// The profile's name, reported by `/get_server_info` (a `--sim-config` file may rename it).
    pub name: String,
    /// The modelled device, for people (`"H100 SXM 80GB"`).
    pub gpu: String,
    /// The modelled model, for people (`"Qwen3.5-122B-A10B-FP8"`).
    pub model: String,
    /// Dense peak of the matrix units at the weights' data type, TFLOP/s.
    pub peak_tflops: f64,
    /// Share of `peak_tflops` a step achieves (model FLOPs utilisation), in (0, 1].
    pub flops_efficiency: f64,
    /// Device memory bandwidth, GB/s (10^9 bytes).
    pub mem_bandwidth_gbs: f64,
    /// Share of `mem_bandwidth_gbs` a step achieves, in (0, 1].
    pub bandwidth_efficiency: f64,
    /// Fixed cost of every step (kernel launches, scheduling, collectives), milliseconds.
    pub step_overhead_ms: f64,
    /// Device memory, GB (10^9 bytes).
    pub gpu_mem_gb: f64,
    /// Share of device memory for weights and the KV pool (SGLang's `--mem-fraction-static`).
    pub mem_fraction: f64,
    /// Parameters, billions: all of them (they sit in memory) ...
    pub total_params_b: f64,
    /// ... and those one token passes through (= total for a dense model; a MoE's active ones).
    pub active_params_b: f64,
    /// Bytes per weight (1 for FP8, 2 for BF16, 4 for f32).
    pub bytes_per_param: f64,
    /// GPUs the weights are split over (tensor or expert parallelism); each rank holds and
    /// reads `1 / weight_shards` of them. 1: a whole copy per rank.
    pub weight_shards: u32,
    /// Layers that keep a KV cache (full attention; a hybrid model's linear-attention layers
    /// keep none).
    pub kv_layers: u32,
    /// Query heads × head dim of those layers: the width attention's FLOPs scale with.
    pub q_dim: u32,
    /// KV cache bytes one token takes over all layers (K and V).
    pub kv_bytes_per_token: u64,
    /// Longest sequence (prompt + output) a request may have.
    pub context_len: usize,
    /// Not the device's: how many times faster than modelled its steps run (each sleeps its
    /// modelled time ÷ speed). A study's shortcut: `dpserve bench --sim-speed` sends its
    /// workload this much faster and multiplies what it measures back, so a sweep that would
    /// take an hour takes 60 ÷ speed minutes. What does not scale (HTTP, tokenizing, routing,
    /// the host's own time per step) reads `speed` times larger in the results. 1: real time.
    #[serde(default = "real_time")]
    pub speed: f64,
}

fn real_time() -> f64 {
    1.0
}

impl SimProfile {
    /// The built-in profiles' names.
    pub const BUILTIN: [&'static str; 2] = [DEFAULT_SIM_PROFILE, "cpu-calibrated"];

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Self> {
        match name {
            DEFAULT_SIM_PROFILE => Ok(Self::h100_qwen35_122b_a10b_fp8()),
            "cpu-calibrated" => Ok(Self::cpu_calibrated()),
            other => Err(SimError::UnknownProfile {
                name: other.to_string(),
                known: Self::BUILTIN.join(", "),
            }),
        }
    }

    /// The deployment of SGLang's published prefix-affinity result: 8 × H100 SXM 80GB serving
    /// Qwen3.5-122B-A10B-FP8 with DP attention, so each rank is one GPU holding an eighth of
    /// the (expert- and tensor-parallel) weights and its own requests' KV.
    ///
    /// Model: 48 layers, 12 of them gated (full) attention with a KV cache, the rest Gated
    /// DeltaNet; 256 experts, 8 routed + 1 shared active; 122B parameters, about 10B active.
    /// Assumed (not published in what we read): 2 KV heads × head dim 256 and 32 query heads
    /// in the attention layers (as the smaller Qwen3.5 and Qwen3-Next), KV cache in BF16.
    /// GPU: 1979 TFLOP/s dense FP8, 3.35 TB/s HBM3, 80 GB.
    pub fn h100_qwen35_122b_a10b_fp8() -> Self {
        SimProfile {
            name: DEFAULT_SIM_PROFILE.into(),
            gpu: "H100 SXM 80GB".into(),
            model: "Qwen3.5-122B-A10B-FP8 (DP attention over 8 GPUs)".into(),
            peak_tflops: 1979.0,
            flops_efficiency: 0.4,
            mem_bandwidth_gbs: 3350.0,
            bandwidth_efficiency: 0.75,
            step_overhead_ms: 4.0,
            gpu_mem_gb: 80.0,
            mem_fraction: 0.85,
            total_params_b: 122.0,
            active_params_b: 10.0,
            bytes_per_param: 1.0,
            weight_shards: 8,
            kv_layers: 12,
            q_dim: 32 * 256,
            // 12 layers × (K + V) × 2 heads × 256 × 2 bytes.
            kv_bytes_per_token: 12 * 2 * 2 * 256 * 2,
            context_len: 8192,
            speed: 1.0,
        }
    }

    /// The built-in base model (`--builtin-size base`, about 29.4M f32 parameters) on two
    /// threads of the AVX-512 CPUs these machines have: the ≈ 470 GFLOP/s GEMM ceiling and
    /// ≈ 50 GB/s copy measured in docs/ARCHITECTURE.md, at the shares of them the engine benchmark
    /// reaches. For checking the cost model against the real CPU worker, not for GPU studies.
    pub fn cpu_calibrated() -> Self {
        SimProfile {
            name: "cpu-calibrated".into(),
            gpu: "2-thread AVX-512 CPU".into(),
            model: "dpserve built-in base (29.4M, f32)".into(),
            peak_tflops: 0.47,
            flops_efficiency: 0.5,
            mem_bandwidth_gbs: 50.0,
            bandwidth_efficiency: 0.5,
            step_overhead_ms: 1.0,
            gpu_mem_gb: 4.0,
            mem_fraction: 0.5,
            total_params_b: 0.0294,
            active_params_b: 0.0294,
            bytes_per_param: 4.0,
            weight_shards: 1,
            kv_layers: 8,
            q_dim: 512,
            // 8 layers × (K + V) × 4 heads × 64 × 4 bytes.
            kv_bytes_per_token: 8 * 2 * 4 * 64 * 4,
            context_len: 8192,
            speed: 1.0,
        }
    }

    /// `base` (a built-in name) with the keys of the TOML file at `path` laid over it; the file
    /// may name another built-in base with `base = "NAME"`. Unknown keys are an error.
    pub fn load(base: &str, path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else {
            return Self::builtin(base);
        };
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Config {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::overlay(base, &text).map_err(|e| match e {
            SimError::Invalid { field, reason } => SimError::Config {
                path: path.display().to_string(),
                reason: format!("{field}: {reason}"),
            },
            other => other,
        })
    }

    /// [`Self::load`] from the file's text.
    pub fn overlay(base: &str, toml_text: &str) -> Result<Self> {
        let bad = |reason: String| SimError::Invalid {
            field: "sim config".into(),
            reason,
        };
        let mut over: toml::Table = toml_text.parse().map_err(|e| bad(format!("{e}")))?;
        let base = match over.remove("base") {
            Some(toml::Value::String(name)) => name,
            Some(other) => return Err(bad(format!("base must be a profile name, got {other}"))),
            None => base.to_string(),
        };
        let mut table =
            toml::Table::try_from(Self::builtin(&base)?).map_err(|e| bad(format!("{e}")))?;
        for (key, value) in over {
            // Integers where floats are expected are fine in a hand-written file.
            let value = match (table.get(&key), value) {
                (Some(toml::Value::Float(_)), toml::Value::Integer(i)) => {
                    toml::Value::Float(i as f64)
                }
                (_, v) => v,
            };
            table.insert(key, value);
        }
        let profile: SimProfile = table.try_into().map_err(|e| bad(format!("{e}")))?;
        profile.check()?;
        Ok(profile)
    }

    /// Every number in its range, and the model fits its share of the device.
    pub fn check(&self) -> Result<()> {
        let invalid = |field: &str, reason: String| {
            Err(SimError::Invalid {
                field: field.into(),
                reason,
            })
        };
        for (field, v) in [
            ("peak_tflops", self.peak_tflops),
            ("mem_bandwidth_gbs", self.mem_bandwidth_gbs),
            ("gpu_mem_gb", self.gpu_mem_gb),
            ("total_params_b", self.total_params_b),
            ("active_params_b", self.active_params_b),
            ("bytes_per_param", self.bytes_per_param),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return invalid(field, format!("must be a number > 0, got {v}"));
            }
        }
        for (field, v) in [
            ("flops_efficiency", self.flops_efficiency),
            ("bandwidth_efficiency", self.bandwidth_efficiency),
            ("mem_fraction", self.mem_fraction),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                return invalid(field, format!("must be in (0, 1], got {v}"));
            }
        }
        if !(self.speed.is_finite() && (1.0..=MAX_SPEED).contains(&self.speed)) {
            return invalid(
                "speed",
                format!("must be in [1, {MAX_SPEED}], got {}", self.speed),
            );
        }
        if !(self.step_overhead_ms.is_finite() && self.step_overhead_ms >= 0.0) {
            return invalid(
                "step_overhead_ms",
                format!("must be >= 0, got {}", self.step_overhead_ms),
            );
        }
        if self.active_params_b > self.total_params_b {
            return invalid(
                "active_params_b",
                format!(
                    "{} is more than total_params_b {}",
                    self.active_params_b, self.total_params_b
                ),
            );
        }
        for (field, v) in [
            ("weight_shards", self.weight_shards as u64),
            ("kv_bytes_per_token", self.kv_bytes_per_token),
            ("context_len", self.context_len as u64),
        ] {
            if v == 0 {
                return invalid(field, "must be at least 1".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_is_valid_and_named_as_listed() {
        for name in SimProfile::BUILTIN {
            let p = SimProfile::builtin(name).unwrap();
            assert_eq!(p.name, name);
            p.check().unwrap();
        }
        let err = SimProfile::builtin("a100").unwrap_err().to_string();
        assert!(
            err.contains("a100") && err.contains("cpu-calibrated"),
            "{err}"
        );
    }

    #[test]
    fn a_config_file_overrides_keys_of_its_base() {
        let p = SimProfile::overlay(
            DEFAULT_SIM_PROFILE,
            "name = \"h200\"\ngpu_mem_gb = 141\nmem_bandwidth_gbs = 4800.0\n",
        )
        .unwrap();
        assert_eq!((p.name.as_str(), p.gpu_mem_gb), ("h200", 141.0));
        assert_eq!(p.mem_bandwidth_gbs, 4800.0);
        assert_eq!(
            p.peak_tflops, 1979.0,
            "untouched keys keep the base's value"
        );
        let p = SimProfile::overlay(DEFAULT_SIM_PROFILE, "base = \"cpu-calibrated\"").unwrap();
        assert_eq!(p, SimProfile::cpu_calibrated());
        assert_eq!(p.speed, 1.0, "real time unless a file says otherwise");
        let p = SimProfile::overlay(DEFAULT_SIM_PROFILE, "speed = 4").unwrap();
        assert_eq!(p.speed, 4.0);
    }

    #[test]
    fn bad_config_files_say_what_is_wrong() {
        for (text, want) in [
            ("peak_tflop = 3", "peak_tflop"),
            ("flops_efficiency = 1.5", "flops_efficiency"),
            ("active_params_b = 500", "active_params_b"),
            ("weight_shards = 0", "weight_shards"),
            ("speed = 0.5", "speed"),
            ("speed = 17", "speed"),
            ("base = \"b200\"", "b200"),
            ("gpu_mem_gb = \"lots\"", "gpu_mem_gb"),
            ("not toml", "sim config"),
        ] {
            let err = SimProfile::overlay(DEFAULT_SIM_PROFILE, text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
