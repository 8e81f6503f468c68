"""The whole dispatch core as a hypothesis state machine, in exact virtual time.

Random arrivals in both tiers (multi-input requests, tight admission budgets, short
deadlines), cancellations, workers coming up, replying, failing, dying and hanging at random
moments, stalled batches hedged on another worker (both copies answering, failing or
dying), replies from dead incarnations and for batches long closed. Time only moves the way
the owner task moves it: to the core's own next deadline, or to an event. After every step
and once everything has drained, the invariants of the dispatch core hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batcher import (
    BatchgateError,
    Closed,
    DeadlineExceeded,
    FlushPolicy,
    Item,
    ItemId,
    Tier,
)
from failover import (
    BatchTimes,
    CoreActions,
    CoreSettings,
    HangSettings,
    ModelError,
    QueryOfDeath,
    build_core,
)
from failover.hang import REFRESH
from gpu_pool import Err, Ok, Run, WorkerId

MAX_BATCH = 4
MAX_WAIT = 0.05
LATENCY = 0.1
HANG = 1.0
HEDGE = 0.35
MAX_ATTEMPTS = 3


def learned() -> BatchTimes:
    """Batch times as if many batches had run: stalled batches are hedged after HEDGE."""
    times = BatchTimes(HangSettings(hedge_floor=HEDGE, kill_after=HANG))
    for _ in range(REFRESH):
        times.observe(LATENCY, 12)
    assert times.hedge_after(12) == HEDGE
    return times


@dataclass
class Request:
    items: list[Item]
    cancelled: bool = False


@dataclass
class Flight:
    run: Run
    items: list[Item]
    sent_at: float
    group: bool = False  # run again by the table, not cut fresh from the queues


@dataclass
class Model:
    """What the core was told and what it did, for the invariants."""

    settled: dict[int, list[str | BaseException]] = field(default_factory=dict)
    settled_at: dict[int, float] = field(default_factory=dict)
    queued: dict[int, Item] = field(default_factory=dict)  # admitted, not running, not done
    flights: dict[WorkerId, Flight] = field(default_factory=dict)
    closed: list[tuple[WorkerId, Run]] = field(default_factory=list)  # every past dispatch
    forgiven: list[WorkerId] = field(default_factory=list)  # deaths pinned on an input


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = build_core(CoreSettings(
            budgets={Tier.PAID: 0.6, Tier.FREE: 0.3},
            policy=FlushPolicy(max_batch=MAX_BATCH, max_wait=MAX_WAIT), queue_capacity=40,
            initial_latency=LATENCY, max_attempts=MAX_ATTEMPTS, bisect_budget=6,
        ), times=learned())
        self.now = 0.0
        self.m = Model()
        self.requests: list[Request] = []
        self.items: dict[int, Item] = {}
        self.next_id = 0
        self.up: set[WorkerId] = set()
        self.incarnations = 0
        self.batch_of: dict[int, WorkerId] = {}

    # -- the sink of every item -----------------------------------------------------------
    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.m.settled.setdefault(item.id, []).append(result)
        self.m.settled_at[item.id] = self.now
        self.m.queued.pop(item.id, None)

    # -- carrying out the core's actions, checking each --------------------------------------
    def perform(self, actions: CoreActions) -> None:
        for send in actions.send:
            assert send.worker in self.up, "a batch went to a worker that is not up"
            assert send.worker not in self.m.flights, "a worker was given two batches"
            assert 1 <= len(send.run.inputs) <= MAX_BATCH
            items = [self.by_text(t) for t in send.run.inputs]
            if send.reason is not None:  # a fresh cut, not a group run again
                self.check_priority(items)
            else:
                self.check_group_tier(items)
            for item in items:
                self.m.queued.pop(item.id, None)
            self.m.flights[send.worker] = Flight(send.run, items, self.now, send.reason is None)
            self.m.closed.append((send.worker, send.run))
        for worker in actions.kill:  # the pool kills it; its death comes back as an event
            assert worker in self.m.flights, "a worker with no batch was killed as hung"
            flight = self.m.flights[worker]
            # Suspects (inputs that killed or stalled a worker) are killed once they stall.
            assert self.now - flight.sent_at >= self.kill_limit(flight) - 1e-9, "killed early"
            self.died(worker)
        self.m.forgiven += actions.forgive
        for item, result in actions.settle:
            item.settle(result)

    def by_text(self, text: str) -> Item:
        return self.items[int(text.split(":")[1])]

    def kill_limit(self, flight: Flight) -> float:
        """A group's run (a re-run, an isolation run, a hedge) is killed once it stalls; a
        fresh batch once it hangs, or once it stalled and its hedge stalled too."""
        return HEDGE if flight.group else min(HANG, 2 * HEDGE)

    def check_group_tier(self, batch: list[Item]) -> None:
        """A group of free items never runs while fresh paid work is queued."""
        if all(i.tier is Tier.FREE for i in batch):
            assert not any(i.tier is Tier.PAID for i in self.fresh_queued()), (
                "a free group ran ahead of queued paid work")

    def fresh_queued(self) -> list[Item]:
        """Live items in the batcher's queues (not waiting in the table's groups)."""
        grouped = self.core.grouped()
        return [i for i in self.m.queued.values() if not i.cancelled
                and i.deadline > self.now and i.id not in grouped]

    def check_priority(self, batch: list[Item]) -> None:
        """Fresh free items never leave an older paid item queued; FIFO within a tier.
        Items in groups follow the groups' rules (`check_group_tier`)."""
        taken = {i.id for i in batch}
        left = [i for i in self.fresh_queued() if i.id not in taken]
        if any(i.tier is Tier.FREE and i.attempts == 0 for i in batch):
            assert not any(i.tier is Tier.PAID for i in left), "paid waited behind free"
        for tier in Tier:
            fresh = [i for i in batch if i.tier is tier and i.attempts == 0]
            if fresh:
                newest = max(i.id for i in fresh)
                assert not any(i.tier is tier and i.attempts == 0 and i.id < newest
                               for i in left), f"{tier.name} left out of arrival order"

    def died(self, worker: WorkerId) -> None:
        self.up.discard(worker)
        flight = self.m.flights.pop(worker, None)
        flying = {i.id for f in self.m.flights.values() for i in f.items}
        for item in flight.items if flight is not None else ():
            if item.id not in self.m.settled and not item.cancelled and item.id not in flying:
                self.m.queued[item.id] = item  # back in the retry lane (or failed)
        self.perform(self.core.worker_died(worker, self.now))

    def advance(self, to: float) -> None:
        """Move time the way the owner does: wake at each of the core's deadlines."""
        while (due := self.core.next_deadline()) <= to:
            self.now = max(self.now, due)
            self.perform(self.core.poll(self.now))
        self.now = to
        self.perform(self.core.poll(self.now))

    # -- rules --------------------------------------------------------------------------------
    @precondition(lambda self: len(self.up) < 4)
    @rule()
    def worker_up(self) -> None:
        self.incarnations += 1
        worker = WorkerId(self.incarnations)
        self.up.add(worker)
        self.perform(self.core.worker_ready(worker, self.now))

    def new_request(self, tier: Tier, n: int, timeout: float) -> list[Item]:
        base, self.next_id = self.next_id, self.next_id + n
        items = [Item(ItemId(base + k), f"r:{base + k}", tier, self.now, self.now + timeout,
                      self, k) for k in range(n)]
        for item in items:
            self.items[item.id] = item
        return items

    def admitted(self, items: list[Item], refusal: BaseException | None) -> None:
        if refusal is not None:
            for item in items:  # refused: never queued, never answered
                del self.items[item.id]
            return
        self.requests.append(Request(items))
        self.m.queued.update((i.id, i) for i in items)

    def turn_after_admit(self, turn: bool, deadline: float) -> None:
        actions = self.core.poll(self.now)
        # The owner takes a turn only when admit asks for one: a turn it skips must have
        # had nothing to do, and the timer it keeps must still be right.
        assert turn or (not actions.send and self.core.next_deadline() == deadline)
        self.perform(actions)

    @rule(tier=st.sampled_from(Tier), n=st.integers(1, 6),
          timeout=st.sampled_from([0.08, 0.3, 5.0]))
    def admit(self, tier: Tier, n: int, timeout: float) -> None:
        items = self.new_request(tier, n, timeout)
        deadline = self.core.next_deadline()  # the owner's timer, armed at its last turn
        try:
            turn = self.core.admit(items, timeout, self.now)
        except (BatchgateError, Closed) as exc:
            self.admitted(items, exc)
            return
        self.admitted(items, None)
        self.turn_after_admit(turn, deadline)

    @rule(frame=st.lists(st.tuples(st.sampled_from(Tier), st.integers(1, 6),
                                   st.sampled_from([0.3, 5.0])), min_size=1, max_size=8))
    def admit_frame(self, frame: list[tuple[Tier, int, float]]) -> None:
        """A gateway's frame: requests admitted together, runs of one tier and deadline
        in one step when the last of the run fits."""
        requests = [(self.new_request(tier, n, timeout), timeout) for tier, n, timeout in frame]
        deadline = self.core.next_deadline()
        refusals, turn = self.core.admit_all(requests, self.now)
        for (items, _), refusal in zip(requests, refusals, strict=True):
            self.admitted(items, refusal)
        self.turn_after_admit(turn, deadline)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.requests))
        request.cancelled = True
        turn = False
        for item in request.items:
            turn |= self.core.cancel(item)
            self.m.queued.pop(item.id, None)
        if turn:  # the owner takes a turn when a cancellation asks for one
            self.perform(self.core.poll(self.now))

    @precondition(lambda self: self.m.flights)
    @rule(data=st.data(), fail=st.sampled_from(["ok", "ok", "ok", "error", "short"]))
    def reply(self, data: st.DataObject, fail: str) -> None:
        worker = data.draw(st.sampled_from(sorted(self.m.flights)))
        flight = self.m.flights.pop(worker)
        run = flight.run
        message: Ok | Err
        if fail == "error":
            message = Err(run.batch_id, "model", "ValueError", "the model raised")
        else:
            outputs = tuple(t[::-1] for t in run.inputs)
            message = Ok(run.batch_id, outputs[1:] if fail == "short" else outputs, LATENCY)
        self.perform(self.core.reply(worker, message, self.now, self.now))

    @precondition(lambda self: self.m.closed)
    @rule(data=st.data())
    def stale_reply(self, data: st.DataObject) -> None:
        """A reply for a batch no longer in flight on that worker changes nothing."""
        worker, run = data.draw(st.sampled_from(self.m.closed))
        flight = self.m.flights.get(worker)
        if flight is not None and flight.run.batch_id == run.batch_id:
            return  # that one is live: not stale
        ok = Ok(run.batch_id, tuple(t[::-1] for t in run.inputs), LATENCY)
        actions = self.core.reply(worker, ok, self.now, self.now)
        assert not actions.settle and not actions.send, "a stale reply changed something"

    @precondition(lambda self: self.up)
    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        self.died(data.draw(st.sampled_from(sorted(self.up))))

    @rule(dt=st.sampled_from([0.001, 0.02, 0.05, 0.1, 0.4, 1.2]))
    def tick(self, dt: float) -> None:
        self.advance(self.now + dt)

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def answered_at_most_once_and_rightly(self) -> None:
        for item_id, results in self.m.settled.items():
            assert len(results) == 1, f"item {item_id} answered {len(results)} times"
            result, item = results[0], self.items[item_id]
            if isinstance(result, str):
                assert result == item.text[::-1], "an item got another item's output"
            elif isinstance(result, DeadlineExceeded):
                assert self.m.settled_at[item_id] >= item.deadline
            else:
                assert isinstance(result, BatchgateError)

    @invariant()
    def no_item_waits_past_max_wait_with_a_worker_idle(self) -> None:
        table = self.core.statistics(self.now).table
        if table.idle - table.pending_groups <= 0:
            return
        # A free re-run may wait on purpose: with fewer than two sound workers it leaves
        # the one it would take to everyone else (`DispatchCore._group_may_run`).
        core = self.core
        held = core.grouped() if core._table.runnable(core._group_may_run) is None else set()
        for item in self.m.queued.values():
            if not item.cancelled and item.deadline > self.now and item.id not in held:
                assert self.now < item.enqueued + MAX_WAIT + 1e-9, "waited with a worker free"

    def teardown(self) -> None:
        """Drain: every admitted item that was not cancelled is answered exactly once."""
        self.core.drain()
        for _ in range(500):
            if not self.up:
                self.worker_up()
            for worker in sorted(self.m.flights):
                flight = self.m.flights.pop(worker)
                ok = Ok(flight.run.batch_id, tuple(t[::-1] for t in flight.run.inputs), LATENCY)
                self.perform(self.core.reply(worker, ok, self.now, self.now))
            if self.core.finished():
                break
            self.advance(self.now + LATENCY)
        assert self.core.finished(), "the core never drained"
        for request in self.requests:
            for item in request.items:
                n = len(self.m.settled.get(item.id, []))
                assert n == 1 or (request.cancelled and n == 0), (
                    f"item {item.id} answered {n} times"
                )
        stats = self.core.statistics(self.now)
        assert stats.batcher.pending == 0 and stats.table.in_flight_batches == 0


