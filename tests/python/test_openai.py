"""End-to-end tests of dpserve's OpenAI API with the official `openai` Python client.

Starts a real `dpserve up --builtin-size tiny --dp-size 2` (binary from $DPSERVE_BIN, default
target/debug/dpserve) on a free port, runs every test against it, and always stops it.
Standard library `unittest` only, so the one pinned dependency is `openai`. With
$DPSERVE_TEST_SSL_CERTFILE, $DPSERVE_TEST_SSL_KEYFILE and $DPSERVE_TEST_SSL_CAFILE (the CA that
signed the certificate) the server runs HTTPS and every client trusts only that CA
(tests/e2e_tls.rs runs part of the suite so):

    pip install -r tests/python/requirements.txt
    cargo build
    python3 -m unittest discover -s tests/python -v
"""

import base64
import json
import math
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import struct
import time
import unittest
import urllib.error
import urllib.request

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DPSERVE_BIN", os.path.join(ROOT, "target", "debug", "dpserve"))
STARTUP_TIMEOUT_S = float(os.environ.get("DPSERVE_TEST_STARTUP_TIMEOUT", "300"))

SERVER = {}

# HTTPS when the test certificates are given: the server's files, and the CA the clients trust.
CERTFILE = os.environ.get("DPSERVE_TEST_SSL_CERTFILE")
KEYFILE = os.environ.get("DPSERVE_TEST_SSL_KEYFILE")
CAFILE = os.environ.get("DPSERVE_TEST_SSL_CAFILE")
TLS = ssl.create_default_context(cafile=CAFILE) if CERTFILE else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(path):
    with urllib.request.urlopen(SERVER["url"] + path, timeout=10, context=TLS) as r:
        return r.status, r.read().decode()


def http_post(path, body, headers=None):
    """POST JSON; returns (status, parsed body), 4xx/5xx included."""
    req = urllib.request.Request(
        SERVER["url"] + path, data=json.dumps(body).encode(), method="POST",
        headers=dict({"content-type": "application/json"}, **(headers or {})),
    )
    try:
        with urllib.request.urlopen(req, timeout=120, context=TLS) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(server, model_args):
    """`dpserve up` (2 ranks, `model_args`) on a free port, healthy, into `server`."""
    if not os.path.exists(BIN):
        raise RuntimeError(f"{BIN} not found: run `cargo build` or set DPSERVE_BIN")
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="dpserve-py-", suffix=".log", delete=False)
    env = dict(os.environ, DPSERVE_LOG=os.environ.get("DPSERVE_LOG", "warn"))
    argv = [BIN, "up", *model_args, "--dp-size", "2", "--port", str(port)]
    if TLS:
        argv += ["--ssl-certfile", CERTFILE, "--ssl-keyfile", KEYFILE]
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    scheme = "https" if TLS else "http"
    server.update(proc=proc, log=log.name, url=f"{scheme}://127.0.0.1:{port}")
    deadline = time.time() + STARTUP_TIMEOUT_S
    while time.time() < deadline:
        if proc.poll() is not None:
            stop_server(server)
            raise RuntimeError(f"dpserve up exited with {proc.returncode}; log: {tail_log(server)}")
        try:
            with urllib.request.urlopen(server["url"] + "/health", timeout=10, context=TLS) as r:
                if r.status == 200 and len(json.loads(r.read())["live_ranks"]) == 2:
                    break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        stop_server(server)
        raise RuntimeError(f"dpserve never became healthy; log: {tail_log(server)}")


def setUpModule():
    start_server(SERVER, ["--builtin-size", "tiny"])
    http_client = openai.DefaultHttpxClient(verify=TLS) if TLS else None
    SERVER["client"] = openai.OpenAI(
        base_url=SERVER["url"] + "/v1", api_key="unused", max_retries=0, timeout=120,
        http_client=http_client,
    )


def tail_log(server=SERVER):
    try:
        with open(server["log"]) as f:
            return f.read()[-4000:]
    except OSError:
        return "(no log)"


