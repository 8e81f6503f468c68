"""Tier queues, the flush policy, admission, and the batcher that joins them.

Offers the nouns (`Item`, `Tier`, `FlushReason`), the bounded queues, the pure flush
decision, the synchronous batcher (the batching half of the dispatch core), admission
control and the injected clock.
"""

from batcher.admission import Admission, AdmissionSettings, AdmissionStatistics, RateMeter
from batcher.batcher import Batcher, BatcherStatistics, Closed, Cut
from batcher.clock import Clock, LoopClock, MonotonicClock
from batcher.errors import BatchgateError, DeadlineExceeded, Overloaded, QueueFull
from batcher.policy import Capacity, FlushPolicy
from batcher.queues import QueueStatistics, TierQueues
from batcher.types import MAX_BATCH, FlushReason, Item, ItemId, ItemSink, Lane, Tier

__all__ = [
    "MAX_BATCH",
    "Admission",
    "AdmissionSettings",
    "AdmissionStatistics",
    "Batcher",
    "BatcherStatistics",
    "BatchgateError",
    "Capacity",
    "Clock",
    "Closed",
    "Cut",
    "DeadlineExceeded",
    "FlushPolicy",
    "FlushReason",
    "Item",
    "ItemId",
    "ItemSink",
    "Lane",
    "LoopClock",
    "MonotonicClock",
    "Overloaded",
    "QueueFull",
    "QueueStatistics",
    "RateMeter",
    "Tier",
    "TierQueues",
]
