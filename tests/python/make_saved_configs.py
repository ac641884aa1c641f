#!/usr/bin/env python3
"""Writes model/tests/fixtures/saved_configs/<family>.json: the config.json transformers'
own `save_pretrained` writes for a small model of each family dpserve serves, so that
model/tests/saved_configs.rs checks dpserve reads what transformers writes (a Qwen3-MoE
config it saves names only `num_local_experts`, for one), not just configs written by hand.
No torch needed: configuration classes only.

    python3 tests/python/make_saved_configs.py [--out model/tests/fixtures/saved_configs]
"""

import argparse
import json
import pathlib
import tempfile

import transformers

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

FAMILIES = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": 64}),
    "qwen2": (transformers.Qwen2Config, {}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 8}),
    "qwen3_moe": (transformers.Qwen3MoeConfig,
                  {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8}),
    "qwen2_moe": (transformers.Qwen2MoeConfig,
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                   "shared_expert_intermediate_size": 16}),
    "mixtral": (transformers.MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "gemma2": (transformers.Gemma2Config, {"head_dim": 8}),
    "gemma3_text": (transformers.Gemma3TextConfig, {"head_dim": 8}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="model/tests/fixtures/saved_configs")
    out = pathlib.Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (cls, extra) in FAMILIES.items():
        with tempfile.TemporaryDirectory() as d:
            cls(**SHAPE, **extra).save_pretrained(d)
            config = json.loads((pathlib.Path(d) / "config.json").read_text())
        config.pop("transformers_version", None)
        (out / f"{name}.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
        print(name, {k: v for k, v in config.items() if "expert" in k})
    (out / "README.md").write_text(
        "What transformers " + transformers.__version__ + "'s `save_pretrained` writes for a small model of each\n"
        "family (`tests/python/make_saved_configs.py`); read by `model/tests/saved_configs.rs`.\n"
    )


if __name__ == "__main__":
    main()
