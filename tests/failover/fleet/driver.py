"""A world around `ModelCores` in virtual time, on the simulator: the real `CoreOwner`
drives the cores and a `DirectedPool` (the contract pool, `failover.sim`), the clock moves
only as the test says (`Steps`), and waiters give up at their deadlines as the door's do.

The test states the events: requests, cancellations, a worker's answer now (ok, failed,
short), a death now (heard by the pool now or later, so the cores may meanwhile send the
worker a batch or decide to switch it), a load ending or failing now, time passing with
the pool holding what its workers finish (`advance`) or running healthy, each batch
answered LATENCY after it was sent and each load done in its version's hint (`run`; a load
with none, in LATENCY).

Between the owner and the pool the world checks each action as the owner carries it out
(`Checked`), and the contract pool raises on a send the seam forbids, so a test says when
the cores broke a rule: a batch holds one version and goes to a worker holding it, in tier
and arrival order; a worker is killed only with a batch, switched only idle, live and off
a version it held its minimum residency, to a live version not already loading. Every
output names the version of the worker that ran it, so a batch on the wrong version shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from batcher import (
    BatchgateError,
    FlushPolicy,
    Item,
    ItemId,
    LoopClock,
    Tier,
    VersionKey,
)
from batcher.shared import Backoff
from failover import (
    BatchTimes,
    CoreOwner,
    CoreSettings,
    HangSettings,
    build_core,
)
from failover.core import DispatchCore, Refusal
from failover.fleet.catalogue import Catalogue
from failover.fleet.cores import ModelCores
from failover.fleet.placement import (
    PlacementSettings,
    SwitchCost,
)
from failover.hang import REFRESH
from failover.sim import DirectedPool, Steps
from gpu_pool import Err, Load, Ok, Run, StartId, WorkerId
from tests.failover.fleet.parts import Checked, Flight, Heard, Slot, Spy, Watched

MAX_BATCH = 4
MAX_WAIT = 0.05
LATENCY = 0.1
HEDGE = 0.35
HANG = 1.0
PLACEMENT = PlacementSettings(min_resident_s=1.0, min_resident_loads=2.0, cold_recent_s=0.5,
                              deadline_slack_s=0.1)
SETTINGS = CoreSettings(budgets={Tier.PAID: 0.6, Tier.FREE: 0.3},
                        policy=FlushPolicy(max_batch=MAX_BATCH, max_wait=MAX_WAIT),
                        queue_capacity=40, initial_latency=LATENCY, max_attempts=3,
                        bisect_budget=6)


def learned() -> BatchTimes:
    """Batch times as if many batches had run: a stalled batch is hedged after HEDGE."""
    times = BatchTimes(HangSettings(hedge_floor=HEDGE, kill_after=HANG))
    for _ in range(REFRESH):
        times.observe(LATENCY, 12)
    return times


def output(version: str, text: str) -> str:
    """What a worker holding `version` answers for `text`."""
    return f"{version}|{text}"


def answer(load: Load, run: Run) -> Ok:
    """The contract workers' answer: each input, named by the version that ran it."""
    return Ok(run.batch_id, tuple(output(load.version, t) for t in run.inputs), LATENCY)


