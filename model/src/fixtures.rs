//! Checkpoints made from dummy weights, written as Hugging Face saves them: for the model's
//! unit tests, and (the `fixtures` feature) for the worker's tests of its start-up refusals.

use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, View};

use crate::weights::Weights;
use crate::*;

pub(crate) fn small_cfg() -> ModelConfig {
    ModelConfig {
        family: ModelFamily::Llama,
        vocab_size: 48,
        hidden_size: 32,
        intermediate_size: 40,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        qk_norm: false,
        sliding_window: None,
        gemma: None,
        moe: None,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        model_id: "small".into(),
    }
}

pub(crate) fn config_json(c: &ModelConfig) -> String {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": c.qkv_bias, "mlp_bias": c.mlp_bias,
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "tie_word_embeddings": c.tie_word_embeddings,
        "rope_scaling": null, "bos_token_id": 1, "eos_token_id": [2, 3]
    })
    .to_string()
}

pub(crate) struct Raw {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

pub(crate) fn encode(v: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// The HF tensors of dummy weights (un-fusing q/k/v and gate/up).
pub(crate) fn hf_tensors(c: &ModelConfig, w: &Weights, dtype: Dtype) -> HashMap<String, Raw> {
    let (h, i, q, kv) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim());
    let mut t = HashMap::new();
    let mut put = |name: String, shape: Vec<usize>, v: &[f32]| {
        t.insert(
            name,
            Raw {
                dtype,
                shape,
                data: encode(v, dtype),
            },
        );
    };
    put(
        "model.embed_tokens.weight".into(),
        vec![c.vocab_size, h],
        &w.embed.unpack(),
    );
    put("model.norm.weight".into(), vec![h], &w.norm);
    if let Some(lm) = &w.lm_head {
        put("lm_head.weight".into(), vec![c.vocab_size, h], &lm.unpack());
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let (wqkv, wgu) = (lw.wqkv.unpack(), lw.wgu.unpack());
        put(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            &lw.attn_norm,
        );
        put(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            &lw.mlp_norm,
        );
        put(
            format!("{p}.self_attn.q_proj.weight"),
            vec![q, h],
            &wqkv[..q * h],
        );
        put(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv, h],
            &wqkv[q * h..(q + kv) * h],
        );
        put(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv, h],
            &wqkv[(q + kv) * h..],
        );
        if let Some(b) = &lw.bqkv {
            put(format!("{p}.self_attn.q_proj.bias"), vec![q], &b[..q]);
            put(
                format!("{p}.self_attn.k_proj.bias"),
                vec![kv],
                &b[q..q + kv],
            );
            put(format!("{p}.self_attn.v_proj.bias"), vec![kv], &b[q + kv..]);
        }
        if let Some(b) = &lw.bo {
            put(format!("{p}.self_attn.o_proj.bias"), vec![h], b);
        }
        put(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, q],
            &lw.wo.unpack(),
        );
        put(
            format!("{p}.mlp.gate_proj.weight"),
            vec![i, h],
            &wgu[..i * h],
        );
        put(format!("{p}.mlp.up_proj.weight"), vec![i, h], &wgu[i * h..]);
        if let (Some(bgu), Some(bdown)) = (&lw.bgu, &lw.bdown) {
            put(format!("{p}.mlp.gate_proj.bias"), vec![i], &bgu[..i]);
            put(format!("{p}.mlp.up_proj.bias"), vec![i], &bgu[i..]);
            put(format!("{p}.mlp.down_proj.bias"), vec![h], bdown);
        }
        put(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, i],
            &lw.wdown.unpack(),
        );
    }
    t
}

pub(crate) fn write_model(dir: &Path, c: &ModelConfig, tensors: &HashMap<String, Raw>) {
    std::fs::write(dir.join("config.json"), config_json(c)).unwrap();
    let views: Vec<(&String, &Raw)> = tensors.iter().collect();
    safetensors::serialize_to_file(views, &None, &dir.join("model.safetensors")).unwrap();
}

/// A Qwen2 checkpoint in `dir` whose o_proj biases its config (`attention_bias` false) does
/// not use (also the worker's start-up tests' bad checkpoint).
pub fn write_checkpoint_with_unused_o_bias(dir: &Path) {
    let mut with_o_bias = small_cfg();
    with_o_bias.mlp_bias = false;
    let w = Weights::dummy(&with_o_bias, 11);
    let mut c = with_o_bias.clone();
    c.o_bias = false;
    let mut cj: serde_json::Value = serde_json::from_str(&config_json(&c)).unwrap();
    cj["model_type"] = "qwen2".into();
    cj["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    let t = hf_tensors(&c, &w, Dtype::F32);
    write_model(dir, &c, &t);
    std::fs::write(dir.join("config.json"), cj.to_string()).unwrap();
}
