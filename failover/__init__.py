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
from failover.idempotency import (
    LEADER_GONE,
    Begin,
    Entry,
    IdempotencyStatistics,
    IdempotencyStore,
    Join,
    Lead,
    MemoryIdempotencyStore,
    Replay,
    StoredResponse,
)
from failover.table import Actions, Dispatch, InFlight, InFlightTable, TableStatistics

__all__ = [
    "LEADER_GONE",
    "Actions",
    "Begin",
    "ContractViolation",
    "Dispatch",
    "DispatchObserver",
    "Dispatcher",
    "DispatcherStatistics",
    "Entry",
    "IdempotencyMismatch",
    "IdempotencyStatistics",
    "IdempotencyStore",
    "InFlight",
    "InFlightTable",
    "Join",
    "Lead",
    "MemoryIdempotencyStore",
    "ModelError",
    "NoHealthyWorker",
    "Pool",
    "Replay",
    "StoredResponse",
    "TableStatistics",
    "WorkerCrashed",
]
