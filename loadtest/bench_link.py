"""Dispatch benchmark through the link: the core process as `--gateways K` runs it, fed by
load-generating processes that speak the gateway-to-core protocol (no HTTP).

This process is the core: the real `Service` (owner task, real `sim` worker processes at
100 ms a batch), the `Door` and the `LinkServer`, on uvloop. Each generator process connects
to the link as a gateway does and sends `run` jobs on an open-loop Poisson schedule (its
share of the rate, its own seed), every latency from the job's scheduled time, every
answer checked. `core us/item` is this process's CPU (core, owner, door, link, pool IPC;
the workers and generators excluded) over the items answered.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from api.cell import LinkServer
from api.config import DEFAULT_TIERS, KeyRing, Principal, Settings, Workers
from api.door import build_door
from api.gateway import run_message
from api.gateway.remote import RemoteCore, _CoreConnection, _Settles
from api.http import Answered, Job, settle_heap
from api.metrics import Metrics
from batcher import Tier
from loadtest.plan import poisson
from loadtest.probe_results import Latency

BOUNDLESS = 1e9  # rates and budgets past any benchmark load: this measures dispatch
SETTLE_S = 15.0


def generate(path: str, rate: float, duration: float, seed: int, start_at: float,
             out: Any) -> None:
    """A generator process: offer `rate` jobs/s from `start_at` (a monotonic time)."""
    import uvloop

    # A bounded harness process that keeps every future it sends: with the collector on,
    # each generator spent ~0.3 s of a 20 s run in ~600 collections, on the cores the core
    # it measures runs on, and stalled its own receiving (its latencies' tail) meanwhile.
    gc.disable()
    out.send(uvloop.run(_generate(path, rate, duration, seed, start_at)))


async def _generate(path: str, rate: float, duration: float, seed: int,
                    start_at: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    remote = RemoteCore(path, reconnect=False)
    _, conn = await loop.create_unix_connection(lambda: _CoreConnection(remote), path)
    principal = Principal(Tier.PAID, f"gen-{seed}", f"gen-{seed}")
    offsets = poisson(rate, duration, seed)
    latencies: list[float] = []
    wrong = errors = 0
    pending: list[asyncio.Future[Any]] = []

    def check(text: str, at: float, done: asyncio.Future[Any]) -> None:
        nonlocal wrong, errors
        outcome = done.result()
        if not isinstance(outcome, Answered):
            errors += 1
        elif outcome.outputs != [text[::-1]]:
            wrong += 1
        else:
            latencies.append(time.monotonic() - at)

    cpu0 = time.process_time()
    for i, offset in enumerate(offsets):
        at = start_at + offset
        delay = at - time.monotonic()
        if delay > 0.001:
            await asyncio.sleep(delay)
        text = f"g{seed}-{i}"
        future: asyncio.Future[Any] = loop.create_future()
        conn.core.jobs[i] = ((), _Settles(future))
        conn.send(run_message(i, Job(principal, [text], True, 60.0)))
        future.add_done_callback(functools.partial(check, text, at))
        pending.append(future)
    await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True),
                           SETTLE_S + duration)
    return {"latencies": latencies, "wrong": wrong, "errors": errors, "sent": len(offsets),
            "cpu": time.process_time() - cpu0}


async def run_core(rate: float, workers: int, generators: int, duration: float,
                   seed: int) -> dict[str, Any]:
    tiers = {t: dataclasses.replace(p, rate=BOUNDLESS, burst=BOUNDLESS,
                                    account_rate=BOUNDLESS, account_burst=BOUNDLESS,
                                    budget_ms=BOUNDLESS, timeout_ms=BOUNDLESS)
             for t, p in DEFAULT_TIERS.items()}
    settings = Settings(model="sim", workers=Workers(workers), queue_capacity=10_000_000,
                        ready_timeout_s=120.0)
    metrics = Metrics()
    service, door, status, _ = build_door(settings, KeyRing({}, frozenset(), tiers=tiers), metrics)
    server = LinkServer(door, service.clock, status.table)
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as scratch:
        path = str(Path(scratch) / "link.sock")
        async with asyncio.TaskGroup() as tg:
            started = asyncio.Event()
            runner = tg.create_task(service.run(task_status=_Started(started)))
            await started.wait()
            listening = asyncio.Event()
            serving = tg.create_task(server.serve(path, task_status=_Started(listening)))
            await listening.wait()
            settle_heap()  # as the cell's core does once started
            before = service.core.statistics().batcher
            start_at = time.monotonic() + 2.0  # the generators' imports take a moment
            pipes, procs = [], []
            for g in range(generators):
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=generate, args=(
                    path, rate / generators, duration, seed + g, start_at, send))
                proc.start()
                pipes.append(recv)
                procs.append(proc)
            cpu0 = time.process_time()
            results = [await asyncio.to_thread(p.recv) for p in pipes]
            cpu = time.process_time() - cpu0
            after = service.core.statistics().batcher
            for proc in procs:
                proc.join(timeout=10)
            server.close()
            await service.drain()
            serving.cancel()
            runner.cancel()
    latencies = sorted(x for r in results for x in r["latencies"])
    batches = after.batches - before.batches
    answered = len(latencies)
    return {
        "rate": rate, "workers": workers, "generators": generators,
        "sent": sum(r["sent"] for r in results), "ok": answered,
        "wrong": sum(r["wrong"] for r in results), "errors": sum(r["errors"] for r in results),
        "latency": Latency.of(latencies), "fill": (after.items - before.items) / max(1, batches),
        "core_us_per_item": cpu * 1e6 / max(1, answered),
        "generator_cpu_s": [round(r["cpu"], 2) for r in results],
    }


class _Started:
    """A task_status for running `Service.run` and `LinkServer.serve` under a plain asyncio
    TaskGroup."""

    def __init__(self, event: asyncio.Event) -> None:
        self._event = event

    def started(self, value: object = None) -> None:
        self._event.set()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_link",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=10_000.0, help="items/s over all generators")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--generators", type=int, default=4)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    import uvloop

    r = uvloop.run(run_core(a.rate, a.workers, a.generators, a.duration, a.seed))
    lat = r["latency"]
    print(f"{r['rate']:.0f} items/s from {r['generators']} generator processes over the link, "
          f"{r['workers']} sim workers, {a.duration:g} s: sent {r['sent']}, ok {r['ok']}, "
          f"wrong {r['wrong']}, errors {r['errors']}; P50/P95/P99 "
          f"{lat.p50 * 1e3:.1f}/{lat.p95 * 1e3:.1f}/{lat.p99 * 1e3:.1f} ms; fill "
          f"{r['fill']:.1f}; core {r['core_us_per_item']:.1f} us/item; generators' CPU "
          f"{r['generator_cpu_s']} s")
    return 1 if r["wrong"] or r["errors"] or r["ok"] < r["sent"] else 0


if __name__ == "__main__":
    sys.exit(main())
