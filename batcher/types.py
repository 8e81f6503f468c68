"""The nouns of batching: tiers, items, flush reasons, version keys, and the sink an item
answers to."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType, Protocol

if TYPE_CHECKING:
    from batcher.tracing import RequestTrace

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


NAME_MAX = 64  # characters of a model or version name: as many as a request may name
NAME_PATTERN = rf"[A-Za-z0-9_.-]{{1,{NAME_MAX}}}"  # a model's or a version's name
_NAME = re.compile(NAME_PATTERN)
_SHOWN = 64  # characters of a text quoted back in an error


class VersionKey(str):
    """One version of one model, "model@version", the name every part of batchgate gives
    it: the core's routing, the pool's slots, metrics' labels, an answer's `model` field.

    A `str`, so that it is a dict key, a label and a frame field as it is and costs
    nothing on the hot path; its parts are read by name (`model`, `version`), never
    split by hand. Made by `of` or `parse`, which check both names (1 to `NAME_MAX`
    letters, digits, `_`, `.`, `-`: a key splits one way, and a request can name it); a
    plain `str` is not one (mypy says so).
    """

    __slots__ = ()

    @staticmethod
    def is_name(text: str) -> bool:
        """Whether `text` may name a model or a version."""
        return _NAME.fullmatch(text) is not None

    @classmethod
    def of(cls, model: str, version: str) -> VersionKey:
        """The key of `version` of `model`; ValueError unless both are names."""
        if not (_NAME.fullmatch(model) and _NAME.fullmatch(version)):
            raise ValueError(f"{model[:_SHOWN]!r}, {version[:_SHOWN]!r}: a model and a "
                             f"version are names (1 to {NAME_MAX} letters, digits, _ . -)")
        return cls(f"{model}@{version}")

    @classmethod
    def parse(cls, text: str) -> VersionKey:
        """The key `text` spells ("model@version"); ValueError for anything else."""
        if isinstance(text, VersionKey):
            return text
        model, at, version = text.partition("@")
        if not (at and _NAME.fullmatch(model) and _NAME.fullmatch(version)):
            raise ValueError(f"{text[:_SHOWN]!r} is not a version key (model@version)")
        return cls(text)

    @property
    def model(self) -> str:
        return self.partition("@")[0]

    @property
    def version(self) -> str:
        return self.partition("@")[2]


class ItemSink(Protocol):
    """Whoever waits for an item. Called at most once per item, with an output or an error."""

    def item_done(self, item: Item, result: str | BaseException) -> None: ...


Tag = tuple[str, str, int]
"""A keyed input's name across a core's death: (account, Idempotency-Key, index). A batch
carries its inputs' tags to the worker, which keeps the answers of its last keyed batches
for the next core (`gpu_pool.Salvage`): a resent request is answered from them."""


class Staged(ItemSink, Protocol):
    """An input's way through guard stages (`failover.fleet.stages.Route`), as the door asks
    it: whether a stage item of it runs in a batch now."""

    def in_flight(self) -> bool: ...


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
    version: VersionKey | None = None  # the version it runs on; None: the first model's
    tag: Tag | None = None  # a keyed input's name, which its batch carries to the worker
    skipped: tuple[str, ...] = ()  # guards that failed open for it: its answer says so
    route: Staged | None = None  # its way through guard stages (`failover.fleet.stages`)
    trace: RequestTrace | None = None  # its request's trace, shared by its items; None: off
    # A streamed request's input: its stream was judged whole before it began, and its parts
    # come through a window, so admission does not judge each part against the tier's
    # budget again (the queue's hard cap still holds).
    streamed: bool = False

    def settle(self, result: str | BaseException) -> None:
        """Hand the result to the waiter (exactly once: callers guarantee it)."""
        self.sink.item_done(self, result)


__all__ = ["LANE_OF", "MAX_BATCH", "NAME_MAX", "NAME_PATTERN", "FlushReason", "Item", "ItemId",
           "ItemSink", "Lane", "Tag", "Tier", "VersionKey"]
