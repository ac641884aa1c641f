//! Unit tests of the model: builtin dummy behaviour, batch invariance, input validation, and
//! loading Hugging Face directories (errors and F32/F16/BF16 round trips).

use std::path::Path;

use safetensors::Dtype;

use super::fixtures::*;
use super::weights::Weights;
use super::*;

fn tiny() -> LlamaModel {
    LlamaModel::dummy(ModelConfig::builtin(BuiltinSize::Tiny), 7)
}

/// Greedy decode with one prefill then single-token steps; returns generated ids.
fn greedy(model: &LlamaModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut kv = KvBuffers::new(model.config(), 256);
    let slots: Vec<u32> = (0..256).map(|i| 255 - i).collect();
    let mut toks = prompt.to_vec();
    let mut out = Vec::new();
    let mut logits = model
        .forward(
            &mut kv,
            &[SeqInput {
                new_tokens: prompt,
                start_pos: 0,
                slots: &slots[..prompt.len()],
            }],
        )
        .unwrap();
    for _ in 0..n {
        let next = kernels::argmax(&logits) as u32;
        out.push(next);
        toks.push(next);
        let p = toks.len() - 1;
        logits = model
            .forward(
                &mut kv,
                &[SeqInput {
                    new_tokens: &toks[p..],
                    start_pos: p,
                    slots: &slots[..=p],
                }],
            )
            .unwrap();
    }
    out
}

#[test]
fn builtin_sizes_parse_and_count() {
    assert_eq!("tiny".parse::<BuiltinSize>().unwrap(), BuiltinSize::Tiny);
    assert_eq!(BuiltinSize::Base.to_string(), "base");
    assert!("huge".parse::<BuiltinSize>().is_err());
    let base = ModelConfig::builtin(BuiltinSize::Base);
    assert_eq!(base.vocab_size, protocol::builtin::VOCAB_SIZE);
    assert!((20_000_000..40_000_000).contains(&base.num_params()));
    // Different weights, different ids: the controller will not mix the two sizes.
    let tiny = ModelConfig::builtin(BuiltinSize::Tiny);
    assert_eq!(base.model_id, protocol::builtin::MODEL_ID);
    assert_ne!(tiny.model_id, base.model_id);
}

#[test]
fn tiny_greedy_output_varies_and_is_deterministic() {
    let m = tiny();
    let a = greedy(&m, &[1, 100, 200, 300], 16);
    assert!(a.iter().any(|&t| t != a[0]), "constant output {a:?}");
    assert_eq!(a, greedy(&tiny(), &[1, 100, 200, 300], 16));
    let b = greedy(&m, &[1, 5, 6], 16);
    assert_ne!(a, b, "output ignores the prompt");
}

#[test]
fn tiny_batch_and_chunking_are_bit_invariant() {
    let m = tiny();
    let prompt: Vec<u32> = (0..9).map(|i| 10 + 37 * i).collect();
    let slots: Vec<u32> = (0..9).map(|i| 3 * i + 1).collect();
    let mut kv = KvBuffers::new(m.config(), 64);
    let whole = m
        .forward(
            &mut kv,
            &[SeqInput {
                new_tokens: &prompt,
                start_pos: 0,
                slots: &slots,
            }],
        )
        .unwrap();
    // Chunks of 4 + 4 + 1, in a batch with an unrelated sequence each time.
    let mut kv2 = KvBuffers::new(m.config(), 64);
    let other: Vec<u32> = vec![5, 6, 7];
    let other_slots: Vec<u32> = vec![40, 41, 42];
    let mut last = Vec::new();
    for (a, b) in [(0, 4), (4, 8), (8, 9)] {
        let out = m
            .forward(
                &mut kv2,
                &[
                    SeqInput {
                        new_tokens: &other,
                        start_pos: 0,
                        slots: &other_slots,
                    },
                    SeqInput {
                        new_tokens: &prompt[a..b],
                        start_pos: a,
                        slots: &slots[..b],
                    },
                ],
            )
            .unwrap();
        last = out[m.config().vocab_size..].to_vec();
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&whole), bits(&last));
    let hidden = m
        .forward_hidden(
            &mut kv2,
            &[SeqInput {
                new_tokens: &prompt[8..],
                start_pos: 8,
                slots: &slots,
            }],
        )
        .unwrap();
    assert_eq!(hidden.len(), m.config().hidden_size);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let m = tiny();
    let mut kv = KvBuffers::new(m.config(), 8);
    let v = m.config().vocab_size as u32;
    let cases: Vec<(Vec<u32>, usize, Vec<u32>)> = vec![
        (vec![v], 0, vec![0]),       // token out of vocab
        (vec![1, 2], 0, vec![0]),    // too few slots
        (vec![1], 0, vec![8]),       // slot out of range
        (vec![], 0, vec![]),         // nothing to compute
        (vec![1], 1, vec![0, 1, 2]), // too many slots
    ];
    for (toks, start, slots) in cases {
        let r = m.forward(
            &mut kv,
            &[SeqInput {
                new_tokens: &toks,
                start_pos: start,
                slots: &slots,
            }],
        );
        assert!(
            matches!(r, Err(ModelError::BadInput { .. })),
            "{toks:?} {start} {slots:?}: {r:?}"
        );
    }
    let mut cfg = ModelConfig::builtin(BuiltinSize::Tiny);
    cfg.max_position_embeddings = 2;
    let short = LlamaModel::dummy(cfg, 1);
    let r = short.forward(
        &mut kv,
        &[SeqInput {
            new_tokens: &[1, 2, 3],
            start_pos: 0,
            slots: &[0, 1, 2],
        }],
    );
    assert!(matches!(r, Err(ModelError::BadInput { .. })));
}

