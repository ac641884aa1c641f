//! RoPE scaling: how a checkpoint's `rope_scaling` (or `rope_parameters`) turns the base
//! inverse frequencies `theta^(-2i/d)` into the ones its positions rotate by, and (YaRN) the
//! factor its cos/sin are scaled by. The tables and the rotation are `kernels::rope`'s; the CPU
//! and the GPU pass both build their tables with [`Rope::tables_into`], so they cannot
//! disagree. Not here: types that depend on the sequence length (dynamic NTK, LongRoPE); the
//! config refuses them.

/// The `rope_type` of a checkpoint, with its parameters, as Hugging Face computes it
/// (`transformers.modeling_rope_utils`, each step in f32 like its tensors).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `default` or no scaling: the base frequencies.
    None,
    /// `linear`: every frequency divided by `factor` (positions interpolated).
    Linear { factor: f32 },
    /// `llama3` (Llama 3.1–3.3): wavelengths longer than `original_max_position_embeddings /
    /// low_freq_factor` divided by `factor`, shorter than `… / high_freq_factor` kept, and a
    /// smooth blend between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// `yarn`: frequencies blended between divided by `factor` (below `beta_slow` rotations
    /// over `original_max_position_embeddings`) and kept (above `beta_fast`), by a linear ramp
    /// over the pair index; cos and sin scaled by `attention_factor`.
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        /// Whether the ramp's ends are rounded to whole pair indices (transformers' default).
        truncate: bool,
        attention_factor: f32,
    },
}

/// What a step's RoPE tables are built from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rope {
    /// `[head_dim / 2]`, scaling applied.
    pub inv_freq: Vec<f32>,
    /// Every cos and sin is multiplied by it (1 but for YaRN).
    pub attention_factor: f32,
}

impl Rope {
    /// cos/sin `[positions.len(), head_dim / 2]` into reused buffers.
    pub fn tables_into(&self, positions: &[usize], cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        kernels::rope_tables_from_freqs_into(positions, &self.inv_freq, cos, sin);
        if self.attention_factor != 1.0 {
            let a = self.attention_factor;
            cos.iter_mut().chain(sin.iter_mut()).for_each(|x| *x *= a);
        }
    }
}

impl RopeScaling {
    /// What the tables of a model with RoPE base `theta` and heads of `head_dim` are built from.
    pub(crate) fn rope(&self, head_dim: usize, theta: f32) -> Rope {
        Rope {
            inv_freq: self.inv_freq(head_dim, theta),
            attention_factor: match *self {
                RopeScaling::Yarn {
                    attention_factor, ..
                } => attention_factor,
                _ => 1.0,
            },
        }
    }

    /// The inverse frequencies `[head_dim / 2]` for RoPE base `theta`.
    pub fn inv_freq(&self, head_dim: usize, theta: f32) -> Vec<f32> {
        let mut f = kernels::rope_inv_freq(head_dim, theta);
        match *self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => f.iter_mut().for_each(|x| *x /= factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                for x in &mut f {
                    let wavelen = 2.0 * std::f32::consts::PI / *x;
                    *x = if wavelen < high_wavelen {
                        *x
                    } else if wavelen > low_wavelen {
                        *x / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * *x / factor + smooth * *x
                    };
                }
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let (d, base) = (head_dim as f64, theta as f64);
                let orig = original_max_position_embeddings as f64;
                // The pair index at which `rotations` turns fit in the original context.
                let dim_of = |rotations: f64| {
                    d * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
                };
                let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                for (i, x) in f.iter_mut().enumerate() {
                    let pos = theta.powf((2 * i) as f32 / head_dim as f32);
                    let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    *x = 1.0 / (factor * pos) * (1.0 - keep) + 1.0 / pos * keep;
                }
            }
        }
        f
    }
}

/// YaRN's default cos/sin factor (transformers' `get_mscale`): `0.1·ln(factor)·mscale + 1`,
/// or the ratio of two such when both `mscale` and `mscale_all_dim` are given.
pub(crate) fn yarn_attention_factor(factor: f64, mscale: Option<f64>, all_dim: Option<f64>) -> f64 {
    let get = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    match (mscale, all_dim) {
        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => get(m) / get(a),
        _ => get(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_keeps_high_divides_low_and_blends_the_middle() {
        // head_dim 8, theta 10000: wavelengths 2π·{1, 10, 100, 1000} ≈ 6.3, 63, 628, 6283.
        let base = kernels::rope_inv_freq(8, 10000.0);
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 128,
        };
        let f = s.inv_freq(8, 10000.0);
        // 6.3 < 128/4: kept; 628 and 6283 > 128: divided by 8.
        assert_eq!(f[0], base[0]);
        assert_eq!(f[2], base[2] / 8.0);
        assert_eq!(f[3], base[3] / 8.0);
        // 63 lies between 32 and 128: between the two.
        assert!(f[1] < base[1] && f[1] > base[1] / 8.0, "{f:?}");
        let lin = RopeScaling::Linear { factor: 4.0 }.inv_freq(8, 10000.0);
        assert!(lin.iter().zip(&base).all(|(a, b)| *a == b / 4.0));
        assert_eq!(RopeScaling::None.inv_freq(8, 10000.0), base);
    }

    #[test]
    fn yarn_keeps_fast_pairs_divides_slow_ones_and_scales_the_tables() {
        // head_dim 16, original context 32: the ramp runs from pair 0 to pair 2.
        let base = kernels::rope_inv_freq(16, 10000.0);
        let s = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 32,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: yarn_attention_factor(4.0, None, None) as f32,
        };
        let rope = s.rope(16, 10000.0);
        let f = &rope.inv_freq;
        assert_eq!(f[0], base[0]);
        assert!(f[1] < base[1] && f[1] > base[1] / 4.0, "{f:?}");
        assert!(f[2..]
            .iter()
            .zip(&base[2..])
            .all(|(a, b)| (a - b / 4.0).abs() <= 1e-6 * b));
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rope.tables_into(&[0], &mut cos, &mut sin);
        assert!(cos.iter().all(|&c| c == rope.attention_factor) && sin.iter().all(|&s| s == 0.0));
        assert!((rope.attention_factor - 1.138_629_4).abs() < 1e-6);
    }
}
