"""Messages between the parent and a worker process: small, frozen, picklable.

Parent -> worker: `Run` (one batch), `Stop`. Worker -> parent: `Ready` once the model is
loaded, then exactly one `Ok` or `Err` per `Run`. EOF on the pipe means the worker is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

BatchId = NewType("BatchId", int)
WorkerId = NewType("WorkerId", int)
"""Unique per worker incarnation: a restarted slot gets a new id, so a late answer from the
dead incarnation can never be taken for the new one's."""


@dataclass(frozen=True, slots=True)
class Ready:
    pid: int
    device: str


@dataclass(frozen=True, slots=True)
class Run:
    batch_id: BatchId
    inputs: tuple[str, ...]


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


ToWorker = Run | Stop
FromWorker = Ready | Ok | Err

__all__ = ["BatchId", "Err", "FromWorker", "Ok", "Ready", "Run", "Stop", "ToWorker", "WorkerId"]
