//! Mixture-of-experts MLPs (Mixtral, Qwen3-MoE, Qwen2-MoE) on the CPU: what their
//! `config.json` asks (experts, top-k, `norm_topk_prob`, which layers have experts, a shared
//! expert) and the routed MLP itself.
//! Each token's router logits go through a softmax, its `top_k` most probable experts run
//! their SwiGLU on it, and their outputs are summed weighted by those probabilities
//! (renormalised to sum 1 for Mixtral, and for Qwen3-MoE with `norm_topk_prob`). Experts are
//! visited in index order, each over the tokens routed to it (one GEMM per expert), and a
//! token's sum is taken in that order, as transformers does. The GEMMs are row-wise batch
//! invariant, so which other tokens an expert serves in a step changes no token's result.
//! Qwen2-MoE adds to that sum a shared expert (a SwiGLU every token runs) times
//! `sigmoid(shared_expert_gate · x)`. Not here: DeepSeek's grouped or biased routing, the GPU
//! pass (refused, see `ModelConfig::cuda_refusal`).

use kernels::{LineVec, PackedMatrix};
use serde_json::Value;

use super::error::Result;
use super::family::ModelFamily;
use super::fields::{unsupported, Fields};

/// Fields refused for the other families that the MoE families read themselves.
pub(super) const OWN_FIELDS: &[&str] = &["num_experts", "num_local_experts"];

/// The experts of a mixture-of-experts model.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeOptions {
    pub num_experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: usize,
    /// Whether the chosen experts' probabilities are renormalised to sum 1.
    pub norm_topk_prob: bool,
    /// Each expert's intermediate size (Qwen3-MoE's `moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub expert_intermediate_size: usize,
    /// For each layer, whether its MLP has experts (else it is dense, of `intermediate_size`).
    pub moe_layers: Vec<bool>,
    /// Qwen2-MoE: the intermediate size of the shared expert every token runs.
    pub shared_expert_intermediate_size: Option<usize>,
}

/// One layer's router and experts.
pub(crate) struct MoeWeights {
    /// `[num_experts, hidden]`.
    pub router: PackedMatrix,
    /// Per expert: gate and up fused `[2·inter, hidden]`, and down `[hidden, inter]`.
    pub experts: Vec<(PackedMatrix, PackedMatrix)>,
    /// Qwen2-MoE's shared expert.
    pub shared: Option<SharedExpert>,
}

/// A shared expert: `sigmoid(gate · x) · down(silu(gate_proj x) · up_proj x)`.
pub(crate) struct SharedExpert {
    /// Gate and up fused `[2·inter, hidden]`.
    pub wgu: PackedMatrix,
    /// `[hidden, inter]`.
    pub wdown: PackedMatrix,
    /// `[1, hidden]`.
    pub gate: PackedMatrix,
}

/// The experts of a Mixtral or Qwen3-MoE `config.json`.
pub(super) fn read(f: &Fields<'_>, family: ModelFamily) -> Result<MoeOptions> {
    let layers = f.usize_opt("num_hidden_layers")?.unwrap_or(0);
    let num_experts = expert_count(f, family)?;
    let top_k = positive(
        f,
        "num_experts_per_tok",
        if family == ModelFamily::Mixtral { 2 } else { 8 },
    )?;
    if top_k > num_experts {
        return Err(unsupported(
            f,
            "num_experts_per_tok",
            &Value::from(top_k),
            format!("more than the {num_experts} experts"),
        ));
    }
    let shared_expert_intermediate_size = match family {
        ModelFamily::Qwen2Moe => Some(positive(f, "shared_expert_intermediate_size", 5632)?),
        _ => None,
    };
    let (norm_topk_prob, expert_intermediate_size, moe_layers) = match family {
        // Mixtral always renormalises, and every layer has experts.
        ModelFamily::Mixtral => (
            true,
            positive(f, "intermediate_size", 14336)?,
            vec![true; layers],
        ),
        _ => {
            let step = positive(f, "decoder_sparse_step", 1)?;
            let dense = mlp_only_layers(f)?;
            (
                f.bool_opt("norm_topk_prob")?.unwrap_or(false),
                positive(f, "moe_intermediate_size", 768)?,
                (0..layers)
                    .map(|l| !dense.contains(&l) && (l + 1) % step == 0)
                    .collect(),
            )
        }
    };
    Ok(MoeOptions {
        num_experts,
        top_k,
        norm_topk_prob,
        expert_intermediate_size,
        moe_layers,
        shared_expert_intermediate_size,
    })
}

/// The count `field` (`default` when absent), refused when 0.
fn positive(f: &Fields<'_>, field: &str, default: usize) -> Result<usize> {
    match f.usize_opt(field)?.unwrap_or(default) {
        0 => Err(unsupported(f, field, &Value::from(0), "must be positive")),
        n => Ok(n),
    }
}

/// The number of experts. transformers spells the count both ways (Qwen3MoeConfig maps
/// `num_local_experts` onto `num_experts`, and a checkpoint it saves names only
/// `num_local_experts`): either is read, the family's own name first; two that differ are
/// refused.
fn expert_count(f: &Fields<'_>, family: ModelFamily) -> Result<usize> {
    let (own, alias, default_experts) = match family {
        ModelFamily::Mixtral => ("num_local_experts", "num_experts", 8),
        _ => ("num_experts", "num_local_experts", 128),
    };
    match (f.usize_opt(own)?, f.usize_opt(alias)?) {
        (Some(a), Some(b)) if a != b => Err(unsupported(
            f,
            alias,
            &Value::from(b),
            format!("differs from `{own}` = {a}"),
        )),
        (None, Some(_)) => positive(f, alias, default_experts),
        _ => positive(f, own, default_experts),
    }
}

