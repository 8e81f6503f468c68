"""What the simulator measures of a pool: GPUs held over time, and the pool's counts.

GPU-seconds count every slot the pool holds, whatever it does: starting, up (idle or busy)
or waiting out a backoff, as a cloud bills a GPU from the moment it is asked for until it
is given back. They are integrated over a window (the simulated day, not the warm-up
before it nor the drain after it), and so is the most held at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class Held:
    """A step function of how many GPUs are held, integrated over `[begin, end)`."""

    def __init__(self, begin: float = 0.0, end: float = math.inf) -> None:
        if not begin <= end:
            raise ValueError(f"a metered window needs begin <= end, not {begin}, {end}")
        self._begin, self._end = begin, end
        self._count, self._since, self._area = 0, begin, 0.0
        self.peak = 0

    def change(self, now: float, count: int) -> None:
        """From `now` on, `count` GPUs are held."""
        self._area += self._count * self._span(self._since, now)
        self._since = max(self._since, now)
        self._count = count
        if self._begin <= now < self._end:
            self.peak = max(self.peak, count)
        elif now < self._begin:  # held when the window opens
            self.peak = count

    def seconds(self, now: float) -> float:
        """GPU-seconds held within the window up to `now`."""
        return self._area + self._count * self._span(self._since, now)

    def _span(self, since: float, until: float) -> float:
        return max(0.0, min(until, self._end) - max(since, self._begin))


@dataclass(slots=True)
class Counts:
    """What a pool counts as it runs."""

    started: int = 0  # slots added (the core's `add`)
    stopped: int = 0  # slots retired, or starts taken back
    switches: int = 0
    crashes: int = 0
    batches: int = 0
    items: int = 0
    switch_s: float = 0.0  # worker-seconds spent loading for switches
    fired: int = 0  # events the pool handled
    spawns: int = 0  # incarnations begun, by how they come up (`gpu_pool.StartKind`)
    forks: int = 0
    wakes: int = 0


@dataclass(frozen=True, slots=True)
class Figures:
    """A pool's figures over a run."""

    gpu_s: float  # GPU-seconds held within the metered window
    peak: int  # the most GPUs held at once within it
    started: int  # workers added (the scaling rule's starts)
    stopped: int  # workers retired, or starts taken back
    switches: int  # idle workers switched to another version
    crashes: int  # deaths, injected or asked
    batches: int
    items: int
    switch_s: float  # worker-seconds spent loading for switches
    spawns: int = 0  # incarnations begun, by how they come up: spawned,
    forks: int = 0  # forked from the launcher,
    wakes: int = 0  # or woken from parked

    @property
    def fill(self) -> float:
        """Mean items per batch."""
        return self.items / self.batches if self.batches else 0.0


__all__ = ["Counts", "Figures", "Held"]
