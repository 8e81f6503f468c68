"""How long a worker takes to come up, by how it starts: a fresh interpreter ("spawn"), a
fork of the pool's launcher, which holds the imports and, where a model lets it, the
weights ("fork"), or a parked worker of the same version woken ("wake"); and a switch
between two versions on one slot with nothing parked, spawned or forked ("switch"). Each
figure is seconds from the pool call (`add`, `switch`) to the `worker_ready` event, and each
start's `how` is checked against the kind it should be: the core weighs each kind's measured
time when it places work, so a start reported as the wrong kind skews what it learns.

It also shows what parking costs and that it is bounded: a parked worker's RSS and PSS (a
forked worker shares the launcher's pages, so its PSS is what it really adds), and, with
`parked_max=2`, three versions parked one after another of which only the two newest stay,
the oldest's process ended.

    python -m loadtest.start_times --models sim minilm --starts 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import orjson

from batcher import VersionKey
from gpu_pool import (
    Err,
    Load,
    Ok,
    Origin,
    PoolSettings,
    StartId,
    StartKind,
    WorkerId,
    WorkerPool,
)

LOAD_TIMEOUT_S = 300.0  # for one load of a real model on a slow machine
GONE_TIMEOUT_S = 30.0  # for a let-go worker's process to exit (the pool kills past 10 s)
POLL_S = 0.005  # how often a wait for a process or slot to go looks again
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Row:
    """One kind of start of one model: seconds from the call to the ready event."""

    model: str
    kind: str
    expected: str  # the `StartKind` every start of this row should report
    seconds: list[float]
    mismatches: int  # starts that reported another kind

    def line(self) -> str:
        s = self.seconds
        return (f"{self.model:<8} {self.kind:<14} {len(s):>4} {statistics.median(s):>9.4f} "
                f"{max(s):>9.4f}  {self.expected:<6} {self.mismatches:>10}")


HEADER = (f"{'model':<8} {'kind':<14} {'n':>4} {'P50 s':>9} {'max s':>9}  {'how':<6} "
          f"{'mismatches':>10}")


@dataclass(frozen=True, slots=True)
class ParkedMemory:
    """What one parked worker holds in host memory, as the kernel counts it."""

    model: str
    version: str
    pid: int
    rss_mib: float
    pss_mib: float
    pool_rss_mib: float | None  # what the pool measured as it parked (`pool.parked()`)

    def line(self) -> str:
        pool = "-" if self.pool_rss_mib is None else f"{self.pool_rss_mib:.1f}"
        return (f"{self.model:<8} parked {self.version} (pid {self.pid}): RSS "
                f"{self.rss_mib:.1f} MiB, PSS {self.pss_mib:.1f} MiB (pool saw RSS {pool} MiB)")


@dataclass(frozen=True, slots=True)
class CapDemo:
    """Four versions on one slot with `parked_max=2`: which stay parked, and whether the
    first one parked (given up past the cap) has exited."""

    model: str
    parked_max: int
    parked: list[tuple[str, int]]  # (version, pid), oldest first, after the last switch
    given_up: str  # the version parked first, past the cap
    given_up_pid: int
    given_up_state: str  # "gone", or its /proc state letter ("Z": exited, not reaped)

    @property
    def kept(self) -> int:
        return len(self.parked)

    def lines(self) -> list[str]:
        out = [f"{self.model:<8} parked_max={self.parked_max}, switches a->b->c->d: "
               f"{self.kept} parked, oldest first:"]
        out += [f"    {version} pid {pid}" for version, pid in self.parked]
        out.append(f"    given up: {self.given_up} pid {self.given_up_pid}: "
                   f"{self.given_up_state}")
        return out


@dataclass(slots=True)
class Figures:
    rows: list[Row] = field(default_factory=list)
    memory: list[ParkedMemory] = field(default_factory=list)
    caps: list[CapDemo] = field(default_factory=list)


class _Events:
    """PoolEvents that keep each ready with the moment it arrived (taken in the callback,
    so that a millisecond wake is not measured as the loop's next turn). A death outside
    the pool's own stop is an error: no start here should fail."""

    def __init__(self) -> None:
        self.ready: list[tuple[WorkerId, StartId, VersionKey, StartKind, float]] = []
        self.died: list[WorkerId] = []
        self.stopping = False
        self._changed = anyio.Event()

    def worker_ready(self, worker: WorkerId, start: StartId, version: VersionKey,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.ready.append((worker, start, version, how, time.perf_counter()))
        self._changed.set()

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        pass

    def worker_died(self, worker: WorkerId, version: VersionKey,
                    restart: StartId | None) -> None:
        if not self.stopping:
            self.died.append(worker)
            self._changed.set()

    async def next_ready(self, seen: int) -> tuple[WorkerId, StartId, VersionKey, StartKind,
                                                   float]:
        """The ready after the first `seen`, waiting for it at most `LOAD_TIMEOUT_S`."""
        with anyio.fail_after(LOAD_TIMEOUT_S):
            while len(self.ready) <= seen and not self.died:
                await self._changed.wait()
                self._changed = anyio.Event()
        if self.died:
            raise RuntimeError(f"workers {self.died} died while starting")
        return self.ready[seen]


class _Starts:
    """Unique start ids across the whole run (`Origin.CORE`, as the core makes them)."""

    def __init__(self) -> None:
        self._n = 0

    def next(self) -> StartId:
        self._n += 1
        return StartId(Origin.CORE, self._n)


def proc_state(pid: int) -> str:
    """The process's state letter from /proc/<pid>/stat, or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]  # the name, in parentheses, may hold spaces


def rss_pss_mib(pid: int) -> tuple[float, float]:
    """RSS and PSS of `pid` in MiB, from /proc/<pid>/smaps_rollup."""
    kib = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            kib[name] = int(rest.split()[0])
    return kib["Rss"] / 1024, kib["Pss"] / 1024


async def _until(what: str, done: Callable[[], bool], within: float = GONE_TIMEOUT_S) -> None:
    """Poll `done()` until true, at most `within` seconds (TimeoutError naming `what`):
    for what the pool raises no event of (a slot removed)."""
    try:
        with anyio.fail_after(within):
            while not done():  # noqa: ASYNC110  (no event to wait on: the pool offers none)
                await anyio.sleep(POLL_S)
    except TimeoutError:
        raise TimeoutError(f"waited {within:.0f}s for {what}") from None


async def _exit_of(pid: int, within: float = GONE_TIMEOUT_S) -> None:
    """Wait until process `pid` has exited (its pidfd readable), at most `within` seconds;
    one already reaped has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with anyio.fail_after(within):
            await anyio.wait_readable(fd)
    except TimeoutError:
        raise TimeoutError(f"waited {within:.0f}s for pid {pid} to exit") from None
    finally:
        os.close(fd)


@asynccontextmanager
async def _running(settings: PoolSettings) -> AsyncIterator[tuple[WorkerPool, _Events]]:
    """A pool running with its first worker up (and so its launcher, if it has one)."""
    pool, events = WorkerPool(settings), _Events()
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.next_ready(0)
        if settings.launcher and (pool.launcher is None or pool.launcher.up is None):
            raise RuntimeError("the pool's first worker is up but its launcher is not")
        try:
            yield pool, events
        finally:
            events.stopping = True
            tg.cancel_scope.cancel()


def _versions(spec: str, names: str) -> list[Load]:
    return [Load(VersionKey.of(spec, n), spec) for n in names]


def _pid_of(pool: WorkerPool, worker: WorkerId) -> int:
    pid = next((w.pid for w in pool.workers() if w.id == worker), None)
    if pid is None:
        raise RuntimeError(f"worker {worker} has no pid")
    return pid


async def _add_retire(spec: str, launcher: bool, n: int, ids: _Starts) -> Row:
    """`n` times: add a worker, time it to ready, retire it and wait until its process and
    slot are gone, so that each start finds the pool as the first did."""
    load = _versions(spec, "a")[0]
    expected = StartKind.FORK if launcher else StartKind.SPAWN
    took, wrong = [], 0
    settings = PoolSettings(model=spec, workers=1, latency_floor=0.0, loads=(load,),
                            launcher=launcher, parked_max=0)
    async with _running(settings) as (pool, events):
        base = len(pool.workers())
        for _ in range(n):
            start, seen = ids.next(), len(events.ready)
            began = time.perf_counter()
            pool.add(load, start)
            worker, got, _, how, at = await events.next_ready(seen)
            if got != start:
                raise RuntimeError(f"worker {worker} came up for {got}, not {start}")
            took.append(at - began)
            wrong += how is not expected
            pid = _pid_of(pool, worker)
            pool.retire(worker)
            await _exit_of(pid)
            await _until("the retired slot to go", lambda: len(pool.workers()) == base)
    return Row(spec, "fork" if launcher else "spawn", expected.value, took, wrong)


async def _switches(pool: WorkerPool, events: _Events, loads: Sequence[Load],
                    ids: _Starts) -> list[tuple[float, StartKind, WorkerId]]:
    """Switch the pool's one worker through `loads` in turn; each switch's seconds to
    ready, how it came up and the new incarnation."""
    out = []
    worker = events.ready[-1][0]
    for load in loads:
        start, seen = ids.next(), len(events.ready)
        began = time.perf_counter()
        pool.switch(worker, load, start)
        worker, got, version, how, at = await events.next_ready(seen)
        if (got, version) != (start, load.version):
            raise RuntimeError(f"worker {worker} came up for {got} holding {version}")
        out.append((at - began, how, worker))
    return out


async def _switch_row(spec: str, launcher: bool, n: int, ids: _Starts) -> Row:
    """`n` switches between two versions, nothing parked: each loads the other in full."""
    a, b = _versions(spec, "ab")
    expected = StartKind.FORK if launcher else StartKind.SPAWN
    settings = PoolSettings(model=spec, workers=1, latency_floor=0.0, loads=(a,),
                            launcher=launcher, parked_max=0)
    async with _running(settings) as (pool, events):
        done = await _switches(pool, events, [(b, a)[i % 2] for i in range(n)], ids)
    kind = f"switch {'fork' if launcher else 'spawn'}"
    return Row(spec, kind, expected.value, [s for s, _, _ in done],
               sum(how is not expected for _, how, _ in done))


async def _wake_row(spec: str, n: int, ids: _Starts) -> tuple[Row, ParkedMemory]:
    """`n` switches between two versions with two may park: the first switch (not timed)
    forks the other version and parks the first; each one after wakes the one parked. The
    worker parked after the last switch is measured."""
    a, b = _versions(spec, "ab")
    settings = PoolSettings(model=spec, workers=1, latency_floor=0.0, loads=(a,),
                            launcher=True, parked_max=2)
    async with _running(settings) as (pool, events):
        await _switches(pool, events, [b], ids)  # nothing parked of b yet: a fork
        done = await _switches(pool, events, [(a, b)[i % 2] for i in range(n)], ids)
        parked = pool.parked()
        if not parked:
            raise RuntimeError("nothing parked after switching with parked_max=2")
        load, pid, rss = parked[-1]
        rss_mib, pss_mib = rss_pss_mib(pid)
    memory = ParkedMemory(spec, str(load.version), pid, rss_mib, pss_mib,
                          None if rss is None else rss / MIB)
    row = Row(spec, "wake", StartKind.WAKE.value, [s for s, _, _ in done],
              sum(how is not StartKind.WAKE for _, how, _ in done))
    return row, memory


async def _cap_demo(spec: str, ids: _Starts) -> CapDemo:
    """Switches a->b->c->d on one slot with `parked_max=2`: a, b and c park in turn, and
    parking c gives up a, the oldest."""
    loads = _versions(spec, "abcd")
    settings = PoolSettings(model=spec, workers=1, latency_floor=0.0, loads=(loads[0],),
                            launcher=True, parked_max=2)
    async with _running(settings) as (pool, events):
        first_pid = _pid_of(pool, events.ready[0][0])
        await _switches(pool, events, loads[1:], ids)
        await _exit_of(first_pid)
        parked = [(str(load.version), pid) for load, pid, _ in pool.parked()]
        state = proc_state(first_pid)
    return CapDemo(spec, settings.parked_max, parked, str(loads[0].version), first_pid, state)


async def measure(spec: str, starts: int, ids: _Starts | None = None) -> Figures:
    """Every figure for one model, each scenario in a pool of its own."""
    ids = ids or _Starts()
    out = Figures()
    out.rows.append(await _add_retire(spec, False, starts, ids))
    out.rows.append(await _add_retire(spec, True, starts, ids))
    row, memory = await _wake_row(spec, starts, ids)
    out.rows.append(row)
    out.memory.append(memory)
    out.rows.append(await _switch_row(spec, False, starts, ids))
    out.rows.append(await _switch_row(spec, True, starts, ids))
    out.caps.append(await _cap_demo(spec, ids))
    return out


async def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.start_times", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["sim", "minilm"],
                   help="specs as --model takes them")
    p.add_argument("--starts", type=int, default=10, help="timed starts per kind")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = p.parse_args(argv)
    if a.starts < 1:
        p.error("--starts must be at least 1")
    ids, figures = _Starts(), Figures()
    print("start time: the pool call (add, switch) to the worker's ready event")
    print(HEADER, flush=True)
    for spec in a.models:
        one = await measure(spec, a.starts, ids)
        for row in one.rows:
            print(row.line(), flush=True)
        figures.rows += one.rows
        figures.memory += one.memory
        figures.caps += one.caps
    print("\nparked worker memory (/proc/<pid>/smaps_rollup)")
    for memory in figures.memory:
        print(memory.line())
    print("\nparked cap")
    for cap in figures.caps:
        print("\n".join(cap.lines()))
    if a.json is not None:
        a.json.write_bytes(orjson.dumps(
            {"rows": [asdict(r) for r in figures.rows],
             "memory": [asdict(m) for m in figures.memory],
             "caps": [asdict(c) | {"kept": c.kept} for c in figures.caps]},
            option=orjson.OPT_INDENT_2))
        print(f"\nwritten to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
