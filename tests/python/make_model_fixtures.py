#!/usr/bin/env python3
"""Builds the tiny random checkpoints of model/tests/fixtures/hf/ and records what Hugging Face
transformers computes for them: the reference the worker's `hf_parity` test compares against.

Each fixture is a directory with a Hub-style `config.json` (written here, then saved again by
transformers' own `save_pretrained`, so it is a config as transformers writes it and the
reference is what transformers makes of exactly that file) and
`reference.json`: for a few prompts the greedy continuation and the f32 logits of every position
of prompt + continuation (each logit the shortest decimal that reads back as the same f32), and
the list of the checkpoint's tensors (name, shape, the mean and std they are drawn with and an
FNV-1a 64 hash of their bf16 bits). No weights are stored: every tensor comes from WEIGHTS, a
generator defined by integer arithmetic and IEEE-754 operations only, which the Rust tests
(model/tests/common/hf_weights.rs) implement bit for bit; they write the bf16 safetensors at
test time and check each tensor's hash first. Here the generated tensors are written to a
temporary model.safetensors that transformers loads, so the reference is computed from exactly
those weights, in the Hub's layout.

Every option a fixture exists for is shown to matter at the recorded lengths: the same weights
with the option turned off must move some logit by more than OPTION_MATTERS, or the script fails.
Greedy steps whose top two logits are closer than MIN_MARGIN, and continuations of fewer than
three distinct tokens, are avoided by trying the next seed.

Run (CPU only; torch and transformers as pinned in requirements-model-fixtures.txt):
    python tests/python/make_model_fixtures.py [--out model/tests/fixtures/hf]
"""

import argparse
import copy
import json
import math
import pathlib
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 96
NEW_TOKENS = 8
MIN_MARGIN = 1e-3
OPTION_MATTERS = 1e-2

# Shapes shared by every fixture; each family below overrides what it is about.
BASE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

