//! `exp` for softmax and SiLU that every kernel path computes bit for bit alike, and that the
//! compiler can vectorize (the C library's `expf` is neither: one call per element, and its
//! last bit may differ between libraries). Not a general-purpose libm.
//!
//! Cody–Waite range reduction and the Cephes `expf` polynomial, with plain IEEE multiplies and
//! adds only (no fused multiply-add: on CPUs without FMA it would be a slow software call, and
//! mixing the two would change bits). Relative error ≤ 2 ulp on the clamped range.

/// `log2(e)`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n * LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 · 2^23`: adding and subtracting it rounds to the nearest integer (ties to even), and
/// the integer sits in the low mantissa bits of the sum.
const ROUND: f32 = 12_582_912.0;
/// Inputs are clamped to `[LO, HI]` so that `2^n` stays a normal float. `exp(LO)` ≈ 1.7e-38
/// stands for anything smaller (a softmax weight that small, beside the maximum's 1, is
/// nothing), `exp(HI)` ≈ 1.7e38 for anything larger (SiLU divides by it). NaN stays NaN.
const LO: f32 = -87.0;
const HI: f32 = 88.0;

/// `e^x`, deterministic on every path (see the module comment).
#[inline(always)]
pub fn exp_fixed(x: f32) -> f32 {
    // Comparisons (not `min`/`max`) so a NaN input falls through and comes out NaN.
    let x = if x < LO { LO } else { x };
    let x = if x > HI { HI } else { x };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let z = r * r;
    let p = ((((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * z
        + r)
        + 1.0;
    // n ∈ [-126, 127] after the clamp: the low bits of t hold n + 2^22 (two's complement).
    let n_bits = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits(((n_bits + 127) as u32) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> i64 {
        (a.to_bits() as i64 - b.to_bits() as i64).abs()
    }

    #[test]
    fn close_to_libm_over_the_range() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp() as f32;
            let got = exp_fixed(x);
            worst = worst.max(ulps(got, want));
            x += 0.001_3;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert_eq!(exp_fixed(0.0), 1.0);
    }

    #[test]
    fn edges() {
        assert!(exp_fixed(f32::NAN).is_nan());
        assert_eq!(exp_fixed(-1000.0), exp_fixed(LO));
        assert!(exp_fixed(f32::NEG_INFINITY) > 0.0 && exp_fixed(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_fixed(f32::INFINITY).is_finite() && exp_fixed(f32::INFINITY) > 1e38);
        // SiLU at the extremes stays finite and sensible.
        let silu = |x: f32| x / (1.0 + exp_fixed(-x));
        assert_eq!(silu(200.0), 200.0);
        assert!(silu(-200.0).abs() < 1e-35);
    }
}