TestCore = CoreMachine.TestCase
TestCore.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def test_a_reply_with_work_queued_sends_the_next_batch_before_any_answer() -> None:
    m = CoreMachine()
    m.worker_up()
    m.admit(Tier.PAID, MAX_BATCH, 5.0)  # full: cut at once
    m.admit(Tier.PAID, MAX_BATCH, 5.0)  # queued behind it
    (worker,) = m.m.flights
    run = m.m.flights.pop(worker).run
    actions = m.core.reply(worker, Ok(run.batch_id, tuple(t[::-1] for t in run.inputs), 0.1),
                           m.now, m.now)
    assert [s.worker for s in actions.send] == [worker]
    assert actions.send[0].idle_gap == 0.0 and len(actions.settle) == MAX_BATCH
    assert {m.by_text(t).id for t in actions.send[0].run.inputs}.isdisjoint(
        i.id for i, _ in actions.settle)


def test_a_model_error_is_isolated_to_its_item() -> None:
    m = CoreMachine()
    m.worker_up()
    m.admit(Tier.PAID, MAX_BATCH, 5.0)
    for _ in range(10):
        for worker in sorted(m.m.flights):
            run = m.m.flights.pop(worker).run
            bad = any(t.endswith(":0") for t in run.inputs)
            reply: Ok | Err = (Err(run.batch_id, "model", "ValueError", "no") if bad
                               else Ok(run.batch_id, tuple(t[::-1] for t in run.inputs), 0.1))
            m.perform(m.core.reply(worker, reply, m.now, m.now))
    results = {i: r[0] for i, r in m.m.settled.items()}
    assert isinstance(results[0], ModelError)
    assert all(results[i] == f"r:{i}"[::-1] for i in range(1, MAX_BATCH))


