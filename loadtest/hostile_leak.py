"""Hostile: a model that leaks (`tests.models:leak` keeps 20 MB per batch for ever).

    python -m loadtest.hostile_leak [--root DIR] [--batches 40] [--max-rss-mb 300]

Runs `batchgate serve` with one worker of the leaking model, from this checkout or `--root`,
with `--worker-max-rss-mb` (0: the flag is left out, for a checkout that lacks it), and
sends `--batches` requests one after another, each its own batch. Prints the answers by
status, the worker's pids, its resident set at start, at its peak and at the end (read from
/proc: Linux), the replacements, crashes, re-routes and hangs the watchdog saw, and the
slowest answer (a request sent while the worker is replaced waits for the new process).
Bounded: each request has 60 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx

from gpu_pool.memory import MIB, resident_bytes
from loadtest.server import fetch_metrics, metric, running_server

PAID = {"Authorization": "Bearer paid-demo-key", "X-Request-Timeout-Ms": "60000"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}


def worker_pid(client: httpx.Client) -> int:
    r = client.get("/admin/workers", headers=ADMIN)
    r.raise_for_status()
    (worker,) = r.json()["workers"]
    return int(worker["pid"])


def mib(pid: int) -> float:
    rss = resident_bytes(pid)
    return round(rss / MIB, 1) if rss is not None else -1.0


def run(root: Path, batches: int, max_rss_mb: int, extra: Sequence[str]) -> dict[str, object]:
    args = ["--keys", str(root / "examples" / "keys.toml"), *extra]
    if max_rss_mb:
        args += ["--worker-max-rss-mb", str(max_rss_mb)]
    with running_server(workers=1, model="tests.models:leak", args=args, cwd=root) as srv, \
            httpx.Client(base_url=srv.url, timeout=90) as client:
        first = worker_pid(client)
        at_start = mib(first)
        statuses: Counter[int] = Counter()
        pids = [first]
        peak, slowest = at_start, 0.0
        for n in range(batches):
            t0 = time.monotonic()
            r = client.post("/v1/batchstring", json={"input": f"leak-{n}"}, headers=PAID)
            slowest = max(slowest, time.monotonic() - t0)
            statuses[r.status_code] += 1
            pid = worker_pid(client)
            if pid not in pids:
                pids.append(pid)
            peak = max(peak, mib(pid))
        m = fetch_metrics(srv.url)
        return {
            "root": str(root), "batches": batches, "max_rss_mb": max_rss_mb or None,
            "statuses": dict(statuses), "worker_pids": len(pids),
            "rss_mib_at_start": at_start, "rss_mib_peak": peak,
            "rss_mib_at_end": mib(pids[-1]),
            "replacements": metric(m, "batchgate_worker_replacements_total"),
            "crashes": metric(m, "batchgate_worker_crashes_total"),
            "reroutes": metric(m, "batchgate_batch_reroutes_total"),
            "hangs": metric(m, "batchgate_worker_hangs_total"),
            "slowest_answer_s": round(slowest, 2),
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                        help="the checkout to run the server from (default: this one)")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--max-rss-mb", type=int, default=300,
                        help="--worker-max-rss-mb for the server; 0 leaves the flag out")
    parser.add_argument("--hang-timeout-ms", type=float, default=None,
                        help="passed on to the server (default: the server's own)")
    opts = parser.parse_args(argv)
    extra = [] if opts.hang_timeout_ms is None else ["--hang-timeout-ms",
                                                     str(opts.hang_timeout_ms)]
    print(json.dumps(run(opts.root.resolve(), opts.batches, opts.max_rss_mb, extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
