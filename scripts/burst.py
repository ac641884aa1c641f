#!/usr/bin/env python3
"""Send N requests at once at a dpserve server and say what happened to them.

Each request has its own connection (aiohttp, no pooling), so the server sees N clients at
the same instant. Prints, per burst: admitted (200) and refused (429/503) counts, whether every
refusal carried Retry-After, the client-side latency of refusals and of admitted requests
(median / p99), and the resident memory of every dpserve process (from /proc). The latencies
include the client's own cost of opening N connections; `--health-floor` measures that floor
with N `GET /health` at once. Beside them it prints the server's own refusal latency: the
median and p99 of the burst's observations of `dpserve:request_refusal_seconds{reason}` (from
the handler's entry to the refusal), estimated from its buckets in `/metrics` read before and
after the burst, per reason. `--sequential M` then measures a refusal without a connection
storm: it holds `--hold` long generations open (the server's `--max-in-flight-requests`) and
sends M requests one after another on one keep-alive connection.

    dpserve up --builtin-size tiny --dp-size 2 --max-in-flight-requests 64 &
    python3 scripts/burst.py --requests 2000 --bursts 3 --health-floor

Needs `pip install aiohttp`. Used for docs/RELIABILITY.md ("Overload").
"""

import argparse
import asyncio
import collections
import os
import statistics
import re
import time
import urllib.request

import aiohttp

REFUSAL_HISTOGRAM = "dpserve:request_refusal_seconds"


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def dpserve_rss_kb():
    """RSS of each dpserve process, named by its subcommand and rank."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not argv or not argv[0].endswith(b"dpserve") or len(argv) < 2:
                continue
            name = argv[1].decode()
            if name == "worker" and b"--rank" in argv:
                name += " " + argv[argv.index(b"--rank") + 1].decode()
            with open(f"/proc/{pid}/status") as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
            out[name] = rss
        except (OSError, StopIteration, IndexError):
            continue
    return dict(sorted(out.items()))


def refusal_buckets(base_url):
    """{reason: {le: cumulative count}} of the refusal histogram in /metrics now."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = collections.defaultdict(dict)
    for line in text.splitlines():
        if not line.startswith(REFUSAL_HISTOGRAM + "_bucket{"):
            continue
        labels, value = line[len(REFUSAL_HISTOGRAM + "_bucket{"):].rsplit("} ", 1)
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        le = float(labels["le"])  # "+Inf" parses as inf
        out[labels.get("reason", "")][le] = float(value)
    return out


def bucket_quantile(q, buckets):
    """Prometheus' histogram_quantile over {le: cumulative count}: linear within the bucket the
    rank falls in (from 0 for the first); `(value, beyond)`, beyond when the rank is past the
    last finite bound (the value is then that bound)."""
    les = sorted(buckets)
    total = buckets[les[-1]]
    if total == 0:
        return float("nan"), False
    rank = q * total
    lower, below = 0.0, 0.0
    for le in les:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower, True
            inside = buckets[le] - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0), False
        lower, below = le, buckets[le]
    return lower, True


def server_refusals(before, after):
    """The burst's own observations (after - before), per reason: '<reason> median .. p99 ..'."""
    parts = []
    for reason in sorted(after):
        delta = {le: n - before.get(reason, {}).get(le, 0.0) for le, n in after[reason].items()}
        n = int(delta.get(float("inf"), 0))
        if n == 0:
            continue

        def ms(q):
            value, beyond = bucket_quantile(q, delta)
            return (">" if beyond else "") + f"{value * 1000:.3f}"
        parts.append(f"{reason} (n={n}) median {ms(0.5)} p99 {ms(0.99)}")
    return "; ".join(parts) or "none"


def in_flight(base_url):
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("dpserve:requests_in_flight "):
                return int(float(line.split()[1]))
    return 0