@dataclass(repr=False)
class World:
    """`ModelCores` over `slots_n` workers, started with the cores' initial placement, all
    up at 0 (no start to count). `backoff`: the pool's, which the cores are told."""

    catalogue: Catalogue
    slots_n: int
    backoff: Backoff = field(default_factory=Backoff)
    next_id: int = 0
    items: dict[int, Item] = field(default_factory=dict)
    settled: dict[int, list[str | BaseException]] = field(default_factory=dict)
    queued: dict[int, Item] = field(default_factory=dict)  # admitted, not running, not done
    requests: list[list[Item]] = field(default_factory=list)
    flights: dict[WorkerId, Flight] = field(default_factory=dict)
    switches: list[tuple[float, WorkerId, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.expected: dict[StartId, Any] = {}  # starts the rule counts (a scaled pool)
        self.dead: dict[WorkerId, str] = {}  # incarnations reported dead: the version held
        self.came_up: set[WorkerId] = set()
        self.failed_loads: set[StartId] = set()  # starts whose worker died loading
        self.replacing = 0  # starts taken back whose slot a new start replaces
        self.spy = Spy(SwitchCost(PLACEMENT))
        self.cores = self.build_cores()
        self.spy.cores = self.cores
        self.spy.note()
        self.watched = Watched(self.cores)
        self.steps = Steps()
        initial = self.cores.initial(self.slots_n)
        self.pool = DirectedPool([self.load(v) for v in initial], self.load_time, self.backoff,
                                 answer=answer)
        self.pool.hold()
        self.checked = Checked(self)
        self.owner = CoreOwner(self.watched, self.checked, LoopClock(),  # type: ignore[arg-type]
                               observer=self.checked, loads=self.load)
        self.steps.start(partial(self.pool.run, Heard(self, self.owner)))
        self.steps.call(lambda: [self.pool.load_done(i) for i in range(len(initial))])
        self.steps.start(self.owner.run)  # its first turn reads them all up

    def build_cores(self) -> ModelCores:
        """The cores under test, placing through the spy."""
        return ModelCores(self.catalogue, self.make_core, self.spy, backoff=self.backoff)

    def __repr__(self) -> str:
        return "World"  # items name it as their sink: keep hypothesis's reports short

    @staticmethod
    def make_core(version: VersionKey, catalogue: Catalogue) -> DispatchCore:
        return build_core(SETTINGS, times=learned(), version=version)

    @staticmethod
    def load(version: VersionKey) -> Load:
        return Load(version, "sim", LATENCY)

    def close(self) -> None:
        self.steps.close()

    # -- reading -------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.steps.now

    @property
    def slots(self) -> list[Slot]:
        return [Slot(self, view.index) for view in self.pool.view()]

    @property
    def deaths(self) -> list[WorkerId]:
        """Dead workers the pool has not heard of yet."""
        return self.pool.unheard()

    def slot_of(self, worker: WorkerId) -> Slot | None:
        return next((s for s in self.slots if s.worker == worker), None)

    def up(self, worker: WorkerId) -> bool:
        slot = self.slot_of(worker)
        return slot is not None and slot.state == "up"

    def resident(self, version: str) -> int:
        return sum(s.state == "up" and s.version == version for s in self.slots)

    def answers(self, items: list[Item]) -> list[str | BaseException]:
        return [r for i in items for r in self.settled.get(i.id, [])]

    def unanswered(self) -> list[Item]:
        """Items of requests not cancelled that got no answer."""
        return [i for items in self.requests for i in items
                if not i.cancelled and i.id not in self.settled]

    # -- the sink and the waiters --------------------------------------------------------
    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.settled.setdefault(item.id, []).append(result)
        self.queued.pop(item.id, None)

    def new_items(self, version: str, tier: Tier, n: int, timeout: float) -> list[Item]:
        base, self.next_id = self.next_id, self.next_id + n
        key = VersionKey.parse(version)
        items = [Item(ItemId(base + k), f"r:{base + k}", tier, self.now, self.now + timeout,
                      self, k, version=key) for k in range(n)]
        self.items.update((i.id, i) for i in items)
        return items

    def _admitted(self, items: list[Item]) -> None:
        """Queued: its waiter gives up at its deadline, as the door's does."""
        self.requests.append(items)
        self.queued.update((i.id, i) for i in items)
        self.steps.loop.call_at(items[0].deadline, self._give_up, items)

    def _give_up(self, items: list[Item]) -> None:
        if not items[0].cancelled and any(i.id not in self.settled for i in items):
            self._cancel(items)

    def _cancel(self, items: list[Item]) -> None:
        for item in items:
            self.owner.cancel(item)  # marks it cancelled
            item.cancelled = True  # an item no core holds any more, too
            self.queued.pop(item.id, None)

    def cancel(self, items: list[Item]) -> None:
        """The waiter gave up (its client left, or its deadline passed)."""
        self.steps.call(lambda: self._cancel(items))

    def time_out_waiters(self) -> None:
        """Each waiter whose deadline passed stops waiting, as the door's does (each
        already did, at its deadline)."""
        for items in self.requests:
            if items[0].deadline <= self.now:
                self.steps.call(partial(self._give_up, items))

    def admit(self, items: list[Item], timeout: float) -> None:
        """Through the owner, as the door admits a request; raises its refusal."""
        def admit() -> None:
            self.owner.admit(items, timeout)
            self._admitted(items)
        self.steps.call(admit)

    def admit_all(self, requests: list[tuple[list[Item], float]]
                  ) -> tuple[list[Refusal | None], bool]:
        """A frame of requests through the owner: each one's refusal, and whether the
        cores asked the owner for a turn."""
        def admit() -> list[Refusal | None]:
            refusals = self.owner.admit_all(requests, self.now)
            for (items, _), refusal in zip(requests, refusals, strict=True):
                if refusal is None:
                    self._admitted(items)
            return refusals
        self.watched.asked_turn = None
        refusals = self.steps.call(admit)
        assert self.watched.asked_turn is not None
        return refusals, self.watched.asked_turn

    def submit(self, model: str | None, n: int = 1, tier: Tier = Tier.PAID,
               timeout: float = 5.0) -> list[Item] | BatchgateError:
        """A request as the door makes one: resolved, admitted through the owner; its
        items, or why it was refused."""
        version = self.cores.resolve(model, None)
        items = self.new_items(version, tier, n, timeout)
        try:
            self.admit(items, timeout)
        except BatchgateError as exc:
            return exc
        return items

    # -- the pool ------------------------------------------------------------------------
    def answer(self, worker: WorkerId, kind: str = "ok") -> None:
        """The worker's batch is answered now: "ok", "error" (the model raised) or
        "short"."""
        run = self.pool.running(worker)
        assert run is not None and self.up(worker)
        reply: Ok | Err | None = None
        if kind == "error":
            reply = Err(run.batch_id, "model", "ValueError", "the model raised")
        elif kind == "short":
            slot = self.slot_of(worker)
            assert slot is not None
            reply = Ok(run.batch_id, tuple(output(slot.version, t) for t in run.inputs[1:]),
                       LATENCY)
        self.steps.call(lambda: self.pool.finish(worker, reply))

    def die(self, worker: WorkerId) -> None:
        """The incarnation is gone; the pool hears of it at `report_deaths` (or the next
        `advance`)."""
        if self.up(worker):
            self.steps.call(lambda: self.pool.die(worker, heard=False))

    def report_deaths(self) -> None:
        self.steps.call(self.pool.hear)

    def ready(self, slot: Slot) -> None:
        """The slot's load ends now."""
        self.steps.call(lambda: self.pool.load_done(slot.index))

    def load_failed(self, slot: Slot) -> None:
        """The slot's load dies now: reported, the start retried after the backoff."""
        self.steps.call(lambda: self.pool.fail_load(slot.index))

    # -- the books, as the pool's events come --------------------------------------------
    def on_ready(self, worker: WorkerId, start: StartId, version: str) -> None:
        self.came_up.add(worker)

    def on_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        """A batch lost with its worker is queued again (unless another runs it)."""
        self.dead[worker] = version
        if worker not in self.came_up and restart is not None:
            self.failed_loads.add(restart)
        flight = self.flights.pop(worker, None)
        flying = {i.id for f in self.flights.values() for i in f.items}
        for item in flight.items if flight is not None else ():
            if item.id not in self.settled and not item.cancelled and item.id not in flying:
                self.queued[item.id] = item

    # -- checking the owner's actions ----------------------------------------------------
    def sent(self, worker: WorkerId, run: Run, version: str, group: bool) -> None:
        """A batch sent: to a worker up (or dead, unheard), or to one whose death the owner
        reads in this very turn (the pool drops it, the death re-routes it)."""
        slot = self.slot_of(worker)
        lost = self.dead.get(worker)
        assert lost is not None or (slot is not None and slot.state in ("up", "dead")), (
            "sent to no live worker")
        assert worker not in self.flights, "a worker was given two batches"
        assert 1 <= len(run.inputs) <= MAX_BATCH
        items = [self.items[int(t.split(":")[1])] for t in run.inputs]
        held = {i.version for i in items}
        assert held == {version}, f"a batch mixed versions {held} (cut by {version})"
        holds = lost if lost is not None else slot.version if slot is not None else None
        assert version == holds, f"{version}'s batch went to a {holds} worker"
        if not group:
            self.check_order(items, version)
        self.watched.sending.difference_update(i.id for i in items)
        if lost is not None:
            return
        for item in items:
            self.queued.pop(item.id, None)
        self.flights[worker] = Flight(run, items, self.now, version)

    def switched(self, worker: WorkerId, to: str) -> None:
        """A switch: of an idle worker up (or dead, unheard), or of one whose death the
        owner reads in this very turn (the pool does nothing)."""
        assert worker not in self.flights, "a busy worker was switched"
        assert to in self.cores.catalogue.versions(), f"switched to {to}, not live"
        if worker in self.dead:
            assert self.dead[worker] != to, "switched to the version it holds"
            self.switches.append((self.now, worker, self.dead[worker], to))
            return
        slot = self.slot_of(worker)
        assert slot is not None, "switched a worker the pool never had"
        assert slot.state != "loading"
        old = slot.version
        assert old != to, "switched to the version it holds"
        assert not any(s.state == "loading" and s.version == to for s in self.slots), (
            f"a second load of {to} at once (a switch's, or a dead worker's restart)")
        self.switches.append((self.now, worker, old, to))
        judged = self.spy.judged_load_s.pop(worker, None)  # when placement decided it
        if old in self.cores.catalogue.versions():
            stay = PLACEMENT.min_resident(self.load_s(old) if judged is None else judged)
            assert self.now >= slot.since + stay - 1e-9, (
                f"{old} switched away {self.now - slot.since:.3f} s after its load "
                f"(minimum {stay:.3f} s)")

    def add(self, version: str, start: StartId) -> None:
        """Only in place of a start taken back: a fixed pool keeps its size."""
        assert self.replacing > 0, f"a fixed pool was asked to grow by {version}"
        self.replacing -= 1

    def added(self, version: str) -> None:
        pass

    def retiring(self, worker: WorkerId) -> str:
        raise AssertionError(f"a fixed pool was asked to retire {worker}")

    def retired_from(self, worker: WorkerId, version: str) -> None:
        pass

    def cancelling(self, start: StartId) -> None:
        """Only a start whose loads died (its version's keep failing) or of a version gone
        from the catalogue, and only to start another in its place."""
        version = next((s.version for s in self.slots if s.start == start), None)
        assert start in self.failed_loads or (
            version is not None and version not in self.cores.catalogue.versions()), (
            f"a fixed pool was asked to take back {start}")
        self.replacing += 1

    def cancelled(self, start: StartId, version: str) -> None:
        pass

    def load_s(self, version: str) -> float:
        """The load time placement weighs for `version`: measured, else the hint."""
        measured = {s.version: s.load_s for s in self.cores.versions(self.now)}.get(version)
        if measured is not None:
            return measured
        key = VersionKey.parse(version)
        hint = self.cores.catalogue.models[key.model].versions[key.version].load_s
        assert hint is not None, "test catalogues give every version a load_s hint"
        return hint

    def check_order(self, batch: list[Item], version: str) -> None:
        """Within a version, fresh free items never leave an older paid item queued, and
        each tier goes in arrival order."""
        grouped = self.cores.grouped()
        taken = {i.id for i in batch}
        taken |= self.watched.sending
        left = [i for i in self.queued.values() if i.version == version and not i.cancelled
                and i.deadline > self.now and i.id not in grouped and i.id not in taken]
        if any(i.tier is Tier.FREE and i.attempts == 0 for i in batch):
            assert not any(i.tier is Tier.PAID for i in left), "paid waited behind free"
        for tier in Tier:
            fresh = [i.id for i in batch if i.tier is tier and i.attempts == 0]
            if fresh:
                assert not any(i.tier is tier and i.attempts == 0 and i.id < max(fresh)
                               for i in left), f"{tier.name} left out of arrival order"

    # -- time and the catalogue ------------------------------------------------------------
    def advance(self, to: float, hear: bool = True) -> None:
        """Time passes to `to`, the pool holding what its workers finish: the owner wakes
        at the cores' deadlines, waiters give up at theirs. With `hear`, the pool first
        hears the deaths it has not yet."""
        if hear:
            self.report_deaths()
        self.steps.advance(max(to, self.now))

    def run(self, until: float) -> None:
        """A healthy pool until `until`: each batch answered LATENCY after it was sent
        (one held meanwhile, at once), each load done its version's hint after it began
        (a restart after the pool's backoff), waiters giving up at their deadlines."""
        self.report_deaths()
        self.steps.call(self.pool.let_go)
        self.steps.advance(max(until, self.now))
        self.steps.call(self.pool.hold)

    def turn(self) -> None:
        """The owner takes a turn now (`CoreOwner.change`, changing nothing)."""
        self.steps.call(lambda: self.owner.change(lambda now: None))

    def load_time(self, version: str) -> float:
        """What a load of `version` takes in the pool: its hint (one with none, a batch's
        time: no load is instant)."""
        return self.hint(version) or LATENCY

    def hint(self, version: str) -> float:
        """Its load time: the hint of the catalogue served now, else of the first one."""
        key = VersionKey.parse(version)
        for catalogue in (self.cores.catalogue, self.catalogue):
            config = catalogue.models.get(key.model)
            if config is not None and key.version in config.versions:
                return config.versions[key.version].load_s or 0.0
        raise AssertionError(f"{version} is in no catalogue")

    def change(self, apply: Callable[[float], None]) -> None:
        """A change of what the cores decide on, applied in an owner's turn taken at once
        (`CoreOwner.change`), as the admin API and SIGHUP do."""
        self.steps.call(lambda: self.owner.change(apply))

    def serve(self, catalogue: Catalogue,
              check: Callable[[], None] | None = None) -> None:
        """A catalogue handed to the cores as the admin API does, in the owner's turn;
        `check` runs right after the cores took it, before they decide anything."""
        def apply(now: float) -> None:
            self.cores.set_catalogue(catalogue, now)
            if check is not None:
                check()
            self.spy.note()
        self.change(apply)

    # -- checks --------------------------------------------------------------------------
    def check_settled(self) -> None:
        """Each item answered at most once, with its own version's output."""
        for item_id, results in self.settled.items():
            assert len(results) == 1, f"item {item_id} answered {len(results)} times"
            item, result = self.items[item_id], results[0]
            if isinstance(result, str):
                assert result == output(str(item.version), item.text), (
                    f"{item.version} item answered {result!r}")

    def drain(self) -> bool:
        """Drain as the service does, on a healthy pool; True when the cores finished,
        False when they had to abandon: work of a version that holds no worker (none is
        loaded while draining), queued."""
        self.steps.call(self.owner.drain)
        self.run(self.now)
        self.steps.call(self.pool.let_go)
        for _ in range(400):
            if self.cores.finished():
                return True
            self.steps.advance(self.now + LATENCY)
        tables = self.cores.statistics_by_version(self.now)
        stuck = [v for v in self.cores.versions(self.now) if not v.resident
                 and (v.queued or tables[v.version].table.pending_groups)]
        assert stuck, "the cores never drained, though every version's work had a worker"
        self.steps.call(self.owner.abandon)
        return False


def finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


__all__ = ["HANG", "HEDGE", "LATENCY", "MAX_BATCH", "MAX_WAIT", "PLACEMENT",
           "World", "finite_positive", "output"]
