"""Messages between the parent and a worker process: small, frozen, picklable.

Parent -> worker: `Run` (one batch), `Stop`. Worker -> parent: `Ready` once the model is
loaded, then exactly one `Ok` or `Err` per `Run`. EOF on the pipe means the worker is gone.
An idle worker told to `Park` says `Parked` once its device is free, and `Ready` again when
told to `Wake`.

A cell's worker outlives its core (`gpu_pool.lasting`): to the next core, which connects to
it, it says `Attached` first (in place of `Ready`), and `Salvaged` once the batch the dead
core sent it has finished.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

from batcher import Tag, VersionKey

BatchId = NewType("BatchId", int)
WorkerId = NewType("WorkerId", int)
"""Unique per worker incarnation: a restarted slot gets a new id, so a late answer from the
dead incarnation can never be taken for the new one's."""


class Origin(enum.Enum):
    """Who made a start."""

    FIRST = "first"  # a slot the pool was built with: `number` is the slot's index
    CORE = "core"  # the core asked for it (a worker added, a switch): the core's count
    RESTART = "restart"  # the pool restarts a dead worker: `number` is the dead one's id


@dataclass(frozen=True, slots=True)
class StartId:
    """The identity of one start of a slot (a worker on its way), from the moment it is
    asked for until a worker is up for it (`PoolEvents.worker_ready` carries it back) or
    it is taken back. A start whose worker dies while loading is retried under the same
    id; a worker that dies once up is restarted under a new one (`Origin.RESTART`)."""

    origin: Origin
    number: int


class StartKind(enum.Enum):
    """How a worker came up, each kind's time measured apart (`failover.fleet.ledger`)."""

    SPAWN = "spawn"  # a fresh interpreter: every import and the weights from scratch
    FORK = "fork"  # forked from the pool's launcher, which holds the imports (and weights)
    WAKE = "wake"  # a parked worker of the same version: its weights back on its device
    ATTACH = "attach"  # an earlier core's live worker, loaded already: nothing measured


@dataclass(frozen=True, slots=True)
class Ready:
    pid: int
    device: str


@dataclass(frozen=True, slots=True)
class Run:
    batch_id: BatchId
    inputs: tuple[str, ...]
    tags: tuple[Tag | None, ...] | None = None  # the keyed inputs' names; None: none is keyed
    traces: tuple[str, ...] | None = None  # the attempts' traceparents; None: none traced


@dataclass(frozen=True, slots=True)
class Salvaged:
    """A keyed batch a dead core sent: what it answered (`outputs`), or that it still runs
    (`running`: another `Salvaged` follows) or failed (neither: its inputs run again)."""

    tags: tuple[Tag | None, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] | None
    running: bool = False


@dataclass(frozen=True, slots=True)
class Attached:
    """A live worker's first word to a core that did not start it: up on `ready.device`,
    holding `version` of `spec` (padded to `latency_floor`), with the keyed batches it ran
    last for a core now dead, the one it runs now included."""

    ready: Ready
    version: VersionKey
    spec: str
    latency_floor: float
    salvaged: tuple[Salvaged, ...]


@dataclass(frozen=True, slots=True)
class Ok:
    batch_id: BatchId
    outputs: tuple[str, ...]
    seconds: float  # time the model took, floor padding included


@dataclass(frozen=True, slots=True)
class Err:
    """The model raised (`kind="model"`) or broke the contract (`kind="contract"`).

    The worker is alive and ready for the next batch either way.
    """

    batch_id: BatchId
    kind: str
    error_type: str
    message: str


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish nothing more; exit cleanly."""


@dataclass(frozen=True, slots=True)
class Park:
    """Give back the device: weights to host memory, then say `Parked` and wait for `Wake`
    or `Stop`. The process and what it imported stay."""


@dataclass(frozen=True, slots=True)
class Parked:
    """The worker's weights are in host memory: its device is free for another."""

    moved: bool  # whether it held weights to move (a plain function holds none)


@dataclass(frozen=True, slots=True)
class Wake:
    """Take the device again (weights back on it), with `threads` torch threads on the
    CPU, and say `Ready`."""

    threads: int


ToWorker = Run | Stop | Park | Wake
FromWorker = Ready | Ok | Err | Attached | Salvaged | Parked

__all__ = ["Attached", "BatchId", "Err", "FromWorker", "Ok", "Origin", "Park", "Parked", "Ready",
           "Run", "Salvaged", "StartId", "StartKind", "Stop", "ToWorker", "Wake", "WorkerId"]
