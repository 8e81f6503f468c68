"""The seam between the dispatch core's owner and a pool of workers, wherever they run.

A pool starts its workers, runs what it is told (`send`, `kill`, `switch`, and the scaling
the core decides: `add`, `retire`, `cancel_start`) and reports what happens to them
(`PoolEvents`: ready, reply, died). It decides nothing about batches, items
or which version a worker should hold: the core does. Every start has an identity
(`StartId`): the core makes one when it asks for a worker, the pool one when it starts a
slot on its own (its first workers, a dead worker's restart); each event says which start
it ends or begins and which version the worker holds, so the core never asks the pool what
its own event meant. The process pool (`gpu_pool/pool.py`) is the first
implementation; a pool of actors on other hosts is another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from anyio.abc import TaskStatus

from batcher import VersionKey
from gpu_pool.load import DEFAULT_VERSION, Load
from gpu_pool.protocol import Err, Ok, Run, StartId, StartKind, WorkerId


class PoolEvents(Protocol):
    """Where a pool reports; called from the event loop, must not block or call back."""

    def worker_ready(self, worker: WorkerId, start: StartId, version: VersionKey,
                     how: StartKind = StartKind.SPAWN) -> None:
        """Incarnation `worker`, holding `version`, is up: it ends `start`, which came up
        `how` (its time is measured by kind)."""

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None: ...

    def worker_died(self, worker: WorkerId, version: VersionKey, restart: StartId | None) -> None:
        """Incarnation `worker` (holding or loading `version`) is gone. `restart`: the
        start its slot now carries out to replace it (the same start again when it died
        loading; a new one, `Origin.RESTART`, when it was up); None when the slot does not
        start again (the pool is stopping, or does not restart)."""


class Unstarted:
    """A pool's listener before `run` names one: no worker exists, so nothing is heard."""

    def worker_ready(self, worker: WorkerId, start: StartId, version: VersionKey,
                     how: StartKind = StartKind.SPAWN) -> None:
        raise RuntimeError("a worker event before the pool ran")

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        raise RuntimeError("a worker event before the pool ran")

    def worker_died(self, worker: WorkerId, version: VersionKey, restart: StartId | None) -> None:
        raise RuntimeError("a worker event before the pool ran")


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as `/admin/workers` shows it."""

    id: int
    slot: int
    pid: int | None
    state: str
    device: str
    batches: int
    restarts: int
    node: str = "local"
    version: VersionKey = DEFAULT_VERSION  # the version it holds, or loads (starting, switching)


class Pool(Protocol):
    """What the core's owner needs of a pool of workers."""

    async def run(
        self, events: PoolEvents, *, task_status: TaskStatus[None]
    ) -> None:
        """Start every worker, report their events to `events`, restart the dead, until
        cancelled; stop every worker on the way out."""

    async def wait_ready(self, count: int, within: float) -> int:
        """Wait until `count` workers are ready (or `within` seconds); return how many are."""

    def send(self, worker: WorkerId, run: Run) -> None:
        """Hand a batch to an idle worker. If the worker is gone, its death is (or already
        was) reported through `worker_died`; nothing is raised."""

    def kill(self, worker: WorkerId) -> None:
        """End a worker (its batch hangs); its death is reported as any other."""

    def forgive(self, worker: WorkerId) -> None:
        """The death of incarnation `worker` was its input's doing (convicted as a query
        of death): it does not count against its slot's restart backoff."""

    def switch(self, worker: WorkerId, load: Load, start: StartId) -> None:
        """The core retires idle incarnation `worker`: its slot stops that process (its
        memory freed) and starts a new one holding `load` for `start`, under a new id
        reported through `worker_ready`. The retired one is never reported dead; a switch
        is no crash, no restart, no backoff failure. If `worker` is not its slot's live,
        idle incarnation, nothing happens (a death is, or was, reported as usual)."""

    def add(self, load: Load, start: StartId) -> None:
        """Start one more worker holding `load` for `start`, in a new slot (an index never used
        before), reported through `worker_ready` once up; a start that fails (it dies while
        loading) is a death like any other, its slot restarted after its backoff. The
        process pool pins it to a device no other slot holds; a Ray actor waits, pending,
        until the cluster has room for it (on an autoscaled cluster, that asks for a node)."""

    def retire(self, worker: WorkerId) -> None:
        """The core retires idle incarnation `worker` for good: its slot lets it go as a
        switch does (told to stop, killed past a grace) and is removed once it has exited.
        It is never reported dead: no crash, no restart. If `worker` is not its slot's
        live, idle incarnation, nothing happens."""

    def cancel_start(self, start: StartId) -> bool:
        """Take back `start` while no worker is up for it (pending, starting, or dead and
        waiting out its backoff; not a switch's): end what it started and remove its slot,
        reporting nothing of it. False if it is not such a start (it came up meanwhile)."""

    def start_kind(self, load: Load) -> StartKind:
        """How a start of `load` would come up now (spawned, forked, woken): the core
        expects it to take the time measured of that kind."""

    def ready_count(self) -> int: ...

    def workers(self) -> list[WorkerInfo]: ...

    def state_counts(self) -> dict[str, int]: ...

    @property
    def crashes(self) -> int: ...


__all__ = ["Pool", "PoolEvents", "Unstarted", "WorkerInfo"]