fn run(m: &LlamaModel) -> Vec<f32> {
    let mut kv = KvBuffers::new(m.config(), 16);
    let toks = [1u32, 7, 30, 12, 44];
    m.forward(
        &mut kv,
        &[SeqInput {
            new_tokens: &toks,
            start_pos: 0,
            slots: &[0, 1, 2, 3, 4],
        }],
    )
    .unwrap()
}

#[test]
fn loads_f32_f16_bf16_safetensors() {
    let c = small_cfg();
    let w = Weights::dummy(&c, 11);
    let reference = run(&LlamaModel {
        config: c.clone(),
        weights: Weights::dummy(&c, 11),
    });
    let scale = reference.iter().fold(0f32, |a, x| a.max(x.abs()));
    for (dtype, tol) in [(Dtype::F32, 0.0), (Dtype::F16, 0.01), (Dtype::BF16, 0.05)] {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), &c, &hf_tensors(&c, &w, dtype));
        let m = LlamaModel::load_hf(dir.path()).unwrap();
        assert_eq!(m.config().eos_token_ids, vec![2, 3]);
        assert_eq!(m.config().head_dim, 8);
        let got = run(&m);
        let diff = got
            .iter()
            .zip(&reference)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(
            diff <= tol * scale,
            "{dtype:?}: max diff {diff} (scale {scale})"
        );
    }
}

#[test]
fn loader_errors_name_file_field_and_tensor() {
    let c = small_cfg();
    let w = Weights::dummy(&c, 11);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(
        matches!(err, ModelError::MissingFile { .. }) && err.to_string().contains("config.json"),
        "{err}"
    );

    std::fs::write(d.join("config.json"), "{ not json").unwrap();
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(
        matches!(err, ModelError::BadJson { .. }) && err.to_string().contains("config.json"),
        "{err}"
    );

    std::fs::write(
        d.join("config.json"),
        r#"{"model_type": "llama", "hidden_size": "big"}"#,
    )
    .unwrap();
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(
        err.to_string().contains("hidden_size") && err.to_string().contains("config.json"),
        "{err}"
    );

    std::fs::write(d.join("config.json"), config_json(&c)).unwrap();
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(
        matches!(err, ModelError::MissingFile { .. }) && err.to_string().contains("safetensors"),
        "{err}"
    );

    let mut t = hf_tensors(&c, &w, Dtype::F32);
    let name = "model.layers.1.mlp.up_proj.weight".to_string();
    let bad = t.get_mut(&name).unwrap();
    bad.shape = vec![c.hidden_size, c.intermediate_size];
    write_model(d, &c, &t);
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(
        matches!(err, ModelError::BadShape { .. }) && err.to_string().contains(&name),
        "{err}"
    );

    t.remove(&name);
    write_model(d, &c, &t);
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(
        matches!(err, ModelError::MissingTensor { .. }) && err.to_string().contains(&name),
        "{err}"
    );

    std::fs::write(d.join("model.safetensors"), b"garbage").unwrap();
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(matches!(err, ModelError::BadSafetensors { .. }), "{err}");

    let mut cj: serde_json::Value = serde_json::from_str(&config_json(&c)).unwrap();
    cj["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    std::fs::write(d.join("config.json"), cj.to_string()).unwrap();
    let err = LlamaModel::load_hf(d).unwrap_err();
    assert!(err.to_string().contains("rope_scaling"), "{err}");
}

/// `config_json(small_cfg())` with `edit` applied (a null value removes the field).
fn config_with(edit: serde_json::Value) -> serde_json::Value {
    let mut cj: serde_json::Value = serde_json::from_str(&config_json(&small_cfg())).unwrap();
    for (k, v) in edit.as_object().unwrap() {
        match v {
            serde_json::Value::Null => {
                cj.as_object_mut().unwrap().remove(k);
            }
            v => cj[k] = v.clone(),
        }
    }
    cj
}

fn parse_config(cj: &serde_json::Value) -> Result<ModelConfig> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), cj.to_string()).unwrap();
    ModelConfig::from_hf_dir(dir.path())
}

