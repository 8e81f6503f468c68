"""Chaos load test: steady open-loop load while a random worker is SIGKILLed every few seconds.

    python -m loadtest.chaos --rps 500 --workers 4 --kill-every 3 --duration 60
    python -m loadtest.chaos --rps 300 --workers 3 --signal STOP --kill-every 6 --duration 9

With `--signal STOP` the worker is stopped instead (a stall, not a death): its batch runs again
on another worker (a hedge) and the watchdog kills it as hung; the latency percentiles are
what that costs the requests (tests/e2e/test_failover.py checks the outcome, this the figure).

Starts the real server with `sim` workers on 127.0.0.1, offers the load with the open-loop
probe (every answer checked), kills a worker (a busy one when there is one: the worst case,
a batch in flight) on a fixed period, and prints what happened: sent, answered correctly,
wrong, lost, errors by status, re-routes and crashes from the server's own metrics, and the
latency percentiles. Exits 1 if anything was lost or wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import urllib.request
from collections.abc import Sequence

import anyio

from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult, format_result
from loadtest.server import fetch_metrics, metric, running_server

ADMIN = "admin-demo-key"


def worker_pids(url: str) -> tuple[list[int], list[int]]:
    """(busy, ready) worker pids, from /admin/workers."""
    req = urllib.request.Request(url + "/admin/workers",
                                 headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        workers = json.load(resp)["workers"]
    busy = [w["pid"] for w in workers if w["state"] == "busy"]
    ready = [w["pid"] for w in workers if w["state"] == "ready"]
    return busy, ready


async def killer(url: str, every: float, until: float, rng: random.Random,
                 sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Send `sig` to one worker per period (a busy one if any) until `until`; the pids."""
    killed: list[int] = []
    while anyio.current_time() + every < until:
        await anyio.sleep(every)
        busy, ready = await anyio.to_thread.run_sync(worker_pids, url)
        victims = busy or ready
        if victims:
            pid = rng.choice(victims)
            os.kill(pid, sig)
            killed.append(pid)
    return killed


async def chaos(url: str, rps: float, duration: float, every: float, seed: int,
                sig: signal.Signals = signal.SIGKILL) -> tuple[ProbeResult, list[int]]:
    config = ProbeConfig(url=url, rps=rps, duration_s=duration, seed=seed, timeout_s=10.0,
                         classes=(TrafficClass.bearer("paid", "paid-demo-key"),))
    killed: list[int] = []
    async with anyio.create_task_group() as tg:
        async def kill() -> None:
            killed.extend(await killer(url, every, anyio.current_time() + duration,
                                       random.Random(seed), sig))

        tg.start_soon(kill)
        result = await run_probe(config)
    return result, killed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rps", type=float, default=500.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--kill-every", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--signal", choices=["KILL", "STOP"], default="KILL",
                   help="STOP: a stalled worker, caught as hung (default KILL)")
    a = p.parse_args(argv)
    sig = signal.Signals[f"SIG{a.signal}"]
    args = ["--keys", "examples/keys.toml"]
    with running_server(workers=a.workers, args=args) as srv:
        result, killed = anyio.run(chaos, srv.url, a.rps, a.duration, a.kill_every, a.seed,
                                   sig)
        m = fetch_metrics(srv.url)
    statuses = " ".join(f"{s}:{n}" for s, n in sorted(result.statuses.items()))
    print(f"chaos: {a.rps:.0f} RPS for {a.duration:.0f} s on {a.workers} sim workers, "
          f"one SIG{a.signal} every {a.kill_every:g} s")
    print(f"sent {result.sent}  answered correctly {result.ok}  wrong {result.wrong}  "
          f"lost {result.lost}  statuses {statuses}")
    print(f"workers signalled {len(killed)}  crashes "
          f"{metric(m, 'batchgate_worker_crashes_total'):.0f}"
          f"  re-routes {metric(m, 'batchgate_batch_reroutes_total'):.0f}  hangs "
          f"{metric(m, 'batchgate_worker_hangs_total'):.0f}  hedges "
          f"{metric(m, 'batchgate_batch_hedges_total'):.0f}")
    lat = result.latency
    print(f"latency p50 {lat.p50 * 1e3:.1f} ms  p95 {lat.p95 * 1e3:.1f} ms  "
          f"p99 {lat.p99 * 1e3:.1f} ms  max {lat.max * 1e3:.1f} ms")
    print(format_result(result).splitlines()[-1])
    return 0 if result.lost == 0 and result.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
