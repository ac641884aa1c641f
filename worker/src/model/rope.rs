//! RoPE scaling: how a checkpoint's `rope_scaling` (or `rope_parameters`) turns the base
//! inverse frequencies `theta^(-2i/d)` into the ones its positions rotate by. Only the
//! frequencies change (the tables and the rotation are `kernels::rope`'s), so the CPU and the
//! GPU pass, which both take their tables from [`RopeScaling::inv_freq`], cannot disagree.
//! Not here: types that also rescale cos/sin or depend on the sequence length (YaRN, dynamic
//! NTK, LongRoPE); the config refuses them.

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
}

impl RopeScaling {
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
        }
        f
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
}