#[test]
fn what_is_not_implemented_is_refused_in_one_line_naming_field_and_value() {
    use serde_json::json;
    let llama3 = |drop: &str| {
        let mut rs = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        rs.as_object_mut().unwrap().remove(drop);
        rs
    };
    let cases = [
        // Gemma 3 with its vision tower, and Gemma's options it does not implement.
        (
            json!({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}),
            "`architectures` = [\"Gemma3ForConditionalGeneration\"]",
        ),
        (
            json!({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                "hidden_activation": "gelu"}),
            "`hidden_activation` = \"gelu\"",
        ),
        (
            json!({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "use_bidirectional_attention": true}),
            "`use_bidirectional_attention` = true",
        ),
        (
            json!({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "layer_types": ["sliding_attention", "chunked_attention"]}),
            "`layer_types` = \"chunked_attention\"",
        ),
        (
            json!({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                "layer_types": ["sliding_attention"]}),
            "1 entries for num_hidden_layers 2",
        ),
        (
            json!({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "rope_parameters": {"full_attention": {"rope_type": "default"},
                "sliding_attention": {"rope_type": "linear", "factor": 2.0}}}),
            "RoPE scaling on Gemma 3's local layers",
        ),
        (
            json!({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
                "final_logit_softcapping": -1.0}),
            "`final_logit_softcapping` = -1.0",
        ),
        // The other families still refuse Gemma's options.
        (
            json!({"query_pre_attn_scalar": 256}),
            "`query_pre_attn_scalar` = 256",
        ),
        (
            json!({"architectures": ["PhimoeForCausalLM"], "model_type": "phimoe"}),
            "PhimoeForCausalLM",
        ),
        (
            json!({"architectures": null, "model_type": "deepseek_v3"}),
            "`model_type` = \"deepseek_v3\"",
        ),
        // Experts in a family without them, and an impossible routing.
        (json!({"num_local_experts": 8}), "`num_local_experts` = 8"),
        (
            json!({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": 4, "num_experts_per_tok": 5}),
            "`num_experts_per_tok` = 5",
        ),
        (
            json!({"architectures": ["LlamaForCausalLM", "MistralForCausalLM"]}),
            "`architectures`",
        ),
        (
            json!({"model_type": "qwen2"}),
            "`model_type` = \"qwen2\" is not supported (LlamaForCausalLM checkpoints",
        ),
        (
            json!({"architectures": null, "model_type": null}),
            "neither it nor model_type",
        ),
        (
            json!({"hidden_act": "gelu_pytorch_tanh"}),
            "`hidden_act` = \"gelu_pytorch_tanh\"",
        ),
        (
            json!({"final_logit_softcapping": 30.0}),
            "`final_logit_softcapping` = 30.0",
        ),
        (
            json!({"attn_logit_softcapping": 50.0}),
            "`attn_logit_softcapping` = 50.0",
        ),
        (
            json!({"query_pre_attn_scalar": 256}),
            "`query_pre_attn_scalar` = 256",
        ),
        (
            json!({"quantization_config": {"quant_method": "gptq", "bits": 4}}),
            "`quantization_config`",
        ),
        (
            json!({"partial_rotary_factor": 0.5}),
            "`partial_rotary_factor` = 0.5",
        ),
        (json!({"num_local_experts": 8}), "`num_local_experts` = 8"),
        (
            json!({"layer_types": ["full_attention", "sliding_attention"]}),
            "`layer_types` = \"sliding_attention\"",
        ),
        (
            json!({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}),
            "RoPE type `longrope` is not implemented",
        ),
        (
            json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": "fast"}}),
            "`beta_fast` must be a number",
        ),
        (
            json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}),
            "RoPE type `dynamic`",
        ),
        (
            json!({"rope_scaling": llama3("low_freq_factor")}),
            "`low_freq_factor` must be a positive number",
        ),
        (
            json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "mrope_section": [1]}}),
            "`mrope_section` is not implemented for RoPE type `linear`",
        ),
        (
            json!({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}),
            "`rope_parameters`",
        ),
        (
            json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "use_sliding_window": true, "sliding_window": 4096}),
            "`use_sliding_window` = true",
        ),
        (
            json!({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": 0}),
            "`sliding_window` = 0",
        ),
    ];
    for (edit, want) in cases {
        let err = parse_config(&config_with(edit.clone())).unwrap_err();
        let msg = err.to_string();
        assert!(err.is_unsupported(), "{edit}: {err:?}");
        assert!(msg.contains(want), "{edit}: {msg}");
        assert!(msg.contains("config.json") && !msg.contains('\n'), "{msg}");
    }
}

