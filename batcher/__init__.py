"""Tier queues, the flush policy, admission, and the batcher that joins them.

Offers the nouns (`Item`, `Tier`, `FlushReason`, `VersionKey`), the bounded queues, the pure flush
decision, the synchronous batcher (the batching half of the dispatch core), admission
control and the injected clock. The small pieces every process shares (framing, backoff)
are `batcher.shared`.
"""

from batcher.admission import Admission, AdmissionSettings, RateMeter
from batcher.batcher import Batcher, BatcherStatistics, Cut
from batcher.clock import Clock, LoopClock, MonotonicClock
from batcher.cost import BatchCost, Throughput
from batcher.errors import (
    BatchgateError,
    Closed,
    DeadlineExceeded,
    DeadlineUnreachable,
    GuardUnavailable,
    NoWorkerReady,
    OverBudget,
    Overloaded,
    QueueFull,
    Refused,
)
from batcher.policy import Capacity, FlushPolicy
from batcher.queues import QueueStatistics, TierQueues
from batcher.types import (
    LANE_OF,
    MAX_BATCH,
    NAME_MAX,
    NAME_PATTERN,
    FlushReason,
    Item,
    ItemId,
    ItemSink,
    Lane,
    Tag,
    Tier,
    VersionKey,
)

__all__ = [
    "LANE_OF",
    "MAX_BATCH",
    "NAME_MAX",
    "NAME_PATTERN",
    "Admission",
    "AdmissionSettings",
    "BatchCost",
    "Batcher",
    "BatcherStatistics",
    "BatchgateError",
    "Capacity",
    "Clock",
    "Closed",
    "Cut",
    "DeadlineExceeded",
    "DeadlineUnreachable",
    "FlushPolicy",
    "FlushReason",
    "GuardUnavailable",
    "Item",
    "ItemId",
    "ItemSink",
    "Lane",
    "LoopClock",
    "MonotonicClock",
    "NoWorkerReady",
    "OverBudget",
    "Overloaded",
    "QueueFull",
    "QueueStatistics",
    "RateMeter",
    "Refused",
    "Tag",
    "Throughput",
    "Tier",
    "TierQueues",
    "VersionKey",
]
