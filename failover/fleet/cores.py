"""Several versions on one pool: the composite core that routes each event to one dispatch
core per live version, so a batch holds one version's items and runs on a worker holding it,
and what a core guarantees (exactly-once settlement, tier order) holds per version.

Its parts: `Versions` (which version a request gets, rollouts), `Residency` (which worker
holds what, the ledger of starts), `Failing` (versions whose loads keep failing), `Routing`
(which core a request goes to, cold refusals), `Placing` (placement's switches), `Sizing`
(the scaling rule) and the guard stages (`failover.fleet.stages`: an input of a guarded
model moves from core to core as each stage's batch is answered, in that turn). The
one-model case costs a dictionary lookup per event: placement runs only while the catalogue
holds more than one live version or a version is leaving, and stages only while an input
is on its way through them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from batcher import Item, Tier, VersionKey
from batcher.shared import Backoff
from failover import CoreActions, CoreStatistics, DispatchCore, ModelFailing, Refusal
from failover.fleet.capacity import Capacity, CapacityGauges
from failover.fleet.catalogue import Catalogue
from failover.fleet.failing import Failing
from failover.fleet.ledger import Kind, Ledger, Start
from failover.fleet.placement import Placement
from failover.fleet.placing import Placing, VersionState
from failover.fleet.residency import Residency
from failover.fleet.routing import Routing
from failover.fleet.sizing import Sizing
from failover.fleet.staging import Stages
from failover.fleet.versions import Versions
from gpu_pool import Err, Ok, StartId, StartKind, WorkerId


class ModelCores:
    """Implements `failover.Core` over one dispatch core per version."""

    def __init__(
        self, catalogue: Catalogue, make_core: Callable[[VersionKey, Catalogue], DispatchCore],
        placement: Placement, capacity: Capacity | None = None,
        backoff: Backoff | None = None, most: int | None = None,
        how: Callable[[VersionKey], StartKind] | None = None,
    ) -> None:
        """`make_core`: a new dispatch core serving a version of the catalogue. `capacity`:
        the rule of the pool's size (None: none). `backoff`: the pool's, which a start
        that dies loading waits out. `most`: the pool's largest size, against which a
        request for a version no placement can serve is refused (None: never). `how`: the
        kind of start the pool would make of a version now, whose measured time placement,
        the rule and admission read (None: a spawn)."""
        self._make_core = make_core
        self._counts_offered = capacity is not None
        self._cores: dict[VersionKey, DispatchCore] = {}
        self._versions = Versions(catalogue)
        self._residency = Residency(Ledger(backoff), self._versions.load_hint, how)
        self._failing = Failing()
        self._placing = Placing(placement, self._versions, self._residency, self._cores,
                                self._failing)
        self._sizing = Sizing(capacity, self._residency, self._placing, self._cores,
                              self._failing)
        self._routing = Routing(self._versions, self._residency, self._placing, self._cores,
                                self._failing, most)
        self._stages = Stages(self._versions, self._routing, self._cores)
        self._draining = False
        self._sole: DispatchCore | None = None
        self._freed: list[VersionKey] = []  # versions gone from the catalogue, their starts not
        self.set_catalogue(catalogue, 0.0)  # yet replaced (done in the next turn's actions)

    @property
    def catalogue(self) -> Catalogue:
        return self._versions.catalogue

    @property
    def loads(self) -> Counter[tuple[VersionKey, str]]:
        """(version, reason) -> switches made for it (metrics read it)."""
        return self._placing.loads

    def set_catalogue(self, catalogue: Catalogue, now: float) -> None:
        """Serve `catalogue` from now on (in the owner's turn). Versions it no longer holds
        live are retired: their queues finish and their workers leave."""
        for version in catalogue.versions():  # in catalogue order: placement breaks ties by it
            if version not in self._cores:
                self._cores[version] = self._new_core(version)
        self._versions.change(catalogue, now, frozenset(self._cores))
        self._stages.set_catalogue(catalogue)
        self._counted()
        self._freed = [v for v in self._cores if not self._versions.live(v)]

    def _free_left(self, out: CoreActions, now: float) -> None:
        """The versions that left the catalogue: what was loading them loads what placement
        wants instead, at once (a load that keeps failing would never end by itself)."""
        left, self._freed = self._freed, []
        for version in left:
            self._failing.forget(version)
            self._replace_starts(version, now, out, adds_too=True)

    def _counted(self) -> None:
        """Note whether one core serves everything (the one-model case takes it)."""
        alone = len(self._cores) == 1 and not self._stages.pipelines
        self._sole = next(iter(self._cores.values())) if alone else None

    def resolve(self, model: str | None, sticky: str | None) -> VersionKey:
        return self._versions.resolve(model, sticky)

    # -- the front door ------------------------------------------------------------------
    def admit(self, items: list[Item], deadline_in: float, now: float) -> bool:
        if self._sizing.metered is not None:  # offered, admitted or not: demand
            self._sizing.arrived(len(items), now, items[0].tier is Tier.PAID)
        sole, version = self._sole, items[0].version
        if sole is not None and (version == sole.version or not version):
            return sole.admit(items, deadline_in, now)
        pipeline = self._stages.guards(items) if self._stages.pipelines else None
        if pipeline is not None:
            return self._stages.enter(items, pipeline, now, self._draining)
        return self._routing.admit(items, deadline_in, now, self._draining)

    def admit_all(
        self, requests: Sequence[tuple[list[Item], float]], now: float
    ) -> tuple[list[Refusal | None], bool]:
        if self._sizing.metered is not None:
            for items, _ in requests:
                self._sizing.arrived(len(items), now, items[0].tier is Tier.PAID)
        sole = self._sole
        if sole is not None and all(r[0][0].version in (sole.version, None) for r in requests):
            return sole.admit_all(requests, now)
        if self._stages.pipelines:
            return self._stages.admit_all(requests, now, self._draining)
        return self._routing.admit_all(requests, now, self._draining)

    def judge(self, version: VersionKey | None, tier: Tier, items: int, chars: int,
              deadline_in: float, now: float) -> int:
        """`DispatchCore.judge` by the core of `version` (None: the first). A version with
        no worker ready is not judged here: its inputs meet the cold version's refusals
        (`Routing`) as they are admitted."""
        core = self._cores.get(version or self.first_version())
        if core is None or core.ready_count() == 0:
            return 0
        return core.judge(version, tier, items, chars, deadline_in, now)

    def cancel(self, item: Item) -> bool:
        turn = False
        for held in self._stages.cancel(item) if item.route is not None else (item,):
            core = self._cores.get(held.version or self.first_version())
            turn = (core is not None and core.cancel(held)) or turn
        return turn

    def _staged_out(self, out: CoreActions, now: float) -> CoreActions:
        """`out`, each stage item's result moving its input on (`Stages.staged`)."""
        stages = self._stages
        return stages.staged(out, now, self._draining) if stages.routes or stages.said else out

    def drain(self) -> None:
        self._draining = True
        for core in self._cores.values():
            core.drain()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The accounts' new fair-share weights, for every version's queues (the cores
        made later take theirs from `make_core`)."""
        for core in self._cores.values():
            core.set_weights(weights)

    # -- the pool's events ---------------------------------------------------------------
    def worker_ready(self, worker: WorkerId, now: float, start: StartId | None = None,
                     version: VersionKey | None = None,
                     how: StartKind = StartKind.SPAWN) -> CoreActions:
        """Incarnation `worker` holds `version` (None: the first model's), loaded for
        `start`, come up `how`."""
        version = version or self.first_version()
        out = CoreActions()
        ended = self._residency.up(worker, start, version, now, how) if start is not None \
            else None
        if ended is not None and ended.kind.measured:
            out.loaded.append((ended.version, now - ended.since))
        self._failing.loaded(version)
        self._versions.recovered(version, now)
        core = self._cores.get(version)
        if core is None:  # gone from the catalogue while it loaded: it leaves when idle
            core = self._cores[version] = self._new_core(version)
            self._counted()
        self._sizing.tell_coming(now)
        out.extend(core.worker_ready(worker, now))
        return self._staged_out(out, now)

    def reply(self, worker: WorkerId, reply: Ok | Err, now: float, at: float) -> CoreActions:
        """While paid work waits for a version no worker holds, a worker of a version with
        no paid work queued is held idle for placement's look before its next batch: paid
        work of any model outranks free work of another."""
        version = self._residency.version_of(worker)
        if version is None:
            return CoreActions()
        core = self._cores[version]
        if self._sole is None and self._paid_waits_cold(core, now):
            out = self._placed(core.reply(worker, reply, now, at, hold=True), now)
            out.extend(core.pump(now))  # switched away, or back to its own queue
            return self._staged_out(out, now)
        # Placement looks once the turn's batches and answers are out (`place`).
        return self._staged_out(core.reply(worker, reply, now, at), now)

    def _paid_waits_cold(self, mine: DispatchCore, now: float) -> bool:
        if mine.demand(now).paid:
            return False
        return any(core is not mine and not core.ready_count()
                   and not self._residency.loading(version) and core.demand(now).paid
                   for version, core in self._cores.items())

    def worker_died(self, worker: WorkerId, now: float, version: VersionKey | None = None,
                    restart: StartId | None = None) -> CoreActions:
        """Its slot carries out `restart`: a load under way, seen by placement and the rule
        (no second worker is sent to fill the gap)."""
        serving = self._residency.version_of(worker)
        version = version or self.first_version()
        known = self._residency.died(worker, version, restart, now)
        out = CoreActions()
        if not known and self._failing.load_died(version, now):
            self._gave_up(version, now, out)
        self._sizing.tell_coming(now)
        if serving is not None:
            out.extend(self._cores[serving].worker_died(worker, now))
        return self._staged_out(out, now)

    # -- versions whose loads keep failing ---------------------------------------------------
    def _gave_up(self, version: VersionKey, now: float, out: CoreActions) -> None:
        """`version`'s loads keep failing: a rollout to it ends, the slots loading it load
        what placement wants instead, and with no worker up its queue is answered now."""
        self._versions.abandon(version)
        self._replace_starts(version, now, out, adds_too=False)
        core = self._cores.get(version)
        if core is not None and not core.ready_count():
            wait = self._failing.until(version) - now
            out.extend(core.refuse_queued(ModelFailing(
                f"{version}'s loads keep failing", retry_after=wait)))

    def _replace_starts(self, version: VersionKey, now: float, out: CoreActions,
                        adds_too: bool) -> None:
        """Each start of `version` whose worker died loading is taken back and a slot
        started in its place with the version placement wants (none: it keeps trying). A
        start the rule added is replaced only when `adds_too` (else it counts as no capacity
        coming and keeps trying)."""
        ledger, residency = self._residency.ledger, self._residency
        for start in ledger.of(version):
            if start.kind is Kind.ADD and not adds_too:
                continue
            if start.kind is not Kind.ADD and not start.failures:
                continue  # its first load, in a slot the pool may not give back (a switch
                # under way): it comes up, and leaves if unwanted
            to = self._placing.replacement(now)
            if to is None and start.kind is not Kind.ADD:
                return  # nothing else to hold: the slot keeps trying
            ledger.cancel(start.id)
            out.cancel_start.append(start.id)
            if to is not None:  # the pool's size is the rule's to change, not this
                out.grow.append((to, ledger.ask(Kind.ADD, to, now, residency.load_s(to))))

    # -- time ----------------------------------------------------------------------------
    def poll(self, now: float) -> CoreActions:
        out = CoreActions()
        if self._freed:
            self._free_left(out, now)
        for core in self._cores.values():
            out.extend(core.poll(now))
        if self._stages.routes:
            self._stages.expire(now, out)
        return self._staged_out(out, now)

    def place(self, now: float) -> CoreActions:
        """Placement's and the scaling rule's look, last in each turn: both act on idle
        workers and on rates (loads of seconds), so the turn's batches go out and its
        answers are written first (in the guard benchmark placement was half a turn's CPU)."""
        out = self._placed(CoreActions(), now)
        if not self._draining and now >= self._sizing.due():  # after placement: it sees
            self._sizing.step(now, self.ready_count(), out)  # the starts the rule takes back
        return self._staged_out(out, now)

    def _placed(self, out: CoreActions, now: float) -> CoreActions:
        """`out`, with the switches placement and rollouts decide now (none for one core)."""
        if len(self._cores) == 1 and not self._versions.rolling_out:
            self._placing.next_check = math.inf  # a stale one would spin the owner
            return out
        self._placing.place(out, now, self._draining)
        self._forget_empty()
        return out

    def stalled(self, seconds: float) -> None:
        for core in self._cores.values():
            core.stalled(seconds)

    def next_deadline(self) -> float:
        """The cores' earliest, or placement's next look (or a rollout's timeout) if sooner."""
        if self._freed:
            return -math.inf  # a turn at once: the slots of versions gone are given back
        cores = min((core.next_deadline() for core in self._cores.values()), default=math.inf)
        scale = math.inf if self._draining else self._sizing.due()
        return min(cores, self._placing.next_check, self._versions.next_rollout_deadline(),
                   scale, self._stages.next_deadline())

    def _forget_empty(self) -> None:
        """Drop the core of a retired version once nothing is left in it."""
        for v in [v for v, c in self._cores.items() if not self._versions.live(v)
                  and not c.ready_count() and c.finished_empty()
                  and not self._residency.loading(v)]:
            del self._cores[v]
            self._counted()

    def _new_core(self, version: VersionKey) -> DispatchCore:
        core = self._make_core(version, self.catalogue)
        self._stages.pace(version, core)
        if self._counts_offered:
            core.count_offered()
        if self._draining:
            core.drain()
        return core

    # -- start-up --------------------------------------------------------------------------
    def initial(self, workers: int) -> list[VersionKey]:
        """The version each of `workers` slots starts with (`Placing.initial`)."""
        return self._placing.initial(workers)

    def starting(self, versions: Sequence[VersionKey], now: float) -> None:
        """The pool starts a slot holding each of `versions`, in order: its first starts."""
        for slot, version in enumerate(versions):
            self._residency.ledger.first(slot, version, now, self._residency.load_s(version))
        self._sizing.tell_coming(now)

    # -- reading -------------------------------------------------------------------------
    def versions(self, now: float) -> list[VersionState]:
        return self._placing.states(now)

    def abandoned(self) -> dict[str, VersionKey]:
        """Model -> the new default whose rollout was given up (its loads keep failing)."""
        return dict(self._versions.abandoned)

    def serving_default(self, model: str) -> str | None:
        return self._versions.serving_default(model)

    def first_version(self) -> VersionKey:
        return self._versions.first_version()

    def finished(self) -> bool:
        return all(core.finished() for core in self._cores.values())

    def abandon(self) -> CoreActions:
        out = CoreActions()
        for core in self._cores.values():
            out.extend(core.abandon())
        return self._staged_out(out, 0.0)  # errors all: each input answered with its own

    def ready_count(self) -> int:
        return sum(core.ready_count() for core in self._cores.values())

    def starts(self) -> list[Start]:
        """The starts under way that add a worker, soonest expected first (the ledger's)."""
        return sorted(self._residency.ledger.adding(), key=lambda s: s.eta)

    def capacity(self, now: float) -> CapacityGauges | None:
        """The pool's size as the rule sees it (None: a fixed pool)."""
        return self._sizing.gauges(now, self.ready_count())

    def expected_wait(self, tier: Tier, now: float) -> float:
        """The longest over the versions with workers up or coming (limits tighten on it)."""
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

    def statistics_by_version(self, now: float) -> dict[VersionKey, CoreStatistics]:
        return {version: core.statistics(now) for version, core in self._cores.items()}


__all__ = ["ModelCores", "VersionState"]
