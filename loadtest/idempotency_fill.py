"""Does latency drift as the idempotency store fills? Every request carries a unique
Idempotency-Key, so every answer is kept until the store's bounds evict.

    python -m loadtest.idempotency_fill --rps 1200 --duration 220 --windows 2

Starts the real server (`sim` workers) with a keys file of `--accounts` paid accounts, one
key each, limits no load reaches, and offers open-loop load spread over them in
consecutive windows of equal length. After each window: the window's P50/P95/P99, the
server's memory, the store's entries, bytes and evictions, and the collector's pauses.
Exits 1 if a request was lost or answered wrongly.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import psutil

from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.server import fetch_metrics, metric, running_server

KEYS = """anonymous = false

[tiers.paid]
rate = 100000
burst = 100000
account_rate = 100000
account_burst = 100000
budget_ms = 60000
timeout_ms = 10000
"""


def keys_file(folder: Path, accounts: int) -> Path:
    path = folder / "keys.toml"
    entries = "".join(f'\n[[keys]]\nkey = "fill-key-{i}"\ntier = "paid"\naccount = "acct-{i}"\n'
                      for i in range(accounts))
    path.write_text(KEYS + entries)
    return path


def gc_pauses(samples: dict[str, float]) -> tuple[float, float]:
    """(collections, seconds) of the cyclic collector in all generations."""
    count = sum(v for k, v in samples.items() if k.startswith("batchgate_gc_pause_seconds_count"))
    total = sum(v for k, v in samples.items() if k.startswith("batchgate_gc_pause_seconds_sum"))
    return count, total


def run(rps: float, duration: float, windows: int, workers: int, accounts: int) -> int:
    classes = tuple(TrafficClass.bearer(f"acct-{i}", f"fill-key-{i}") for i in range(accounts))
    failed = 0
    print(f"{rps:,.0f} RPS of single-input requests, a unique Idempotency-Key each, over "
          f"{accounts} accounts, {workers} sim workers, {windows} windows of "
          f"{duration / windows:.0f} s")
    print("window  sent     p50     p95     p99   rss MiB  entries  store MiB  evicted  "
          "gc n   gc s")
    with tempfile.TemporaryDirectory() as folder, running_server(
        workers, "sim", ["--keys", str(keys_file(Path(folder), accounts))]
    ) as srv:
        server = psutil.Process(srv.pid)
        for n in range(1, windows + 1):
            before = gc_pauses(fetch_metrics(srv.url))
            cfg = ProbeConfig(srv.url, rps, duration / windows, classes=classes,
                              timeout_s=10.0, idempotency=True)
            result = anyio.run(run_probe, cfg)
            m = fetch_metrics(srv.url)
            after = gc_pauses(m)
            lat = result.latency
            print(f"{n:>6} {result.sent:>6} {lat.p50 * 1000:7.1f} {lat.p95 * 1000:7.1f} "
                  f"{lat.p99 * 1000:7.1f} {server.memory_info().rss / 2**20:9.0f} "
                  f"{metric(m, 'batchgate_idempotency_entries'):8.0f} "
                  f"{metric(m, 'batchgate_idempotency_bytes') / 2**20:10.1f} "
                  f"{metric(m, 'batchgate_idempotency_evictions_total'):8.0f} "
                  f"{after[0] - before[0]:6.0f} {after[1] - before[1]:6.2f}")
            failed += result.lost + result.wrong + result.rejected
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.idempotency_fill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rps", type=float, default=1200)
    parser.add_argument("--duration", type=float, default=220, help="seconds, all windows")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--accounts", type=int, default=8)
    a = parser.parse_args(argv)
    return run(a.rps, a.duration, a.windows, a.workers, a.accounts)


if __name__ == "__main__":
    sys.exit(main())
