"""Per-batch overhead of a pool: a batch of 100 short strings sent through the pool seam
and answered, minus the time the model itself took (the worker's `Ok.seconds`), one batch
at a time on one worker with no latency floor. What is left is the pool's own cost per
batch (pickling, the pipe or Ray's RPCs, waking the event loop), to read against the 100 ms
a batch takes on a GPU.

The Ray pool starts a local Ray of one node (loopback only: run this in a namespace where
`lo` is the only interface; `main` reruns itself in one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from gpu_pool import (
    BatchId,
    Err,
    Ok,
    Pool,
    PoolSettings,
    RayPoolSettings,
    Run,
    StartId,
    StartKind,
    WorkerId,
    WorkerPool,
)
from loadtest.netns import loopback_only, rerun_isolated

SLOT = "batchgate_slot"
INPUTS = tuple(f"input-{i:03d}-abcdefg" for i in range(100))  # 16-odd characters each


@dataclass(frozen=True, slots=True)
class Overhead:
    pool: str
    batches: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


class _Replies:
    """PoolEvents for one worker: waits for it to be ready, then for each reply."""

    def __init__(self) -> None:
        self.ready: list[WorkerId] = []
        self.reply: Ok | Err | None = None
        self.died = False
        self._changed = anyio.Event()

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.ready.append(worker)
        self._changed.set()

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        self.reply = reply
        self._changed.set()

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        self.died = True  # also said of every worker as the pool stops
        self._changed.set()

    async def wait(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()


def make_pool(kind: str) -> Pool:
    base = PoolSettings(model="sim", workers=1, latency_floor=0.0)
    if kind == "process":
        return WorkerPool(base)
    from gpu_pool.ray_pool import RayPool

    return RayPool(RayPoolSettings(base, resources={SLOT: 1.0}))


async def _measure(kind: str, batches: int, warmup: int) -> Overhead:
    events, pool, costs = _Replies(), make_pool(kind), []
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        with anyio.fail_after(120):
            while not events.ready:
                await events.wait()
            for i in range(warmup + batches):
                start = time.perf_counter()
                pool.send(events.ready[0], Run(BatchId(i), INPUTS))
                await events.wait()
                took = time.perf_counter() - start
                if events.died or not isinstance(events.reply, Ok):
                    raise RuntimeError(f"batch {i} failed: {events.reply}")
                if i >= warmup:
                    costs.append(took - events.reply.seconds)
        tg.cancel_scope.cancel()
    q = statistics.quantiles(costs, n=100)
    return Overhead(kind, batches, q[49] * 1e3, q[94] * 1e3, q[98] * 1e3,
                    statistics.fmean(costs) * 1e3)


def measure(kind: str, batches: int = 500, warmup: int = 50) -> Overhead:
    return anyio.run(_measure, kind, batches, warmup)


def format_overhead(o: Overhead) -> str:
    return (f"{o.pool:<8} {o.batches:>7} {o.p50_ms:>7.2f} {o.p95_ms:>7.2f} {o.p99_ms:>7.2f} "
            f"{o.mean_ms:>7.2f}")


HEADER = f"{'pool':<8} {'batches':>7} {'p50':>7} {'p95':>7} {'p99':>7} {'mean':>7}  (ms/batch)"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.pool_overhead", description=__doc__)
    p.add_argument("--pools", nargs="+", choices=["process", "ray"], default=["process", "ray"])
    p.add_argument("--batches", type=int, default=500)
    a = p.parse_args(argv)
    if "ray" in a.pools and not loopback_only():
        return rerun_isolated("loadtest.pool_overhead", sys.argv[1:] if argv is None else argv)
    print("per-batch overhead: round trip of 100 strings minus model time, one worker")
    print(HEADER, flush=True)
    for kind in a.pools:
        print(format_overhead(measure(kind, a.batches)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