def stop_server(server=SERVER):
    proc = server.get("proc")
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
    server.pop("proc")


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

    def test_top_logprobs_hold_the_greedy_token_and_stream_the_same(self):
        r = self.greedy(max_tokens=6, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.top_logprobs), len(lp.tokens))
        self.assertEqual(len(lp.tokens), r.usage.completion_tokens)
        for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            # Up to 3: two ids with the same text share one key. A JSON map: keys unordered.
            self.assertTrue(1 <= len(top) <= 3, top)
            values = sorted(top.values(), reverse=True)
            self.assertLessEqual(sum(math.exp(v) for v in values), 1.0 + 1e-6)
            # Greedy: the chosen token is the most likely one, with the same logprob.
            self.assertEqual(values[0], chosen)
            self.assertEqual(top[token], chosen)
        chunks = list(self.greedy(max_tokens=6, logprobs=3, stream=True))
        streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        self.assertEqual([t for s in streamed for t in s.tokens], lp.tokens)
        self.assertEqual([t for s in streamed for t in s.token_logprobs], lp.token_logprobs)
        self.assertEqual([t for s in streamed for t in s.top_logprobs], lp.top_logprobs)

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

    def test_chat_top_logprobs_hold_the_greedy_token_and_stream_the_same(self):
        kw = dict(model=MODEL, messages=self.MESSAGES, max_tokens=6, temperature=0,
                  logprobs=True, top_logprobs=4)
        r = client().chat.completions.create(**kw)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for item in content:
            top = item.top_logprobs
            self.assertEqual(len(top), 4)
            values = [t.logprob for t in top]
            self.assertEqual(values, sorted(values, reverse=True))
            self.assertLessEqual(sum(math.exp(v) for v in values), 1.0 + 1e-6)
            self.assertEqual((top[0].token, top[0].logprob), (item.token, item.logprob))
            for t in top:
                self.assertEqual(bytes(t.bytes), t.token.encode())
        chunks = list(client().chat.completions.create(stream=True, **kw))
        streamed = [i for c in chunks if c.choices and c.choices[0].logprobs
                    for i in c.choices[0].logprobs.content]
        self.assertEqual([i.model_dump() for i in streamed], [i.model_dump() for i in content])


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
            model=MODEL, messages=Chat.MESSAGES, logprobs=True, top_logprobs=21))
        self.assert_bad("top_logprobs", lambda: c.chat.completions.create(
            model=MODEL, messages=Chat.MESSAGES, top_logprobs=2))
        self.assert_bad("logprobs", lambda: c.completions.create(
            model=MODEL, prompt="hi", logprobs=6))
        self.assert_bad("presence_penalty", lambda: c.chat.completions.create(
            model=MODEL, messages=Chat.MESSAGES, presence_penalty=3))
        # Still serving.
        r = c.completions.create(model=MODEL, prompt="hi", max_tokens=1)
        self.assertEqual(len(r.choices), 1)


