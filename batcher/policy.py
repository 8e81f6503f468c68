"""The flush decision: should a batch be cut now, and why. Pure, so it is tested exhaustively.

Late binding: nothing is cut unless a worker is idle to take it, so batches fill while every
worker is busy and the queue, not a pile of premature small batches, absorbs the load.
"""

from __future__ import annotations

from dataclasses import dataclass

from batcher.types import MAX_BATCH, FlushReason


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """Size-or-time, plus the idle trigger: with more than one worker idle, waiting buys
    nothing (no batch would be fuller for it), so flush at once."""

    max_batch: int = MAX_BATCH
    max_wait: float = 0.050
    idle_trigger: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be within 1..{MAX_BATCH}, got {self.max_batch}")
        if self.max_wait < 0:
            raise ValueError(f"max_wait must be >= 0 seconds, got {self.max_wait}")

    def due(self, oldest_enqueued: float) -> float:
        """When the oldest item's wait runs out. The loop's timer and `decide` share this
        one expression, so a float rounding can never leave a timer that fires forever."""
        return oldest_enqueued + self.max_wait

    def decide(
        self, *, pending: int, oldest_enqueued: float, now: float, idle_workers: int,
        retry: bool,
    ) -> FlushReason | None:
        """Return why to flush now, or None to keep waiting.

        `retry` says whether re-routed items are pending (they already waited once: they
        never wait again).
        """
        if idle_workers <= 0 or pending <= 0:
            return None
        if retry:
            return FlushReason.RETRY
        if pending >= self.max_batch:
            return FlushReason.FULL
        if now >= self.due(oldest_enqueued):
            return FlushReason.TIMEOUT
        if self.idle_trigger and idle_workers > 1:
            return FlushReason.IDLE
        return None


__all__ = ["FlushPolicy"]