#[test]
fn each_family_reads_its_options() {
    use serde_json::json;
    let llama3 = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let c = parse_config(&config_with(
        json!({"rope_scaling": llama3, "rope_theta": 5e5}),
    ))
    .unwrap();
    assert_eq!(c.family, ModelFamily::Llama);
    assert_eq!(c.rope_theta, 5e5);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert!(c.qkv_bias && c.o_bias && c.mlp_bias && !c.qk_norm);
    // The older spelling of the type, and transformers 5's `rope_parameters`.
    let c = parse_config(&config_with(
        json!({"rope_scaling": {"type": "linear", "factor": 2.0}}),
    ))
    .unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    let c = parse_config(&config_with(
        json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    ))
    .unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling), (1e6, RopeScaling::None));
    // YaRN as Qwen2.5 states it, and DeepSeek-style mscales; the config's top-level
    // original_max_position_embeddings wins over the scaling's (as in transformers).
    let c = parse_config(&config_with(
        json!({"rope_scaling": {"type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 32768}}),
    ))
    .unwrap();
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        truncate,
        attention_factor,
    } = c.rope_scaling
    else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!((factor, original_max_position_embeddings), (4.0, 32768));
    assert_eq!((beta_fast, beta_slow, truncate), (32.0, 1.0, true));
    assert!((attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    let c = parse_config(&config_with(
        json!({"original_max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
        "mscale_all_dim": 1.0, "original_max_position_embeddings": 8192}}),
    ))
    .unwrap();
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn { original_max_position_embeddings: 4096, attention_factor, .. }
            if attention_factor == 1.0
    ));

    let c = parse_config(&config_with(json!({"architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2", "attention_bias": null, "use_sliding_window": false,
        "sliding_window": 131072, "layer_types": ["full_attention", "full_attention"]})))
    .unwrap();
    assert_eq!(c.family, ModelFamily::Qwen2);
    // Qwen2's MLP has no biases whatever `mlp_bias` says (config_with sets it).
    assert!(c.qkv_bias && !c.o_bias && !c.mlp_bias && c.sliding_window.is_none());

    let c = parse_config(&config_with(json!({"architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3", "attention_bias": false, "head_dim": 16})))
    .unwrap();
    assert!(c.qk_norm && !c.qkv_bias && c.head_dim == 16 && c.q_dim() == 64);

    // Transformers gives Mistral no biases whatever `attention_bias` says.
    let c = parse_config(&config_with(
        json!({"architectures": ["MistralForCausalLM"],
        "model_type": "mistral", "sliding_window": 4096}),
    ))
    .unwrap();
    assert_eq!(c.sliding_window, Some(4096));
    assert!(!c.qkv_bias && !c.o_bias);
    assert_eq!((c.attend_from(4095), c.attend_from(4096)), (0, 1));
}

