"""Telling a slow batch from a hung one, from what the pool has learned of batch times.

A fixed hang timeout is wrong both ways: 5 s let a SIGSTOPped worker cost every request of
its batch its deadline, and it killed the real model on this CPU running 100 long inputs
(9 s). So the limits follow the recent P99 batch time, scaled by how much more input the
batch holds than a typical one (a batch's time grows with its characters, up to the
model's truncation; over-estimating only makes detection later, never wrong):

- past `hedge_after`, the batch is re-run at once on another worker and the first answer
  wins (the table's fencing drops the other): a stall costs latency, not a request;
- past `kill_after`, far later, its worker is killed and its slot restarted.

Until `MIN_SAMPLES` batches have run nothing is known: no hedge, and the cold kill limit.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW = 256  # recent batches the limits follow
MIN_SAMPLES = 16  # batches seen before the learned limits apply
REFRESH = 16  # observations between recomputing the percentiles


@dataclass(frozen=True, slots=True)
class HangSettings:
    hedge_floor: float = 0.5  # seconds: never re-run a batch sooner than this
    hedge_factor: float = 3.0  # x the expected time (recent P99, scaled by input size)
    kill_floor: float = 5.0
    kill_factor: float = 20.0
    cold_kill: float = 60.0  # before MIN_SAMPLES batches
    kill_after: float | None = None  # a fixed kill limit instead of the learned one
    hedge: bool = True

    def __post_init__(self) -> None:
        if min(self.hedge_floor, self.hedge_factor, self.kill_floor, self.kill_factor,
               self.cold_kill) <= 0:
            raise ValueError("hang limits must be > 0")
        if self.kill_after is not None and self.kill_after <= 0:
            raise ValueError("kill_after must be > 0")


class BatchTimes:
    """Recent (seconds, characters) of answered batches and the limits they imply."""

    def __init__(self, settings: HangSettings | None = None) -> None:
        self.settings = settings or HangSettings()
        self._seconds: deque[float] = deque(maxlen=WINDOW)
        self._chars: deque[int] = deque(maxlen=WINDOW)
        self._fresh = 0
        self._p99 = math.inf
        self._typical_chars = 1

    def observe(self, seconds: float, chars: int) -> None:
        self._seconds.append(seconds)
        self._chars.append(chars)
        self._fresh += 1
        if self._fresh >= REFRESH and len(self._seconds) >= MIN_SAMPLES:
            self._fresh = 0
            ordered = sorted(self._seconds)
            self._p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
            self._typical_chars = max(1, sorted(self._chars)[len(self._chars) // 2])

    @property
    def learned(self) -> bool:
        return self._p99 < math.inf

    def expected(self, chars: int) -> float:
        """A generous estimate of the batch's time (inf while nothing is learned)."""
        return self._p99 * max(1.0, chars / self._typical_chars)

    def hedge_after(self, chars: int) -> float:
        s = self.settings
        if not s.hedge or not self.learned:
            return math.inf
        return max(s.hedge_floor, s.hedge_factor * self.expected(chars))

    def kill_after(self, chars: int) -> float:
        s = self.settings
        if s.kill_after is not None:
            return s.kill_after
        if not self.learned:
            return s.cold_kill
        return max(s.kill_floor, s.kill_factor * self.expected(chars))

    def stall_after(self, chars: int) -> float:
        """When a run of suspects (inputs that already killed or stalled a worker) counts
        as hung: where a fresh batch would be hedged, hedging on or off (inf while nothing
        is learned: then the kill limit judges)."""
        s = self.settings
        if not self.learned:
            return math.inf
        stall = max(s.hedge_floor, s.hedge_factor * self.expected(chars))
        return min(self.kill_after(chars), stall)


__all__ = ["BatchTimes", "HangSettings"]
