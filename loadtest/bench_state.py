"""What kept answers cost by where they live (`--state`): one sim server per mode, the same
flags otherwise, offered the same open-loop load of paid requests on 127.0.0.1, each with
an Idempotency-Key of its own (every one leads, claims and stores: the keyed path's whole
cost), beside the same load without keys as the reference.

Per mode: requests answered per second, latency, and the server's CPU per request (the
server process; sim workers take none), plus for redis the redis-server's own CPU per
request. The generator shares this machine's cores with the server: read the columns
against the unkeyed row of the same run, not as absolutes.

`--calls N` also times the SQLite layer's calls alone (a claim and a store per key) run on
the event loop and handed to a thread, the choice `failover/state/sqlite.py` makes.

    python -m loadtest.bench_state [--rps 1000] [--duration 8] [--workers 4] [--calls 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from api.kept import SqliteSettings, SqliteState, StoredResponse
from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.server import cpu_seconds, running_server

KEYS_FILE = Path(__file__).resolve().parents[1] / "examples" / "keys.toml"
PAID_KEY = "paid-demo-key"
MODES = ("unkeyed", "memory", "sqlite", "redis")


@dataclass(frozen=True, slots=True)
class Row:
    mode: str
    offered_rps: float
    achieved_rps: float
    ok: int
    other: int  # answers other than 200, and requests lost
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float  # per answered request
    store_cpu_ms: float | None  # redis-server's, per answered request


def measure(mode: str, rps: float, duration: float, workers: int, folder: Path,
            redis_url: str | None, redis_pid: int | None) -> Row:
    state = {"unkeyed": "memory", "memory": "memory", "sqlite": f"sqlite:{folder / 'kept.db'}",
             "redis": redis_url or ""}[mode]
    args = ["--keys", str(KEYS_FILE), "--state", state]
    classes = (TrafficClass.bearer("paid", PAID_KEY),)
    keyed = mode != "unkeyed"
    with running_server(workers, "sim", args) as srv:
        warm = ProbeConfig(srv.url, rps, 2.0, classes=classes, timeout_s=5.0,
                           idempotency=keyed)
        asyncio.run(run_probe(warm))
        cpu0 = cpu_seconds(srv.pid)
        store0 = cpu_seconds(redis_pid) if redis_pid and mode == "redis" else 0.0
        cfg = ProbeConfig(srv.url, rps, duration, classes=classes, timeout_s=10.0,
                          idempotency=keyed)
        result = asyncio.run(run_probe(cfg))
        cpu = cpu_seconds(srv.pid) - cpu0
        store = cpu_seconds(redis_pid) - store0 if redis_pid and mode == "redis" else None
    answered = max(1, result.ok)
    return Row(mode, rps, result.achieved_rps, result.ok,
               sum(n for s, n in result.statuses.items() if s != 200) + result.lost,
               result.latency.p50 * 1e3, result.latency.p99 * 1e3, cpu * 1e3 / answered,
               None if store is None else store * 1e3 / answered)


def format_row(r: Row) -> str:
    store = "" if r.store_cpu_ms is None else f"{r.store_cpu_ms:8.3f}"
    return (f"{r.mode:<8} {r.offered_rps:>6.0f} {r.achieved_rps:>7.0f} {r.ok:>7} {r.other:>6} "
            f"{r.p50_ms:>7.1f} {r.p99_ms:>7.1f} {r.server_cpu_ms:>9.3f} {store:>8}")


HEADER = (f"{'mode':<8} {'offer':>6} {'answrd':>7} {'ok':>7} {'other':>6} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'cpu ms/r':>9} {'redis ms/r':>8}")


async def time_calls(folder: Path, calls: int) -> tuple[float, float]:
    """CPU microseconds per key (a claim and a store) on the loop, and through a thread."""
    state = SqliteState(SqliteSettings(folder / "calls.db", ttl=3600, max_entries=10 * calls,
                                       max_bytes=1 << 30))
    await state.open()
    answer = StoredResponse(200, b'{"id":"0123456789abcdef","output":"olleh"}')
    fp = b"f" * 32
    try:
        start = time.process_time()
        for n in range(calls):
            await state.claim("acct", f"loop-{n}", fp, 10.0)
            await state.store("acct", f"loop-{n}", fp, answer)
        on_loop = time.process_time() - start
        start = time.process_time()
        for n in range(calls):
            key = f"thread-{n}"
            await anyio.to_thread.run_sync(_finish, state.claim("acct", key, fp, 10.0))
            await anyio.to_thread.run_sync(_finish, state.store("acct", key, fp, answer))
        threaded = time.process_time() - start
    finally:
        await state.close()
    return on_loop * 1e6 / calls, threaded * 1e6 / calls


def _finish(call: Coroutine[Any, Any, object]) -> object:
    """Run a coroutine that never awaits (the SQLite layer's calls) to its end, here: on
    the thread that calls this."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the call awaited something")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rps", type=float, default=1000.0)
    p.add_argument("--duration", type=float, default=8.0, help="seconds measured per mode")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--calls", type=int, default=0, help="also time N SQLite calls alone")
    a = p.parse_args(argv)
    if not 0 < a.duration <= 120 or not 0 < a.rps <= 20_000 or not 0 <= a.calls <= 10**6:
        p.error("--duration within (0, 120], --rps within (0, 20000], --calls up to 1e6")
    from tests.redis_server import RedisServer  # the tests' real-server helper

    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        folder = Path(tmp)
        redis = RedisServer(folder / "redis") if "redis" in a.modes else None
        if redis is not None:
            redis.start()
        try:
            print(f"sim, {a.workers} workers, {a.rps:.0f} RPS offered for {a.duration:.0f} s "
                  "per mode, paid key, one server per mode", flush=True)
            print(HEADER, flush=True)
            for mode in a.modes:
                pid = redis.process.pid if redis and redis.process else None
                row = measure(mode, a.rps, a.duration, a.workers, folder,
                              redis.url if redis else None, pid)
                print(format_row(row), flush=True)
        finally:
            if redis is not None:
                redis.stop()
        if a.calls:
            loop_us, thread_us = anyio.run(time_calls, folder, a.calls)
            print(f"sqlite calls alone, CPU per key (claim + store), {a.calls} keys: "
                  f"on the loop {loop_us:.1f} us, through a thread {thread_us:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
