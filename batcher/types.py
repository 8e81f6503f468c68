"""The nouns of batching: tiers, items, flush reasons, and the sink an item answers to."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType, Protocol

ItemId = NewType("ItemId", int)

MAX_BATCH = 100
"""The contract's hard ceiling: no batch ever holds more items."""


class Tier(enum.IntEnum):
    """Service tiers; a lower value is served first."""

    PAID = 0
    FREE = 1

    @property
    def label(self) -> str:
        """The name in metrics, messages and config files."""
        return _TIER_LABELS[self]


class Lane(enum.IntEnum):
    """Queue lanes in priority order: items re-run after a crash go before every tier."""

    RETRY = 0
    PAID = 1
    FREE = 2

    @property
    def label(self) -> str:
        return self.name.lower()


_TIER_LABELS = {tier: tier.name.lower() for tier in Tier}
LANE_OF = (Lane.PAID, Lane.FREE)
"""Each tier's lane, indexed by the tier."""
assert all(LANE_OF[tier].name == tier.name for tier in Tier)


class FlushReason(enum.Enum):
    """Why a batch was cut; reported in metrics as `batchgate_batch_flush_total{reason}`."""

    FULL = "full"
    TIMEOUT = "timeout"
    IDLE = "idle"
    RETRY = "retry"


class ItemSink(Protocol):
    """Whoever waits for an item. Called at most once per item, with an output or an error."""

    def item_done(self, item: Item, result: str | BaseException) -> None: ...


@dataclass(slots=True, eq=False)
class Item:
    """One input string on its way through the queue, a batch, and back to its sink.

    Mutable on purpose: `attempts` counts runs for failover, `cancelled` is set by the
    waiter when its client left or its deadline passed, so the batcher can skip it.
    """

    id: ItemId
    text: str
    tier: Tier
    arrived: float
    deadline: float
    sink: ItemSink
    index: int = 0
    attempts: int = 0
    cancelled: bool = False
    enqueued: float = field(default=0.0)
    lane: int = -1  # the Lane it is queued in, -1 when not queued
    dispatched: float = 0.0  # when it last left the queue for a worker
    batch: int = -1  # the batch it was last cut into (for the access log)
    flights: int = 0  # batches now running it (two while a stalled batch is hedged)
    done: bool = False  # answered, or failed for good: a twin batch's answer is dropped
    caller: str | None = None  # whose it is (an account), charged if it kills workers
    version: str = ""  # the model version ("model@version") it runs on; "": the only one

    def settle(self, result: str | BaseException) -> None:
        """Hand the result to the waiter (exactly once: callers guarantee it)."""
        self.sink.item_done(self, result)


__all__ = ["LANE_OF", "MAX_BATCH", "FlushReason", "Item", "ItemId", "ItemSink", "Lane", "Tier"]
