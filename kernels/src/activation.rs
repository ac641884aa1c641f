//! Element-wise ops of the Llama block (SwiGLU, residual add) and argmax over logits.

/// SwiGLU: `out[t, i] = silu(gu[t, i]) * gu[t, inter + i]` for `gu` = `[tokens, 2·inter]` holding
/// the fused gate and up projections.
pub fn silu_mul(gu: &[f32], inter: usize, out: &mut [f32]) {
    assert!(inter > 0 && gu.len() == out.len() * 2, "silu_mul shape");
    for (g, o) in gu.chunks(2 * inter).zip(out.chunks_mut(inter)) {
        let (gate, up) = g.split_at(inter);
        for i in 0..inter {
            let x = gate[i];
            o[i] = x / (1.0 + (-x).exp()) * up[i];
        }
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add shape");
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Index of the largest value, ties to the lowest index; NaNs are never chosen unless all are.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v || (!found && !v.is_nan()) {
            best = i;
            best_v = v;
            found = true;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_ties_low_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn silu_mul_matches_formula() {
        let gu = [1.0f32, -2.0, 3.0, 4.0];
        let mut o = [0f32; 2];
        silu_mul(&gu, 2, &mut o);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert!((o[0] - silu(1.0) * 3.0).abs() < 1e-6);
        assert!((o[1] - silu(-2.0) * 4.0).abs() < 1e-6);
    }
}
