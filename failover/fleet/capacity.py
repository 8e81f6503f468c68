"""The pool's size, decided in the core: the scaling rule (`failover.fleet`) carried out
over the versions the core serves.

The rule says how many workers; this says which: a new worker holds the version that most
needs one (its demand per worker, within its model's max_workers), the worker retired is an
idle one of the version that needs it least, never below its model's min_workers, and a start
the rule takes back is the newest whose model keeps its floor without it. The workers on
their way are the ledger's (`failover.fleet.ledger`); the caller records the starts this
asks for there and carries the decisions out (`CoreActions.grow`, `retire`,
`cancel_start`).

What a worker drains is measured by each version's core (`VersionView.throughput`); the rule
is given the pool's per worker (`pool_throughput`), and demand per worker is counted in the
workers it keeps busy at its version's throughput.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batcher import VersionKey
from failover.fleet.ledger import Ledger
from failover.fleet.placement import VersionView
from failover.fleet.rule import Scaler
from gpu_pool import StartId, WorkerId

STEP_S = 1.0  # the rule is asked at least this often while the pool may change


def pool_throughput(views: Sequence[VersionView], start_s: float) -> float:
    """Items/s one worker of the pool drains, for the rule: the versions' measured
    throughputs (`VersionView.throughput`), their harmonic mean weighted by each one's
    demand (its arrivals plus its queue spread over `start_s`, as the rule spreads it).

    Why that mean: version v's demand d_v keeps d_v / c_v workers busy, so the mix needs
    sum(d_v / c_v) workers, and D / that (D = sum d_v) is the one capacity per worker with
    which the rule's demand / capacity counts exactly those workers. An arithmetic mean
    would let a fast version hide a slow one's need. With no demand anywhere, the live
    versions weigh alike (the rule then asks only for its floor whatever the figure)."""
    spread = max(start_s, 1.0)
    weights = [(v.rate + v.queued / spread, v) for v in views]
    if not any(w > 0 for w, _ in weights):
        live = [v for v in views if not v.retired] or list(views)
        weights = [(1.0, v) for v in live]
    total = sum(w for w, _ in weights)
    workers = sum(w / v.throughput.per_worker for w, v in weights if w > 0)
    return total / workers if workers > 0 else math.inf


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
    version: VersionKey
    since: float  # resident since


@dataclass(slots=True)
class Scaling:
    """What one step of the rule decided, for the caller to record and carry out."""

    grow: list[VersionKey] = field(default_factory=list)  # a new worker holding each version
    take_back: StartId | None = None  # a start not yet up that demand no longer needs
    retire: WorkerId | None = None  # an idle worker leaving for good


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

    # -- deciding ------------------------------------------------------------------------
    def due(self, ledger: Ledger) -> float:
        """When to ask the rule next: each `STEP_S`, or sooner when it says so (never
        again at the moment it was asked: a past check would spin the owner)."""
        check = self.scaler.next_check(self._last, len(ledger.adding()))
        return self._next if check <= self._last else min(self._next, check)

    def step(
        self, now: float, running: int, views: Sequence[VersionView], idle: Sequence[Idle],
        start_s: Callable[[VersionKey], float], ledger: Ledger,
    ) -> Scaling:
        """Ask the rule, the workers on their way read from `ledger`: what it decided."""
        out = Scaling()
        if now < self.due(ledger):
            return out
        self._last, self._next = now, now + STEP_S
        queued = sum(v.queued for v in views)
        horizon = max((start_s(v.version) for v in views if not v.retired), default=0.0)
        decision = self.scaler.decide(now, running, len(ledger.adding()), queued, horizon,
                                      pool_throughput(views, horizon))
        adding: Counter[VersionKey] = Counter()
        for _ in range(decision.up):
            version = neediest(views, adding)
            if version is None:
                break
            adding[version] += 1
            out.grow.append(version)
            self.events[("up", str(decision.reason))] += 1
        if not decision.down:
            return out
        if decision.take_back:
            out.take_back = self._take_back(views, ledger)
        else:
            out.retire = self._retiree(views, idle)
        if out.take_back is not None or out.retire is not None:
            self.events[("down", str(decision.reason))] += 1
        return out

    @staticmethod
    def _take_back(views: Sequence[VersionView], ledger: Ledger) -> StartId | None:
        """The newest start that adds a worker whose model keeps its min_workers without
        it."""
        of = {v.version: v for v in views}
        per_model: Counter[str] = Counter()
        for view in views:
            per_model[view.model] += view.resident + view.loading
        for start in sorted(ledger.adding(), key=lambda s: s.since, reverse=True):
            v = of.get(start.version)
            if v is None or v.retired or per_model[v.model] - 1 >= v.min_workers:
                return start.id
        return None

    @staticmethod
    def _retiree(views: Sequence[VersionView], idle: Sequence[Idle]) -> WorkerId | None:
        """An idle worker of the version that needs it least: retired or unwanted versions
        first, then the lowest demand per worker (at its throughput); never a model's last
        above its floor."""
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
            busy = (v.rate + v.queued) / (v.throughput.per_worker * max(v.resident, 1))
            key = (not leaving, busy, -w.since)
            if best_key is None or key < best_key:
                best, best_key = w.worker, key
        return best

    def gauges(self, now: float, running: int, ledger: Ledger) -> CapacityGauges:
        return CapacityGauges(self.scaler.desired(), len(ledger.adding()), running,
                              ledger.next_eta(now), dict(self.events))


def neediest(views: Sequence[VersionView], adding: Counter[VersionKey] | None = None,
             floors_first: bool = False) -> VersionKey | None:
    """The version that most needs another worker: the highest demand per worker (up, loading
    and `adding`, in workers busy at its throughput), within its model's max_workers, never
    a retired, unwanted or failing one; ties to the first. `floors_first`: a model below its
    min_workers before any other."""
    adding = adding if adding is not None else Counter()
    per_model: Counter[str] = Counter()
    for v in views:
        per_model[v.model] += v.resident + v.loading + adding[v.version]
    best, best_key = None, None
    for order, v in enumerate(views):
        if v.retired or not v.wanted or v.failing:
            continue
        if v.max_workers is not None and per_model[v.model] >= v.max_workers:
            continue
        workers = v.resident + v.loading + adding[v.version]
        key = (floors_first and per_model[v.model] >= v.min_workers,
               -(v.rate + v.queued) / (v.throughput.per_worker * (workers + 1)), order)
        if best_key is None or key < best_key:
            best, best_key = v.version, key
    return best


__all__ = ["STEP_S", "Capacity", "CapacityGauges", "Idle", "Scaling", "neediest",
           "pool_throughput"]
