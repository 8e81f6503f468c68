"""The batching loop against a fake pool, in exact virtual time, over random schedules."""

from __future__ import annotations

import math
from dataclasses import dataclass

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import (
    Batcher,
    Closed,
    DeadlineExceeded,
    FlushPolicy,
    FlushReason,
    Item,
    ItemId,
    LoopClock,
    Tier,
    TierQueues,
)
from tests.batcher.fakes import FakeWorkers, Recorder
from tests.virtual import run_virtual

LATENCY = 0.1


@dataclass
class Arrival:
    gap: float
    tier: Tier
    inputs: int
    timeout: float


@dataclass
class Run:
    items: list[Item]
    workers: FakeWorkers
    recorder: Recorder
    cut_seen: list[int]  # for each cut, how many items had arrived when it was cut


def simulate(
    arrivals: list[Arrival], workers: int, max_wait: float, idle_trigger: bool = True
) -> Run:
    async def main() -> Run:
        clock = LoopClock()
        fake = FakeWorkers(workers, LATENCY, clock)
        policy = FlushPolicy(max_batch=100, max_wait=max_wait, idle_trigger=idle_trigger)
        batcher = Batcher(TierQueues({Tier.PAID: 10**6, Tier.FREE: 10**6}), policy, clock, fake)
        fake.batcher = batcher
        recorder = Recorder(clock)
        items: list[Item] = []
        cut_seen: list[int] = []
        submit = fake.submit

        def spy(batch: list[Item], reason: FlushReason) -> None:
            cut_seen.append(len(items))
            submit(batch, reason)

        fake.submit = spy  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            fake.tg = tg
            await tg.start(batcher.run)
            for a in arrivals:
                await anyio.sleep(a.gap)
                now = clock.now()
                for k in range(a.inputs):
                    n = len(items)
                    it = Item(ItemId(n), f"in-{n}", a.tier, now, now + a.timeout, recorder, k)
                    items.append(it)
                    batcher.put_nowait(it)
            await anyio.sleep(1.0)  # virtual: let the schedule play out before draining
            batcher.drain()
        return Run(items, fake, recorder, cut_seen)

    return run_virtual(main)


arrivals = st.lists(
    st.builds(
        Arrival,
        gap=st.floats(0, 0.02),
        tier=st.sampled_from(Tier),
        inputs=st.integers(1, 25),
        timeout=st.sampled_from([0.15, 0.5, 10.0]),
    ),
    max_size=120,
)


def idle_at(run: Run, t: float) -> int:
    idle = run.workers.count
    for when, n in run.workers.idle_log:
        if when > t:
            break
        idle = n
    return idle


@settings(max_examples=150, deadline=None)
@given(arrivals, st.integers(1, 12), st.sampled_from([0.0, 0.01, 0.05]), st.booleans())
def test_invariants_hold_over_random_schedules(
    schedule: list[Arrival], workers: int, max_wait: float, idle_trigger: bool
) -> None:
    run = simulate(schedule, workers, max_wait, idle_trigger)
    # Every item answered exactly once: its own output, or a deadline error when it was due.
    for it in run.items:
        results = run.recorder.results.get(it.id, [])
        assert len(results) == 1, f"item {it.id} answered {len(results)} times"
        at, result = results[0]
        if isinstance(result, DeadlineExceeded):
            assert at >= it.deadline
        else:
            assert result == it.text[::-1]
    # No batch is empty or larger than max_batch; no worker ever held two (asserted in fake).
    assert all(1 <= len(c.items) <= 100 for c in run.workers.cuts)
    # Higher tiers never wait behind lower ones; FIFO within a tier.
    position = {i.id: (n, k) for n, c in enumerate(run.workers.cuts) for k, i in enumerate(c.items)}
    for n, cut in enumerate(run.workers.cuts):
        if any(i.tier is Tier.FREE for i in cut.items):
            for it in run.items[: run.cut_seen[n]]:
                if it.tier is Tier.PAID and it.id not in position:
                    continue  # expired in the queue, never ran
                if it.tier is Tier.PAID:
                    assert position[it.id][0] <= n, "a paid item waited behind free work"
    for tier in Tier:
        order = [position[i.id] for i in run.items if i.tier is tier and i.id in position]
        assert order == sorted(order), f"{tier.name} items left out of arrival order"
    # With a worker free, nobody waits longer than max_wait.
    for it in run.items:
        if it.id in position and it.dispatched - it.enqueued > max_wait + 1e-9:
            start = it.enqueued + max_wait
            log = run.workers.idle_log
            checkpoints = [start] + [t for t, _ in log if start < t < it.dispatched]
            assert all(idle_at(run, t) == 0 for t in checkpoints), "waited with a worker free"


