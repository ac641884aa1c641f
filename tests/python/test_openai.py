"""End-to-end tests of dpserve's OpenAI API with the official `openai` Python client.

Starts a real `dpserve up --builtin-size tiny --dp-size 2` (binary from $DPSERVE_BIN, default
target/debug/dpserve) on a free port, runs every test against it, and always stops it.
Standard library `unittest` only, so the one pinned dependency is `openai`:

    pip install -r tests/python/requirements.txt
    cargo build
    python3 -m unittest discover -s tests/python -v
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DPSERVE_BIN", os.path.join(ROOT, "target", "debug", "dpserve"))
STARTUP_TIMEOUT_S = float(os.environ.get("DPSERVE_TEST_STARTUP_TIMEOUT", "300"))

SERVER = {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(path):
    with urllib.request.urlopen(SERVER["url"] + path, timeout=10) as r:
        return r.status, r.read().decode()


def setUpModule():
    if not os.path.exists(BIN):
        raise RuntimeError(f"{BIN} not found: run `cargo build` or set DPSERVE_BIN")
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="dpserve-py-", suffix=".log", delete=False)
    env = dict(os.environ, DPSERVE_LOG=os.environ.get("DPSERVE_LOG", "warn"))
    proc = subprocess.Popen(
        [BIN, "up", "--builtin-size", "tiny", "--dp-size", "2", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    SERVER.update(proc=proc, log=log.name, url=f"http://127.0.0.1:{port}")
    deadline = time.time() + STARTUP_TIMEOUT_S
    while time.time() < deadline:
        if proc.poll() is not None:
            stop_server()
            raise RuntimeError(f"dpserve up exited with {proc.returncode}; log: {tail_log()}")
        try:
            status, body = http_get("/health")
            if status == 200 and len(json.loads(body)["live_ranks"]) == 2:
                break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        stop_server()
        raise RuntimeError(f"dpserve never became healthy; log: {tail_log()}")
    SERVER["client"] = openai.OpenAI(
        base_url=SERVER["url"] + "/v1", api_key="unused", max_retries=0, timeout=120
    )


def tail_log():
    try:
        with open(SERVER["log"]) as f:
            return f.read()[-4000:]
    except OSError:
        return "(no log)"


def stop_server():
    proc = SERVER.get("proc")
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `up` stops its children
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left of the session (children included) goes, by process group.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    SERVER.pop("proc")


def tearDownModule():
    stop_server()


def client():
    return SERVER["client"]


MODEL = "dpserve-builtin"
PROMPT = "once upon a time there was a little girl who loved to play in the sun with her dog"


class Completions(unittest.TestCase):
    def greedy(self, max_tokens=12, **kw):
        return client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0, **kw
        )

    def test_models(self):
        ids = [m.id for m in client().models.list().data]
        self.assertEqual(len(ids), 1)

    def test_completion_shape_usage_and_greedy_determinism(self):
        a = self.greedy()
        self.assertTrue(a.id.startswith("cmpl-"))
        self.assertEqual(len(a.choices), 1)
        self.assertIsInstance(a.choices[0].text, str)
        self.assertIn(a.choices[0].finish_reason, ("length", "stop"))
        self.assertGreater(a.usage.prompt_tokens, 10)
        self.assertGreaterEqual(a.usage.completion_tokens, 1)
        self.assertEqual(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens)
        self.assertIsNotNone(a.usage.prompt_tokens_details)
        b = self.greedy()
        self.assertEqual(a.choices[0].text, b.choices[0].text)

    def test_repeated_prefix_reports_cached_tokens(self):
        prompt = PROMPT + " and then a cat came along the long road home"
        for _ in range(2):
            r = client().completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)

    def test_stream_matches_non_stream_and_reports_usage(self):
        full = self.greedy().choices[0].text
        chunks = list(self.greedy(stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, full)
        self.assertEqual(chunks[-1].choices, [])
        self.assertGreater(chunks[-1].usage.prompt_tokens, 10)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertIn(finishes[-1], ("length", "stop"))

    def test_stop_strings_trim_output_streaming_or_not(self):
        full = self.greedy(max_tokens=16).choices[0].text
        words = full.split()
        if len(words) < 3:
            self.skipTest(f"greedy text too short to pick a stop string: {full!r}")
        stop = " " + words[2]
        want = full[: full.find(stop)]
        r = self.greedy(max_tokens=16, stop=[stop])
        self.assertEqual(r.choices[0].text, want)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        chunks = list(self.greedy(max_tokens=16, stop=stop, stream=True))
        self.assertEqual("".join(c.choices[0].text for c in chunks), want)
        self.assertEqual(chunks[-1].choices[0].finish_reason, "stop")

    def test_n_choices_and_seeds(self):
        r = client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, n=3, seed=1
        )
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1, 2])
        again = client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, n=3, seed=1
        )
        self.assertEqual([c.text for c in r.choices], [c.text for c in again.choices])
        chunks = list(client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, n=2, stream=True
        ))
        done = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
        self.assertEqual(done, [0, 1])

    def test_logprobs_of_chosen_tokens(self):
        r = self.greedy(max_tokens=5, logprobs=0)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.token_logprobs), r.usage.completion_tokens)
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs))

    def test_routing_key_header_is_accepted(self):
        r = client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2,
            extra_headers={"x-smg-routing-key": "user-7"},
        )
        self.assertEqual(len(r.choices), 1)


class Chat(unittest.TestCase):
    MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]

    def test_chat_and_stream_agree(self):
        r = client().chat.completions.create(
            model=MODEL, messages=self.MESSAGES, max_tokens=8, temperature=0
        )
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIsNotNone(r.usage.prompt_tokens_details)
        chunks = list(client().chat.completions.create(
            model=MODEL, messages=self.MESSAGES, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True},
        ))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, r.choices[0].message.content)
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)

    def test_chat_n_and_logprobs(self):
        r = client().chat.completions.create(
            model=MODEL, messages=self.MESSAGES, max_completion_tokens=4, n=2, logprobs=True
        )
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        content = r.choices[0].logprobs.content
        self.assertGreaterEqual(len(content), 1)
        self.assertLessEqual(content[0].logprob, 0)


class Errors(unittest.TestCase):
    def assert_bad(self, param, call):
        with self.assertRaises(openai.BadRequestError) as ctx:
            call()
        self.assertEqual(ctx.exception.status_code, 400)
        err = ctx.exception.body
        self.assertEqual(err.get("param"), param, err)
        self.assertEqual(err.get("type"), "invalid_request_error", err)
        self.assertTrue(err.get("message"), err)

    def test_bad_parameters_are_400_with_openai_shape(self):
        c = client()
        self.assert_bad("temperature", lambda: c.completions.create(
            model=MODEL, prompt="hi", temperature=5))
        self.assert_bad("n", lambda: c.completions.create(model=MODEL, prompt="hi", n=0))
        self.assert_bad("max_tokens", lambda: c.completions.create(
            model=MODEL, prompt="hi", max_tokens=10**7))
        self.assert_bad("messages", lambda: c.chat.completions.create(model=MODEL, messages=[]))
        self.assert_bad("top_logprobs", lambda: c.chat.completions.create(
            model=MODEL, messages=Chat.MESSAGES, logprobs=True, top_logprobs=2))
        self.assert_bad("presence_penalty", lambda: c.chat.completions.create(
            model=MODEL, messages=Chat.MESSAGES, presence_penalty=3))
        # Still serving.
        r = c.completions.create(model=MODEL, prompt="hi", max_tokens=1)
        self.assertEqual(len(r.choices), 1)


class Metrics(unittest.TestCase):
    def test_metrics_move(self):
        client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        # Per-rank gauges come from the workers' status snapshots, relayed by the controller:
        # wait (bounded) until both ranks' have reached the tokenizer.
        deadline = time.monotonic() + 15
        while True:
            status, text = http_get("/metrics")
            self.assertEqual(status, 200)
            ready = all(f'dpserve:num_running_reqs{{dp_rank="{r}"}}' in text for r in (0, 1))
            if ready or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertIn("dpserve:prompt_tokens_total", text)
        self.assertIn('dpserve:num_running_reqs{dp_rank="0"}', text)
        self.assertIn("dpserve:time_to_first_token_seconds_bucket", text)


if __name__ == "__main__":
    sys.exit(unittest.main())
