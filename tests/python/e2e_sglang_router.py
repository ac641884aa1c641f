"""End-to-end: SGLang's own gateway, `sglang-router` from PyPI, in front of a real dpserve.

Starts `dpserve up --builtin-size tiny --dp-size 2` (binary from $DPSERVE_BIN, default
target/debug/dpserve) with a routing trace, then the real router with `--dp-aware` pointed at
it. The router reads `/server_info` (dp_size) and `/model_info`, makes one worker per rank
(`URL@0`, `URL@1`), health-checks them, and forwards `/generate` and the OpenAI endpoints with
`data_parallel_rank` set and many SGLang-only fields. The tests check that every request
succeeds, that dpserve routed it by that explicit rank (routing trace branch `explicit`), that
both ranks got traffic, and that the router's per-worker counts equal dpserve's per-rank counts.
Everything is stopped at the end, by process group.

The file name does not match `test*.py`, so `tests/e2e_openai_python.rs` (unittest discover)
does not run it; `tests/e2e_sglang_router.rs` does:

    pip install -r tests/python/requirements.txt
    cargo build
    python3 tests/python/e2e_sglang_router.py -v
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DPSERVE_BIN", os.path.join(ROOT, "target", "debug", "dpserve"))
STARTUP_TIMEOUT_S = float(os.environ.get("DPSERVE_TEST_STARTUP_TIMEOUT", "300"))
MODEL = "dpserve-builtin"
PROMPT = "once upon a time there was a little girl who loved to play in the sun with her dog"

# What SGLang clients and the router itself add to a /generate body; dpserve must ignore what
# it does not implement and keep serving.
SGLANG_GENERATE_EXTRAS = {
    "return_hidden_states": False,
    "lora_path": None,
    "custom_logit_processor": None,
    "bootstrap_host": None,
    "bootstrap_port": None,
    "bootstrap_room": None,
    "log_metrics": True,
    "logprob_start_len": -1,
    "top_logprobs_num": 0,
    "return_text_in_logprobs": False,
    "modalities": None,
    "session_params": None,
    "image_data": None,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
}
SGLANG_SAMPLING_EXTRAS = {
    "min_new_tokens": 0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "custom_params": None,
    "n": 1,
}
SGLANG_OPENAI_EXTRAS = {
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "regex": None,
    "ebnf": None,
    "no_stop_trim": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
    "lora_path": None,
    "separate_reasoning": True,
    "stream_reasoning": True,
}

PROCS = {}


def free_ports(n):
    """`n` distinct free loopback ports (all held open while choosing, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def request(url, body=None, timeout=60):
    """(status, text) of a GET, or a POST of `body` as JSON; HTTP errors are returned too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post_json(url, body):
    status, text = request(url, body)
    if status != 200:
        raise AssertionError(f"POST {url}: HTTP {status}: {text}")
    return json.loads(text)


def post_sse(url, body):
    """The `data:` payloads of an SSE response, `[DONE]` included."""
    status, text = request(url, body)
    if status != 200:
        raise AssertionError(f"POST {url}: HTTP {status}: {text}")
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def wait_until(what, ready, timeout_s, procs):
    """Poll `ready()` until it returns a true value (returned); fail on timeout or a dead child."""
    deadline = time.monotonic() + timeout_s
    while True:
        for name in procs:
            proc = PROCS[name]["proc"]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; log:\n{tail(name)}")
        try:
            value = ready()
            if value:
                return value
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}; logs:\n{all_tails()}")
        time.sleep(0.2)


def start(name, argv, env):
    log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    PROCS[name] = {"proc": proc, "log": log.name}


def tail(name):
    try:
        with open(PROCS[name]["log"], errors="replace") as f:
            return f.read()[-4000:]
    except OSError:
        return "(no log)"


def all_tails():
    return "\n".join(f"--- {name} ---\n{tail(name)}" for name in PROCS)


def stop(name):
    entry = PROCS.pop(name, None)
    if entry is None:
        return
    proc = entry["proc"]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
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


def setUpModule():
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        raise unittest.SkipTest(
            "sglang-router is not installed (pip install -r tests/python/requirements.txt)"
        )
    if not os.path.exists(BIN):
        raise RuntimeError(f"{BIN} not found: run `cargo build` or set DPSERVE_BIN")
    try:
        start_cluster_and_router()
    except BaseException:
        tearDownModule()
        raise


def start_cluster_and_router():
    tmp = tempfile.mkdtemp(prefix="dpserve-sglang-router-")
    trace = os.path.join(tmp, "route.jsonl")
    [port] = free_ports(1)
    env = dict(os.environ, DPSERVE_LOG=os.environ.get("DPSERVE_LOG", "warn"))
    start(
        "dpserve",
        [BIN, "up", "--builtin-size", "tiny", "--dp-size", "2", "--port", str(port),
         "--trace-file", trace],
        env,
    )
    dpserve = f"http://127.0.0.1:{port}"
    PROCS["dpserve"].update(url=dpserve, trace=trace)

    def both_ranks_live():
        status, body = request(dpserve + "/health", timeout=5)
        return status == 200 and len(json.loads(body)["live_ranks"]) == 2

    wait_until("dpserve /health with 2 live ranks", both_ranks_live, STARTUP_TIMEOUT_S, ["dpserve"])

    router_port, metrics_port, closed_port = free_ports(3)
    # The router loads a tokenizer for the model it discovers; the built-in model has no
    # tokenizer files, so it would ask the Hugging Face Hub. Point the Hub at a closed
    # loopback port: the test never leaves the machine, and routing does not need it.
    router_env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{closed_port}")
    start(
        "sglang-router",
        [sys.executable, "-m", "sglang_router.launch_router",
         "--worker-urls", dpserve, "--dp-aware", "--policy", "round_robin",
         "--host", "127.0.0.1", "--port", str(router_port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
         "--health-check-interval-secs", "1", "--worker-startup-check-interval", "1",
         "--worker-startup-timeout-secs", str(int(STARTUP_TIMEOUT_S)),
         # A failed request must fail the test, not be retried on the other rank.
         "--disable-retries", "--log-level", "warn"],
        router_env,
    )
    router = f"http://127.0.0.1:{router_port}"
    PROCS["sglang-router"].update(url=router, metrics=f"http://127.0.0.1:{metrics_port}")

    def workers_healthy():
        status, body = request(router + "/workers", timeout=5)
        workers = json.loads(body)["workers"] if status == 200 else []
        healthy = sorted(w["url"] for w in workers if w["is_healthy"])
        return workers if healthy == [f"{dpserve}@0", f"{dpserve}@1"] else None

    PROCS["sglang-router"]["workers"] = wait_until(
        "sglang-router to report both DP workers healthy", workers_healthy, 60,
        ["dpserve", "sglang-router"],
    )


def tearDownModule():
    for name in ["sglang-router", "dpserve"]:
        stop(name)


def dpserve():
    return PROCS["dpserve"]["url"]


def router():
    return PROCS["sglang-router"]["url"]


def route_records(rids, timeout_s=15):
    """dpserve's routing-trace records of `rids`, waiting (bounded) for the writer's flush."""
    want = set(rids)

    def read():
        found = {}
        with open(PROCS["dpserve"]["trace"]) as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    if rec["rid"] in want:
                        found[rec["rid"]] = rec
        return found if set(found) == want else None

    return wait_until(f"routing trace records of {sorted(want)}", read, timeout_s, ["dpserve"])


def explicit_ranks(test, rids):
    """rid -> rank dpserve chose, asserting it took each rank from the request (routing trace
    branch `explicit`) rather than from its own policy."""
    records = route_records(rids)
    for rid in rids:
        test.assertEqual(records[rid]["branch"], "explicit", records[rid])
        test.assertEqual(records[rid]["key_source"], "explicit", records[rid])
    return {rid: records[rid]["rank"] for rid in rids}


def router_success_counts():
    """Per rank, the requests the router sent to worker `URL@rank` that succeeded."""
    _, text = request(PROCS["sglang-router"]["metrics"] + "/metrics", timeout=5)
    counts = {0: 0.0, 1: 0.0}
    pattern = re.compile(
        r'^smg_worker_cb_outcomes_total\{(?=[^}]*worker="' + re.escape(dpserve())
        + r'@(\d+)")(?=[^}]*outcome="success")[^}]*\} (\S+)$', re.M
    )
    for rank, value in pattern.findall(text):
        counts[int(rank)] = float(value)
    return counts


def dpserve_request_counts():
    """Per rank, the requests dpserve finished (`dpserve:requests_total`, all finish reasons)."""
    _, text = request(dpserve() + "/metrics", timeout=5)
    counts = {0: 0.0, 1: 0.0}
    for rank, value in re.findall(
        r'^dpserve:requests_total\{dp_rank="(\d+)"[^}]*\} (\S+)$', text, re.M
    ):
        counts[int(rank)] += float(value)
    return counts


def generate_body(**kw):
    sampling = dict(SGLANG_SAMPLING_EXTRAS, max_new_tokens=6, temperature=0)
    body = dict(SGLANG_GENERATE_EXTRAS, sampling_params=sampling)
    body.update(kw)
    return body


class Discovery(unittest.TestCase):
    def test_router_made_one_worker_per_rank_from_server_info(self):
        workers = PROCS["sglang-router"]["workers"]
        self.assertEqual(len(workers), 2, workers)
        for w in workers:
            self.assertEqual(w["model_id"], MODEL, w)
            self.assertEqual(w["metadata"].get("dp_size"), "2", w)
        status, body = request(router() + "/v1/models")
        self.assertEqual(status, 200, body)
        self.assertEqual([m["id"] for m in json.loads(body)["data"]], [MODEL])

    def test_info_endpoints_the_router_reads(self):
        for path in ["/server_info", "/get_server_info"]:
            status, body = request(dpserve() + path)
            self.assertEqual(status, 200, body)
            info = json.loads(body)
            self.assertEqual(info["dp_size"], 2)
            self.assertEqual(info["tp_size"], 1)
            self.assertEqual(info["served_model_name"], MODEL)
        for path in ["/model_info", "/get_model_info"]:
            status, body = request(dpserve() + path)
            self.assertEqual(status, 200, body)
            self.assertIs(json.loads(body)["is_generation"], True)
        for path in ["/health", "/health_generate"]:
            self.assertEqual(request(dpserve() + path)[0], 200, path)


class ThroughRouter(unittest.TestCase):
    def test_generate_follows_the_routers_round_robin_rank(self):
        # The same prompt four times: dpserve's own prefix-affinity routing would send all of
        # them to one rank; the router's round robin alternates, and dpserve must follow it.
        ranks, rid_to_rank, texts = [], {}, set()
        for _ in range(4):
            r = post_json(router() + "/generate", generate_body(text=PROMPT))
            meta = r["meta_info"]
            self.assertEqual(meta["completion_tokens"], 6, r)
            ranks.append(meta["dp_rank"])
            rid_to_rank[meta["id"]] = meta["dp_rank"]
            texts.add(r["text"])
        self.assertEqual(set(ranks), {0, 1}, ranks)
        self.assertTrue(all(a != b for a, b in zip(ranks, ranks[1:])), ranks)
        # Greedy and batch-invariant: both ranks give the same text.
        self.assertEqual(len(texts), 1, texts)
        self.assertEqual(explicit_ranks(self, rid_to_rank), rid_to_rank)

    def test_generate_with_sglang_only_fields_set(self):
        body = generate_body(
            text=PROMPT,
            return_hidden_states=True,
            lora_path="adapter-that-does-not-exist",
            custom_logit_processor="{}",
            bootstrap_host="127.0.0.1",
            bootstrap_port=8998,
            bootstrap_room=12345,
            return_logprob=True,
        )
        r = post_json(router() + "/generate", body)
        self.assertEqual(r["meta_info"]["completion_tokens"], 6, r)
        meta = r["meta_info"]
        self.assertEqual(explicit_ranks(self, [meta["id"]]), {meta["id"]: meta["dp_rank"]})

    def test_generate_input_ids_streaming_and_not(self):
        ids = [5, 17, 300, 41, 9, 1000, 77]
        full = post_json(router() + "/generate", generate_body(input_ids=ids))
        self.assertEqual(len(full["output_ids"]), 6, full)
        events = post_sse(router() + "/generate", generate_body(input_ids=ids, stream=True))
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        # SGLang's stream: each chunk holds every id so far, the last one all of them.
        for before, after in zip(chunks, chunks[1:]):
            self.assertEqual(after["output_ids"][:len(before["output_ids"])], before["output_ids"])
        self.assertEqual(chunks[-1]["output_ids"], full["output_ids"])
        self.assertEqual(len({c["meta_info"]["dp_rank"] for c in chunks}), 1, chunks)
        self.assertIsNotNone(chunks[-1]["meta_info"]["finish_reason"])
        # Round robin: two consecutive requests, two ranks.
        ranks = {full["meta_info"]["id"]: full["meta_info"]["dp_rank"],
                 chunks[-1]["meta_info"]["id"]: chunks[-1]["meta_info"]["dp_rank"]}
        self.assertEqual(set(ranks.values()), {0, 1}, ranks)
        self.assertEqual(explicit_ranks(self, ranks), ranks)

    def test_text_streaming_matches_non_streaming(self):
        full = post_json(router() + "/generate", generate_body(text=PROMPT))
        events = post_sse(router() + "/generate", generate_body(text=PROMPT, stream=True))
        self.assertEqual(events[-1], "[DONE]")
        texts = [json.loads(e)["text"] for e in events[:-1]]
        # SGLang's stream: each chunk's text is the whole text so far.
        for before, after in zip(texts, texts[1:]):
            self.assertTrue(after.startswith(before), texts)
        self.assertEqual(texts[-1], full["text"])

    def test_openai_completions_through_the_router(self):
        rids, texts = [], set()
        for _ in range(2):
            body = dict(SGLANG_OPENAI_EXTRAS, model=MODEL, prompt=PROMPT, max_tokens=5,
                        temperature=0)
            r = post_json(router() + "/v1/completions", body)
            self.assertEqual(r["object"], "text_completion", r)
            self.assertEqual(r["usage"]["completion_tokens"], 5, r)
            texts.add(r["choices"][0]["text"])
            rids.append(r["id"])
        self.assertEqual(len(texts), 1, texts)
        # Round robin: two consecutive requests, two ranks.
        self.assertEqual(set(explicit_ranks(self, rids).values()), {0, 1})

        body = dict(SGLANG_OPENAI_EXTRAS, model=MODEL, prompt=PROMPT, max_tokens=5,
                    temperature=0, stream=True)
        events = post_sse(router() + "/v1/completions", body)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        self.assertEqual("".join(c["choices"][0]["text"] for c in chunks if c["choices"]),
                         texts.pop())

    def test_openai_chat_through_the_router(self):
        messages = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hello"}]
        body = dict(SGLANG_OPENAI_EXTRAS, model=MODEL, messages=messages, max_tokens=5,
                    temperature=0, chat_template_kwargs={"enable_thinking": False})
        r = post_json(router() + "/v1/chat/completions", body)
        self.assertEqual(r["choices"][0]["message"]["role"], "assistant", r)
        self.assertEqual(r["usage"]["completion_tokens"], 5, r)
        explicit_ranks(self, [r["id"]])
        events = post_sse(router() + "/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks if c["choices"])
        self.assertEqual(text, r["choices"][0]["message"]["content"])

    def test_router_per_worker_counts_equal_dpserve_per_rank_counts(self):
        # The router's choice is observable in its metrics, per worker `URL@rank`; dpserve
        # counts finished requests per rank. Over a burst through the router, both moves agree.
        before_router, before_dpserve = router_success_counts(), dpserve_request_counts()
        for i in range(6):
            if i % 2:
                post_json(router() + "/generate", generate_body(text=f"{PROMPT} {i}"))
            else:
                post_json(router() + "/v1/completions",
                          dict(SGLANG_OPENAI_EXTRAS, model=MODEL, prompt=f"{PROMPT} {i}",
                               max_tokens=2))

        def deltas():
            r, d = router_success_counts(), dpserve_request_counts()
            moved_r = {k: r[k] - before_router[k] for k in r}
            moved_d = {k: d[k] - before_dpserve[k] for k in d}
            return (moved_r, moved_d) if moved_r == moved_d else None

        try:
            moved_router, _ = wait_until("router and dpserve counts to agree", deltas, 15,
                                         ["dpserve", "sglang-router"])
        except RuntimeError:
            self.fail(f"router moved {router_success_counts()} from {before_router}, "
                      f"dpserve moved {dpserve_request_counts()} from {before_dpserve}")
        self.assertEqual(sum(moved_router.values()), 6, moved_router)
        self.assertTrue(all(n > 0 for n in moved_router.values()), moved_router)

    def test_bad_request_is_dpserves_400_through_the_router(self):
        body = generate_body(text=PROMPT)
        body["sampling_params"]["max_new_tokens"] = 10**7
        status, text = request(router() + "/generate", body)
        self.assertEqual(status, 400, text)
        self.assertIn("max_new_tokens", json.loads(text)["error"]["message"])
        # Still serving, through the router.
        r = post_json(router() + "/generate", generate_body(text=PROMPT))
        self.assertEqual(r["meta_info"]["completion_tokens"], 6)


class Direct(unittest.TestCase):
    """dpserve alone honours `data_parallel_rank`, as the router relies on."""

    def test_explicit_data_parallel_rank_is_honoured(self):
        for rank in [0, 1, 1, 0]:
            r = post_json(dpserve() + "/generate",
                          generate_body(text=PROMPT, data_parallel_rank=rank))
            self.assertEqual(r["meta_info"]["dp_rank"], rank, r)
            self.assertEqual(explicit_ranks(self, [r["meta_info"]["id"]]), {r["meta_info"]["id"]: rank})
        for rank in [0, 1]:
            r = post_json(dpserve() + "/v1/completions",
                          dict(SGLANG_OPENAI_EXTRAS, model=MODEL, prompt=PROMPT, max_tokens=2,
                               data_parallel_rank=rank))
            self.assertEqual(explicit_ranks(self, [r["id"]]), {r["id"]: rank})

    def test_rank_that_is_not_live_is_a_400(self):
        status, text = request(dpserve() + "/generate",
                               generate_body(text=PROMPT, data_parallel_rank=7))
        self.assertEqual(status, 400, text)


if __name__ == "__main__":
    unittest.main()