def test_single_worker_waits_for_max_wait_then_flushes() -> None:
    run = simulate([Arrival(0.0, Tier.FREE, 3, 10.0)], workers=1, max_wait=0.05)
    (cut,) = run.workers.cuts
    assert cut.reason is FlushReason.TIMEOUT
    assert math.isclose(cut.at, run.items[0].enqueued + 0.05)


def test_spare_workers_flush_at_once() -> None:
    run = simulate([Arrival(0.0, Tier.FREE, 1, 10.0)], workers=4, max_wait=0.05)
    (cut,) = run.workers.cuts
    assert cut.reason is FlushReason.IDLE and cut.at == run.items[0].enqueued


def test_a_full_queue_flushes_without_waiting() -> None:
    run = simulate([Arrival(0.0, Tier.FREE, 8, 10.0)] * 13, workers=1, max_wait=0.05)
    assert run.workers.cuts[0].reason is FlushReason.FULL
    assert len(run.workers.cuts[0].items) == 100


def test_busy_pool_fills_batches_instead_of_cutting_on_the_timer() -> None:
    # 1,000 items/s on one worker: late binding gives one batch per 100 ms run, not 20 a second.
    schedule = [Arrival(0.001, Tier.FREE, 1, 10.0) for _ in range(1000)]
    run = simulate(schedule, workers=1, max_wait=0.05)
    sizes = [len(c.items) for c in run.workers.cuts]
    assert len(sizes) <= 12 and sum(sizes) == 1000


def test_paid_items_take_the_next_batch_ahead_of_an_older_free_backlog() -> None:
    schedule = [Arrival(0.0, Tier.FREE, 100, 10.0)] + [Arrival(0.001, Tier.FREE, 25, 10.0)] * 8
    schedule += [Arrival(0.001, Tier.PAID, 10, 10.0)]
    run = simulate(schedule, workers=1, max_wait=0.05)
    second = run.workers.cuts[1].items
    assert [i.tier for i in second[:10]] == [Tier.PAID] * 10


def test_items_past_their_deadline_never_reach_a_worker() -> None:
    schedule = [Arrival(0.0, Tier.FREE, 100, 10.0), Arrival(0.0, Tier.FREE, 1, 0.05)]
    run = simulate(schedule, workers=1, max_wait=0.0)
    late = run.items[-1]
    assert all(late not in c.items for c in run.workers.cuts)
    assert isinstance(run.recorder.results[late.id][0][1], DeadlineExceeded)


def test_draining_refuses_new_items() -> None:
    async def main() -> None:
        clock = LoopClock()
        fake = FakeWorkers(1, LATENCY, clock)
        batcher = Batcher(TierQueues({Tier.PAID: 1, Tier.FREE: 1}), FlushPolicy(), clock, fake)
        batcher.drain()
        try:
            batcher.put_nowait(Item(ItemId(1), "x", Tier.FREE, 0.0, 1.0, Recorder(clock)))
        except Closed:
            return
        raise AssertionError("a draining batcher accepted an item")

    run_virtual(main)