def test_a_deadline_passed_in_the_queue_is_answered_at_the_deadline_without_running() -> None:
    m = CoreMachine()
    m.worker_up()
    m.admit(Tier.PAID, MAX_BATCH, 5.0)  # the only worker is busy
    m.admit(Tier.FREE, 1, 0.08)
    m.advance(0.5)
    (worker,) = m.m.flights
    m.reply(_Draw(worker), "ok")  # type: ignore[arg-type]
    late = m.items[MAX_BATCH]
    assert isinstance(m.m.settled[late.id][0], DeadlineExceeded)
    assert all(late not in f.items for f in m.m.flights.values())


@dataclass
class _Draw:
    """Stands in for hypothesis's data object in the example tests: draws `value`."""

    value: object

    def draw(self, strategy: object) -> object:
        return self.value


def test_next_deadline_is_the_oldest_items_max_wait_with_a_worker_idle() -> None:
    m = CoreMachine()
    assert m.core.next_deadline() == math.inf
    m.worker_up()
    m.admit(Tier.FREE, 1, 5.0)
    assert m.core.next_deadline() == MAX_WAIT
    m.advance(MAX_WAIT)
    # The one batch is hedged first (a second worker takes it if one comes), then killed.
    assert len(m.m.flights) == 1 and m.core.next_deadline() == MAX_WAIT + HEDGE
    m.advance(MAX_WAIT + HEDGE)
    assert m.core.next_deadline() == MAX_WAIT + HANG


