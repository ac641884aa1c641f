#!/usr/bin/env python3
"""Send N requests at once at a dpserve server and say what happened to them.

Each request has its own connection (aiohttp, no pooling), so the server sees N clients at
the same instant. Prints, per burst: admitted (200) and refused (429/503) counts, whether every
refusal carried Retry-After, the client-side latency of refusals and of admitted requests
(median / p99), and the resident memory of every dpserve process (from /proc). The latencies
include the client's own cost of opening N connections; `--health-floor` measures that floor
with N `GET /health` at once.

    dpserve up --builtin-size tiny --dp-size 2 --max-in-flight-requests 64 &
    python3 scripts/burst.py --requests 2000 --bursts 3 --health-floor

Needs `pip install aiohttp`. Used for docs/RELIABILITY.md ("Overload").
"""

import argparse
import asyncio
import collections
import os
import statistics
import time

import aiohttp


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


def report(label, results):
    by_status = collections.Counter(r[0] for r in results)
    refused = [r for r in results if r[0] in (429, 503)]
    admitted = [r[2] * 1000 for r in results if r[0] == 200]
    refusal_ms = [r[2] * 1000 for r in refused]
    print(
        f"{label}: {dict(sorted(by_status.items(), key=str))}; "
        f"Retry-After on every refusal: {all(r[1] for r in refused)}; "
        f"refusal ms median {pct(refusal_ms, 0.5):.0f} p99 {pct(refusal_ms, 0.99):.0f}; "
        f"admitted ms median {pct(admitted, 0.5):.0f} p99 {pct(admitted, 0.99):.0f}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--health-floor", action="store_true",
                    help="first send as many GET /health at once: the client's own floor")
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
        res = asyncio.run(burst(args.base_url + "/generate", "POST", body, args.requests))
        report(f"burst {i}", res)
        print(f"rss kB after burst {i}: {dpserve_rss_kb()}")


if __name__ == "__main__":
    main()
