"""End-to-end: SGLang's own benchmark client against a real dpserve, read as SGLang users read it.

Runs `python -m sglang.bench_serving` from the `sglang` package (PyPI, pinned in
tests/python/requirements-sglang-bench.txt; through tests/python/sglang_bench_serving.py, which
leaves out the server stack the client never runs) against `dpserve up --builtin-size tiny
--dp-size 2` with the shared-prefix dataset, `--cache-report` and `--flush-cache`, once per
SGLang backend: `sglang` (`/generate`), `sglang-oai` (`/v1/completions`) and `sglang-oai-chat`
(`/v1/chat/completions`). Each run must succeed (its flush comes right after the warmup
request, while the ranks' status still lags it), and what it prints must be what dpserve's
`/metrics` counted over the run: the requests, the generated tokens (and the retokenized count
equal to them: each chunk's text is the whole text so far), the prompt and cached tokens, and
the hit rate within 1 %.

The benchmark also sends one warmup request (the dataset's first prompt, at most 32 tokens)
before its flush, which `/metrics` counts and the report does not; this test flushes before
each run, so the warmup finds nothing cached.

Needs $BUILTIN_TOKENIZER_DIR: the built-in model's tokenizer as a Hugging Face one, which
tests/e2e_sglang_bench_serving.rs writes (bench_serving makes its prompts and retokenizes the
output with it). Run from `cargo test --test e2e e2e_sglang_bench_serving::`.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from e2e_sglang_router import BIN, PROCS, free_ports, request, start, stop, tail, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "sglang_bench_serving.py")
STARTUP_TIMEOUT_S = float(os.environ.get("DPSERVE_TEST_STARTUP_TIMEOUT", "300"))
MODEL = "dpserve-builtin"

GROUPS, PER_GROUP, OUTPUT_LEN = 2, 4, 24
PROMPTS = GROUPS * PER_GROUP
# bench_serving's warmup request: the first prompt, output cut to 32 tokens.
WARMUP_OUTPUT = min(OUTPUT_LEN, 32)
BENCH_ARGS = [
    "--model", MODEL,
    "--dataset-name", "generated-shared-prefix",
    "--gsp-num-groups", str(GROUPS), "--gsp-prompts-per-group", str(PER_GROUP),
    "--gsp-system-prompt-len", "96", "--gsp-question-len", "16",
    "--gsp-output-len", str(OUTPUT_LEN),
    "--num-prompts", str(PROMPTS), "--max-concurrency", "4", "--seed", "7",
    "--cache-report", "--flush-cache", "--disable-tqdm", "--output-details",
]
COUNTERS = ("requests_total", "prompt_tokens_total", "generation_tokens_total",
            "cached_tokens_total")


def dpserve():
    return PROCS["dpserve"]["url"]


def counters():
    """dpserve's request and token counters, summed over their labels."""
    status, text = request(dpserve() + "/metrics")
    assert status == 200, text
    sums = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        m = re.match(r"dpserve:(\w+)(?:\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in sums:
            sums[m.group(1)] += float(m.group(2))
    return {k: int(v) for k, v in sums.items()}


def printed(stdout, label):
    """The value bench_serving printed after `label`."""
    m = re.search(rf"^{re.escape(label)}\s+(\S+)", stdout, re.MULTILINE)
    if m is None:
        raise AssertionError(f"bench_serving printed no {label!r}:\n{stdout}")
    return float(m.group(1).rstrip("%"))


def setUpModule():
    if not os.path.exists(BIN):
        raise RuntimeError(f"{BIN} not found: run `cargo build` or set DPSERVE_BIN")
    if not os.path.isdir(os.environ.get("BUILTIN_TOKENIZER_DIR", "")):
        raise RuntimeError("set BUILTIN_TOKENIZER_DIR (tests/e2e_sglang_bench_serving.rs does)")
    [port] = free_ports(1)
    env = dict(os.environ, DPSERVE_LOG=os.environ.get("DPSERVE_LOG", "warn"))
    start("dpserve", [BIN, "up", "--builtin-size", "tiny", "--dp-size", "2",
                      "--port", str(port)], env)
    PROCS["dpserve"]["url"] = f"http://127.0.0.1:{port}"

    def both_ranks_live():
        status, body = request(dpserve() + "/health", timeout=5)
        return status == 200 and len(json.loads(body)["live_ranks"]) == 2

    try:
        wait_until("dpserve /health with 2 live ranks", both_ranks_live, STARTUP_TIMEOUT_S,
                   ["dpserve"])
    except BaseException:
        stop("dpserve")
        raise


def tearDownModule():
    stop("dpserve")


class BenchServing(unittest.TestCase):
    def run_bench(self, backend, *extra):
        # An empty cache for the warmup request, so /metrics and the report differ by its
        # prompt and output only.
        status, text = request(dpserve() + "/flush_cache?timeout=60", {})
        self.assertEqual(status, 200, text)
        before = counters()
        work = tempfile.mkdtemp(prefix=f"bench-serving-{backend}-")
        out_file = os.path.join(work, "result.jsonl")
        # HOME: bench_serving caches its generated dataset under ~/.cache; offline: the
        # tokenizer is a local directory and nothing may leave the machine.
        env = dict(os.environ, HOME=work, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        proc = subprocess.run(
            [sys.executable, LAUNCHER, "--backend", backend, "--base-url", dpserve(),
             "--tokenizer", os.environ["BUILTIN_TOKENIZER_DIR"], "--output-file", out_file,
             *BENCH_ARGS, *extra],
            capture_output=True, text=True, timeout=300, env=env, cwd=work)
        self.assertEqual(proc.returncode, 0,
                         f"bench_serving failed:\n{proc.stdout}\n{proc.stderr}\n{tail('dpserve')}")
        after = counters()
        with open(out_file) as f:
            details = json.loads(f.readline())
        return proc.stdout, {k: after[k] - before[k] for k in COUNTERS}, details

    def check(self, backend, *extra):
        stdout, served, details = self.run_bench(backend, *extra)
        print(f"\n--- {backend} ---\n{stdout}\nserver counted {served}", file=sys.stderr)
        self.assertFalse(any(details["errors"]), details["errors"])
        self.assertEqual(printed(stdout, "Successful requests:"), PROMPTS)
        self.assertEqual(served["requests_total"], PROMPTS + 1, "the runs and the warmup")

        generated = printed(stdout, "Total generated tokens:")
        self.assertEqual(generated, PROMPTS * OUTPUT_LEN)
        self.assertEqual(printed(stdout, "Total generated tokens (retokenized):"), generated)
        self.assertEqual(served["generation_tokens_total"], generated + WARMUP_OUTPUT)

        # The report's prompt tokens are the server's (meta_info or usage); bench_serving's
        # "Total input tokens" are its own tokenizer's count of the prompt text, the same but
        # for the chat template's tokens, which only the server adds.
        prompt = printed(stdout, "Total prompt tokens:")
        if backend != "sglang-oai-chat":
            self.assertEqual(printed(stdout, "Total input tokens:"), prompt)
        warmup_prompt = details["input_lens"][0]
        self.assertEqual(served["prompt_tokens_total"], prompt + warmup_prompt)

        cached = printed(stdout, "Total cached tokens:")
        self.assertGreater(cached, 0, "shared prefixes found nothing cached")
        self.assertEqual(served["cached_tokens_total"], cached, "the warmup found none")
        self.assertEqual(sum(details["cached_tokens"]), cached)
        server_rate = 100.0 * served["cached_tokens_total"] / (
            served["prompt_tokens_total"] - warmup_prompt)
        self.assertAlmostEqual(printed(stdout, "Cache hit rate:"), server_rate, delta=1.0)
        for d in details["cached_tokens_details"]:
            if d is not None:
                self.assertEqual(d["host"], 0, d)

    def test_native_generate(self):
        self.check("sglang")

    def test_openai_completions(self):
        self.check("sglang-oai")

    def test_openai_chat(self):
        # Its prompt counts come from the server's usage (the chat template's tokens are
        # the server's): asked for the way any OpenAI client asks.
        self.check("sglang-oai-chat", "--extra-request-body",
                   json.dumps({"stream_options": {"include_usage": True}}))


if __name__ == "__main__":
    unittest.main()
