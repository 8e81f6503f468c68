"""`driver.World` with a pool whose size follows the load: `ModelCores` built with a
`Capacity`, the real owner carrying out `grow`, `retire` and `cancel_start` on the contract
pool (`failover.sim`: it adds a slot loading that version for that start, retires only an
idle live incarnation, takes back only a start no worker is up for; a load that fails is
reported with the same start and retried after the pool's backoff, a worker that dies up is
restarted under a new start after it), the world checking each as it goes.

What the world expects the cores to count, start by start (each event names its start):
each start the pool carries out (added or restarted slot), with its ETA as the ledger's
contract says: asked at t, up at t + the version's load time; a failure moves it to now +
backoff + load time. `check_capacity` holds the cores to that: each version's
`DispatchCore.joining` lists exactly those ETAs not overdue by more than a start-up,
sorted; every start slot is counted once; the pool stays within its bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from batcher import BatchgateError, Item, RateMeter, Tier, VersionKey
from batcher.shared import Backoff
from failover import CoreSettings, build_core
from failover.core import DispatchCore
from failover.errors import ModelLoading, UnknownModel
from failover.fleet import Decision, Scaler, ScalerSettings
from failover.fleet.capacity import STEP_S, Capacity
from failover.fleet.catalogue import Catalogue
from failover.fleet.cores import ModelCores
from failover.fleet.failing import FAILED_LOADS, HOLD_S
from failover.fleet.ledger import LATE_SHARE
from gpu_pool import Origin, Run, StartId, WorkerId
from tests.failover.fleet.driver import (
    LATENCY,
    MAX_BATCH,
    SETTINGS,
    World,
    learned,
)

CAPACITY = MAX_BATCH / LATENCY  # items/s one worker drains at full batches
SCALED = replace(SETTINGS, queue_capacity=400)  # a queue that a step of load can fill
TOLERANCE = 1e-9
BACKOFF = Backoff(first=0.5, cap=4.0)  # the pool's: a start that dies loading waits it out


def scaling(min_workers: int = 1, max_workers: int = 4, **kw: float) -> ScalerSettings:
    """The rule over the driver's workers, with windows and delays short enough for a test
    to walk through them."""
    values: dict[str, float] = {
        "short_window_s": 1.0, "long_window_s": 5.0, "scale_down_delay_s": 10.0,
        "down_step_s": 2.0, **kw}
    return ScalerSettings(min_workers, max_workers, **values)


def backoff(failures: int) -> float:
    """The pool's retry delay after `failures` failed attempts (its documented contract)."""
    return BACKOFF.delay(failures)


@dataclass(frozen=True, slots=True)
class Decided:
    """One decision of the rule and what it was asked with."""

    now: float
    running: int
    queued: int
    start_s: float
    decision: Decision


class Recording(Scaler):
    """The rule as it is, remembering each decision (what the glue asked, what it said)."""

    def __init__(self, settings: ScalerSettings) -> None:
        super().__init__(settings)
        self.decided: list[Decided] = []

    def decide(self, now: float, running: int, starting: int, queued: int, start_s: float,
               capacity: float) -> Decision:
        decision = super().decide(now, running, starting, queued, start_s, capacity)
        self.decided.append(Decided(now, running, queued, start_s, decision))
        return decision


@dataclass
class Expected:
    """A start the cores should count, as the rule's contract places it."""

    version: str
    since: float
    eta: float
    failures: int = 0


