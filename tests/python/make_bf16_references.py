#!/usr/bin/env python3
"""Records what Hugging Face transformers computes for each fixture of model/tests/fixtures/hf
when it runs the model in bf16 (`dtype=torch.bfloat16`, as `torch_dtype=bfloat16` loads it):
the reference of the worker's bf16 compute mode (`--compute-dtype bf16`, model/tests/hf_parity.rs).

For each fixture (its config.json and the seed of its reference.json, so the same generated bf16
weights as make_model_fixtures.py writes), it writes `reference_bf16.json`: per prompt of
reference.json, the bf16 model's own greedy continuation, the top-two margin of each greedy step,
and the logits (bf16, written as the f32 they widen to) of every position of prompt + that
continuation. reference.json is not touched.

With `--model DIR` it does the same for a real checkpoint (its tokenizer encodes PROMPTS; 32
greedy tokens each) and writes DIR/reference_bf16.json, which
`DPSERVE_TEST_BF16_MODEL=DIR cargo test -p model --test bf16_parity` compares against.

Run (CPU; torch and transformers as in requirements-model-fixtures.txt or newer):
    python tests/python/make_bf16_references.py [--dir model/tests/fixtures/hf] [names...]
    python tests/python/make_bf16_references.py --model /path/to/SmolLM2-135M
"""

import argparse
import json
import pathlib
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import make_model_fixtures as fx  # noqa: E402

NEW_TOKENS = fx.NEW_TOKENS
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "def fibonacci(n):",
    "The three primary colors are",
]


@torch.no_grad()
def greedy_bf16(model, prompt, new_tokens=NEW_TOKENS):
    toks = list(prompt)
    margins = []
    for _ in range(new_tokens):
        last = model(torch.tensor([toks])).logits[0, -1].float()
        top = torch.topk(last, 2).values
        margins.append(float(top[0] - top[1]))
        toks.append(int(last.argmax()))
    logits = model(torch.tensor([toks[:-1]])).logits[0].float()
    return toks[len(prompt) :], logits, margins


def write(path, meta, seqs):
    head = json.dumps(meta, indent=2)[:-2]
    path.write_text(head + ',\n  "sequences": [\n' + ",\n".join(seqs) + "\n  ]\n}\n")
    json.loads(path.read_text())


def seq_text(prompt, g, margins, lg):
    return '    {"prompt": %s, "greedy": %s, "margins": %s, "logits": [\n      %s\n    ]}' % (
        json.dumps(prompt),
        json.dumps(g),
        json.dumps([round(m, 6) for m in margins]),
        ",\n      ".join(fx.f32_text(r) for r in lg),
    )


def real_checkpoint(d):
    tok = transformers.AutoTokenizer.from_pretrained(d)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    seqs = []
    for text in PROMPTS:
        prompt = tok(text)["input_ids"]
        g, lg, margins = greedy_bf16(model, prompt, 32)
        seqs.append(seq_text(prompt, g, margins, lg))
    meta = {"model": str(d), "transformers": transformers.__version__, "torch": torch.__version__, "dtype": "bfloat16"}
    write(d / "reference_bf16.json", meta, seqs)
    print(f"{d}: written")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="model/tests/fixtures/hf")
    ap.add_argument("--model", help="a real checkpoint directory instead of the fixtures")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    if args.model:
        return real_checkpoint(pathlib.Path(args.model))
    root = pathlib.Path(args.dir)
    names = args.names or sorted(p.name for p in root.iterdir() if (p / "reference.json").exists())
    for name in names:
        d = root / name
        ref = json.loads((d / "reference.json").read_text())
        cfg = json.loads((d / "config.json").read_text())
        tensors, _ = fx.checkpoint(fx.load(d), cfg, ref["seed"])
        model = fx.load_generated(d, tensors).to(torch.bfloat16)
        seqs = []
        for s in ref["sequences"]:
            g, lg, margins = greedy_bf16(model, s["prompt"])
            seqs.append(seq_text(s["prompt"], g, margins, lg))
        meta = {
            "family": ref["family"],
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "dtype": "bfloat16",
            "seed": ref["seed"],
        }
        write(d / "reference_bf16.json", meta, seqs)
        print(f"{name}: written")


if __name__ == "__main__":
    main()