# name -> (config.json fields, {option: value that turns it off}, or a list of such: each must
# matter on its own).
FIXTURES = {
    # GQA, untied head, attention_bias (q, k, v and o biases), mlp_bias (gate, up, down).
    "llama": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": False,
            "rope_scaling": None,
        },
        {"attention_bias": False, "mlp_bias": False},
    ),
    # Llama 3.1-style RoPE scaling, tied head (as Llama 3.2 1B/3B), head_dim 16: with
    # original_max_position_embeddings 128 two frequencies are kept, one is blended, five are
    # divided by the factor.
    "llama3_rope": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "tie_word_embeddings": True,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        },
        {"rope_scaling": None},
    ),
    "llama_linear_rope": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "tie_word_embeddings": False,
            "rope_scaling": {"type": "linear", "factor": 4.0},
        },
        {"rope_scaling": None},
    ),
    # q/k/v biases (always, in Qwen2), tied head.
    "qwen2": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "rope_theta": 1000000.0,
        },
        {},
    ),
    # YaRN as Qwen2.5 states it for long contexts (`type` yarn, factor 4), head_dim 16 and an
    # original context of 32: one frequency kept, one blended, six divided; cos/sin × 1.139.
    "qwen2_yarn": (
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "max_position_embeddings": 128,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        },
        {"rope_scaling": None},
    ),
    # Per-head q/k RMSNorm, head_dim 16 with hidden 32 (q_dim 64 ≠ hidden), untied head.
    "qwen3": (
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "head_dim": 16,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "rope_theta": 1000000.0,
        },
        {},
    ),
    # A window of 5, shorter than every long prompt.
    "mistral_window": (
        {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "sliding_window": 5,
            "tie_word_embeddings": False,
        },
        {"sliding_window": None},
    ),
    # Mixtral: 4 experts, 2 per token (always renormalised), expert intermediate 24, a window
    # of 6, untied head; saved in the Hub's layout (block_sparse_moe.experts.E.w1/w2/w3).
    "mixtral": (
        {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "intermediate_size": 24,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 6,
            "tie_word_embeddings": False,
        },
        [{"num_experts_per_tok": 1}, {"sliding_window": None}],
    ),
    # Qwen3-MoE: 3 layers, experts in layers 0 and 2 (`mlp_only_layers` [1]: a dense MLP of
    # intermediate 64 there), 6 experts of intermediate 16, 3 per token, `norm_topk_prob`
    # false (its default: the chosen probabilities are not renormalised), q/k norms, head_dim
    # 16, tied head; saved in the Hub's layout (mlp.experts.E.gate_proj/up_proj/down_proj).
    "qwen3_moe": (
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "num_hidden_layers": 3,
            "head_dim": 16,
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 16,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
            "attention_bias": False,
            "use_sliding_window": False,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
        },
        [{"norm_topk_prob": True}, {"num_experts_per_tok": 1}],
    ),
    # Qwen2-MoE (Qwen1.5-MoE): 4 experts of intermediate 16, 2 per token, a shared expert of
    # intermediate 24 under its sigmoid gate, q/k/v biases (`qkv_bias`), untied head; the
    # Hub's layout.
    "qwen2_moe": (
        {
            "architectures": ["Qwen2MoeForCausalLM"],
            "model_type": "qwen2_moe",
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 24,
            "norm_topk_prob": False,
            "qkv_bias": True,
            "use_sliding_window": False,
            "tie_word_embeddings": False,
        },
        [{"num_experts_per_tok": 1}, {"norm_topk_prob": True}],
    ),
    # Gemma 2: 4 layers alternating local (window 4, shorter than the 10-token prompts) and
    # global, head_dim 16 ≠ hidden/heads, query_pre_attn_scalar 24 ≠ head_dim, attention and
    # final-logit soft caps small enough to bite at these logits, tied head; GeGLU, the (1 + w)
    # norms, the post-attention / post-MLP norms and the embedding scale come with the family.
    "gemma2": (
        {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "num_hidden_layers": 4,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 4,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
            "tie_word_embeddings": True,
            "pad_token_id": 0,
        },
        [
            {"attn_logit_softcapping": None},
            {"final_logit_softcapping": None},
            {"query_pre_attn_scalar": 16},
            {"layer_types": ["full_attention"] * 4},
        ],
    ),
    # Gemma 3 text: 3 layers with `sliding_window_pattern` 3 (local, local, global), window 4,
    # per-head q/k norms (1 + w), the global layers' rope_theta 1e6 with linear scaling 8 and
    # the local layers' rope_local_base_freq 1e4 (as Gemma 3 4B–27B), no soft caps (its default).
    "gemma3": (
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "num_hidden_layers": 3,
            "head_dim": 16,
            "query_pre_attn_scalar": 32,
            "sliding_window": 4,
            "sliding_window_pattern": 3,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "tie_word_embeddings": True,
            "pad_token_id": 0,
        },
        [
            {"rope_scaling": None},
            {"rope_local_base_freq": None},
            {"layer_types": ["full_attention"] * 3},
        ],
    ),
}


def hub_layout(state, model_type):
    """transformers 5 holds a layer's experts fused (`mlp.experts.gate_up_proj` [E, 2I, H],
    `mlp.experts.down_proj` [E, H, I]); checkpoints on the Hub store one tensor per expert and
    projection, Mixtral's under `block_sparse_moe` as w1 (gate), w3 (up), w2 (down)."""
    per_expert = ("mlp", "gate_proj", "up_proj", "down_proj")
    names = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2"), "qwen3_moe": per_expert, "qwen2_moe": per_expert}
    if model_type not in names:
        return state
    block, gate, up, down = names[model_type]
    out = {}
    for k, v in state.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            p = k[: -len(".mlp.experts.gate_up_proj")] + f".{block}.experts"
            i = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{p}.{e}.{gate}.weight"] = v[e, :i].contiguous()
                out[f"{p}.{e}.{up}.weight"] = v[e, i:].contiguous()
        elif k.endswith(".mlp.experts.down_proj"):
            p = k[: -len(".mlp.experts.down_proj")] + f".{block}.experts"
            for e in range(v.shape[0]):
                out[f"{p}.{e}.{down}.weight"] = v[e].contiguous()
        elif k.endswith(".mlp.gate.weight"):
            out[k.replace(".mlp.gate.", f".{block}.gate.")] = v
        else:
            out[k] = v
    return out