def test_a_killer_that_leaves_mid_batch_gets_no_innocent_quarantined() -> None:
    m = CoreMachine()
    m.worker_up()
    m.admit(Tier.FREE, 1, 5.0)  # r:0 kills its worker
    m.admit(Tier.PAID, 1, 5.0)  # r:1 is innocent
    m.advance(MAX_WAIT)  # one batch of both
    m.died(next(iter(m.m.flights)))
    m.cancel(_Draw(m.requests[0]))  # the killer's client leaves
    m.worker_up()  # each runs again in its own tier's group: the paid innocent first
    (worker,) = m.m.flights
    assert m.m.flights[worker].run.inputs == ("r:1",)
    m.reply(_Draw(worker), "ok")
    assert m.m.settled[1] == ["r:1"[::-1]]
    m.died(next(iter(m.m.flights)))  # then the killer, alone though its client left
    assert isinstance(m.m.settled[0][0], QueryOfDeath)
    m.worker_up()
    again = Item(ItemId(99), "r:1", Tier.PAID, m.now, m.now + 5.0, m)
    m.core.admit([again], 5.0, m.now)  # not refused on sight


def test_a_hedge_whose_paid_items_were_cancelled_waits_behind_queued_paid_work() -> None:
    m = CoreMachine()
    m.worker_up()
    m.worker_up()
    m.admit_frame([(Tier.PAID, 1, 5.0), (Tier.FREE, 1, 5.0)])  # one batch of both
    m.admit(Tier.PAID, 1, 5.0)  # the other worker
    m.advance(MAX_WAIT + HEDGE)  # both stalled: hedged, no worker to take a copy
    m.admit(Tier.PAID, 1, 5.0)  # fresh paid work queued
    m.cancel(_Draw(m.requests[0]))  # the paid item of the first batch leaves
    m.worker_up()  # takes paid work: the first hedge holds only a free item now
    (sent,) = [f for w, f in m.m.flights.items() if w == m.incarnations]
    assert any(i.tier is Tier.PAID for i in sent.items)
