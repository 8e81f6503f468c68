"""The in-flight table driven through every interleaving by a hypothesis state machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batcher import Item, ItemId, Tier
from failover import (
    BatchTimes,
    ContractViolation,
    Dispatch,
    HangSettings,
    InFlightTable,
    ModelError,
    QueryOfDeath,
    WorkerCrashed,
)
from failover.hang import MIN_SAMPLES
from gpu_pool import BatchId, WorkerId

MAX_ATTEMPTS = 3


class Sink:
    def __init__(self) -> None:
        self.got: dict[int, list[str | BaseException]] = {}

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.got.setdefault(item.id, []).append(result)


def make_items(sink: Sink, start: int, n: int) -> list[Item]:
    return [Item(ItemId(i), f"in-{i}", Tier.FREE, 0.0, 1e9, sink) for i in range(start, start + n)]


def test_answer_goes_to_the_batch_items_in_order() -> None:
    sink, table = Sink(), InFlightTable()
    table.worker_up(WorkerId(1))
    items = make_items(sink, 0, 3)
    d = table.assign(items, now=0.0)
    actions = table.on_ok(d.worker, d.batch_id, ("a", "b", "c"))
    assert [(i.id, r) for i, r in actions.deliver] == [(0, "a"), (1, "b"), (2, "c")]
    assert table.idle_count() == 1


def test_a_late_answer_from_a_dead_worker_is_discarded() -> None:
    sink, table = Sink(), InFlightTable()
    table.worker_up(WorkerId(1))
    d = table.assign(make_items(sink, 0, 2), now=0.0)
    died = table.on_worker_died(d.worker)
    assert len(died.retry) == 2
    assert table.on_ok(d.worker, d.batch_id, ("x", "y")).discarded


def test_items_fail_after_max_attempts_crashes() -> None:
    sink, table = Sink(), InFlightTable(max_attempts=2)
    items = make_items(sink, 0, 2)  # never alone: a crash alone would convict instead
    for w in (1, 2):
        table.worker_up(WorkerId(w))
        table.assign(items, now=0.0)
        actions = table.on_worker_died(WorkerId(w))
    assert all(isinstance(r, WorkerCrashed) for _, r in actions.deliver) and not actions.retry
    assert len(actions.deliver) == 2


def test_wrong_output_count_is_a_contract_violation_isolated_by_bisection() -> None:
    sink, table = Sink(), InFlightTable()
    table.worker_up(WorkerId(1))
    d = table.assign(make_items(sink, 0, 1), now=0.0)
    actions = table.on_ok(d.worker, d.batch_id, ("a", "b"))
    assert isinstance(actions.deliver[0][1], ContractViolation)


def test_bisection_isolates_one_poison_item() -> None:
    sink, table = Sink(), InFlightTable(bisect_budget=64)
    table.worker_up(WorkerId(1))
    items = make_items(sink, 0, 51)
    poison = items[17]
    d = table.assign(items, now=0.0)
    while d is not None:
        texts = d.texts
        if poison.text in texts:
            actions = table.on_error(d.worker, d.batch_id, ModelError("ValueError", "bad"))
        else:
            actions = table.on_ok(d.worker, d.batch_id, tuple(t[::-1] for t in texts))
        for item, result in actions.deliver:
            item.settle(result)
        d = table.next_group(now=0.0)
    assert all(len(v) == 1 for v in sink.got.values()) and len(sink.got) == 51
    failed = [i for i, v in sink.got.items() if isinstance(v[0], ModelError)]
    assert failed == [poison.id]


def test_paid_batch_mates_of_a_failed_batch_run_again_at_once_apart_from_free_inputs() -> None:
    """A free poison in a mixed batch: the paid items' next run holds them alone and is
    answered; only the free ones are bisected."""
    sink, table = Sink(), InFlightTable(bisect_budget=16)
    table.worker_up(WorkerId(1))
    items = [Item(ItemId(i), f"in-{i}", Tier.PAID if i % 2 else Tier.FREE, 0.0, 1e9, sink)
             for i in range(20)]
    poison = items[4].text  # a free input
    d = table.assign(items, now=0.0)
    table.on_error(d.worker, d.batch_id, ModelError("ValueError", "bad"))
    again = table.next_group(now=0.0)
    assert again is not None
    assert set(again.texts) == {i.text for i in items if i.tier is Tier.PAID}
    actions = table.on_ok(again.worker, again.batch_id, tuple(t[::-1] for t in again.texts))
    for item, result in actions.deliver:
        item.settle(result)
    assert sorted(sink.got) == [i.id for i in items if i.tier is Tier.PAID]
    d = table.next_group(now=0.0)
    while d is not None:  # the free half, bisected: only the poison fails
        if poison in d.texts:
            actions = table.on_error(d.worker, d.batch_id, ModelError("ValueError", "bad"))
        else:
            actions = table.on_ok(d.worker, d.batch_id, tuple(t[::-1] for t in d.texts))
        for item, result in actions.deliver:
            item.settle(result)
        d = table.next_group(now=0.0)
    failed = [i for i, v in sink.got.items() if isinstance(v[0], ModelError)]
    assert failed == [items[4].id] and len(sink.got) == 20


def run_all(table: InFlightTable, items: list[Item], fails: Callable[[str], bool]) -> int:
    """Run `items` as one batch and every group bisected from it; the model raises on any
    batch holding an input that `fails`. Returns the number of runs."""
    table.worker_up(WorkerId(1))
    d = table.assign(items, now=0.0)
    runs = 0
    while d is not None:
        runs += 1
        if any(fails(t) for t in d.texts):
            actions = table.on_error(d.worker, d.batch_id, ModelError("ValueError", "no"))
        else:
            actions = table.on_ok(d.worker, d.batch_id, tuple(t[::-1] for t in d.texts))
        for item, result in actions.deliver:
            item.settle(result)
        d = table.next_group(now=0.0)
    return runs


def test_bisection_work_is_bounded_for_a_model_that_always_fails() -> None:
    sink = Sink()
    runs = run_all(InFlightTable(bisect_budget=16), make_items(sink, 0, 100), lambda t: True)
    assert runs <= 1 + 16 + 100  # the budget's halvings, then at most one run per input
    assert len(sink.got) == 100 and all(isinstance(v[0], ModelError) for v in sink.got.values())


@pytest.mark.parametrize("poisoned", [1, 16, 50])
def test_every_innocent_item_is_answered_however_many_inputs_are_poison(poisoned: int) -> None:
    sink = Sink()
    items = make_items(sink, 0, 2 * poisoned)
    bad = {i.text for i in items[::2]}  # interleaved: every other input is poison
    runs = run_all(InFlightTable(bisect_budget=16), items, lambda t: t in bad)
    assert runs <= 1 + 16 + len(items)
    for item in items:
        (result,) = sink.got[item.id]
        if item.text in bad:
            assert isinstance(result, ModelError)
        else:
            assert result == item.text[::-1]


def test_an_input_that_kills_its_worker_is_refused_alone_and_the_rest_answered() -> None:
    sink, table = Sink(), InFlightTable()
    items = make_items(sink, 0, 20)
    killer = items[7]
    workers = iter(range(1, 100))
    table.worker_up(WorkerId(next(workers)))
    d: Dispatch | None = table.assign(items, now=0.0)
    deaths = 0
    while d is not None:
        if killer.text in d.texts:  # os._exit in the model
            deaths += 1
            actions = table.on_worker_died(d.worker)
            table.worker_up(WorkerId(next(workers)))  # its replacement
        else:
            actions = table.on_ok(d.worker, d.batch_id, tuple(t[::-1] for t in d.texts))
        for item, result in actions.deliver:
            item.settle(result)
        # The retry lane, as the batcher cuts it: first, and together.
        d = (table.assign(actions.retry, now=0.0) if actions.retry
             else table.next_group(now=0.0))
    assert isinstance(sink.got[killer.id][0], QueryOfDeath)
    assert all(sink.got[i.id] == [i.text[::-1]] for i in items if i is not killer)
    assert deaths <= 2 + 5 + 1  # once, twice, halvings down to one, and once alone


def test_hung_batches_are_reported_after_their_deadline() -> None:
    sink, table = Sink(), InFlightTable(times=BatchTimes(HangSettings(kill_after=5.0)))
    table.worker_up(WorkerId(1))
    table.assign(make_items(sink, 0, 1), now=10.0)
    assert table.hung(now=14.9) == [] and table.hung(now=15.0) == [WorkerId(1)]
    assert table.hung(now=16.0) == []  # reported once; its death does the rest


def hedging(workers: int) -> InFlightTable:
    """A table that has learned 100 ms batches: stalled ones are hedged after 0.5 s."""
    times = BatchTimes(HangSettings(hedge_floor=0.5, kill_after=5.0))
    for _ in range(MIN_SAMPLES):
        times.observe(0.1, 10)
    table = InFlightTable(times=times)
    for w in range(1, workers + 1):
        table.worker_up(WorkerId(w))
    return table


def answer(table: InFlightTable, d: Dispatch) -> list[tuple[Item, str | BaseException]]:
    actions = table.on_ok(d.worker, d.batch_id, tuple(t[::-1] for t in d.texts), 0.1)
    assert not actions.discarded
    for item, result in actions.deliver:
        item.settle(result)
    return actions.deliver


@pytest.mark.parametrize("first", ["original", "hedge"])
def test_a_stalled_batch_runs_again_elsewhere_and_the_first_answer_wins(first: str) -> None:
    sink, table = Sink(), hedging(2)
    d = table.assign(make_items(sink, 0, 3), now=0.0)
    assert table.hedge(now=0.49) == 0 and table.next_group(now=0.49) is None
    assert table.hedge(now=0.5) == 1
    h = table.next_group(now=0.5)
    assert h is not None and h.worker != d.worker and h.texts == d.texts
    winner, loser = (d, h) if first == "original" else (h, d)
    assert len(answer(table, winner)) == 3
    assert answer(table, loser) == []  # both workers are free again; nothing twice
    assert sink.got == {i: [f"in-{i}"[::-1]] for i in range(3)}
    assert table.idle_count() == 2 and table.statistics().hedges == 1
    assert table.hedge(now=100.0) == 0  # neither copy is hedged again


def test_a_hedge_waiting_for_a_worker_gives_way_to_a_rerun_when_the_original_dies() -> None:
    sink, table = Sink(), hedging(1)
    d = table.assign(make_items(sink, 0, 2), now=0.0)
    table.hedge(now=0.5)
    assert table.next_group(now=0.5) is None  # the only worker is the stalled one
    assert table.hung(now=5.0) == [d.worker]
    died = table.on_worker_died(d.worker)
    assert [i.text for i in died.retry] == list(d.texts) and died.deliver == []
    assert table.statistics().pending_groups == 0  # the hedge is gone: its items died once
    table.requeue(died.retry)
    table.worker_up(WorkerId(2))
    h = table.next_group(now=6.0)
    assert h is not None and h.texts == d.texts
    assert len(answer(table, h)) == 2 and table.next_group(now=6.0) is None


def test_a_failure_of_one_copy_leaves_its_items_to_the_other() -> None:
    sink, table = Sink(), hedging(2)
    items = make_items(sink, 0, 2)
    d = table.assign(items, now=0.0)
    table.hedge(now=0.5)
    h = table.next_group(now=0.5)
    assert h is not None
    failed = table.on_error(d.worker, d.batch_id, ModelError("E", "x"))
    assert failed.deliver == [] and table.statistics().pending_groups == 0  # no bisection
    assert table.on_worker_died(h.worker).retry == items  # the last copy decides


def test_items_that_already_cost_a_worker_are_never_hedged() -> None:
    sink, table = Sink(), hedging(2)
    items = make_items(sink, 0, 2)
    first = table.assign(items, now=0.0)
    assert table.on_worker_died(first.worker).retry == items
    table.assign(items, now=1.0)
    assert table.hedge(now=100.0) == 0


def test_max_attempts_is_validated() -> None:
    with pytest.raises(ValueError):
        InFlightTable(max_attempts=0)


class TableMachine(RuleBasedStateMachine):
    """Random dispatch, answers, model errors, crashes, late answers, hedges of stalled
    batches and cancellations."""

    def __init__(self) -> None:
        super().__init__()
        self.sink = Sink()
        self.table = InFlightTable(max_attempts=MAX_ATTEMPTS, bisect_budget=8,
                                   times=hedging(0).times)
        self.next_worker = 1
        self.next_item = 0
        self.waiting: list[Item] = []  # queued or re-routed, not in flight
        self.in_flight: dict[WorkerId, tuple[BatchId, tuple[str, ...]]] = {}
        self.dead_batches: list[tuple[WorkerId, BatchId, tuple[str, ...]]] = []
        self.all: list[Item] = []

    def _apply(self, actions: object) -> None:
        from failover import Actions

        assert isinstance(actions, Actions)
        for item, result in actions.deliver:
            item.settle(result)
        self.waiting.extend(actions.retry)
        self._start_groups()

    def _start_groups(self) -> None:
        while (d := self.table.next_group(0.0)) is not None:
            self.in_flight[d.worker] = (d.batch_id, d.texts)

    @rule()
    def worker_up(self) -> None:
        self.table.worker_up(WorkerId(self.next_worker))
        self.next_worker += 1
        self._start_groups()

    @rule(n=st.integers(1, 12))
    def arrive(self, n: int) -> None:
        items = make_items(self.sink, self.next_item, n)
        self.next_item += n
        self.waiting.extend(items)
        self.all.extend(items)

    @precondition(lambda self: self.waiting and self.table.idle_count() > 0)
    @rule(n=st.integers(1, 100))
    def dispatch(self, n: int) -> None:
        batch, self.waiting = self.waiting[:n], self.waiting[n:]
        d = self.table.assign(batch, 0.0)
        self.in_flight[d.worker] = (d.batch_id, d.texts)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "error", "short", "crash"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        worker = data.draw(st.sampled_from(sorted(self.in_flight)))
        batch_id, texts = self.in_flight.pop(worker)
        if outcome == "ok":
            self._apply(self.table.on_ok(worker, batch_id, tuple(t[::-1] for t in texts)))
        elif outcome == "short":
            self._apply(self.table.on_ok(worker, batch_id, tuple(t[::-1] for t in texts[1:])))
        elif outcome == "error":
            self._apply(self.table.on_error(worker, batch_id, ModelError("E", "x")))
        else:
            self.dead_batches.append((worker, batch_id, texts))
            self._apply(self.table.on_worker_died(worker))

    @precondition(lambda self: self.in_flight)
    @rule()
    def stall(self) -> None:
        """Time passes the hedge deadline: every batch still running is hedged (once)."""
        self.table.hedge(now=1.0)
        self._start_groups()

    @precondition(lambda self: self.dead_batches)
    @rule(data=st.data())
    def late_answer_from_the_dead(self, data: st.DataObject) -> None:
        worker, batch_id, texts = data.draw(st.sampled_from(self.dead_batches))
        actions = self.table.on_ok(worker, batch_id, tuple(t[::-1] for t in texts))
        assert actions.discarded and not actions.deliver

    @precondition(lambda self: self.all)
    @rule(data=st.data())
    def client_leaves(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(self.all)).cancelled = True

    @invariant()
    def answered_at_most_once_with_its_own_output(self) -> None:
        for item in self.all:
            results = self.sink.got.get(item.id, [])
            assert len(results) <= 1, f"item {item.id} answered twice"
            if results and isinstance(results[0], str):
                assert results[0] == item.text[::-1]
            if results and isinstance(results[0], WorkerCrashed):
                assert item.attempts >= MAX_ATTEMPTS

    @invariant()
    def every_live_item_is_somewhere(self) -> None:
        flying = {t for _, texts in self.in_flight.values() for t in texts}
        grouped = self.table.grouped()
        for item in self.all:
            if item.cancelled or item.id in self.sink.got:
                continue
            placed = item in self.waiting or item.text in flying or item.id in grouped
            assert placed, f"item {item.id} was lost"

    @invariant()
    def one_batch_per_worker(self) -> None:
        stats = self.table.statistics()
        assert stats.busy == stats.in_flight_batches == len(self.in_flight)


TestTableMachine = TableMachine.TestCase


def test_a_culprit_that_leaves_mid_batch_gets_no_batch_mate_blamed() -> None:
    sink, table = Sink(), InFlightTable()
    table.worker_up(WorkerId(1))
    poison, innocent = make_items(sink, 0, 2)
    d = table.assign([poison, innocent], now=0.0)
    poison.cancelled = True  # its client left while the batch ran
    failed = table.on_error(d.worker, d.batch_id, ModelError("ValueError", "poison"))
    assert failed.deliver == []  # one member is missing: the failure convicts nobody
    again = table.next_group(now=0.0)
    assert again is not None and again.texts == (innocent.text,)
    answer(table, again)
    assert sink.got == {innocent.id: [innocent.text[::-1]]}



def test_a_failure_with_every_member_present_still_convicts_the_last_one() -> None:
    sink, table = Sink(), InFlightTable()
    table.worker_up(WorkerId(1))
    left, culprit = make_items(sink, 0, 2)
    left.cancelled = True  # left before the run: it never ran
    d = table.assign([culprit], now=0.0)
    failed = table.on_error(d.worker, d.batch_id, ModelError("ValueError", "poison"))
    assert [(i, type(r)) for i, r in failed.deliver] == [(culprit, ModelError)]



def test_a_killer_that_leaves_mid_batch_is_still_caught_and_its_batch_mate_answered() -> None:
    sink, table = Sink(), InFlightTable()
    killer, innocent = make_items(sink, 0, 2)
    for w in (1, 2):  # crashes once, is re-run together, and its client leaves meanwhile
        table.worker_up(WorkerId(w))
        table.assign([killer, innocent], now=0.0)
        killer.cancelled = w == 2
        died = table.on_worker_died(WorkerId(w))
    assert died.deliver == [] and died.retry == []
    table.worker_up(WorkerId(3))
    first = table.next_group(now=0.0)  # each runs alone, the one whose client left too
    assert first is not None and first.texts == (killer.text,)
    (convicted,) = table.on_worker_died(first.worker).deliver
    assert convicted[0] is killer and isinstance(convicted[1], QueryOfDeath)
    table.worker_up(WorkerId(4))
    alone = table.next_group(now=0.0)
    assert alone is not None and alone.texts == (innocent.text,)
    assert answer(table, alone) == [(innocent, innocent.text[::-1])]


def test_an_input_is_a_query_of_death_only_once_it_crashed_alone() -> None:
    sink, table = Sink(), InFlightTable()
    a, b = make_items(sink, 0, 2)
    b.attempts = 1  # crashed once already, with other inputs
    table.worker_up(WorkerId(1))
    table.assign([a, b], now=0.0)
    a.done = True  # answered meanwhile by a copy of its batch
    died = table.on_worker_died(WorkerId(1))
    assert died.deliver == []  # not alone in that run: run it again alone first
    table.worker_up(WorkerId(2))
    alone = table.next_group(now=0.0)
    assert alone is not None and alone.texts == (b.text,)
    (killed,) = table.on_worker_died(alone.worker).deliver
    assert killed[0] is b and isinstance(killed[1], QueryOfDeath)
