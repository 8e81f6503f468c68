"""Several versions on one pool: one dispatch core per live version, placement, and the
pool's size.

Each version ("model@version") has a dispatch core of its own (tier queues, in-flight table,
admission), so a batch holds one version's items and runs on a worker holding it, and what a
core guarantees (exactly-once settlement through deaths, hedges, bisection; tier order) holds
per version. A worker belongs to the core of the version it holds. Placement
(`failover.fleet.placement`) switches idle workers between versions; the scaling rule
(`failover.fleet.capacity`) adds and retires workers; every load under way (a switch, a
restart, a worker added: `failover.fleet.loads`) is seen by both, and admission counts it
at its ETA. The one-model case costs a dictionary lookup per event: placement runs only
while the catalogue holds more than one live version or a version is leaving.

Rollout: a model's new default takes effect (for requests naming no version and carrying no
weights) once resident on as many workers as the old, or after `ROLLOUT_TIMEOUT_S`; the
switches are made here, one load at a time, from the old default's idle workers past their
residency. Cold start: a request for a version with no worker waits, or is refused
`ModelLoading` when its deadline cannot fit the ETA; until the Retry-After it was told, the
refusal asks placement for the load.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batcher import BatchgateError, Item, Tier
from failover import CoreActions, CoreStatistics, DispatchCore, ModelLoading, Refusal, UnknownModel
from failover.fleet.capacity import Capacity, CapacityGauges, Idle
from failover.fleet.catalogue import Catalogue, split_key
from failover.fleet.loads import Loads
from failover.fleet.placement import (
    Placement,
    PlacementSettings,
    Switch,
    VersionView,
    WorkerView,
    initial_placement,
    load_eta,
)
from gpu_pool import Err, Ok, WorkerId

ROLLOUT_TIMEOUT_S = 300.0  # a new default takes effect after this even if not yet resident
DEFAULT_LOAD_S = 30.0  # a version's load time before one is measured or hinted
RETIRED_KEPT = 1024  # workers retired whose death the pool may still report


@dataclass(frozen=True, slots=True)
class VersionState:
    """One version as `/admin/models` shows it."""

    version: str
    state: str  # "resident", "loading", "cold", "retired"
    resident: int
    loading: int
    queued: int
    load_s: float | None  # measured (None: not yet)


class ModelCores:
    """Implements what `CoreOwner` needs of a core, over one core per version."""

    def __init__(
        self, catalogue: Catalogue, make_core: Callable[[str, Catalogue], DispatchCore],
        placement: Placement, capacity: Capacity | None = None,
    ) -> None:
        """`make_core`: a new dispatch core for a version of the catalogue (its batch
        latency assumed until measured is the version's own). `capacity`: the pool's size
        follows the load (None: a fixed pool)."""
        self._make_core = make_core
        self._capacity = capacity
        self._metered = capacity if capacity is not None and capacity.scales else None
        self._placement = placement
        self._cores: dict[str, DispatchCore] = {}
        self._of: dict[WorkerId, str] = {}  # workers up, by the version they hold
        self._since: dict[WorkerId, float] = {}  # when each became resident
        self._loads = Loads(capacity)  # switches, restarts and workers added, under way
        self._retired: dict[WorkerId, str] = {}  # retired workers (newest last), by version
        self._last_arrival: dict[str, float] = {}
        self._promised: dict[str, float] = {}  # cold versions: the Retry-After told, until
        self._effective: dict[str, str] = {}  # model -> the default requests get now
        self._rollout_since: dict[str, float] = {}
        self._draining = False
        self.loads: Counter[tuple[str, str]] = Counter()  # (version, reason) -> switches
        self.load_seconds = self._loads.seconds  # measured loads not yet read by metrics
        self._live_versions: frozenset[str] = frozenset()  # the catalogue's, kept with it
        self._only: str | None = None
        self._next_check = math.inf  # when placement next has something to say unasked
        self._sole: DispatchCore | None = None
        stay = getattr(placement, "settings", None)  # a rollout keeps placement's residency
        self._min_resident: Callable[[float], float] = stay.min_resident if isinstance(
            stay, PlacementSettings) else lambda load_s: 0.0
        self.set_catalogue(catalogue, 0.0)

    # -- the catalogue -------------------------------------------------------------------
    def set_catalogue(self, catalogue: Catalogue, now: float) -> None:
        """Serve `catalogue` from now on (loaded at start, changed by the admin API or
        SIGHUP). Versions it no longer holds live are retired: their queues finish and
        their workers leave."""
        self.catalogue = catalogue
        self._live_versions = frozenset(catalogue.versions())
        for version in catalogue.versions():  # in catalogue order: placement breaks ties by it
            if version not in self._cores:
                self._cores[version] = self._new_core(version)
        for name, model in catalogue.models.items():
            current = self._effective.get(name)
            if current is None or current not in self._cores or not self._live(current):
                self._effective[name] = f"{name}@{model.default}"
            elif current != f"{name}@{model.default}":
                self._rollout_since.setdefault(name, now)
        for name in list(self._effective):
            if name not in catalogue.models:
                del self._effective[name]
                self._rollout_since.pop(name, None)
        self._only = self._the_only()
        self._counted()

    def _counted(self) -> None:
        """Note whether one core serves everything (the one-model case takes it
        directly, as a server of one model always has)."""
        self._sole = next(iter(self._cores.values())) if len(self._cores) == 1 else None

    def _the_only(self) -> str | None:
        """The version every request without `model` gets, when nothing can change it:
        resolving is then one comparison (the one-model case, on the hot path)."""
        first = next(iter(self.catalogue.models.values()))
        if first.weights or self._rollout_since:
            return None
        return self._effective[first.name]

    def resolve(self, model: str | None, sticky: str | None) -> str:
        """The version a request runs on (raises UnknownModel): what the catalogue says,
        except that a model's new default waits for its rollout."""
        if model is None and self._only is not None:
            return self._only
        catalogue = self.catalogue
        try:
            version = catalogue.resolve(model, sticky)
        except LookupError as exc:
            raise UnknownModel(str(exc)) from exc
        name, _ = split_key(version)
        config = catalogue.models[name]
        if not config.weights and (model is None or "@" not in model):
            return self._effective.get(name, version)
        return version

    # -- the front door ------------------------------------------------------------------
    def admit(self, items: list[Item], deadline_in: float, now: float) -> bool:
        if self._metered is not None:  # offered, admitted or not: refused demand is demand
            self._metered.arrived(len(items), now, items[0].tier is Tier.PAID)
        sole, version = self._sole, items[0].version
        if sole is not None and (version == sole.version or not version):
            return sole.admit(items, deadline_in, now)
        core = self._core_for(items, deadline_in, now)
        turn = core.admit(items, deadline_in, now)
        return turn or core.arriving > 0

    def admit_all(
        self, requests: Sequence[tuple[list[Item], float]], now: float
    ) -> tuple[list[Refusal | None], bool]:
        if self._metered is not None:
            for items, _ in requests:
                self._metered.arrived(len(items), now, items[0].tier is Tier.PAID)
        sole = self._sole
        if sole is not None and all(r[0][0].version in (sole.version, "") for r in requests):
            return sole.admit_all(requests, now)
        refusals: list[Refusal | None] = [None] * len(requests)
        by_version: dict[str, list[int]] = {}
        for at, (items, _) in enumerate(requests):
            by_version.setdefault(items[0].version, []).append(at)
        turn = False
        for where in by_version.values():
            first = requests[where[0]]
            try:
                core = self._core_for(first[0], first[1], now)
            except BatchgateError as exc:
                for at in where:
                    refusals[at] = exc
                turn = turn or isinstance(exc, ModelLoading)  # placement may start a load
                continue
            said, must = core.admit_all([requests[at] for at in where], now)
            for at, refusal in zip(where, said, strict=True):
                refusals[at] = refusal
            turn = turn or must or core.arriving > 0
        return refusals, turn

    def _core_for(self, items: list[Item], deadline_in: float, now: float) -> DispatchCore:
        """The core of the items' version, or the refusal: not served, or cold past the
        request's deadline."""
        version = items[0].version or self.first_version()  # "": the first model's
        core = self._cores.get(version)
        if core is None or not self._live(version):
            raise UnknownModel(f"model version {version!r} is not served")
        self._last_arrival[version] = now
        if core.ready_count() == 0 and not self._draining:
            eta = self._eta(version, now)
            if eta > deadline_in:  # until then the refusal asks for the load, as an arrival
                self._promised[version] = max(self._promised.get(version, now), now + eta)
                raise ModelLoading(
                    f"{version} is loading (about {eta:.1f} s), past the request's deadline",
                    retry_after=eta)
            core.arriving = max(1, self._loading(version))
        return core

    def cancel(self, item: Item) -> bool:
        core = self._cores.get(item.version or self.first_version())
        return core is not None and core.cancel(item)

    def drain(self) -> None:
        self._draining = True
        for core in self._cores.values():
            core.drain()

    # -- the pool's events ---------------------------------------------------------------
    def worker_ready(self, worker: WorkerId, now: float, version: str = "") -> CoreActions:
        """Incarnation `worker` holds `version`, loaded."""
        self._loads.arrived(version, now)
        self._joining(now)
        core = self._cores.get(version)
        if core is None:  # gone from the catalogue while it loaded: it leaves when idle
            core = self._cores[version] = self._new_core(version)
            self._counted()
        self._of[worker], self._since[worker] = version, now
        core.arriving = 0
        return self._placed(core.worker_ready(worker, now), now)

    def reply(self, worker: WorkerId, reply: Ok | Err, now: float, at: float) -> CoreActions:
        version = self._of.get(worker)
        if version is None:
            return CoreActions()
        return self._placed(self._cores[version].reply(worker, reply, now, at), now)

    def worker_died(self, worker: WorkerId, now: float, version: str = "") -> CoreActions:
        """Its slot starts its version again: a load under way, as a switch's is, so that
        placement does not send a second worker to fill the gap meanwhile (and the pool's
        size counts it once). `version`: what it held or loaded, as the pool says."""
        self._since.pop(worker, None)
        serving = self._of.pop(worker, None)
        held = serving or self._loads.switch_died(worker) or self._retired.pop(worker, None)
        if held is None:  # died loading: its slot loads the same version again
            if version and self._capacity is not None:
                self._loads.failed(version, now, self._load_s(version))
                self._joining(now)
            return CoreActions()
        self._loads.start(held, now, "restart", self._load_s(held))
        self._joining(now)
        if serving is None:  # died before the pool switched or retired it: it restarts
            return self._placed(CoreActions(), now)
        return self._placed(self._cores[held].worker_died(worker, now), now)

    # -- time ----------------------------------------------------------------------------
    def poll(self, now: float) -> CoreActions:
        out = CoreActions()
        for core in self._cores.values():
            out.extend(core.poll(now))
        out = self._placed(out, now)
        if self._metered is not None and not self._draining and now >= self._metered.due():
            self._scale(now, out)  # after placement: it sees the starts the rule takes back
        return out

    def _scale(self, now: float, out: CoreActions) -> None:
        """Ask the scaling rule; take the workers it retires out of their cores."""
        assert self._capacity is not None
        idle = [Idle(w, v, self._since[w]) for w, v in self._of.items()
                if self._cores[v].is_idle(w)]
        running = self.ready_count() + len(self._loads.switching)  # a switch keeps its worker
        grown, taken = len(out.grow), len(out.cancel_start)
        for worker in self._capacity.step(now, running, self._views(now), idle, self._load_s,
                                          out):
            version = self._of[worker]
            if self._cores[version].worker_left(worker):
                del self._of[worker]
                self._since.pop(worker, None)
                self._retired[worker] = version  # until the pool has let it go, it may die
                while len(self._retired) > RETIRED_KEPT:
                    del self._retired[next(iter(self._retired))]
            else:  # cannot happen: it was idle this turn; keep it, nothing was sent
                out.retire.remove(worker)
        for version in out.grow[grown:]:
            self._loads.start(version, now, "add", self._load_s(version))
        for version in out.cancel_start[taken:]:
            self._loads.cancel(version)
        self._joining(now)

    def _joining(self, now: float) -> None:
        """Tell each version's core when its workers on their way are expected up."""
        if self._capacity is None:
            return
        for version, core in self._cores.items():
            core.joining = self._capacity.joining(version, now, self._load_s(version))

    def stalled(self, seconds: float) -> None:
        for core in self._cores.values():
            core.stalled(seconds)

    def next_deadline(self) -> float:
        """The cores' earliest, or placement's next look (or a rollout's timeout) if sooner."""
        cores = min((core.next_deadline() for core in self._cores.values()), default=math.inf)
        rollouts = min(self._rollout_since.values(), default=math.inf) + ROLLOUT_TIMEOUT_S
        scale = math.inf if self._metered is None or self._draining else self._metered.due()
        return min(cores, self._next_check, rollouts, scale)

    # -- placement -----------------------------------------------------------------------
    def _placed(self, out: CoreActions, now: float) -> CoreActions:
        """`out`, with the switches placement and rollouts decide now."""
        if len(self._cores) == 1 and not self._rollout_since:
            self._next_check = math.inf  # nothing to place (a stale one would spin the owner)
            return out
        self._roll_out(now, out)
        workers = [WorkerView(w, v, self._cores[v].is_idle(w), self._since[w])
                   for w, v in self._of.items()]
        views = self._views(now)
        switches = self._placement.decide(now, workers, views)
        for switch in switches:
            self._switch(switch, now, out)
        if switches:  # asked again with what they changed
            workers = [WorkerView(w, v, self._cores[v].is_idle(w), self._since[w])
                       for w, v in self._of.items()]
            views = self._views(now)
        self._next_check = self._placement.next_check(now, workers, views)
        self._forget_empty()
        return out

    def _switch(self, switch: Switch, now: float, out: CoreActions) -> None:
        version = self._of.get(switch.worker)
        if version is None or version == switch.to or self._draining:
            return
        if not self._cores[version].worker_left(switch.worker):
            return
        del self._of[switch.worker]
        self._since.pop(switch.worker, None)
        self._loads.switch(switch.worker, switch.to, now, version)
        self.loads[(switch.to, switch.reason)] += 1
        out.switch.append((switch.worker, switch.to))

    def _roll_out(self, now: float, out: CoreActions) -> None:
        """Move each rolling model's default once its new version is resident on as many
        workers as the old; until then load it, one worker at a time, from the old one's
        idle workers past their residency (never its last). The old one's arrivals were the
        default's: once moved, it is wanted only if requests name it."""
        for name, since in list(self._rollout_since.items()):
            target = f"{name}@{self.catalogue.models[name].default}"
            old = self._effective[name]
            new_up = self._resident(target)
            if new_up >= max(1, self._resident(old)) or now - since >= ROLLOUT_TIMEOUT_S:
                self._effective[name] = target
                del self._rollout_since[name]
                if old != target:
                    self._last_arrival.pop(old, None)
                self._only = self._the_only()
                continue
            if self._loading(target) or self._resident(old) <= 1:
                continue
            stay = self._min_resident(self._load_s(old))
            idle = [w for w in self._cores[old].idle_workers() if now >= self._since[w] + stay]
            if idle:
                self._switch(Switch(idle[0], target, "rollout"), now, out)

    def _views(self, now: float) -> list[VersionView]:
        views: list[VersionView] = []
        catalogue = self.catalogue
        for version, core in self._cores.items():
            demand = core.demand(now)
            name, _ = split_key(version)
            model = catalogue.models.get(name)
            views.append(VersionView(
                version=version, model=name, queued=demand.queued, paid=demand.paid,
                oldest=demand.oldest, oldest_deadline=demand.oldest_deadline,
                rate=demand.rate, last_arrival=self._arrival(version, now),
                loading=self._loading(version), load_s=self._load_s(version),
                min_workers=0 if model is None else model.min_workers,
                max_workers=None if model is None else model.max_workers,
                idle_unload_s=math.inf if model is None else model.idle_unload_s,
                retired=not self._live(version),
                wanted=self._wanted(version, now),
                resident=core.ready_count(),
                load_started=self._loads.began(version),
            ))
        return views

    def _arrival(self, version: str, now: float) -> float:
        """Its last arrival as placement reads it: now, while a refusal's Retry-After runs
        and the version is still cold (the refused request asks for its load)."""
        promised = self._promised.get(version)
        if promised is not None and (promised <= now or self._resident(version)
                                     or self._loading(version)):
            del self._promised[version]
            promised = None
        return now if promised is not None else self._last_arrival.get(version, -math.inf)

    def _forget_empty(self) -> None:
        """Drop the core of a retired version once nothing is left in it."""
        for version in [v for v, c in self._cores.items()
                        if not self._live(v) and c.ready_count() == 0 and c.finished_empty()
                        and not self._loading(v)]:
            del self._cores[version]
            self._counted()

    # -- reading -------------------------------------------------------------------------
    def _live(self, version: str) -> bool:
        return version in self._live_versions

    def _wanted(self, version: str, now: float) -> bool:
        """Whether requests go to `version`: its model's serving default, a weighted
        version, the target of a rollout, or one named by a request within its model's
        idle_unload_s."""
        name, short = split_key(version)
        model = self.catalogue.models.get(name)
        if model is None or not self._live(version):
            return False
        return (self._effective.get(name) == version or model.weights.get(short, 0) > 0
                or (name in self._rollout_since and model.default == short)
                or self._last_arrival.get(version, -math.inf) > now - model.idle_unload_s)

    def _resident(self, version: str) -> int:
        core = self._cores.get(version)
        return 0 if core is None else core.ready_count()

    def _loading(self, version: str) -> int:
        return self._loads.under_way(version)

    def _load_s(self, version: str) -> float:
        measured = self._loads.measured.get(version)
        if measured is not None:
            return measured
        name, short = split_key(version)
        model = self.catalogue.models.get(name)
        hint = None if model is None or short not in model.versions else \
            model.versions[short].load_s
        return DEFAULT_LOAD_S if hint is None else hint

    def _eta(self, version: str, now: float) -> float:
        """Seconds until a worker of `version` should be ready: what is left of its load
        under way, else a load once a batch and some worker's residency let it leave (or
        a worker added for it, sooner)."""
        view = next(v for v in self._views(now) if v.version == version)
        joining = self._cores[version].joining
        added = max(0.0, joining[0] - now) if joining else math.inf
        eta = min(load_eta(view, now), self._load_s(version) + self._longest_batch())
        if view.loading:
            return min(eta, added)
        leave = min((self._since[w] + self._min_resident(self._load_s(v)) if self._live(v)
                     else now for w, v in self._of.items()), default=now)
        return min(max(eta, leave - now + self._load_s(version)), added)

    def _longest_batch(self) -> float:
        return max((core.batch_latency() for core in self._cores.values()), default=0.1)

    def _new_core(self, version: str) -> DispatchCore:
        core = self._make_core(version, self.catalogue)
        core.version = version
        if self._capacity is not None:
            core.count_offered()
        if self._draining:
            core.drain()
        return core

    def versions(self, now: float) -> list[VersionState]:
        out = []
        for version, core in self._cores.items():
            resident, loading = core.ready_count(), self._loading(version)
            state = ("retired" if not self._live(version) else "resident" if resident
                     else "loading" if loading else "cold")
            out.append(VersionState(version, state, resident, loading,
                                    core.demand(now).queued, self._loads.measured.get(version)))
        return out

    def initial(self, workers: int) -> list[str]:
        """The version each of `workers` slots starts with (`initial_placement` over each
        model's default, in catalogue order)."""
        views = [v for v in self._views(0.0) if v.version in set(self._effective.values())]
        order = list(self._effective.values())
        views.sort(key=lambda v: order.index(v.version))
        return initial_placement(workers, views)

    def serving_default(self, model: str) -> str | None:
        """The version of `model` a request without @version gets now (mid-rollout, the
        old default)."""
        version = self._effective.get(model)
        return None if version is None else split_key(version)[1]

    def version_of(self, worker: WorkerId) -> str | None:
        return self._of.get(worker)

    def finished(self) -> bool:
        return all(core.finished() for core in self._cores.values())

    def abandon(self) -> CoreActions:
        out = CoreActions()
        for core in self._cores.values():
            out.extend(core.abandon())
        return out

    def ready_count(self) -> int:
        return sum(core.ready_count() for core in self._cores.values())

    def starting(self, versions: Sequence[str], now: float) -> None:
        """The pool starts with workers holding `versions`: starts the scaling rule counts
        until they are up (the first start-ups are measured)."""
        for version in versions:
            self._loads.start(version, now, "add", self._load_s(version))
        self._joining(now)

    def capacity(self, now: float) -> CapacityGauges | None:
        """The pool's size as the rule sees it (None: a fixed pool)."""
        running = self.ready_count()
        return None if self._capacity is None else self._capacity.gauges(now, running)

    def first_version(self) -> str:
        """The version a request without `model` gets now, unless weights choose."""
        return self._effective[self.catalogue.first.name]

    def expected_wait(self, tier: Tier, now: float) -> float:
        """The longest estimate over the versions that have workers (up, or on their way):
        the rate limits tighten on the busiest."""
        waits = [core.expected_wait(tier, now) for core in self._cores.values()
                 if core.ready_count() or core.joining]
        return max(waits, default=math.inf)

    @property
    def draining(self) -> bool:
        return self._draining

    def grouped(self) -> set[int]:
        return set().union(*(core.grouped() for core in self._cores.values()))

    def statistics(self, now: float) -> CoreStatistics:
        stats = [core.statistics(now) for core in self._cores.values()]
        return stats[0] if len(stats) == 1 else CoreStatistics.merged(stats)

    def statistics_by_version(self, now: float) -> dict[str, CoreStatistics]:
        return {version: core.statistics(now) for version, core in self._cores.items()}


__all__ = ["ROLLOUT_TIMEOUT_S", "ModelCores", "VersionState"]