@dataclass(repr=False)
class ScaledWorld(World):
    """`ModelCores` with a `Capacity` over `slots_n` workers to start with."""

    backoff: Backoff = BACKOFF  # the pool's
    scaling: ScalerSettings = field(default_factory=scaling)
    core_settings: CoreSettings = SCALED
    retired: set[WorkerId] = field(default_factory=set)
    grown: list[tuple[float, str]] = field(default_factory=list)
    retirements: list[tuple[float, WorkerId, str]] = field(default_factory=list)
    cancels: list[tuple[float, str]] = field(default_factory=list)  # (when, its version)
    refusals: list[tuple[float, Tier, BatchgateError]] = field(default_factory=list)
    made: dict[str, DispatchCore] = field(default_factory=dict)  # each version's newest core
    load_deaths: dict[str, int] = field(default_factory=dict)  # loads dead in a row, by version
    failing_since: dict[str, float] = field(default_factory=dict)
    paid_rates: dict[str, RateMeter] = field(default_factory=dict)  # admitted paid, by version
    offered: dict[tuple[str, Tier], RateMeter] = field(default_factory=dict)  # met the batcher

    def __post_init__(self) -> None:
        self.scaler = Recording(self.scaling)
        self.capacity = Capacity(self.scaler)
        super().__post_init__()

    def build_cores(self) -> ModelCores:
        return ModelCores(self.catalogue, self.new_core, self.spy, self.capacity, self.backoff)

    def new_core(self, version: str, catalogue: Catalogue) -> DispatchCore:
        core = build_core(self.core_settings, times=learned(), version=version)
        self.made[version] = core
        return core

    def core(self, version: str) -> DispatchCore:
        """The dispatch core serving `version` now."""
        assert version in self.cores.statistics_by_version(self.now), f"{version}: no core"
        return self.made[version]

    # -- the books, as the pool's events come ------------------------------------------------
    def on_ready(self, worker: WorkerId, start: StartId, version: str) -> None:
        super().on_ready(worker, start, version)
        self.expected.pop(start, None)
        self.load_deaths.pop(version, None)
        self.failing_since.pop(version, None)

    def on_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        """A start that failed loading moves out by the backoff; a worker up that died is
        restarted, a start the rule counts. FAILED_LOADS loads of a version dead in a row
        make it failing for HOLD_S (`failover.fleet.failing`)."""
        super().on_died(worker, version, restart)
        if worker not in self.came_up:
            self.load_deaths[version] = died = self.load_deaths.get(version, 0) + 1
            if died >= FAILED_LOADS and not self.failing(version):
                self.failing_since[version] = self.now
        if restart is None:
            return
        mine = self.expected.get(restart)
        if mine is not None:
            mine.failures += 1
            mine.eta = self.now + self.backoff.delay(mine.failures) + self.load_s(version)
        elif restart == StartId(Origin.RESTART, worker):
            self.expected[restart] = Expected(version, self.now,
                                              self.now + self.load_s(version))

    # -- checking the owner's actions ----------------------------------------------------------
    def sent(self, worker: WorkerId, run: Run, version: str, group: bool) -> None:
        assert worker not in self.retired, f"a batch went to retired worker {worker}"
        super().sent(worker, run, version, group)

    def switched(self, worker: WorkerId, to: str) -> None:
        assert worker not in self.retired, f"retired worker {worker} was switched"
        super().switched(worker, to)

    def add(self, version: str, start: StartId) -> None:
        """`Pool.add`: a new slot loading `version` for `start`."""
        assert version in self.cores.catalogue.versions(), f"grew {version}, not live"
        assert start not in self.expected, f"start {start} asked for twice"
        self.grown.append((self.now, version))
        self.expected[start] = Expected(version, self.now, self.now + self.load_s(version))

    def added(self, version: str) -> None:
        assert len(self.slots) <= self.scaling.max_workers, (
            f"grew to {len(self.slots)} slots, max {self.scaling.max_workers}")
        model = self.cores.catalogue.models[VersionKey.parse(version).model]
        on = self.on_model(model.name)
        assert model.max_workers is None or on <= model.max_workers, (
            f"grew {model.name} to {on} workers, its max_workers {model.max_workers}")

    def retiring(self, worker: WorkerId) -> str:
        """`Pool.retire`: only its slot's idle live incarnation leaves; a dead one stays
        (its death is reported and its slot restarts)."""
        slot = self.slot_of(worker)
        assert slot is not None, f"retired {worker}, not a slot's current incarnation"
        assert slot.state != "loading", f"retired {worker} while it loads"
        assert worker not in self.flights, f"retired {worker} with a batch in flight"
        self.retired.add(worker)
        self.retirements.append((self.now, worker, slot.version))
        return slot.version

    def retired_from(self, worker: WorkerId, version: str) -> None:
        if self.slot_of(worker) is None:  # it left
            self.check_floor(version, "retired")

    def cancelling(self, start: StartId) -> None:
        known = self.expected.get(start)
        slot = next((s for s in self.slots if s.start == start), None)
        assert known is not None or (start in self.failed_loads and slot is not None), (
            f"took back {start}, which the pool never started")
        self.cancels.append((self.now, known.version if known else str(slot.version)))

    def cancelled(self, start: StartId, version: str) -> None:
        """`Pool.cancel_start` took the slot loading `start` out of the pool: a slot
        whose loads died, or of a version gone, is replaced in the same turn (its floor is
        the turn's check, `check_capacity`)."""
        self.expected.pop(start, None)
        if start in self.failed_loads or version not in self.cores.catalogue.versions():
            return
        self.check_floor(version, "took back a start of")

    # -- the door ------------------------------------------------------------------------
    def submit(self, model: str | None, n: int = 1, tier: Tier = Tier.PAID,
               timeout: float = 5.0) -> list[Item] | BatchgateError:
        """As the driver's, noting refusals, and metering what the version's batcher was
        offered and admitted (paid)."""
        got = super().submit(model, n, tier, timeout)
        if isinstance(got, BatchgateError):
            self.refusals.append((self.now, tier, got))
        if not isinstance(got, ModelLoading | UnknownModel):
            version = self.cores.resolve(model, None)
            self.offered.setdefault((version, tier), RateMeter()).add(n, self.now)
        if isinstance(got, list) and tier is Tier.PAID:
            meter = self.paid_rates.setdefault(got[0].version, RateMeter())
            meter.add(n, self.now, sum(len(i.text) for i in got))
        return got

    def offer(self, until: float, free: float = 0.0, paid: float = 0.0,
              model: str | None = None, timeout: float = 5.0) -> None:
        """One-item requests at `free` and `paid` per second, evenly spaced (the first half
        a gap in), on a healthy pool, until `until`; the capacity checked after each."""
        start, rates = self.now, {Tier.PAID: paid, Tier.FREE: free}
        sent = dict.fromkeys(Tier, 0)

        def due(tier: Tier) -> float:
            rate = rates[tier]
            return start + (sent[tier] + 0.5) / rate if rate > 0 else math.inf

        while (at := min(due(t) for t in Tier)) <= until:
            self.run(at)
            for tier in Tier:
                if due(tier) <= self.now + TOLERANCE:
                    sent[tier] += 1
                    self.submit(model, 1, tier, timeout)
            self.check_capacity()
        self.run(until)

    # -- reading -------------------------------------------------------------------------
    def failing(self, version: str) -> bool:
        since = self.failing_since.get(version)
        return since is not None and self.now < since + HOLD_S

    def on_model(self, model: str) -> int:
        """Slots holding or loading a version of `model`."""
        return sum(VersionKey.parse(s.version).model == model for s in self.slots)

    def starting(self, version: str) -> int:
        return sum(s.counted
                   and s.version == version for s in self.slots)

    # -- checks --------------------------------------------------------------------------
    def check_floor(self, version: str, what: str) -> None:
        """After a slot left: the pool keeps its minimum, the model its min_workers."""
        assert len(self.slots) >= self.scaling.min_workers, (
            f"{what} a worker: {len(self.slots)} slots, min {self.scaling.min_workers}")
        model = self.cores.catalogue.models.get(VersionKey.parse(version).model)
        if model is not None and version in self.cores.catalogue.versions():
            on = self.on_model(model.name)
            assert on >= model.min_workers, (
                f"{what} {version}: {model.name} on {on}, min_workers {model.min_workers}")

    def check_capacity(self) -> None:
        """The pool within its bounds; every start slot counted once by the rule; each
        core's `joining` exactly the starts of its version still expected, sorted."""
        s = self.scaling
        assert len(self.slots) <= s.max_workers, f"{len(self.slots)} slots > {s.max_workers}"
        assert len(self.slots) >= s.min_workers, f"{len(self.slots)} slots < {s.min_workers}"
        counted = [st.version for st in self.cores.starts()]
        assert {st.id for st in self.cores.starts()} == set(self.expected), (
            f"the ledger counts {[st.id for st in self.cores.starts()]}, the pool carries "
            f"out {list(self.expected)}")
        for version in {sl.version for sl in self.slots} | set(counted):
            mine = sum(e.version == version for e in self.expected.values())
            assert self.starting(version) == mine == counted.count(version), (
                f"{version}: {self.starting(version)} start slots loading, "
                f"{mine} expected, {counted.count(version)} counted by the rule")
        for version in self.cores.statistics_by_version(self.now):
            self.check_joining(version)

    def check_joining(self, version: str) -> None:
        """The core's `joining` is the expected ETAs of `version` not overdue by more than a
        start-up, sorted. It is refreshed on every event and each STEP_S: one that went
        overdue since may still be there (the oldest, then)."""
        got = list(self.made[version].joining)
        if self.failing(version):  # its starts bring no capacity anyone can count on
            assert got == [], f"{version}: loads keep failing, yet joining {got}"
            return
        start_s = self.load_s(version)
        etas = sorted(e.eta for e in self.expected.values() if e.version == version)
        due = [t for t in etas if self.now <= t + start_s]
        stale = [t for t in etas if t + start_s < self.now <= t + start_s + STEP_S]
        assert got == sorted(got), f"{version}: joining not sorted {got}"
        want = (stale + due)[-len(got):] if got else []
        assert len(due) <= len(got) <= len(stale) + len(due), (
            f"{version}: joining {got}, expected {due} (maybe {stale} too) at {self.now}")
        if all(t >= self.now for t in want):  # none late: each exactly at its ETA
            assert all(math.isclose(a, b, abs_tol=TOLERANCE)
                       for a, b in zip(got, want, strict=True)), (
                f"{version}: joining {got}, expected {want} at {self.now}")
        else:  # a late one counts a share of a start-up from the refresh: never before its ETA
            latest = max([*want, self.now + LATE_SHARE * start_s]) + TOLERANCE
            assert all(min(want) - TOLERANCE <= g <= latest for g in got), (
                f"{version}: joining {got}, expected within {want} .. {latest} at {self.now}")

__all__ = ["CAPACITY", "SCALED", "Decided", "Expected", "Recording",
           "ScaledWorld", "backoff", "scaling"]
