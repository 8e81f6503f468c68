"""Loads under way, by version, and how long each version takes to load.

A worker's slot loads a version for one of three reasons: a switch (an idle worker's slot
starting another version), a restart (a dead worker's slot starting its own again), or an
add (a slot the pool grows by, or starts with). Placement must see every one of them (a
version loading gets no second worker meanwhile), the pool's size counts restarts and adds as
its starts (`Capacity`; a switch keeps its worker), and admission counts them at their ETA.

The pool reports a worker up by its version alone, so a worker up ends the load of its
version that began first, whatever its reason: the counts stay right even where the pool's
order differs. A switch's load and an add's are measured (a restart's holds its backoff).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from failover.fleet.capacity import Capacity
from gpu_pool import WorkerId

MEASURE_WEIGHT = 0.3  # of the newest load in a version's measured load time
KINDS = ("restart", "add")  # what starts a version's slot, besides a switch


@dataclass(frozen=True, slots=True)
class Switching:
    """An idle worker switched away, its slot loading `to`."""

    to: str
    since: float
    held: str  # the version it held


class Loads:
    def __init__(self, capacity: Capacity | None) -> None:
        self._capacity = capacity
        self.switching: dict[WorkerId, Switching] = {}  # by the worker switched away
        self._starts: dict[str, list[tuple[float, str]]] = {}  # version -> (since, kind)
        self.measured: dict[str, float] = {}  # seconds, by version
        self.seconds: list[float] = []  # measured loads not yet read by metrics

    def switch(self, worker: WorkerId, to: str, now: float, held: str) -> None:
        self.switching[worker] = Switching(to, now, held)

    def start(self, version: str, now: float, kind: str, start_s: float) -> None:
        """A slot starts `version` (`kind`: one of `KINDS`)."""
        self._starts.setdefault(version, []).append((now, kind))
        if self._capacity is not None:
            self._capacity.starting(now, start_s, version)

    def cancel(self, version: str) -> None:
        """The newest start of `version` is taken back (the pool takes back its newest)."""
        starts = self._starts.get(version)
        if starts:
            starts.pop()
            self._tidy(version)
        if self._capacity is not None:
            self._capacity.cancel(version)

    def failed(self, version: str, now: float, start_s: float) -> None:
        """A worker of `version` died loading; its slot loads it again after a backoff (a
        switch's load failing keeps the switch under way, and counts nothing more)."""
        if self._starts.get(version) and self._capacity is not None:
            self._capacity.failed(now, start_s, version)

    def switch_died(self, worker: WorkerId) -> str | None:
        """`worker` died before the pool switched it: the version its slot restarts."""
        switching = self.switching.pop(worker, None)
        return None if switching is None else switching.held

    def arrived(self, version: str, now: float) -> None:
        """A worker of `version` is up: it ends the load under way that began first."""
        starts = self._starts.get(version, [])
        switch = min(((s.since, old) for old, s in self.switching.items() if s.to == version),
                     default=None)
        if starts and (switch is None or starts[0][0] <= switch[0]):
            since, kind = starts.pop(0)
            self._tidy(version)
            if self._capacity is not None:
                self._capacity.up(now, version)
            if kind == "add":
                self.measure(version, now - since)
        elif switch is not None:
            del self.switching[switch[1]]
            self.measure(version, now - switch[0])
        elif self._capacity is not None:  # the pool's, not one the core knew of
            self._capacity.up(now, version)

    def measure(self, version: str, seconds: float) -> None:
        before = self.measured.get(version)
        self.measured[version] = seconds if before is None else (
            (1 - MEASURE_WEIGHT) * before + MEASURE_WEIGHT * seconds)
        self.seconds.append(seconds)

    def under_way(self, version: str) -> int:
        return (sum(s.to == version for s in self.switching.values())
                + len(self._starts.get(version, ())))

    def began(self, version: str) -> float:
        """When the earliest load of `version` under way began (inf: none)."""
        return min([s.since for s in self.switching.values() if s.to == version]
                   + [since for since, _ in self._starts.get(version, ())], default=math.inf)

    def _tidy(self, version: str) -> None:
        if not self._starts.get(version, True):
            del self._starts[version]


__all__ = ["KINDS", "MEASURE_WEIGHT", "Loads", "Switching"]
