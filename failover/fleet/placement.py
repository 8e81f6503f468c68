"""Placement: which idle worker switches to which model version, and when.

A worker holds one version at a time and a switch costs that version's load time, during
which the worker serves nothing: a set-up cost. `SwitchCost` treats it as one (a control-limit
rule, the known optimum for batch service with set-up costs): a worker moves only when the work
waiting elsewhere pays for the load, when waiting items would otherwise miss their deadlines,
or to keep a model's floor; a version just loaded stays a minimum time. `LruOnDemand` is the
baseline it is measured against (`loadtest.sim_models`): any free worker loads whatever the
oldest waiting item needs, as Ray Serve's multiplexing and ModelMesh do, which thrashes when
traffic is mixed.

Both are pure: views in, switches out, time passed in. The owner carries a switch out (stop
the worker, start one with the other version) and reports it back through the next views.

Views contract: `workers` lists the workers that hold a version (idle or busy); a worker being
loaded is counted only in its target's `VersionView.loading`. `versions` lists every version
that has a worker, a load or a queue, in catalogue order with each model's default first (ties
go to the earlier one). A worker whose version has no view is left alone. Each view carries
its version's measured throughput (`DispatchCore.throughput`: what one worker drains at full
batches of the current mix, and how long such a batch takes); nothing here assumes a batch's
size or time.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from batcher import Throughput, VersionKey
from gpu_pool import WorkerId


class SwitchReason(enum.StrEnum):
    """Why a worker switches to another version (the metrics' `reason` label)."""

    DEMAND = "demand"  # work waiting there pays for the load
    DEADLINE = "deadline"  # waiting items would miss their deadlines
    COLD = "cold"  # requests for a version no worker holds
    RETIRE = "retire"  # its version is retired: it goes where it is wanted
    IDLE = "idle"  # its version is idle past idle_unload_s
    MIN_WORKERS = "min_workers"  # a model's floor
    ROLLOUT = "rollout"  # a new default loads from the old one's idle workers


REASONS = tuple(SwitchReason)
_RANK = {SwitchReason.MIN_WORKERS: 0, SwitchReason.COLD: 1, SwitchReason.DEADLINE: 2,
         SwitchReason.DEMAND: 3}


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker: WorkerId
    version: VersionKey  # the version key it holds ("model@version")
    idle: bool  # only idle workers may switch (never load while busy)
    resident_since: float  # when its current version finished loading


@dataclass(frozen=True, slots=True)
class VersionView:
    version: VersionKey  # "model@version"
    model: str
    queued: int  # live items waiting for it, all tiers
    paid: int  # of which paid
    oldest: float  # enqueue time of its oldest waiting item (math.inf: none)
    oldest_deadline: float  # the earliest deadline among waiting items (math.inf: none)
    rate: float  # items/s arriving for it (decaying average)
    last_arrival: float  # time of its last arrival (-math.inf: never)
    loading: int  # switches to it in progress
    load_s: float  # expected load time (measured, else the catalogue's hint)
    throughput: Throughput  # one worker's full batches, as its core measures them
    min_workers: int  # of its MODEL (models may have several versions)
    max_workers: int | None  # of its MODEL
    idle_unload_s: float  # of its MODEL
    retired: bool  # takes no new requests; workers leave once its queue is empty
    wanted: bool = True  # False: nothing sends it new traffic (a version no request resolves to)
    resident: int = 0  # workers holding it, idle or busy (read by load_eta only)
    load_started: float = math.inf  # start of its load in progress (read by load_eta only)
    failing: bool = False  # its loads keep failing: nothing is loaded for it for a while


@dataclass(frozen=True, slots=True)
class Switch:
    worker: WorkerId
    to: VersionKey  # the version to load
    reason: SwitchReason


class Placement(Protocol):
    def decide(
        self, now: float, workers: Sequence[WorkerView], versions: Sequence[VersionView]
    ) -> list[Switch]: ...

    def next_check(
        self, now: float, workers: Sequence[WorkerView], versions: Sequence[VersionView]
    ) -> float:
        """The earliest time after `now` at which `decide` may say something new with no other
        event (a residency ending, an idle unload, a cold item's last moment); math.inf: none."""
        ...


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    """`SwitchCost`'s knobs. A switch is worth it when the work it would find, counted over
    `horizon_loads` load times ahead (queue plus arrivals beyond what the version's workers
    run), reaches `factor` load times; a worker is spare when the rest of its version's workers
    run its rate at `utilization`; a version just loaded stays resident
    max(`min_resident_s`, `min_resident_loads` x load_s), which bounds any thrash to one load
    per worker per residency. What a worker drains is no knob: each view carries its
    version's measured throughput."""

    factor: float = 0.25
    horizon_loads: float = 2.0
    utilization: float = 0.85
    min_resident_s: float = 10.0
    min_resident_loads: float = 5.0
    cold_recent_s: float = 1.0  # an arrival this recent (admitted or refused) asks for a cold start
    late_share: float = 0.5  # a queue whose tail waits past this share of its budget is late
    deadline_slack_s: float = 0.5  # a cold item is urgent this long before its last moment

    def __post_init__(self) -> None:
        if self.factor < 0 or self.horizon_loads <= 0:
            raise ValueError("factor must be >= 0 and horizon_loads > 0")
        if not 0 < self.utilization <= 1:
            raise ValueError("utilization must be within (0, 1]")
        if min(self.min_resident_s, self.min_resident_loads, self.cold_recent_s,
               self.deadline_slack_s) < 0:
            raise ValueError("residency, cold_recent_s and deadline_slack_s must be >= 0")
        if not 0 < self.late_share <= 1:
            raise ValueError("late_share must be within (0, 1]")

    def min_resident(self, load_s: float) -> float:
        return max(self.min_resident_s, self.min_resident_loads * load_s)


def load_eta(version: VersionView, now: float) -> float:
    """Seconds until a worker of `version` could be ready: 0 when resident, the rest of its
    load when loading, load_s when a load could start now, math.inf when placement would start
    none (retired, not wanted, no workers allowed) or its loads keep failing. It cannot see
    whether a worker is free to switch: read it as the soonest the version can serve."""
    if version.resident > 0:
        return 0.0
    if version.failing:
        return math.inf
    if version.loading > 0:
        if math.isfinite(version.load_started):
            return max(0.0, version.load_started + version.load_s - now)
        return version.load_s
    if version.retired or not version.wanted or version.max_workers == 0:
        return math.inf
    return version.load_s


def queued_batches(version: VersionView) -> int:
    """The batches its queue makes, as full as its measured throughput says."""
    return math.ceil(version.queued / version.throughput.batch_items)


def initial_placement(workers: int, versions: Sequence[VersionView]) -> list[VersionKey]:
    """The version each of `workers` slots starts with, from one view per model (its default,
    catalogue order): every model its min_workers, the first at least 1; the rest one at a time
    to the model with the fewest so far (ties: catalogue order), within max_workers, so every
    model starts warm when the pool allows and the first models get the extra workers.

    Raises ValueError when the catalogue's bounds cannot fit `workers`."""
    if workers < 1 or not versions:
        raise ValueError("initial placement needs at least one worker and one model")
    floors = [max(v.min_workers, 1 if i == 0 else 0) for i, v in enumerate(versions)]
    caps = [math.inf if v.max_workers is None else v.max_workers for v in versions]
    if any(f > c for f, c in zip(floors, caps, strict=True)):
        raise ValueError("a model's min_workers exceeds its max_workers")
    if sum(floors) > workers:
        raise ValueError(f"the models' min_workers add up to {sum(floors)}, "
                         f"more than the pool's {workers} workers")
    if sum(caps) < workers:
        raise ValueError(f"the models' max_workers leave some of the {workers} workers "
                         "with no model to hold")
    counts = list(floors)
    for _ in range(workers - sum(floors)):
        _, i = min((counts[i], i) for i in range(len(counts)) if counts[i] < caps[i])
        counts[i] += 1
    return [v.version for v, n in zip(versions, counts, strict=True) for _ in range(n)]


@dataclass(frozen=True, slots=True)
class _Need:
    rank: tuple[float, ...]
    view: VersionView
    reason: SwitchReason


class _Round:
    """One `SwitchCost.decide`: the counts it starts from, updated as it picks switches."""

    def __init__(self, now: float, workers: Sequence[WorkerView],
                 versions: Sequence[VersionView], s: PlacementSettings) -> None:
        self.now, self.s = now, s
        self.views = {v.version: v for v in versions}
        self.order = {v.version: i for i, v in enumerate(versions)}
        self.workers = [w for w in workers if w.version in self.views]
        self.resident = Counter(w.version for w in self.workers)
        self.loading = Counter({v.version: v.loading for v in versions})
        self.model_resident = Counter(self.views[w.version].model for w in self.workers)
        self.model_total = Counter(self.model_resident)
        self.model_last: dict[str, float] = {}
        self.bounds: dict[str, VersionView] = {}  # a model's bounds, from its first view
        self.live_models: set[str] = set()
        for v in versions:
            self.model_total[v.model] += v.loading
            self.model_last[v.model] = max(self.model_last.get(v.model, -math.inf),
                                           v.last_arrival)
            self.bounds.setdefault(v.model, v)
            if not v.retired:
                self.live_models.add(v.model)
        self.used: set[WorkerId] = set()
        self.switches: list[Switch] = []

    def workers_of(self, v: VersionView) -> int:
        return self.resident[v.version] + self.loading[v.version]

    def horizon(self, v: VersionView) -> float:
        return self.s.horizon_loads * max(v.load_s, v.throughput.batch_s)

    def excess(self, v: VersionView) -> float:
        """Worker-seconds of work over the horizon that v's own workers will not run."""
        cap = v.throughput.per_worker
        return v.queued / cap + (v.rate / cap - self.workers_of(v)) * self.horizon(v)

    def pressure(self, v: VersionView, workers: int) -> float:
        demand = v.rate + v.queued / self.horizon(v)
        if workers <= 0:
            return 0.0 if demand == 0 else math.inf
        return demand / (workers * v.throughput.per_worker)

    def free(self, w: WorkerView) -> bool:
        """Idle, past its minimum residency (unless retired), and not needed by its own queue:
        the version's other workers, idle or within a batch of it, take the batches waiting."""
        v = self.views[w.version]
        if not w.idle or w.worker in self.used:
            return False
        if self.resident[v.version] - 1 < queued_batches(v):
            return False
        return v.retired or self.now >= w.resident_since + self.s.min_resident(v.load_s)

    def free_for_paid(self, w: WorkerView) -> bool:
        """Free for a version whose paid items wait: idle and past its minimum residency,
        its own queue holding no paid item (paid work of any model outranks free work of
        another: the free queue it leaves waits for the version's other workers)."""
        v = self.views[w.version]
        if not w.idle or w.worker in self.used or v.paid > 0 or v.retired:
            return False  # (a retired version's queue has only its own workers to drain it)
        return self.now >= w.resident_since + self.s.min_resident(v.load_s)

    def donor_class(self, v: VersionView) -> int:
        """0: its version is leaving anyway; 1: spare; 2: its version would run short."""
        if v.retired or not v.wanted:
            return 0
        rest = self.workers_of(v) - 1
        return 1 if rest * v.throughput.per_worker * self.s.utilization >= v.rate else 2

    def floor_ok(self, w: WorkerView, to_model: str) -> bool:
        v = self.views[w.version]
        if v.model not in self.live_models:
            return True  # every version of the model retired: no floor to keep
        if to_model == v.model and (v.retired or not v.wanted):
            return True
        return self.model_resident[v.model] - 1 >= self.bounds[v.model].min_workers

    def can_take(self, v: VersionView, from_model: str) -> bool:
        if v.retired or not v.wanted or v.failing or self.loading[v.version] > 0:
            return False
        cap = self.bounds[v.model].max_workers
        return from_model == v.model or cap is None or self.model_total[v.model] < cap

    def urgent(self, v: VersionView) -> bool:
        return self.now + v.load_s + self.s.deadline_slack_s >= v.oldest_deadline

    def late(self, v: VersionView) -> bool:
        budget = v.oldest_deadline - v.oldest
        if not math.isfinite(budget) or v.load_s + v.throughput.batch_s >= budget:
            return False  # no budget to read, or a load could not help in time
        drain = v.queued / (self.resident[v.version] * v.throughput.per_worker)
        return drain >= self.s.late_share * budget

    def may_rob(self, d: VersionView, need: _Need) -> bool:
        """May a worker leave `d`, which needs it, for `need`? Never for free work while paid
        work waits at `d`; for plain demand only `d`'s last worker, when nothing waits there
        and its arrivals would not pay for a load; never otherwise to leave `d` cold unless
        `need` is a cold version wanted more, or urgent."""
        v, rest = need.view, self.workers_of(d) - 1
        if v.paid == 0 and d.paid > 0:
            return False  # free work never takes a worker from waiting paid work
        if need.reason == SwitchReason.DEMAND:
            # Its last worker, nothing waiting, and its own arrivals would not pay for a
            # load: it goes to work that does now, not after the idle timeout.
            own = d.rate / d.throughput.per_worker * self.horizon(d)
            return rest == 0 and d.queued == 0 and own < self.s.factor * d.load_s
        if rest >= 1:
            mine = self.pressure(v, self.workers_of(v))
            return need.reason != SwitchReason.DEADLINE or self.pressure(d, rest) < mine
        return need.reason == SwitchReason.COLD and (d.rate <= v.rate or self.urgent(v))

    def move(self, w: WorkerView, to: VersionView, reason: SwitchReason) -> None:
        src = self.views[w.version]
        self.used.add(w.worker)
        self.resident[src.version] -= 1
        self.model_resident[src.model] -= 1
        self.model_total[src.model] -= 1
        self.loading[to.version] += 1
        self.model_total[to.model] += 1
        self.switches.append(Switch(w.worker, to.version, reason))


class SwitchCost:
    """The recommended placement (see the module docstring). Per call, in order: each version
    that needs a worker (a model below min_workers, a cold version with waiting items or a
    fresh arrival, a queue whose tail would miss its deadline, work that pays for a load) takes
    the best free worker it may have; then free workers of retired versions, and of versions
    idle past idle_unload_s, go where they are most wanted."""

    def __init__(self, settings: PlacementSettings | None = None) -> None:
        self.settings = settings or PlacementSettings()

    def decide(
        self, now: float, workers: Sequence[WorkerView], versions: Sequence[VersionView]
    ) -> list[Switch]:
        if not any(w.idle for w in workers):
            return []
        r = _Round(now, workers, versions, self.settings)
        free = sorted((w for w in r.workers if r.free(w) or r.free_for_paid(w)),
                      key=lambda w: (w.resident_since, w.worker))
        if not free:
            return []
        for need in sorted(self._needs(r), key=lambda n: n.rank):
            self._serve(r, need, free)
        for w in free:
            if r.free(w):  # still: a move may have left its queue short
                self._leave(r, w)
        return r.switches

    def next_check(
        self, now: float, workers: Sequence[WorkerView], versions: Sequence[VersionView]
    ) -> float:
        s, views = self.settings, {v.version: v for v in versions}
        model_last: dict[str, float] = {}
        for v in versions:
            model_last[v.model] = max(model_last.get(v.model, -math.inf), v.last_arrival)
        held = {w.version for w in workers}
        times = [v.oldest_deadline - v.load_s - s.deadline_slack_s
                 for v in versions if v.queued and v.version not in held]
        for w in workers:
            held_v = views.get(w.version)
            if held_v is None:
                continue
            settled = w.resident_since + s.min_resident(held_v.load_s)
            times.append(settled)
            if held_v.min_workers == 0 or not held_v.wanted:
                last = model_last[held_v.model] if held_v.wanted else held_v.last_arrival
                times.append(max(settled, max(last, w.resident_since) + held_v.idle_unload_s))
        return min((t for t in times if t > now), default=math.inf)

    def _needs(self, r: _Round) -> list[_Need]:
        s, now, out = self.settings, r.now, []
        for v in r.views.values():
            if v.retired or not v.wanted or v.failing or v.loading > 0:
                continue
            here = r.resident[v.version]
            excess = r.excess(v)
            if r.model_total[v.model] < v.min_workers and self._model_pick(r, v.model) is v:
                reason = SwitchReason.MIN_WORKERS
            elif here == 0 and (v.queued > 0 or now - v.last_arrival <= s.cold_recent_s):
                reason = SwitchReason.COLD
            elif here > 0 and v.queued > 0 and r.late(v):
                reason = SwitchReason.DEADLINE
            elif here > 0 and excess >= s.factor * v.load_s:
                reason = SwitchReason.DEMAND
            else:
                continue
            rank = (float(reason != SwitchReason.MIN_WORKERS), float(v.paid == 0), _RANK[reason],
                    v.oldest_deadline, -excess, r.order[v.version])
            out.append(_Need(rank, v, reason))
        return out

    def _serve(self, r: _Round, need: _Need, free: list[WorkerView]) -> None:
        v, best, best_key = need.view, None, None
        for w in free:
            d = r.views[w.version]
            if d is v or not r.can_take(v, d.model):
                continue
            if not r.free(w) and not (v.paid > 0 and r.free_for_paid(w)):
                continue
            if not r.floor_ok(w, v.model):
                continue
            cls = r.donor_class(d)
            if cls == 2 and not r.may_rob(d, need):
                continue
            key = (cls, r.pressure(d, r.workers_of(d) - 1), w.resident_since, w.worker)
            if best_key is None or key < best_key:
                best, best_key = w, key
        if best is not None:
            r.move(best, v, need.reason)

    def _leave(self, r: _Round, w: WorkerView) -> None:
        d, now = r.views[w.version], r.now
        if d.retired:
            reason = SwitchReason.RETIRE
        else:
            last = r.model_last[d.model] if d.wanted else d.last_arrival
            idle_model = d.min_workers == 0 or not d.wanted
            if not idle_model or now - max(last, w.resident_since) < d.idle_unload_s:
                return
            reason = SwitchReason.IDLE
        to = self._home(r, w, d, same_model=d.retired or not d.wanted)
        if to is not None:
            r.move(w, to, reason)

    def _home(self, r: _Round, w: WorkerView, d: VersionView,
              same_model: bool) -> VersionView | None:
        """Where a leaving worker is most wanted: the highest rate per worker, ties to the
        catalogue's first; within its own model when the model's floor needs it there."""
        best, best_key = None, None
        for v in r.views.values():
            if v is d or not r.can_take(v, d.model) or not r.floor_ok(w, v.model):
                continue
            if v.model == d.model and not same_model:
                continue  # an idle model's other versions are idle too
            if (v.min_workers == 0 and v.queued == 0
                    and r.now - r.model_last[v.model] >= v.idle_unload_s):
                continue  # idle itself: it would only be unloaded again
            key = (-v.rate / (r.workers_of(v) + 1), r.order[v.version])
            if best_key is None or key < best_key:
                best, best_key = v, key
        return best

    @staticmethod
    def _model_pick(r: _Round, model: str) -> VersionView | None:
        """The version a model's floor is filled with: its busiest live one, ties to the first."""
        live = [v for v in r.views.values()
                if v.model == model and not v.retired and v.wanted and not v.failing
                and v.loading == 0]
        return min(live, key=lambda v: (-v.queued, -v.rate, r.order[v.version]), default=None)


class LruOnDemand:
    """The baseline: each free worker with nothing queued for its version loads whatever the
    oldest waiting item needs, evicting the least recently requested version first (Ray Serve's
    multiplexing, ModelMesh). Like them it keeps no floor and no residency; it skips versions
    that already have an idle worker or a load in progress, which only spares it loads."""

    def decide(
        self, now: float, workers: Sequence[WorkerView], versions: Sequence[VersionView]
    ) -> list[Switch]:
        views = {v.version: v for v in versions}
        free = [w for w in workers
                if w.idle and w.version in views and views[w.version].queued == 0]
        if not free:
            return []
        idle_at = {w.version for w in workers if w.idle}
        resident = {w.version for w in workers}
        order = {v.version: i for i, v in enumerate(versions)}
        waiting = sorted((v for v in versions if v.queued > 0 and v.loading == 0
                          and not v.retired and v.version not in idle_at),
                         key=lambda v: (v.oldest, order[v.version]))
        free.sort(key=lambda w: (views[w.version].last_arrival, w.resident_since, w.worker))
        return [Switch(w.worker, v.version, SwitchReason.DEMAND if v.version in resident
                       else SwitchReason.COLD)
                for v, w in zip(waiting, free, strict=False)]

    def next_check(
        self, now: float, workers: Sequence[WorkerView], versions: Sequence[VersionView]
    ) -> float:
        return math.inf


__all__ = [
    "REASONS",
    "LruOnDemand",
    "Placement",
    "PlacementSettings",
    "Switch",
    "SwitchCost",
    "SwitchReason",
    "VersionView",
    "WorkerView",
    "initial_placement",
    "load_eta",
    "queued_batches",
]
