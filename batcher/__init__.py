"""Tier queues, the flush policy, admission, and the batcher that joins them.

Offers the nouns (`Item`, `Tier`, `FlushReason`), the bounded queues, the pure flush
decision, the synchronous batcher (the batching half of the dispatch core), admission
control, the injected clock, and the framed-message transport that every process of
batchgate speaks (a cell's link, a worker's pipe).
"""

from batcher.admission import Admission, AdmissionSettings, RateMeter
from batcher.batcher import Batcher, BatcherStatistics, Cut
from batcher.clock import Clock, LoopClock, MonotonicClock
from batcher.cost import BatchCost
from batcher.errors import (
    BatchgateError,
    Closed,
    DeadlineExceeded,
    DeadlineUnreachable,
    NoWorkerReady,
    OverBudget,
    Overloaded,
    QueueFull,
)
from batcher.framing import READ_CHUNK, Framed, FrameReader, frame
from batcher.policy import Capacity, FlushPolicy
from batcher.queues import QueueStatistics, TierQueues
from batcher.types import MAX_BATCH, FlushReason, Item, ItemId, ItemSink, Lane, Tier

__all__ = [
    "MAX_BATCH",
    "READ_CHUNK",
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
    "FrameReader",
    "Framed",
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
    "Tier",
    "TierQueues",
    "frame",
]