#[test]
fn moe_families_read_their_experts() {
    use serde_json::json;
    let c = parse_config(&config_with(
        json!({"architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
        "sliding_window": 4096}),
    ))
    .unwrap();
    let m = c.moe.clone().expect("experts");
    assert_eq!((m.num_experts, m.top_k, m.norm_topk_prob), (8, 2, true));
    assert_eq!(
        (m.expert_intermediate_size, m.moe_layers),
        (40, vec![true, true])
    );
    assert!(!c.qkv_bias && !c.qk_norm && c.sliding_window == Some(4096));
    assert!(c.cuda_refusal().unwrap().contains("mixture-of-experts"));
    let c = parse_config(&config_with(
        json!({"architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe", "num_hidden_layers": 4, "num_experts": 16,
        "num_experts_per_tok": 4, "moe_intermediate_size": 8, "decoder_sparse_step": 2,
        "mlp_only_layers": [3], "attention_bias": false}),
    ))
    .unwrap();
    let m = c.moe.clone().unwrap();
    assert_eq!((m.num_experts, m.top_k, m.norm_topk_prob), (16, 4, false));
    // What transformers' save_pretrained writes for Qwen3-MoE: `num_local_experts` alone (it
    // failed to load with 128 experts before).
    let saved = parse_config(&config_with(
        json!({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 2}),
    ))
    .unwrap();
    assert_eq!(saved.moe.as_ref().unwrap().num_experts, 4);
    let both = parse_config(&config_with(
        json!({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "num_hidden_layers": 4, "num_experts": 4, "num_local_experts": 8, "num_experts_per_tok": 2}),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        both.contains("`num_local_experts` = 8") && both.contains("differs from `num_experts` = 4"),
        "{both}"
    );
    // Layers 1 and 3 by the step, less layer 3.
    assert_eq!(m.moe_layers, [false, true, false, false]);
    assert!(c.qk_norm && !c.qkv_bias);
    assert!(m.shared_expert_intermediate_size.is_none());
    // Three dense layers of intermediate 40, one of 16 experts of intermediate 8.
    let (h, dense, experts) = (32, 3 * 32 * 40, 16 * (32 + 3 * 32 * 8));
    let attn = h * (c.q_dim() + 2 * c.kv_dim()) + 2 * 8 + c.q_dim() * h + 2 * h;
    let embed = c.vocab_size * h;
    assert_eq!(
        c.num_params(),
        2 * embed + 4 * attn + 3 * dense + experts + h
    );
}

/// The `config.json` fields of published checkpoints of the new families (Gemma 2 2B, Gemma 3
/// 1B, Mixtral 8x7B, Qwen3-30B-A3B, their shapes and options as the Hub states them) parse
/// as the model they are: nothing in them is refused, and each option lands where it should.
#[test]
fn published_configs_of_the_new_families_parse() {
    use serde_json::json;
    let parse = |v: serde_json::Value| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
        ModelConfig::from_hf_dir(dir.path()).unwrap_or_else(|e| panic!("{e}"))
    };
    let c = parse(
        json!({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "attention_bias": false, "attention_dropout": 0.0, "attn_logit_softcapping": 50.0,
        "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
        "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
        "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
        "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000}),
    );
    let g = c.gemma.as_ref().unwrap();
    assert_eq!(
        (g.attn_softcap, g.final_softcap, g.sliding_window),
        (Some(50.0), Some(30.0), 4096)
    );
    assert_eq!(g.local_layers.iter().filter(|&&l| l).count(), 13);
    let c = parse(
        json!({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "attention_bias": false, "attention_dropout": 0.0, "attn_logit_softcapping": null,
        "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": null, "head_dim": 256, "hidden_activation":
        "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
        "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
        "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
        "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
        "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "use_cache": true,
        "vocab_size": 262144}),
    );
    let g = c.gemma.as_ref().unwrap();
    assert_eq!(
        (g.attn_softcap, g.final_softcap, g.sliding_window),
        (None, None, 512)
    );
    assert_eq!(
        (c.rope_theta, g.local_rope_theta, c.head_dim),
        (1e6, Some(1e4), 256)
    );
    assert_eq!(g.local_layers.iter().filter(|&&l| !l).count(), 4);
    let c = parse(
        json!({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
        "vocab_size": 32000}),
    );
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate_size),
        (8, 2, 14336)
    );
    assert!(c.sliding_window.is_none());
    let c = parse(
        json!({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
        "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
        "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
        "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 151936}),
    );
    let m = c.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.top_k, m.norm_topk_prob), (128, 8, true));
    assert!(m.moe_layers.iter().all(|&l| l) && c.qk_norm);
    // The "30B" of its name.
    assert!(
        (30_000_000_000..31_000_000_000).contains(&c.num_params()),
        "{}",
        c.num_params()
    );
}

