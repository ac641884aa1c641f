//! The `config.json` that transformers' own `save_pretrained` writes for a small model of each
//! family (tests/python/make_saved_configs.py, committed in tests/fixtures/saved_configs/):
//! dpserve reads each as the model it describes. Configs written by hand missed that a
//! Qwen3-MoE config transformers saves names only `num_local_experts`.

use std::path::Path;

use model::ModelConfig;

fn saved(family: &str) -> ModelConfig {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/saved_configs")
        .join(format!("{family}.json"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&src, dir.path().join("config.json")).unwrap();
    ModelConfig::from_hf_dir(dir.path()).unwrap_or_else(|e| panic!("{family}: {e}"))
}

#[test]
fn every_family_s_saved_config_reads_as_its_model() {
    for family in [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "gemma2",
        "gemma3_text",
    ] {
        let c = saved(family);
        assert_eq!(
            (c.vocab_size, c.hidden_size, c.num_hidden_layers),
            (96, 32, 2),
            "{family}"
        );
        let experts = c.moe.as_ref().map(|m| (m.num_experts, m.top_k));
        let want = match family {
            "qwen3_moe" | "qwen2_moe" | "mixtral" => Some((4, 2)),
            _ => None,
        };
        assert_eq!(experts, want, "{family}");
    }
    assert_eq!(saved("mistral").sliding_window, Some(64));
    assert_eq!(saved("qwen3").head_dim, 8);
}