class Embeddings(unittest.TestCase):
    TEXTS = ["the little dog ran home", "a cat sat in the sun", "once upon a time"]

    def embed(self, input, **kw):
        return client().embeddings.create(model=MODEL, input=input, encoding_format="float", **kw)

    def assert_close(self, a, b):
        self.assertEqual(len(a), len(b))
        self.assertTrue(all(abs(x - y) <= 1e-6 for x, y in zip(a, b)))

    def test_shape_unit_norm_and_usage(self):
        r = self.embed(self.TEXTS[0])
        self.assertEqual(r.object, "list")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.data), 1)
        self.assertEqual((r.data[0].object, r.data[0].index), ("embedding", 0))
        v = r.data[0].embedding
        self.assertGreater(len(v), 8)
        self.assertAlmostEqual(math.sqrt(sum(x * x for x in v)), 1.0, places=4)
        self.assertGreater(r.usage.prompt_tokens, 3)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens)

    def test_same_input_same_vector_on_both_ranks(self):
        by_rank = [
            self.embed(self.TEXTS[1], extra_headers={"X-Data-Parallel-Rank": str(rank)})
            .data[0].embedding
            for rank in (0, 1)
        ]
        self.assert_close(by_rank[0], by_rank[1])
        # The native endpoint says where it ran: the rank asked for, and the same vector.
        for rank in (0, 1):
            status, body = http_post("/encode", {"text": self.TEXTS[1], "routed_dp_rank": rank})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["meta_info"]["dp_rank"], rank)
            self.assert_close(body["embedding"], by_rank[0])

    def test_batch_keeps_input_order(self):
        texts = self.TEXTS + [self.TEXTS[0]]
        r = self.embed(texts)
        self.assertEqual([d.index for d in r.data], [0, 1, 2, 3])
        alone = [self.embed(t).data[0].embedding for t in self.TEXTS]
        for d, want in zip(r.data, alone + alone[:1]):
            self.assert_close(d.embedding, want)
        self.assertNotEqual(r.data[0].embedding, r.data[1].embedding)
        ids = [[1, 50, 60, 70], [1, 80, 90]]
        by_ids = self.embed(ids)
        self.assertEqual(by_ids.usage.prompt_tokens, 7)
        self.assert_close(self.embed(ids[1]).data[0].embedding, by_ids.data[1].embedding)

    def test_base64_decodes_to_the_float_result(self):
        # JSON numbers are the f32 values printed; rounding them to f32 gives the bits back.
        floats = self.embed(self.TEXTS[2]).data[0].embedding
        n = len(floats)
        as_f32 = list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *floats)))
        # The client asks for base64 by default and decodes it itself.
        decoded = client().embeddings.create(model=MODEL, input=self.TEXTS[2]).data[0].embedding
        self.assertEqual([float(x) for x in decoded], as_f32)
        status, body = http_post(
            "/v1/embeddings", {"input": self.TEXTS[2], "encoding_format": "base64"})
        self.assertEqual(status, 200, body)
        raw = base64.b64decode(body["data"][0]["embedding"])
        self.assertEqual(len(raw), 4 * n)
        self.assertEqual(list(struct.unpack(f"<{n}f", raw)), as_f32)

    def test_bad_requests_are_400_with_param(self):
        for param, call in [
            ("dimensions", lambda: self.embed("hi", dimensions=8)),
            ("input", lambda: self.embed("")),
            ("input", lambda: self.embed([])),
            ("encoding_format", lambda: client().embeddings.create(
                model=MODEL, input="hi", encoding_format="int8")),
        ]:
            with self.assertRaises(openai.BadRequestError) as ctx:
                call()
            self.assertEqual(ctx.exception.body.get("param"), param, ctx.exception.body)
        _, info = http_get("/get_server_info")
        too_long = [5] * (json.loads(info)["context_length"] + 1)
        with self.assertRaises(openai.BadRequestError) as ctx:
            self.embed(too_long)
        self.assertIn("context length", ctx.exception.body["message"])
        self.assertEqual(len(self.embed("still serving").data), 1)


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

    @staticmethod
    def parsed():
        """/metrics through the reference Prometheus text parser: name -> (type, samples)."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = http_get("/metrics")
        assert status == 200, status
        return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}

    @staticmethod
    def total(families, name, **labels):
        _, samples = families.get(name, (None, []))
        return sum(
            s.value
            for s in samples
            if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def test_metrics_parse_as_prometheus_text_and_counters_move(self):
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            self.skipTest("prometheus_client not installed (pip install -r tests/python/requirements.txt)")
        before = self.parsed()
        types = {name: t for name, (t, _) in before.items()}
        self.assertEqual(types.get("dpserve:num_running_reqs"), "gauge", types)
        self.assertEqual(types.get("dpserve:prompt_tokens"), "counter", types)
        self.assertEqual(types.get("dpserve:time_to_first_token_seconds"), "histogram", types)
        self.assertEqual(types.get("dpserve:routing_decisions"), "counter", types)

        client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        # Token counters move with the response; routing counters with the controller's next
        # cluster status (about every 500 ms): poll, bounded.
        deadline = time.monotonic() + 15
        while True:
            after = self.parsed()
            prompt_moved = self.total(after, "dpserve:prompt_tokens") > self.total(
                before, "dpserve:prompt_tokens")
            routed_moved = self.total(after, "dpserve:routing_decisions") > self.total(
                before, "dpserve:routing_decisions")
            if (prompt_moved and routed_moved) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertTrue(prompt_moved, "dpserve:prompt_tokens_total did not move")
        self.assertTrue(routed_moved, "dpserve:routing_decisions_total did not move")


if __name__ == "__main__":
    sys.exit(unittest.main())
