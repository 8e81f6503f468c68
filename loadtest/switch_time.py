"""How long a worker takes to switch model versions: from `Pool.switch` to the new
incarnation's ready event, on one worker, switching back and forth between two versions of
the same model (each switch stops the process, or kills the actor, and loads the model in a
new one). Read it as the set-up cost the core's placement weighs against the work waiting
for another version. The first start (no process to stop) is printed beside it.

The Ray pool starts a local Ray of one node (loopback only: `main` reruns itself in a
namespace where `lo` is the only interface).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from batcher import VersionKey
from gpu_pool import (
    Err,
    Load,
    Ok,
    Origin,
    Pool,
    PoolSettings,
    RayPoolSettings,
    StartId,
    StartKind,
    WorkerId,
    WorkerPool,
)
from loadtest.netns import loopback_only, rerun_isolated

SLOT = "batchgate_slot"
LOAD_TIMEOUT_S = 300.0  # for one load of a real model on a slow machine


@dataclass(frozen=True, slots=True)
class SwitchTime:
    pool: str
    spec: str
    first_s: float  # the first start, nothing to stop
    switches: list[float]  # seconds from switch() to the ready event, one per switch

    def line(self) -> str:
        s = self.switches
        return (f"{self.pool:<8} {self.spec:<8} {self.first_s:>7.2f} {len(s):>8} "
                f"{statistics.median(s):>7.2f} {min(s):>7.2f} {max(s):>7.2f}")


HEADER = (f"{'pool':<8} {'model':<8} {'first':>7} {'switches':>8} {'median':>7} {'min':>7} "
          f"{'max':>7}  (seconds)")


class _Ready:
    """PoolEvents that wait for the next ready worker; a death while switching is an error
    (every worker is said dead as the pool stops: that one is not)."""

    def __init__(self) -> None:
        self.ready: list[tuple[WorkerId, StartId, str]] = []
        self.died: list[WorkerId] = []
        self._changed = anyio.Event()

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.ready.append((worker, start, version))
        self._changed.set()

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        pass

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        self.died.append(worker)
        self._changed.set()

    async def next_ready(self, seen: int) -> tuple[WorkerId, StartId, str]:
        with anyio.fail_after(LOAD_TIMEOUT_S):
            while len(self.ready) <= seen and not self.died:
                await self._changed.wait()
                self._changed = anyio.Event()
        if self.died:
            raise RuntimeError(f"workers {self.died} died while switching")
        return self.ready[seen]


def make_pool(kind: str, first: Load) -> Pool:
    base = PoolSettings(model=first.spec, workers=1, latency_floor=0.0, loads=(first,))
    if kind == "process":
        return WorkerPool(base)
    from gpu_pool.ray_pool import RayPool

    return RayPool(RayPoolSettings(base, resources={SLOT: 1.0}))


async def _measure(kind: str, spec: str, switches: int) -> SwitchTime:
    versions = (Load(VersionKey.of(spec, "a"), spec), Load(VersionKey.of(spec, "b"), spec))
    events, pool = _Ready(), make_pool(kind, versions[0])
    took: list[float] = []
    async with anyio.create_task_group() as tg:
        began = time.perf_counter()
        await tg.start(pool.run, events)
        worker, _, _ = await events.next_ready(0)
        first = time.perf_counter() - began
        for n in range(1, switches + 1):
            load = versions[n % 2]
            began = time.perf_counter()
            pool.switch(worker, load, StartId(Origin.CORE, n))
            worker, start, version = await events.next_ready(n)
            took.append(time.perf_counter() - began)
            if (start, version) != (StartId(Origin.CORE, n), load.version):
                raise RuntimeError(f"worker {worker} came up for {start} holding {version}")
        tg.cancel_scope.cancel()
    return SwitchTime(kind, spec, first, took)


def measure(kind: str, spec: str, switches: int = 5) -> SwitchTime:
    return anyio.run(_measure, kind, spec, switches)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.switch_time", description=__doc__)
    p.add_argument("--pools", nargs="+", choices=["process", "ray"], default=["process"])
    p.add_argument("--models", nargs="+", default=["sim", "minilm"],
                   help="specs as --model takes them")
    p.add_argument("--switches", type=int, default=5)
    a = p.parse_args(argv)
    if "ray" in a.pools and not loopback_only():
        return rerun_isolated("loadtest.switch_time", sys.argv[1:] if argv is None else argv)
    print("switch time: switch() to the new incarnation's ready event, one worker")
    print(HEADER, flush=True)
    for kind in a.pools:
        for spec in a.models:
            print(measure(kind, spec, a.switches).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
