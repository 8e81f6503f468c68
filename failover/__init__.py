"""Owns every batch in flight: hands batches to workers, answers each item exactly once,
re-routes the items of a dead worker, isolates poison inputs, and remembers idempotent
requests.
"""

from failover.dispatcher import Dispatcher, DispatcherStatistics, DispatchObserver, Pool
from failover.errors import (
    ContractViolation,
    IdempotencyMismatch,
    ModelError,
    NoHealthyWorker,
    WorkerCrashed,
)
from failover.table import Actions, Dispatch, InFlight, InFlightTable, TableStatistics

__all__ = [
    "Actions",
    "ContractViolation",
    "Dispatch",
    "DispatchObserver",
    "Dispatcher",
    "DispatcherStatistics",
    "IdempotencyMismatch",
    "InFlight",
    "InFlightTable",
    "ModelError",
    "NoHealthyWorker",
    "Pool",
    "TableStatistics",
    "WorkerCrashed",
]
