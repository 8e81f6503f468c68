"""A virtual-time world around `ModelCores`: a fake pool of slots that does what the real
one promises (`gpu_pool.seam.Pool`), waiters with deadlines, and a clock that moves only as
the test says. Every action the cores return is checked as it is carried out, so a test
states the events and the world says when the cores broke a rule.

The pool: a slot holds one incarnation, loading, up or dead. A switch of an idle, live
incarnation starts a new one (a new id) loading the other version and never reports the
old one dead; a switch of anything else does nothing (its death is, or will be, reported).
A death is reported when the test says (the owner's inbox), then the slot restarts its own
version. A batch sent to a dead incarnation is lost; its death re-routes it. Every output
names the version of the worker that ran it, so a batch on the wrong version shows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from batcher import BatchgateError, FlushPolicy, Item, ItemId, Tier
from failover import BatchTimes, CoreActions, CoreSettings, HangSettings, build_core
from failover.core import DispatchCore
from failover.errors import ModelLoading
from failover.fleet.catalogue import Catalogue, split_key
from failover.fleet.cores import ModelCores
from failover.fleet.placement import (
    PlacementSettings,
    Switch,
    SwitchCost,
    VersionView,
    WorkerView,
)
from failover.fleet.versions import ROLLOUT_TIMEOUT_S
from failover.hang import REFRESH
from gpu_pool import Err, Ok, Origin, Run, StartId, WorkerId

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


@dataclass
class Slot:
    worker: WorkerId
    version: str
    state: str  # "loading", "up", "dead" (its death not yet reported)
    since: float  # up: when it became ready; loading: when its load began
    start: StartId | None = None  # loading: the start it carries out


@dataclass
class Flight:
    run: Run
    items: list[Item]
    sent_at: float
    version: str


class Spy:
    """Placement as served (`SwitchCost`), watching the serving defaults at each decision:
    a rollout's new default takes over only once it is resident on as many workers as the
    old one (the views `decide` gets are taken right after `ModelCores` moved it), or once
    ROLLOUT_TIMEOUT_S has passed (a rollout starts at 0 at the earliest)."""

    def __init__(self, inner: SwitchCost) -> None:
        self.inner = inner
        self.settings = inner.settings  # what `ModelCores` reads the residency from
        self.cores: ModelCores | None = None
        self.serving: dict[str, str | None] = {}
        self.flips: list[tuple[str, str, str, int, int]] = []  # model, old, new, on new, on old

    def note(self) -> None:
        """The serving defaults now are the baseline (a catalogue change moved them)."""
        assert self.cores is not None
        self.serving = {m: self.cores.serving_default(m) for m in self.cores.catalogue.models}

    def decide(self, now: float, workers: Sequence[WorkerView],
               versions: Sequence[VersionView]) -> list[Switch]:
        assert self.cores is not None
        on = Counter(w.version for w in workers)
        for name in self.cores.catalogue.models:
            now_serving, before = self.cores.serving_default(name), self.serving.get(name)
            if before is not None and now_serving != before:
                old, new = f"{name}@{before}", f"{name}@{now_serving}"
                self.flips.append((name, old, new, on[new], on[old]))
                assert on[new] >= max(1, on[old]) or now >= ROLLOUT_TIMEOUT_S, (
                    f"{name}'s default moved to {new} on {on[new]} workers, the old "
                    f"{old} on {on[old]}")
            self.serving[name] = now_serving
        return self.inner.decide(now, workers, versions)

    def next_check(self, now: float, workers: Sequence[WorkerView],
                   versions: Sequence[VersionView]) -> float:
        return self.inner.next_check(now, workers, versions)


@dataclass(repr=False)
class World:
    """`ModelCores` over `slots` workers, started with the cores' initial placement."""

    catalogue: Catalogue
    slots_n: int
    now: float = 0.0
    next_id: int = 0
    incarnations: int = 0
    slots: list[Slot] = field(default_factory=list)
    items: dict[int, Item] = field(default_factory=dict)
    settled: dict[int, list[str | BaseException]] = field(default_factory=dict)
    queued: dict[int, Item] = field(default_factory=dict)  # admitted, not running, not done
    requests: list[list[Item]] = field(default_factory=list)
    flights: dict[WorkerId, Flight] = field(default_factory=dict)
    switched_out: set[WorkerId] = field(default_factory=set)
    deaths: list[WorkerId] = field(default_factory=list)  # dead, not yet reported
    switches: list[tuple[float, WorkerId, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.spy = Spy(SwitchCost(PLACEMENT))
        self.cores = self.build_cores()
        self.spy.cores = self.cores
        self.spy.note()
        initial = self.cores.initial(self.slots_n)  # up at once: no start to count
        for index, version in enumerate(initial):
            self.slots.append(self.first_slot(index, version))
        for slot in list(self.slots):
            self.ready(slot)

    def build_cores(self) -> ModelCores:
        """The cores under test, placing through the spy."""
        return ModelCores(self.catalogue, self.make_core, self.spy)

    def first_slot(self, index: int, version: str) -> Slot:
        """The pool's slot `index`, loading `version` for its first start."""
        return Slot(self.new_worker(), version, "loading", 0.0, StartId(Origin.FIRST, index))

    def __repr__(self) -> str:
        return "World"  # items name it as their sink: keep hypothesis's reports short

    @staticmethod
    def make_core(version: str, catalogue: Catalogue) -> DispatchCore:
        return build_core(SETTINGS, times=learned(), version=version)

    def new_worker(self) -> WorkerId:
        self.incarnations += 1
        return WorkerId(self.incarnations)

    # -- the sink and the waiters --------------------------------------------------------
    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.settled.setdefault(item.id, []).append(result)
        self.queued.pop(item.id, None)

    def new_items(self, version: str, tier: Tier, n: int, timeout: float) -> list[Item]:
        base, self.next_id = self.next_id, self.next_id + n
        items = [Item(ItemId(base + k), f"r:{base + k}", tier, self.now, self.now + timeout,
                      self, k, version=version) for k in range(n)]
        self.items.update((i.id, i) for i in items)
        return items

    def admitted(self, items: list[Item]) -> None:
        self.requests.append(items)
        self.queued.update((i.id, i) for i in items)

    def cancel(self, items: list[Item]) -> None:
        """The waiter gave up (its client left, or its deadline passed)."""
        turn = False
        for item in items:
            turn |= self.cores.cancel(item)  # marks it cancelled
            item.cancelled = True  # an item no core holds any more, too
            self.queued.pop(item.id, None)
        if turn:
            self.perform(self.cores.poll(self.now))

    def time_out_waiters(self) -> None:
        """Each waiter whose deadline passed stops waiting, as the door's does."""
        for items in self.requests:
            if items[0].deadline <= self.now and not items[0].cancelled and \
                    any(i.id not in self.settled for i in items):
                self.cancel(items)

    # -- the pool ------------------------------------------------------------------------
    def slot_of(self, worker: WorkerId) -> Slot | None:
        return next((s for s in self.slots if s.worker == worker), None)

    def ready(self, slot: Slot) -> None:
        """A loading incarnation finished its load."""
        assert slot.state == "loading" and slot.start is not None
        start, slot.start = slot.start, None
        slot.state, slot.since = "up", self.now
        self.perform(self.cores.worker_ready(slot.worker, self.now, start, slot.version))

    def load_failed(self, slot: Slot) -> None:
        """A loading incarnation died: reported (the cores never knew it), and the slot
        starts its version again."""
        assert slot.state == "loading"
        dead = slot.worker
        slot.worker, slot.since = self.new_worker(), self.now
        self.perform(self.cores.worker_died(dead, self.now, slot.version, slot.start))

    def die(self, worker: WorkerId) -> None:
        """The incarnation is gone; the cores hear of it at `report_deaths`."""
        slot = self.slot_of(worker)
        if slot is not None and slot.state == "up":
            slot.state = "dead"
            self.deaths.append(worker)

    def report_deaths(self) -> None:
        while self.deaths:
            worker = self.deaths.pop(0)
            slot = self.slot_of(worker)
            assert slot is not None and slot.state == "dead"
            slot.worker, slot.state, slot.since = self.new_worker(), "loading", self.now
            slot.start = StartId(Origin.RESTART, worker)
            flight = self.flights.pop(worker, None)
            flying = {i.id for f in self.flights.values() for i in f.items}
            for item in flight.items if flight is not None else ():
                if item.id not in self.settled and not item.cancelled and item.id not in flying:
                    self.queued[item.id] = item
            self.perform(self.cores.worker_died(worker, self.now, slot.version, slot.start))

    def answer(self, worker: WorkerId, kind: str = "ok") -> None:
        """The worker's batch is answered: "ok", "error" (the model raised) or "short"."""
        flight = self.flights.pop(worker)
        slot = self.slot_of(worker)
        assert slot is not None and slot.state == "up"
        run = flight.run
        reply: Ok | Err
        if kind == "error":
            reply = Err(run.batch_id, "model", "ValueError", "the model raised")
        else:
            outputs = tuple(output(slot.version, t) for t in run.inputs)
            reply = Ok(run.batch_id, outputs[1:] if kind == "short" else outputs, LATENCY)
        self.perform(self.cores.reply(worker, reply, self.now, self.now))

    # -- carrying out the cores' actions, checking each ----------------------------------
    def perform(self, actions: CoreActions) -> None:
        for send in actions.send:
            self.sent(send.worker, send.run, send.version, send.reason is None)
        for worker in actions.kill:
            assert worker in self.flights, "a worker with no batch was killed as hung"
            self.die(worker)
        for worker, version, start in actions.switch:
            self.switched(worker, version, start)
        for item, result in actions.settle:
            item.settle(result)

    def sent(self, worker: WorkerId, run: Run, version: str, group: bool) -> None:
        assert worker not in self.switched_out, "a batch went to a worker switched away"
        slot = self.slot_of(worker)
        assert slot is not None and slot.state in ("up", "dead"), "sent to no live worker"
        assert worker not in self.flights, "a worker was given two batches"
        assert 1 <= len(run.inputs) <= MAX_BATCH
        items = [self.items[int(t.split(":")[1])] for t in run.inputs]
        held = {i.version for i in items}
        assert held == {version}, f"a batch mixed versions {held} (cut by {version})"
        assert version == slot.version, f"{version}'s batch went to a {slot.version} worker"
        if not group:
            self.check_order(items, version)
        for item in items:
            self.queued.pop(item.id, None)
        self.flights[worker] = Flight(run, items, self.now, version)

    def switched(self, worker: WorkerId, to: str, start: StartId) -> None:
        assert worker not in self.flights, "a busy worker was switched"
        assert to in self.cores.catalogue.versions(), f"switched to {to}, not live"
        slot = self.slot_of(worker)
        assert slot is not None, "switched a worker the pool never had"
        assert slot.worker == worker and slot.state != "loading"
        old = slot.version
        assert old != to, "switched to the version it holds"
        assert not any(s.state == "loading" and s.version == to for s in self.slots), (
            f"a second load of {to} at once (a switch's, or a dead worker's restart)")
        self.switches.append((self.now, worker, old, to))
        if old in self.cores.catalogue.versions():
            stay = PLACEMENT.min_resident(self.load_s(old))
            assert self.now >= slot.since + stay - 1e-9, (
                f"{old} switched away {self.now - slot.since:.3f} s after its load "
                f"(minimum {stay:.3f} s)")
        if slot.state == "dead":
            return  # the pool does nothing: the death is reported as usual
        self.switched_out.add(worker)
        slot.worker, slot.version, slot.state = self.new_worker(), to, "loading"
        slot.since, slot.start = self.now, start

    def load_s(self, version: str) -> float:
        """The load time placement weighs for `version`: measured, else the hint."""
        measured = {s.version: s.load_s for s in self.cores.versions(self.now)}.get(version)
        if measured is not None:
            return measured
        model, short = split_key(version)
        hint = self.cores.catalogue.models[model].versions[short].load_s
        assert hint is not None, "test catalogues give every version a load_s hint"
        return hint

    def check_order(self, batch: list[Item], version: str) -> None:
        """Within a version, fresh free items never leave an older paid item queued, and
        each tier goes in arrival order."""
        grouped = self.cores.grouped()
        taken = {i.id for i in batch}
        left = [i for i in self.queued.values() if i.version == version and not i.cancelled
                and i.deadline > self.now and i.id not in grouped and i.id not in taken]
        if any(i.tier is Tier.FREE and i.attempts == 0 for i in batch):
            assert not any(i.tier is Tier.PAID for i in left), "paid waited behind free"
        for tier in Tier:
            fresh = [i.id for i in batch if i.tier is tier and i.attempts == 0]
            if fresh:
                assert not any(i.tier is tier and i.attempts == 0 and i.id < max(fresh)
                               for i in left), f"{tier.name} left out of arrival order"

    # -- time ----------------------------------------------------------------------------
    def advance(self, to: float) -> None:
        """Move time the way the owner does: deaths first, then a wake at each of the
        cores' deadlines; a deadline that does not move past a poll is a spinning owner."""
        self.report_deaths()
        for _ in range(10_000):
            due = self.cores.next_deadline()
            if due > to:
                break
            before = self.now
            self.now = max(self.now, due)
            self.perform(self.cores.poll(self.now))
            if self.now == before and self.cores.next_deadline() <= self.now:
                self.perform(self.cores.poll(self.now))
                assert self.cores.next_deadline() > self.now, (
                    f"next_deadline stays at {self.cores.next_deadline()} <= now {self.now}")
        else:
            raise AssertionError("the cores' deadlines never moved on")
        self.now = to
        self.perform(self.cores.poll(self.now))

    def run(self, until: float, step: float = 0.05) -> None:
        """A healthy pool until `until`: each batch answered LATENCY after it was sent,
        each load ready once its version's hint has passed, waiters timing out."""
        while self.now < until - 1e-9:
            self.advance(min(until, self.now + step))
            self.time_out_waiters()
            for worker, flight in sorted(self.flights.items()):
                if self.up(worker) and self.now >= flight.sent_at + LATENCY - 1e-9:
                    self.answer(worker)
            for slot in [s for s in self.slots if s.state == "loading"]:
                if self.now >= slot.since + self.hint(slot.version) - 1e-9:
                    self.ready(slot)

    def hint(self, version: str) -> float:
        """Its load time: the hint of the catalogue served now, else of the first one."""
        model, short = split_key(version)
        for catalogue in (self.cores.catalogue, self.catalogue):
            config = catalogue.models.get(model)
            if config is not None and short in config.versions:
                return config.versions[short].load_s or 0.0
        raise AssertionError(f"{version} is in no catalogue")

    def serve(self, catalogue: Catalogue) -> None:
        """A catalogue handed to the cores as the admin API does, then the owner's turn."""
        self.cores.set_catalogue(catalogue, self.now)
        self.spy.note()
        self.perform(self.cores.poll(self.now))

    def submit(self, model: str | None, n: int = 1, tier: Tier = Tier.PAID,
               timeout: float = 5.0) -> list[Item] | BatchgateError:
        """A request as the door makes one: resolved, admitted, the owner's turn; its
        items, or why it was refused."""
        version = self.cores.resolve(model, None)
        items = self.new_items(version, tier, n, timeout)
        try:
            self.cores.admit(items, timeout, self.now)
        except BatchgateError as exc:
            self.refused(exc)
            return exc
        self.admitted(items)
        self.perform(self.cores.poll(self.now))
        return items

    def refused(self, refusal: BatchgateError) -> None:
        """The owner takes a turn after a refusal for a cold version: the arrival asks
        placement for a load (`CoreOwner.admit` must wake for `ModelLoading`)."""
        if isinstance(refusal, ModelLoading):
            self.perform(self.cores.poll(self.now))

    def answers(self, items: list[Item]) -> list[str | BaseException]:
        return [r for i in items for r in self.settled.get(i.id, [])]

    # -- checks --------------------------------------------------------------------------
    def check_settled(self) -> None:
        """Each item answered at most once, with its own version's output."""
        for item_id, results in self.settled.items():
            assert len(results) == 1, f"item {item_id} answered {len(results)} times"
            item, result = self.items[item_id], results[0]
            if isinstance(result, str):
                assert result == output(item.version, item.text), (
                    f"{item.version} item answered {result!r}")

    def drain(self) -> bool:
        """Drain as the service does; True when the cores finished, False when they had to
        abandon: work of a version that holds no worker (none is loaded while draining),
        queued."""
        self.cores.drain()
        for _ in range(400):
            self.report_deaths()
            for slot in [s for s in self.slots if s.state == "loading"]:
                self.ready(slot)
            for worker in [w for w in sorted(self.flights) if self.up(w)]:
                self.answer(worker)
            if self.cores.finished():
                return True
            self.advance(self.now + LATENCY)
        tables = self.cores.statistics_by_version(self.now)
        stuck = [v for v in self.cores.versions(self.now) if not v.resident
                 and (v.queued or tables[v.version].table.pending_groups)]
        assert stuck, "the cores never drained, though every version's work had a worker"
        self.perform(self.cores.abandon())
        return False

    def up(self, worker: WorkerId) -> bool:
        slot = self.slot_of(worker)
        return slot is not None and slot.state == "up"

    def unanswered(self) -> list[Item]:
        """Items of requests not cancelled that got no answer."""
        return [i for items in self.requests for i in items
                if not i.cancelled and i.id not in self.settled]

    def resident(self, version: str) -> int:
        return sum(s.state == "up" and s.version == version for s in self.slots)


def finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


__all__ = ["HANG", "HEDGE", "LATENCY", "MAX_BATCH", "MAX_WAIT", "PLACEMENT", "Spy", "World",
           "finite_positive", "output"]