/// The indices of the layers `mlp_only_layers` keeps dense (none when absent).
fn mlp_only_layers(f: &Fields<'_>) -> Result<Vec<usize>> {
    match f.get("mlp_only_layers") {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_u64().map(|n| n as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                unsupported(
                    f,
                    "mlp_only_layers",
                    &Value::Array(a.clone()),
                    "layer indices",
                )
            }),
        Some(v) => Err(unsupported(f, "mlp_only_layers", v, "expected a list")),
    }
}

/// Each token's experts and weights, as transformers routes: softmax of the router logits (in
/// f32), the `top_k` most probable (ties to the lower index), renormalised if asked. Returns
/// `[tokens][top_k]` of (expert, weight), sorted by expert.
pub(crate) fn route(opts: &MoeOptions, logits: &[f32]) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks_exact(opts.num_experts)
        .map(|row| {
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&a, &b| e[b].total_cmp(&e[a]).then(a.cmp(&b)));
            let mut chosen: Vec<(usize, f32)> = order[..opts.top_k]
                .iter()
                .map(|&i| (i, e[i] / sum))
                .collect();
            if opts.norm_topk_prob {
                let s: f32 = chosen.iter().map(|c| c.1).sum();
                chosen.iter_mut().for_each(|c| c.1 /= s);
            }
            chosen.sort_by_key(|c| c.0);
            chosen
        })
        .collect()
}

/// `out = Σ_experts weight · expert(x)` for the `t` rows of `x` (`[t, hidden]`), `out`
/// `[t, hidden]` overwritten.
pub(crate) fn moe_mlp(opts: &MoeOptions, w: &MoeWeights, x: &[f32], t: usize, out: &mut [f32]) {
    let h = w.router.cols();
    let inter = opts.expert_intermediate_size;
    let mut logits = vec![0f32; t * opts.num_experts];
    kernels::linear_packed(x, t, &w.router, None, &mut logits);
    let routes = route(opts, &logits);
    out.fill(0.0);
    let (mut xs, mut gu, mut act, mut down) = (
        LineVec::new(),
        LineVec::new(),
        LineVec::new(),
        LineVec::new(),
    );
    for (e, (wgu, wdown)) in w.experts.iter().enumerate() {
        let rows: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(r, c)| c.iter().find(|c| c.0 == e).map(|c| (r, c.1)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let n = rows.len();
        xs.resize(n * h);
        for (i, &(r, _)) in rows.iter().enumerate() {
            xs[i * h..(i + 1) * h].copy_from_slice(&x[r * h..(r + 1) * h]);
        }
        gu.resize(n * 2 * inter);
        kernels::linear_packed(&xs, n, wgu, None, &mut gu);
        act.resize(n * inter);
        kernels::silu_mul(&gu, inter, &mut act);
        down.resize(n * h);
        kernels::linear_packed(&act, n, wdown, None, &mut down);
        for (i, &(r, weight)) in rows.iter().enumerate() {
            let o = &mut out[r * h..(r + 1) * h];
            for (o, &d) in o.iter_mut().zip(&down[i * h..(i + 1) * h]) {
                *o += d * weight;
            }
        }
    }
    if let Some(s) = &w.shared {
        // Added after the routed sum, as transformers adds it.
        let si = s.wdown.cols();
        gu.resize(t * 2 * si);
        kernels::linear_packed(x, t, &s.wgu, None, &mut gu);
        act.resize(t * si);
        kernels::silu_mul(&gu, si, &mut act);
        down.resize(t * h);
        kernels::linear_packed(&act, t, &s.wdown, None, &mut down);
        let mut g = vec![0f32; t];
        kernels::linear_packed(x, t, &s.gate, None, &mut g);
        for (r, &g) in g.iter().enumerate() {
            let gate = 1.0 / (1.0 + (-g).exp());
            let o = &mut out[r * h..(r + 1) * h];
            for (o, &d) in o.iter_mut().zip(&down[r * h..(r + 1) * h]) {
                *o += gate * d;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(norm: bool) -> MoeOptions {
        MoeOptions {
            num_experts: 4,
            top_k: 2,
            norm_topk_prob: norm,
            expert_intermediate_size: 2,
            moe_layers: vec![true],
            shared_expert_intermediate_size: None,
        }
    }

    #[test]
    fn routing_takes_the_top_k_by_softmax_and_renormalises_when_asked() {
        let logits = [0.0, 2.0, 1.0, 2.0f32];
        let p: Vec<f32> = {
            let e: Vec<f32> = logits.iter().map(|x| (x - 2.0f32).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        };
        let r = route(&opts(false), &logits);
        assert_eq!(r, [vec![(1, p[1]), (3, p[3])]]);
        let r = route(&opts(true), &logits);
        assert_eq!(r[0].iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        assert!((r[0][0].1 - 0.5).abs() < 1e-7 && (r[0][1].1 - 0.5).abs() < 1e-7);
    }
}