def prompts(rng, vocab):
    """A of 10 tokens, B sharing A's first 6 (for the prefix-cache test), C of 3."""
    a = [1] + [int(x) for x in rng.integers(3, vocab, 9)]
    b = a[:6] + [int(x) for x in rng.integers(3, vocab, 4)]
    c = [1] + [int(x) for x in rng.integers(3, vocab, 2)]
    return [a, b, c]


# The weight generator, fixed forever (model/tests/common/hf_weights.rs is the same, bit for
# bit): tensor `name` of a fixture with seed `seed` is a SplitMix64 stream whose state starts at
# (the first draw of a SplitMix64 seeded with `seed`) XOR (FNV-1a 64 of the name's UTF-8); its
# k-th draw r gives the k-th value in row-major order:
#   s = the sum of r's four 16-bit lanes (Irwin-Hall: mean 131070, variance (2^32 - 1) / 3),
#   x = mean + std * ((s - 131070) / sqrt(1431655765.0))   (f64: IEEE-754, correctly rounded),
#   then x rounded to f32 and the f32 to bf16 (both to nearest, ties to even).
# Only integer arithmetic and IEEE-754 +, *, / and sqrt: no float RNG, no libm.
WEIGHTS = "splitmix64-irwin-hall-4/bf16"
MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
IRWIN_HALL_MEAN = 131070
IRWIN_HALL_SIGMA = math.sqrt(1431655765.0)


