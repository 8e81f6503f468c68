"""The dispatch core and its owner: hands batches to workers, answers each item exactly
once, re-routes the items of a dead worker, isolates poison inputs and inputs that kill
their worker (`Quarantine`), re-runs stalled batches elsewhere and kills hung workers by
limits learned from recent batch times (`BatchTimes`).

`DispatchCore` is the synchronous state machine (batcher + in-flight table); `CoreOwner`
is the one task that feeds it events and performs its actions.
"""

from failover.actions import CoreActions, Send
from failover.build import CoreSettings, build_core
from failover.core import CoreStatistics, Demand, DispatchCore, Refusal
from failover.errors import (
    ContractViolation,
    ModelError,
    ModelFailing,
    ModelLoading,
    ModelUnplaceable,
    QueryOfDeath,
    ShuttingDown,
    UnknownModel,
    WorkerCrashed,
)
from failover.hang import BatchTimes, HangSettings
from failover.owner import Core, CoreObserver, CoreOwner
from failover.quarantine import Quarantine
from failover.table import Actions, Dispatch, InFlight, InFlightTable, TableStatistics

__all__ = [
    "Actions",
    "BatchTimes",
    "ContractViolation",
    "Core",
    "CoreActions",
    "CoreObserver",
    "CoreOwner",
    "CoreSettings",
    "CoreStatistics",
    "Demand",
    "Dispatch",
    "DispatchCore",
    "HangSettings",
    "InFlight",
    "InFlightTable",
    "ModelError",
    "ModelFailing",
    "ModelLoading",
    "ModelUnplaceable",
    "Quarantine",
    "QueryOfDeath",
    "Refusal",
    "Send",
    "ShuttingDown",
    "TableStatistics",
    "UnknownModel",
    "WorkerCrashed",
    "build_core",
]
