"""When to start again what keeps dying: the one backoff every supervisor here uses (a
worker's slot, the cell's core process and its gateways)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """When to start again what keeps dying: exponential and capped, so a model that
    crashes at load cannot spin the CPU, and forgiven after a stable run, so one crash a
    day never waits long. Pure: the caller keeps the count and measures the time."""

    first: float = 0.5  # seconds before a start after one failure (or a stable run's death)
    cap: float = 30.0  # the longest wait, however many failures
    stable_after: float = 30.0  # up this long, a death resets the count

    def __post_init__(self) -> None:
        if min(self.first, self.cap, self.stable_after) < 0:
            raise ValueError(f"backoff times must be >= 0, got {self}")

    def delay(self, failures: int) -> float:
        """Seconds to wait before the next start after `failures` deaths in a row."""
        return min(self.cap, self.first * 2.0 ** max(0, failures - 1))

    def after_exit(self, failures: int, up_for: float) -> int:
        """The count once an incarnation exits that was up `up_for` seconds (0 if it never
        came up): reset after a stable run, else one failure more."""
        return 0 if up_for >= self.stable_after else failures + 1


__all__ = ["Backoff"]