async def sequential(base_url, body, hold, hold_tokens, m):
    """Hold `hold` long requests open, then send `m` one at a time on one connection."""
    url = base_url + "/generate"
    long_body = {"text": body["text"], "sampling_params": {
        "max_new_tokens": hold_tokens, "temperature": 0, "ignore_eos": True}}
    timeout = aiohttp.ClientTimeout(total=600)
    holders_conn = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=holders_conn, timeout=timeout) as holders, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as probe:
        held = [asyncio.create_task(one(holders, url, "POST", long_body)) for _ in range(hold)]
        deadline = time.monotonic() + 10
        while (n := await asyncio.to_thread(in_flight, base_url)) < hold:
            if time.monotonic() > deadline or any(t.done() for t in held):
                print(f"warning: only {n} of {hold} held requests in flight")
                break
            await asyncio.sleep(0.1)
        before = await asyncio.to_thread(refusal_buckets, base_url)
        results = [await one(probe, url, "POST", body) for _ in range(m)]
        after = await asyncio.to_thread(refusal_buckets, base_url)
        for t in held:
            t.cancel()  # closes their connections: the server aborts them
        await asyncio.gather(*held, return_exceptions=True)
    by_status = collections.Counter(r[0] for r in results)
    ms = [r[2] * 1000 for r in results if r[0] in (429, 503)]
    print(
        f"sequential ({hold} held): {dict(sorted(by_status.items(), key=str))}; "
        f"refusal ms median {pct(ms, 0.5):.3f} p99 {pct(ms, 0.99):.3f}; "
        f"server-side refusal ms (histogram): {server_refusals(before, after)}"
    )


async def one(session, url, method, body):
    start = time.perf_counter()
    try:
        async with session.request(method, url, json=body) as r:
            await r.read()
            return r.status, "Retry-After" in r.headers, time.perf_counter() - start
    except aiohttp.ClientError as e:
        return f"client error: {type(e).__name__}", False, time.perf_counter() - start


async def burst(url, method, body, n):
    # One session, but no pooling: every request opens its own connection at once.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return await asyncio.gather(*(one(session, url, method, body) for _ in range(n)))


def report(label, results, server=None):
    by_status = collections.Counter(r[0] for r in results)
    refused = [r for r in results if r[0] in (429, 503)]
    admitted = [r[2] * 1000 for r in results if r[0] == 200]
    refusal_ms = [r[2] * 1000 for r in refused]
    print(
        f"{label}: {dict(sorted(by_status.items(), key=str))}; "
        f"Retry-After on every refusal: {all(r[1] for r in refused)}; "
        f"refusal ms median {pct(refusal_ms, 0.5):.0f} p99 {pct(refusal_ms, 0.99):.0f}; "
        f"admitted ms median {pct(admitted, 0.5):.0f} p99 {pct(admitted, 0.99):.0f}"
        + ("" if server is None else f"; server-side refusal ms (histogram): {server}")
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--health-floor", action="store_true",
                    help="first send as many GET /health at once: the client's own floor")
    ap.add_argument("--sequential", type=int, default=0, metavar="M",
                    help="after the bursts, send M requests one at a time while --hold are held")
    ap.add_argument("--hold", type=int, default=64,
                    help="long requests held open for --sequential (the server's cap)")
    ap.add_argument("--hold-tokens", type=int, default=1024,
                    help="max_new_tokens of each held request")
    args = ap.parse_args()
    body = {"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}}
    print(f"rss kB before: {dpserve_rss_kb()}")
    if args.health_floor:
        res = asyncio.run(burst(args.base_url + "/health", "GET", None, args.requests))
        ms = [r[2] * 1000 for r in res]
        print(f"health floor: {args.requests} GET /health at once: median {statistics.median(ms):.0f} ms, "
              f"p99 {pct(ms, 0.99):.0f} ms")
    for i in range(1, args.bursts + 1):
        before = refusal_buckets(args.base_url)
        res = asyncio.run(burst(args.base_url + "/generate", "POST", body, args.requests))
        report(f"burst {i}", res, server_refusals(before, refusal_buckets(args.base_url)))
        print(f"rss kB after burst {i}: {dpserve_rss_kb()}")
    if args.sequential:
        asyncio.run(sequential(args.base_url, body, args.hold, args.hold_tokens, args.sequential))


if __name__ == "__main__":
    main()
