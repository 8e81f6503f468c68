"""The pool's size, decided in the core: the scaling rule (`failover.fleet`) carried out
over the versions the core serves.

The rule says how many workers; this says which: a new worker holds the version that most
needs one (its demand per worker, within its model's max_workers), the worker retired is an
idle one of the version that needs it least, never below its model's min_workers, and a start
the rule takes back is the newest whose model keeps its floor without it. The caller carries
the decisions out (`CoreActions.grow`, `retire`, `cancel_start`) and reports the starts back
(`failover.fleet.loads`): workers added, the pool's first, and dead workers' restarts (a
worker lost is replaced by its slot, not asked for twice).

Each version's core is told when its workers on their way are expected up
(`DispatchCore.joining`), so admission counts them from then on: the door stays honest while
capacity is coming. A start past its ETA is late by an unknown amount: it counts a share of a
start-up from now, never as if up; overdue by more than a start-up (a Ray actor no node has
room for) it no longer counts: nobody knows when it comes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from failover import CoreActions
from failover.fleet.placement import VersionView
from failover.fleet.rule import Scaler
from gpu_pool import WorkerId

STEP_S = 1.0  # the rule is asked at least this often while the pool may change
LATE_SHARE = 0.25  # of a start-up: when a start past its ETA is expected from now


@dataclass(frozen=True, slots=True)
class CapacityGauges:
    """What `/metrics` and `/admin/workers` show of the pool's size."""

    desired: int
    starting: int
    running: int
    eta_s: float  # until the next worker on its way is expected up (0: none)
    events: dict[tuple[str, str], int]  # (direction, reason) -> count


@dataclass(frozen=True, slots=True)
class Idle:
    """An idle worker the rule may retire."""

    worker: WorkerId
    version: str
    since: float  # resident since


class Capacity:
    """Carries out the rule's decisions; the multi-version core (`ModelCores`) feeds it."""

    def __init__(self, scaler: Scaler) -> None:
        self.scaler = scaler
        # A fixed pool's rule never scales: it meters no arrivals (the hot path), and only
        # counts its restarts as workers on their way.
        self.scales = scaler.settings.min_workers < scaler.settings.max_workers
        self.events: Counter[tuple[str, str]] = Counter()
        self._last = -math.inf  # when the rule was last asked
        self._next = -math.inf  # when it is asked next, unless it says sooner

    def arrived(self, items: int, now: float, paid: bool) -> None:
        self.scaler.arrived(items, now, paid)

    # -- the starts, as `failover.fleet.loads` reports them --------------------------------
    def starting(self, now: float, start_s: float, version: str) -> None:
        """A slot starts `version`: a worker added, one the pool starts with, or a dead
        one's restart (so the rule asks for no second worker to replace it)."""
        self.scaler.started(now, start_s, version)

    def up(self, now: float, version: str) -> None:
        self.scaler.up(now, version)

    def failed(self, now: float, start_s: float, version: str) -> None:
        """A worker of `version` died loading: its start is retried after a backoff."""
        self.scaler.failed(now, start_s, version)

    def cancel(self, version: str) -> None:
        self.scaler.cancel(version)

    # -- deciding ------------------------------------------------------------------------
    def due(self) -> float:
        """When to ask the rule next: each `STEP_S`, or sooner when it says so (never
        again at the moment it was asked: a past check would spin the owner)."""
        check = self.scaler.next_check(self._last)
        return self._next if check <= self._last else min(self._next, check)

    def step(
        self, now: float, running: int, views: Sequence[VersionView], idle: Sequence[Idle],
        start_s: Callable[[str], float], out: CoreActions,
    ) -> list[WorkerId]:
        """Ask the rule; what it says goes into `out` (`grow`, `cancel_start`, `retire`),
        which the caller carries out: the workers retired (out of their cores)."""
        if now < self.due():
            return []
        self._last, self._next = now, now + STEP_S
        queued = sum(v.queued for v in views)
        horizon = max((start_s(v.version) for v in views if not v.retired), default=0.0)
        decision = self.scaler.decide(now, running, queued, horizon)
        adding: Counter[str] = Counter()
        for _ in range(decision.up):
            version = self._grow_into(views, adding)
            if version is None:
                break
            adding[version] += 1
            out.grow.append(version)
            self.events[("up", decision.reason)] += 1
        if not decision.down:
            return []
        if decision.take_back:
            if (version := self._take_back(views)) is not None:
                out.cancel_start.append(version)
                self.events[("down", decision.reason)] += 1
            return []
        if (worker := self._retiree(views, idle)) is None:
            return []
        out.retire.append(worker)
        self.events[("down", decision.reason)] += 1
        return [worker]

    @staticmethod
    def _grow_into(views: Sequence[VersionView], adding: Counter[str]) -> str | None:
        """The version that most needs another worker: the highest demand per worker (up
        and on their way), within its model's max_workers; ties to the first."""
        per_model: Counter[str] = Counter()
        for v in views:
            per_model[v.model] += v.resident + v.loading + adding[v.version]
        best, best_key = None, None
        for order, v in enumerate(views):
            if v.retired or not v.wanted:
                continue
            if v.max_workers is not None and per_model[v.model] >= v.max_workers:
                continue
            workers = v.resident + v.loading + adding[v.version]
            key = (-(v.rate + v.queued) / (workers + 1), order)
            if best_key is None or key < best_key:
                best, best_key = v.version, key
        return best

    def _take_back(self, views: Sequence[VersionView]) -> str | None:
        """The version of the newest start whose model keeps its min_workers without it."""
        of = {v.version: v for v in views}
        per_model: Counter[str] = Counter()
        for view in views:
            per_model[view.model] += view.resident + view.loading
        for start in sorted(self.scaler.starting(), key=lambda s: s.since, reverse=True):
            v = of.get(start.version)
            if v is None or v.retired or per_model[v.model] - 1 >= v.min_workers:
                return start.version
        return None

    @staticmethod
    def _retiree(views: Sequence[VersionView], idle: Sequence[Idle]) -> WorkerId | None:
        """An idle worker of the version that needs it least: retired or unwanted versions
        first, then the lowest demand per worker; never a model's last above its floor."""
        by_version = {v.version: v for v in views}
        per_model: Counter[str] = Counter()
        for view in views:
            per_model[view.model] += view.resident
        best, best_key = None, None
        for w in idle:
            if (v := by_version.get(w.version)) is None:
                continue
            leaving = v.retired or not v.wanted
            if not leaving and per_model[v.model] - 1 < max(v.min_workers, 0):
                continue
            key = (not leaving, (v.rate + v.queued) / max(v.resident, 1), -w.since)
            if best_key is None or key < best_key:
                best, best_key = w.worker, key
        return best

    def joining(self, version: str, now: float, start_s: float) -> tuple[float, ...]:
        """When each start of `version` is expected up, for admission. A start past its ETA
        is late by an unknown amount: expected a share of a start-up from now, never as if
        up already; overdue by more than a start-up, it is no longer counted."""
        late = now + LATE_SHARE * start_s
        return tuple(sorted(s.eta if s.eta >= now else late for s in self.scaler.starting()
                            if s.version == version and now <= s.eta + start_s))

    def gauges(self, now: float, running: int) -> CapacityGauges:
        starts = self.scaler.starting()
        eta = max(0.0, min((s.eta for s in starts), default=now) - now)
        return CapacityGauges(self.scaler.desired(), len(starts), running, eta,
                              dict(self.events))


__all__ = ["LATE_SHARE", "STEP_S", "Capacity", "CapacityGauges", "Idle"]
