"""Placement carried out over the versions' cores: what placement is shown (a view per
version, a view per worker up), the switches it and the rollouts decide, recorded in the
ledger and handed to the owner as actions, and when a cold version could serve.

Rollout: while a model's new default has not taken over (`Versions.rolled`), it is loaded
one worker at a time from the old default's idle workers past their residency, the old
one's last only once the rollout's time is up (a model on one worker: the new default loads,
then takes over; if its loads keep failing the slot loads the old one again).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from batcher import VersionKey
from failover import CoreActions, DispatchCore
from failover.fleet.capacity import Idle, neediest
from failover.fleet.failing import Failing
from failover.fleet.placement import (
    Placement,
    PlacementSettings,
    Switch,
    SwitchReason,
    VersionView,
    WorkerView,
    initial_placement,
    load_eta,
)
from failover.fleet.residency import Residency
from failover.fleet.versions import Versions
from gpu_pool import StartKind


class VersionStatus(enum.StrEnum):
    RESIDENT = "resident"  # a worker holds it
    LOADING = "loading"  # none does; one is loading it
    COLD = "cold"  # none holds or loads it
    RETIRED = "retired"  # no new requests; its queue finishes, its workers leave
    FAILING = "failing"  # none holds it and its loads keep failing: none is tried for a while


@dataclass(frozen=True, slots=True)
class VersionState:
    """One version as `/admin/models` shows it."""

    version: VersionKey
    state: VersionStatus
    resident: int
    loading: int
    queued: int
    load_s: float | None  # measured, of the kind of start it would get now (None: not yet)
    start: StartKind = StartKind.SPAWN  # the kind of start it would get now
    start_s: Mapping[StartKind, float] = field(default_factory=dict)  # measured, by kind


class Placing:
    def __init__(self, placement: Placement, versions: Versions, residency: Residency,
                 cores: dict[VersionKey, DispatchCore], failing: Failing) -> None:
        """`cores`: the composite's, by version, and `failing` (both read only)."""
        self._placement = placement
        self._failing = failing
        self._versions = versions
        self._residency = residency
        self._cores = cores
        self.loads: Counter[tuple[VersionKey, str]] = Counter()  # (version, reason) -> switches
        self.next_check = math.inf  # when placement next has something to say unasked
        stay = getattr(placement, "settings", None)  # a rollout keeps placement's residency
        self._min_resident = stay.min_resident if isinstance(stay, PlacementSettings) else (
            lambda load_s: 0.0)

    def place(self, out: CoreActions, now: float, draining: bool) -> None:
        """Add to `out` the switches placement and rollouts decide now."""
        self._roll_out(now, out, draining)
        workers, views = self.workers(), self.views(now)
        switches = self._placement.decide(now, workers, views)
        for switch in switches:
            self._switch(switch, now, out, draining)
        if switches:  # asked again with what they changed
            workers, views = self.workers(), self.views(now)
        self.next_check = self._placement.next_check(now, workers, views)

    def _switch(self, switch: Switch, now: float, out: CoreActions, draining: bool) -> None:
        version = self._residency.version_of(switch.worker)
        if version is None or version == switch.to or draining:
            return
        if not self._cores[version].worker_left(switch.worker):
            return
        start = self._residency.switch(switch.worker, switch.to, now)
        self.loads[(switch.to, switch.reason)] += 1
        out.switch.append((switch.worker, switch.to, start))

    def _roll_out(self, now: float, out: CoreActions, draining: bool) -> None:
        for name, old, target in self._versions.rolling():
            old_up = self._resident(old)
            if self._versions.rolled(name, now, self._resident(target), old_up):
                continue
            if self._residency.loading(target):
                continue
            if old_up <= 1 and not self._versions.overdue(name):
                continue  # its last worker goes only once the rollout's time is up
            stay = self._min_resident(self._residency.load_s(old))
            idle = [w for w in self._cores[old].idle_workers()
                    if now >= self._residency.since(w) + stay]
            if idle:
                self._switch(Switch(idle[0], target, SwitchReason.ROLLOUT), now, out, draining)

    # -- views -----------------------------------------------------------------------------
    def workers(self) -> list[WorkerView]:
        return [WorkerView(w, v, self._cores[v].is_idle(w), self._residency.since(w))
                for w, v in self._residency.workers()]

    def idle(self) -> list[Idle]:
        return [Idle(w, v, self._residency.since(w)) for w, v in self._residency.workers()
                if self._cores[v].is_idle(w)]

    def views(self, now: float) -> list[VersionView]:
        out: list[VersionView] = []
        versions, residency = self._versions, self._residency
        catalogue = versions.catalogue
        for version, core in self._cores.items():
            demand = core.demand(now)
            name = version.model
            model = catalogue.models.get(name)
            resident, loading = core.ready_count(), residency.loading(version)
            out.append(VersionView(
                version=version, model=name, queued=demand.queued, paid=demand.paid,
                oldest=demand.oldest, oldest_deadline=demand.oldest_deadline,
                rate=demand.rate,
                last_arrival=versions.last_arrival(version, now, bool(resident or loading)),
                loading=loading, load_s=residency.load_s(version),
                throughput=core.throughput(),
                min_workers=0 if model is None else model.min_workers,
                max_workers=None if model is None else model.max_workers,
                idle_unload_s=math.inf if model is None else model.idle_unload_s,
                retired=not versions.live(version),
                wanted=versions.wanted(version, now),
                resident=resident,
                load_started=residency.ledger.began(version),
                failing=self._failing.failing(version, now),
            ))
        return out

    def states(self, now: float) -> list[VersionState]:
        out = []
        for version, core in self._cores.items():
            resident, loading = core.ready_count(), self._residency.loading(version)
            state = (VersionStatus.RETIRED if not self._versions.live(version)
                     else VersionStatus.RESIDENT if resident
                     else VersionStatus.FAILING if self._failing.failing(version, now)
                     else VersionStatus.LOADING if loading else VersionStatus.COLD)
            out.append(VersionState(version, state, resident, loading, core.demand(now).queued,
                                    self._residency.measured_s(version),
                                    self._residency.how(version),
                                    self._residency.ledger.measured_of(version)))
        return out

    def replacement(self, now: float) -> VersionKey | None:
        """What a slot whose version's loads keep failing loads instead: the version that
        most needs a worker, as the scaling rule grows into, a model below its floor first;
        None if there is none (the slot keeps trying what it holds)."""
        return neediest(self.views(now), floors_first=True)

    def _resident(self, version: VersionKey) -> int:
        core = self._cores.get(version)
        return 0 if core is None else core.ready_count()

    # -- when a cold version could serve ---------------------------------------------------
    def eta(self, version: VersionKey, now: float) -> float:
        """Seconds until a worker of `version` should be ready: what is left of its load
        under way, else a load once a batch and some worker's residency let it leave (or
        a worker added for it, sooner)."""
        residency = self._residency
        view = next(v for v in self.views(now) if v.version == version)
        joining = self._cores[version].joining
        added = max(0.0, joining[0] - now) if joining else math.inf
        eta = min(load_eta(view, now), residency.load_s(version) + self._longest_batch())
        if view.loading:
            return min(eta, added)
        leave = min((residency.since(w) + self._min_resident(residency.load_s(v))
                     if self._versions.live(v) else now for w, v in residency.workers()),
                    default=now)
        return min(max(eta, leave - now + residency.load_s(version)), added)

    def _longest_batch(self) -> float:
        return max((core.batch_latency() for core in self._cores.values()), default=0.1)

    def initial(self, workers: int) -> list[VersionKey]:
        """The version each of `workers` slots starts with (`initial_placement` over each
        model's serving default, in catalogue order)."""
        order = self._versions.defaults()
        views = [v for v in self.views(0.0) if v.version in set(order)]
        views.sort(key=lambda v: order.index(v.version))
        return initial_placement(workers, views)


__all__ = ["Placing", "VersionState", "VersionStatus"]