def mix64(z):
    """SplitMix64's output function (on a Python int): its draw from state z."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def bf16_bits(seed, name, shape, mean, std):
    """The tensor's values as bf16 bit patterns (numpy uint16, `shape`)."""
    n = math.prod(shape)
    state = mix64((seed + GAMMA) & MASK64) ^ fnv1a64(name.encode())
    with np.errstate(over="ignore"):
        # SplitMix64: the k-th state is state + k * GAMMA (mod 2^64), then its output function.
        z = np.uint64(state) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        r = z ^ (z >> np.uint64(31))
    lanes = sum((r >> np.uint64(16 * i)) & np.uint64(0xFFFF) for i in range(4))
    x = mean + std * ((lanes.astype(np.int64) - IRWIN_HALL_MEAN).astype(np.float64) / IRWIN_HALL_SIGMA)
    f = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (f + np.uint64(0x7FFF) + ((f >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return bits.astype(np.uint16).reshape(shape)


def init_of(name, shape, model_type):
    """(mean, std) of a tensor, chosen so the greedy text is not flat: projections N(0, 1/fan_in)
    (the std to 4 significant digits, so reference.json carries it exactly), norms around 1
    (Gemma's store w for a gain of 1 + w: around 0), biases 0.1, embeddings N(0, 0.1) (small
    beside the layers' outputs, or a tied head makes every token predict itself)."""
    if name.endswith("norm.weight"):
        return (0.0 if model_type.startswith("gemma") else 1.0), 0.2
    if name.endswith(".bias") or "embed_tokens" in name:
        return 0.0, 0.1
    return 0.0, float(f"{1 / math.sqrt(shape[-1]):.4g}")


def checkpoint(model, cfg, seed):
    """The generated checkpoint of `model`'s architecture in the Hub's layout: ({name: bf16
    tensor}, the tensor list of reference.json)."""
    state = hub_layout(dict(model.state_dict()), cfg["model_type"])
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    tensors, listing = {}, []
    for name in sorted(state):
        shape = list(state[name].shape)
        mean, std = init_of(name, shape, cfg["model_type"])
        bits = bf16_bits(seed, name, shape, mean, std)
        tensors[name] = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        digest = fnv1a64(bits.astype("<u2").tobytes())
        listing.append({"name": name, "shape": shape, "mean": mean, "std": std, "fnv1a64": f"{digest:016x}"})
    return tensors, listing


def load_generated(d, tensors):
    """transformers' model of config `d`/config.json with `tensors` as its checkpoint (written
    to a temporary directory, read by from_pretrained as a Hub checkpoint is). Every tensor is
    read and none is missing, and the model holds exactly those bits."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(d / "config.json", tmp)
        save_file(tensors, pathlib.Path(tmp) / "model.safetensors", metadata={"format": "pt"})
        model, info = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{d.name}: loading the generated checkpoint: {bad}"
    held = hub_layout({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}, model.config.model_type)
    for name, t in tensors.items():
        assert torch.equal(held[name].view(torch.int16), t.view(torch.int16)), f"{d.name}: {name} differs once loaded"
    return model.eval()


def load(dir_, overrides=None):
    cfg = AutoConfig.from_pretrained(dir_)
    rope = cfg.rope_parameters
    for k, v in (overrides or {}).items():
        if k == "rope_scaling" and "full_attention" in rope:
            # Gemma 3: one entry per layer type; the global layers' scaling off.
            rope["full_attention"] = {"rope_type": "default", "rope_theta": rope["full_attention"]["rope_theta"]}
        elif k == "rope_scaling":
            # transformers 5 keeps RoPE in rope_parameters (rope_scaling is an alias of it).
            cfg.rope_parameters = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
        elif k == "rope_local_base_freq":
            # Gemma 3's local layers with the global layers' base.
            rope["sliding_attention"]["rope_theta"] = rope["full_attention"]["rope_theta"]
        else:
            setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    # Built in f32, not in the config's bf16: buffers computed at build (Gemma's embedding scale)
    # would otherwise be bf16-rounded before `.float()`.
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@torch.no_grad()
def greedy(model, prompt):
    toks = list(prompt)
    margins = []
    for _ in range(NEW_TOKENS):
        last = model(torch.tensor([toks])).logits[0, -1]
        top = torch.topk(last, 2).values
        margins.append(float(top[0] - top[1]))
        toks.append(int(last.argmax()))
    logits = model(torch.tensor([toks[:-1]])).logits[0]
    assert [int(x) for x in logits[len(prompt) - 1 :].argmax(-1)] == toks[len(prompt) :]
    return toks[len(prompt) :], logits, min(margins)


def f32_text(row):
    return "[" + ",".join(np.format_float_positional(x, unique=True, trim="-") for x in row.numpy().astype(np.float32)) + "]"


# `--alt`: every fixture again with other shapes and seeds, for an independent check
# (`DPSERVE_TEST_HF_FIXTURES=DIR cargo test -p model --test hf_parity`); not committed.
ALT_BASE = {
    "hidden_size": 64,
    "intermediate_size": 136,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 200,
    "rms_norm_eps": 1e-6,
}
ALT_FIELDS = {
    "qwen3": {"head_dim": 32, "attention_bias": True},
    "mistral_window": {"sliding_window": 7},
    "gemma2": {"head_dim": 32, "sliding_window": 6, "attention_bias": True, "query_pre_attn_scalar": 40},
    "mixtral": {"num_local_experts": 8, "intermediate_size": 40, "sliding_window": 7},
    "qwen3_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "mlp_only_layers": [],
        "decoder_sparse_step": 2,
        "head_dim": 32,
        "attention_bias": True,
    },
    "qwen2_moe": {"num_experts": 8, "shared_expert_intermediate_size": 40, "mlp_only_layers": [2]},
    "gemma3": {"head_dim": 32, "sliding_window": 7, "final_logit_softcapping": 4.0, "tie_word_embeddings": False},
}


def build(out, name, fields, off, base=BASE, seeds=range(100)):
    d = out / name
    for seed in seeds:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        cfg = dict(base, **fields)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        # Then as transformers itself writes it (`save_pretrained`: its own names and defaults,
        # e.g. Qwen3-MoE's `num_local_experts`, `rope_parameters`), which dpserve must read.
        AutoConfig.from_pretrained(d).save_pretrained(d)
        tensors, listing = checkpoint(load(d), cfg, seed)
        model = load_generated(d, tensors)
        ps = prompts(np.random.default_rng(seed), cfg["vocab_size"])
        runs = [greedy(model, p) for p in ps]
        margin = min(r[2] for r in runs)
        if margin < MIN_MARGIN or any(len(set(r[0])) < 3 for r in runs):
            continue
        # The model built from the config (as the option-off ones below are) with the same
        # weights computes the same logits as the one loaded from the checkpoint.
        built = load(d)
        built.load_state_dict(model.state_dict())
        with torch.no_grad():
            p0 = ps[0] + runs[0][0][:-1]
            moved = float((built(torch.tensor([p0])).logits[0] - runs[0][1]).abs().max())
            assert moved == 0.0, f"{name}: built from the config, the logits move by {moved}"
        # The option turned off, on the same weights: it must matter at these lengths.
        option_moves = None
        for one_off in off if isinstance(off, list) else [off] if off else []:
            plain = load(d, one_off)
            plain.load_state_dict(model.state_dict(), strict=False)
            with torch.no_grad():
                moves = max(
                    float((plain(torch.tensor([p + g[:-1]])).logits[0] - lg).abs().max())
                    for p, (g, lg, _) in zip(ps, runs)
                )
            if moves <= OPTION_MATTERS:
                break
            option_moves = moves if not isinstance(off, list) else (option_moves or []) + [moves]
        else:
            moves = None
        if moves is not None and moves <= OPTION_MATTERS:
            print(f"{name}: seed {seed}: {one_off} changes logits by only {moves}; next seed")
            continue
        seqs = ",\n".join(
            '    {"prompt": %s, "greedy": %s, "logits": [\n      %s\n    ]}'
            % (json.dumps(p), json.dumps(g), ",\n      ".join(f32_text(r) for r in lg))
            for p, (g, lg, _) in zip(ps, runs)
        )
        meta = {
            "family": fields["architectures"][0],
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seed": seed,
            "min_greedy_margin": margin,
            "option_off": off,
            "option_moves_logits_by": option_moves,
            "weights": WEIGHTS,
        }
        head = json.dumps(meta, indent=2)[:-2]
        tensor_lines = ",\n".join("    " + json.dumps(t) for t in listing)
        (d / "reference.json").write_text(
            head + ',\n  "tensors": [\n' + tensor_lines + '\n  ],\n  "sequences": [\n' + seqs + "\n  ]\n}\n"
        )
        json.loads((d / "reference.json").read_text())
        print(f"{name}: seed {seed}, min margin {margin:.4f}, option moves logits by {option_moves}")
        return
    raise SystemExit(f"{name}: no seed in {seeds} gives greedy margins above {MIN_MARGIN}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="model/tests/fixtures/hf")
    ap.add_argument("--alt", action="store_true", help="other shapes and seeds (see ALT_BASE)")
    ap.add_argument("names", nargs="*", help="fixtures to build (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    out = pathlib.Path(args.out)
    for name in args.names or FIXTURES:
        fields, off = copy.deepcopy(FIXTURES[name])
        if args.alt:
            fields.update(ALT_FIELDS.get(name, {}))
            build(out, name, fields, off, dict(BASE, **ALT_BASE), range(1000, 1100))
        else:
            build(out, name, fields, off)


if __name__ == "__main__":
    main()
