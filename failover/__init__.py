"""The dispatch core and its owner: hands batches to workers, answers each item exactly
once, re-routes the items of a dead worker, isolates poison inputs and inputs that kill
their worker (`Quarantine`), re-runs stalled batches elsewhere and kills hung workers by
limits learned from recent batch times (`BatchTimes`), and remembers idempotent requests.

`DispatchCore` is the synchronous state machine (batcher + in-flight table); `CoreOwner`
is the one task that feeds it events and performs its actions.
"""

from failover.build import CoreSettings, build_core
from failover.core import CoreActions, CoreStatistics, DispatchCore, Send
from failover.errors import (
    ContractViolation,
    IdempotencyMismatch,
    ModelError,
    QueryOfDeath,
    ShuttingDown,
    WorkerCrashed,
)
from failover.hang import BatchTimes, HangSettings
from failover.idempotency import (
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
from failover.owner import CoreObserver, CoreOwner
from failover.quarantine import Quarantine
from failover.table import Actions, Dispatch, InFlight, InFlightTable, TableStatistics

__all__ = [
    "Actions",
    "BatchTimes",
    "Begin",
    "ContractViolation",
    "CoreActions",
    "CoreObserver",
    "CoreOwner",
    "CoreSettings",
    "CoreStatistics",
    "Dispatch",
    "DispatchCore",
    "Entry",
    "HangSettings",
    "IdempotencyMismatch",
    "IdempotencyStatistics",
    "IdempotencyStore",
    "InFlight",
    "InFlightTable",
    "Join",
    "Lead",
    "MemoryIdempotencyStore",
    "ModelError",
    "Quarantine",
    "QueryOfDeath",
    "Replay",
    "Send",
    "ShuttingDown",
    "StoredResponse",
    "TableStatistics",
    "WorkerCrashed",
    "build_core",
]