#[test]
fn qwen2_moe_reads_its_shared_expert_and_qkv_bias() {
    use serde_json::json;
    let c = parse_config(&config_with(
        json!({"architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
        "moe_intermediate_size": 8, "shared_expert_intermediate_size": 20,
        "attention_bias": false}),
    ))
    .unwrap();
    let m = c.moe.clone().unwrap();
    assert_eq!((m.num_experts, m.top_k, m.norm_topk_prob), (60, 4, false));
    assert_eq!(m.shared_expert_intermediate_size, Some(20));
    // `qkv_bias` (default true) decides, not `attention_bias`; o has none.
    assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
    let c = parse_config(&config_with(
        json!({"architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe", "qkv_bias": false}),
    ))
    .unwrap();
    assert!(!c.qkv_bias && c.cuda_refusal().is_some());
}

#[test]
fn gemma_reads_its_options_with_transformers_defaults() {
    use serde_json::json;
    // Gemma 2 as its configs leave things out: soft caps 50 and 30, scores by 256^-1/2,
    // layers alternating local (first) and global, head_dim 256, a window of 4096.
    let c = parse_config(&config_with(json!({"architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2", "head_dim": null, "hidden_act": "gelu_pytorch_tanh",
        "num_hidden_layers": 4})))
    .unwrap();
    let g = c.gemma.clone().expect("Gemma options");
    assert_eq!((g.attn_softcap, g.final_softcap), (Some(50.0), Some(30.0)));
    assert_eq!((g.attention_scale, g.sliding_window), (1.0 / 16.0, 4096));
    assert_eq!(g.local_layers, [true, false, true, false]);
    assert_eq!(
        (c.head_dim, c.rope_theta, g.local_rope_theta),
        (256, 1e4, None)
    );
    assert!(c.sliding_window.is_none() && !c.qk_norm && c.cuda_refusal().is_none());
    // The window is the local layers' only: a global layer reads every slot.
    let slots: Vec<u32> = (0..5000).collect();
    assert_eq!(
        (g.window(0, &slots).len(), g.window(1, &slots).len()),
        (4096, 5000)
    );
    // An explicit null (or 0) turns a cap off (`config_with` would drop a null field).
    let mut cj = config_with(json!({"architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2"}));
    cj["attn_logit_softcapping"] = serde_json::Value::Null;
    cj["final_logit_softcapping"] = json!(0);
    let g = parse_config(&cj).unwrap().gemma.unwrap();
    assert_eq!((g.attn_softcap, g.final_softcap), (None, None));

    // Gemma 3 as the Hub states it: every 6th layer global, rope_theta 1e6 scaled on the
    // global layers, rope_local_base_freq on the local ones, q/k norms, no caps.
    let c = parse_config(&config_with(json!({"architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text", "num_hidden_layers": 7, "rope_theta": 1e6,
        "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 64})))
    .unwrap();
    let g = c.gemma.clone().unwrap();
    assert_eq!(g.local_layers, [true, true, true, true, true, false, true]);
    assert_eq!((c.rope_theta, g.local_rope_theta), (1e6, Some(1e4)));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(
        (g.attn_softcap, g.final_softcap, g.attention_scale),
        (None, None, 0.125)
    );
    assert!(c.qk_norm);
    // transformers 5's spelling: one rope_parameters entry per layer type; and a pattern.
    let c = parse_config(&config_with(json!({"architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text", "num_hidden_layers": 4, "sliding_window_pattern": 2,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}})))
    .unwrap();
    let g = c.gemma.unwrap();
    assert_eq!(g.local_layers, [true, false, true, false]);
    assert_eq!((c.rope_theta, g.local_rope_theta), (5e5, Some(2e4)));
}

#[test]
fn a_tensor_the_config_does_not_use_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint_with_unused_o_bias(dir.path());
    let err = LlamaModel::load_hf(dir.path()).unwrap_err();
    assert!(
        matches!(&err, ModelError::UnusedTensor { name, .. } if name == "model.layers.0.self_attn.o_proj.bias"),
        "{err}"
    );
    // The worker refuses to start with it: `startup`'s tests.
}

/// The packed weight files in `dir` (`--weight-cache`), with their inode numbers.
fn packed_files(dir: &Path) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".dpw"))
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, e.metadata().unwrap().ino())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_weight_cache_is_written_once_reused_and_written_again_when_it_does_not_read_back() {
    let c = small_cfg();
    let (model, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_model(
        model.path(),
        &c,
        &hf_tensors(&c, &Weights::dummy(&c, 21), Dtype::BF16),
    );
    let own = run(&LlamaModel::load_hf(model.path()).unwrap());
    let shared = |dtype: LoadDtype| {
        let m = LlamaModel::load_hf_shared(model.path(), dtype, Some(cache.path())).unwrap();
        assert!(m.weights_shared());
        run(&m)
    };
    assert_eq!(shared(LoadDtype::Auto), own);
    let first = packed_files(cache.path());
    assert_eq!(first.len(), 1, "{first:?}");
    // Loaded again: mapped, not written again (the same file).
    assert_eq!(shared(LoadDtype::Auto), own);
    assert_eq!(packed_files(cache.path()), first);
    // Another --weight-dtype is another file (f32 widens exactly: the same logits).
    assert_eq!(shared(LoadDtype::F32), own);
    assert_eq!(packed_files(cache.path()).len(), 2);
    // A damaged file (cut short) is written again, under its name.
    let path = cache.path().join(&first[0].0);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(shared(LoadDtype::Auto), own);
    // Whole again (an inode number is no proof: the damaged copy's may be reused).
    assert_eq!(packed_files(cache.path()).len(), 2);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    // Matrix bytes overwritten in place, same size: the checksum refuses the file, which is
    // written again (mapped as it was, the logits would change).
    let mut tampered = bytes.clone();
    for b in &mut tampered[128..192] {
        *b ^= 0x5a;
    }
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &tampered).unwrap();
    assert_eq!(shared(LoadDtype::Auto), own);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    // Other weights in the checkpoint: a file of their own, and their logits.
    write_model(
        model.path(),
        &c,
        &hf_tensors(&c, &Weights::dummy(&c, 22), Dtype::BF16),
    );
    let other = run(&LlamaModel::load_hf(model.path()).unwrap());
    assert_ne!(other, own);
    assert_eq!(shared(LoadDtype::Auto), other);
    assert_eq!(packed_files(cache.path()).len(), 3);
}

