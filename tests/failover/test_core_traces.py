"""A traced request's batch attempts, as the dispatch core records them, in exact virtual
time (the core reads no clock: each event carries the time it happens at)."""

from __future__ import annotations

from batcher import FlushPolicy, Item, ItemId, Tier
from batcher.tracing import (
    ANSWERED,
    BATCH,
    HEDGE,
    RERAN,
    RERUN,
    TWIN_ANSWERED,
    RequestTrace,
    TraceParent,
    parse_traceparent,
)
from failover import BatchTimes, CoreActions, CoreSettings, HangSettings, build_core
from failover.core import DispatchCore
from failover.hang import REFRESH
from gpu_pool import Ok, Run, WorkerId
from tests.failover.fleet.test_stages import World, catalogue

PARENT = TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7)
W1, W2 = WorkerId(1), WorkerId(2)


class Sink:
    def item_done(self, item: Item, result: str | BaseException) -> None:
        raise AssertionError("the core's owner settles items, never the core")


def core(hedge: bool = False) -> DispatchCore:
    hang = HangSettings(hedge=hedge, hedge_floor=0.3, kill_after=60.0)
    times = BatchTimes(hang)
    for _ in range(REFRESH):  # as if many batches had run: a stalled one is hedged at 0.3 s
        times.observe(0.1, 6)
    return build_core(CoreSettings(
        budgets=dict.fromkeys(Tier, 10.0), policy=FlushPolicy(max_batch=10, max_wait=0.05),
        hang=hang), times=times)


def item(n: int, sink: Sink, trace: RequestTrace | None) -> Item:
    return Item(ItemId(n), f"text-{n}", Tier.PAID, 0.0, 30.0, sink, trace=trace)


def runs(actions: CoreActions) -> dict[WorkerId, Run]:
    return {send.worker: send.run for send in actions.send}


def test_a_traced_items_two_attempts_name_both_workers_when_the_first_dies() -> None:
    c, sink, trace = core(), Sink(), RequestTrace(PARENT, 0.0, 0.0)
    c.worker_ready(W1, 0.0)
    c.admit([item(1, sink, trace), item(2, sink, None)], 30.0, 0.0)
    (worker, first), = runs(c.poll(0.05)).items()
    c.worker_ready(W2 if worker == W1 else W1, 0.06)
    survivor = W2 if worker == W1 else W1
    again = runs(c.worker_died(worker, 0.08))[survivor]
    answered = c.reply(survivor, Ok(again.batch_id, ("a", "b"), 0.1), 0.2, 0.2).settle
    assert [(i.id, output) for i, output in answered] == [(1, "a"), (2, "b")]
    trace.settled(0.2, ANSWERED)
    attempts = trace.in_order()
    assert [(a.worker, a.kind, a.size, a.outcome) for a in attempts] == [
        (worker, BATCH, 2, RERAN), (survivor, RERUN, 2, ANSWERED)]
    assert (attempts[0].start, attempts[0].end, attempts[1].start) == (0.05, 0.08, 0.08)
    assert [a.batch_id for a in attempts] == [first.batch_id, again.batch_id]


def test_each_run_carries_its_attempts_traceparent_and_none_when_nothing_is_traced() -> None:
    c, sink, trace = core(), Sink(), RequestTrace(PARENT, 0.0, 0.0)
    c.worker_ready(W1, 0.0)
    c.admit([item(1, sink, None)], 30.0, 0.0)
    (plain,) = runs(c.poll(0.05)).values()
    assert plain.traces is None
    c.worker_ready(W2, 0.06)
    c.admit([item(2, sink, trace), item(3, sink, trace)], 30.0, 0.06)
    (traced,) = runs(c.poll(0.11)).values()
    assert traced.traces is not None and len(traced.traces) == 1  # one request, one attempt
    (attempt,) = trace.attempts.values()
    assert parse_traceparent(traced.traces[0]) == TraceParent(PARENT.trace_id, attempt.span_id)


def test_a_hedged_batch_is_a_second_attempt_beside_its_open_twin() -> None:
    c, sink, trace = core(hedge=True), Sink(), RequestTrace(PARENT, 0.0, 0.0)
    c.worker_ready(W1, 0.0)
    c.worker_ready(W2, 0.0)
    c.admit([item(1, sink, trace)], 30.0, 0.0)
    (worker,) = runs(c.poll(0.0))
    (twin, hedge), = runs(c.poll(c.next_deadline())).items()
    assert twin != worker and [a.kind for a in trace.in_order()] == [BATCH, HEDGE]
    assert trace.in_order()[0].open
    c.reply(twin, Ok(hedge.batch_id, ("h",), 0.1), 1.0, 1.0)
    trace.settled(1.0, ANSWERED)
    assert [a.outcome for a in trace.in_order()] == [TWIN_ANSWERED, ANSWERED]


def test_a_guarded_inputs_stage_batches_are_attempts_of_its_request() -> None:
    world, trace = World(catalogue()), RequestTrace(PARENT, 0.0, 0.0)
    try:
        now, version = world.steps.now, world.cores.resolve("topics", None)
        item = Item(ItemId(1), "a", Tier.PAID, now, now + 5.0, world, version=version,
                    trace=trace)
        world.steps.call(lambda: world.owner.admit([item], 5.0))
        world.run(2.0)
    finally:
        world.steps.close()
    assert world.answers([item]) == ["out:a"]
    trace.settled(world.steps.now, ANSWERED)
    assert [(a.model, a.kind, a.outcome) for a in trace.in_order()] == [
        ("safety@v1", BATCH, ANSWERED), ("topics@v1", BATCH, ANSWERED)]
