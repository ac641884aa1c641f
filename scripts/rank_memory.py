#!/usr/bin/env python3
"""Memory of the running `dpserve worker` processes: RSS and PSS of each (from
/proc/PID/smaps_rollup: PSS divides each shared page among the processes mapping it, so the
sum over workers is what the host holds for them), and the sum.

    python3 scripts/rank_memory.py [--filter TEXT]   # TEXT: only workers whose command line has it

Linux only. Prints one line per worker (pid, rank, RSS MiB, PSS MiB, of which file-backed and
anonymous PSS), then the totals.
"""

import argparse
import os
import sys


def workers(text):
    for pid in sorted((int(p) for p in os.listdir("/proc") if p.isdigit())):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[1] == b"worker" and (text is None or text.encode() in b" ".join(args)):
            rank = "?"
            if b"--rank" in args:
                rank = args[args.index(b"--rank") + 1].decode()
            yield pid, rank


def rollup(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--filter", help="only workers whose command line contains this")
    args = ap.parse_args()
    total = {"Rss": 0, "Pss": 0, "Pss_File": 0, "Pss_Anon": 0}
    n = 0
    for pid, rank in workers(args.filter):
        r = rollup(pid)
        n += 1
        for k in total:
            total[k] += r.get(k, 0)
        print(
            f"pid {pid} rank {rank}: RSS {r['Rss'] / 1024:.1f} MiB, PSS {r['Pss'] / 1024:.1f} MiB"
            f" (file {r.get('Pss_File', 0) / 1024:.1f}, anon {r.get('Pss_Anon', 0) / 1024:.1f})"
        )
    if n == 0:
        sys.exit("no dpserve worker process found")
    print(
        f"{n} workers: RSS {total['Rss'] / 1024:.1f} MiB, PSS {total['Pss'] / 1024:.1f} MiB"
        f" (file {total['Pss_File'] / 1024:.1f}, anon {total['Pss_Anon'] / 1024:.1f})"
    )


if __name__ == "__main__":
    main()