#[test]
fn a_weight_cache_that_cannot_be_made_is_an_error_naming_it() {
    let c = small_cfg();
    let model = tempfile::tempdir().unwrap();
    write_model(
        model.path(),
        &c,
        &hf_tensors(&c, &Weights::dummy(&c, 21), Dtype::F32),
    );
    // A file where the directory should be.
    let blocker = model.path().join("config.json");
    let err =
        LlamaModel::load_hf_shared(model.path(), LoadDtype::Auto, Some(&blocker)).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn an_lm_head_that_copies_the_embeddings_is_shared_and_one_that_differs_is_kept() {
    let mut c = small_cfg();
    c.tie_word_embeddings = false;
    let w = Weights::dummy(&c, 31);
    let mut t = hf_tensors(&c, &w, Dtype::BF16);
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &c, &t);
    let untied = LlamaModel::load_hf(dir.path()).unwrap();
    assert!(untied.weights.lm_head.is_some());
    // The same bytes under both names: one matrix, the same logits as a tied model.
    let embed = t["model.embed_tokens.weight"].data.clone();
    t.get_mut("lm_head.weight").unwrap().data = embed.clone();
    write_model(dir.path(), &c, &t);
    let copied = LlamaModel::load_hf(dir.path()).unwrap();
    assert!(copied.weights.lm_head.is_none());
    // Stored in another type with the same values (bf16 widened to f32): shared too.
    let wide: Vec<f32> = embed
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    let head = t.get_mut("lm_head.weight").unwrap();
    head.dtype = Dtype::F32;
    head.data = encode(&wide, Dtype::F32);
    write_model(dir.path(), &c, &t);
    let m = LlamaModel::load_hf_as(dir.path(), LoadDtype::F32).unwrap();
    assert!(m.weights.lm_head.is_none());
    assert_eq!(run(&m), run(&copied));
}
