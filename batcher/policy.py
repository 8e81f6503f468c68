"""The flush decision: should a batch be cut now, and why. Pure, so it is tested exhaustively.

Late binding: nothing is cut unless a worker is idle to take it, so batches fill while every
worker is busy and the queue, not a pile of premature small batches, absorbs the load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batcher.types import MAX_BATCH, FlushReason


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the decision needs to know of the pool and the load at this moment."""

    idle: int  # workers free to take a batch now
    ready: int  # workers up, idle or busy
    needed: float = 0.0  # workers the measured arrival rate keeps busy at full batches


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """Size-or-time, plus a load-aware idle trigger.

    The idle trigger flushes at once while workers are idle that the load does not need:
    waiting would make no batch fuller. A small batch holds its worker for a whole batch
    latency, though, so under heavy load a moment with two idle workers must not cut one:
    the trigger fires only while the workers already busy, plus the one it would take,
    leave room for `spare` times the workers the measured rate needs at full batches.
    """

    max_batch: int = MAX_BATCH
    max_wait: float = 0.050
    idle_trigger: bool = True
    spare: float = 1.5
    max_batch_chars: int | None = None  # a fixed cap on characters per batch (None: learned)

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be within 1..{MAX_BATCH}, got {self.max_batch}")
        if self.max_wait < 0:
            raise ValueError(f"max_wait must be >= 0 seconds, got {self.max_wait}")
        if self.spare < 0:
            raise ValueError(f"spare must be >= 0, got {self.spare}")
        if self.max_batch_chars is not None and self.max_batch_chars < 1:
            raise ValueError(f"max_batch_chars must be at least 1, got {self.max_batch_chars}")

    def due(self, oldest_enqueued: float) -> float:
        """When the oldest item's wait runs out. The owner's timer and `decide` share this
        one expression, so a float rounding can never leave a timer that fires forever."""
        return oldest_enqueued + self.max_wait

    def spare_capacity(self, pool: Capacity) -> bool:
        """True while cutting a batch early leaves the load the workers it needs."""
        busy = pool.ready - pool.idle
        return pool.idle > 1 and busy + 1 + self.spare * pool.needed <= pool.ready

    def decide(
        self, *, pending: int, oldest_enqueued: float, now: float, pool: Capacity, retry: bool,
        pending_chars: int = 0, max_chars: float = math.inf, hold_until: float = -math.inf,
    ) -> FlushReason | None:
        """Return why to flush now, or None to keep waiting.

        `retry` says whether re-routed items are pending (they already waited once: they
        never wait again). A batch is full at `max_batch` items or at `max_chars` characters
        pending (`pending_chars`): waiting could not make it fuller. Before `hold_until` a
        timed or idle cut waits (a partner stage's cut is due within moments: cut together,
        parallel stages stay in step); a full batch or a retry never does.
        """
        if pool.idle <= 0 or pending <= 0:
            return None
        if retry:
            return FlushReason.RETRY
        if pending >= self.max_batch or pending_chars >= max_chars:
            return FlushReason.FULL
        if now < hold_until:
            return None
        if now >= self.due(oldest_enqueued):
            return FlushReason.TIMEOUT
        if self.idle_trigger and self.spare_capacity(pool):
            return FlushReason.IDLE
        return None


__all__ = ["Capacity", "FlushPolicy"]
