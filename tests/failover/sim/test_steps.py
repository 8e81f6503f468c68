"""Virtual time in steps, and the contract pool as a test directs it: tasks stay pending
between steps, a step runs everything due up to its instant and no further, a failing task
fails the step that ran it; the pool holds what its workers finish until let go, ends one
now, and hears a death now or later, keeping the seam's order of events."""

from __future__ import annotations

from functools import partial

import anyio
import pytest
from anyio.abc import TaskStatus

from batcher.shared import Backoff
from failover.sim import DirectedPool, Steps, VirtualTimeError
from gpu_pool import BatchId as B
from gpu_pool import Load, Ok, Origin, Run, StartId, WorkerId
from tests.failover.sim.test_pool import FAST, LOAD_S, Heard


def test_a_task_stays_pending_between_steps_and_each_step_stops_at_its_instant() -> None:
    woke: list[float] = []

    async def ticker(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await anyio.sleep(1.0)
            woke.append(anyio.current_time())

    steps = Steps()
    steps.start(ticker)
    steps.advance(2.5)
    assert woke == [1.0, 2.0] and steps.now == 2.5
    assert steps.call(anyio.current_time) == 2.5  # inside the loop, at the same instant
    steps.advance(3.0)
    assert woke == [1.0, 2.0, 3.0] and steps.now == 3.0
    steps.close()


def test_a_task_that_fails_fails_the_step_with_its_own_error() -> None:
    async def failing(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep(1.0)
        raise LookupError("broken")

    steps = Steps()
    steps.start(failing)
    with pytest.raises(LookupError, match="broken"):
        steps.advance(2.0)
    steps.close()


def test_a_task_ready_again_and_again_at_one_instant_is_an_error_not_a_hang() -> None:
    async def spinning(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await anyio.lowlevel.checkpoint()

    steps = Steps()
    with pytest.raises(VirtualTimeError, match="spins"):
        steps.start(spinning)
    steps.close()


def directed() -> tuple[Steps, DirectedPool, Heard]:
    steps, heard = Steps(), Heard()
    pool = DirectedPool([FAST, FAST], LOAD_S.__getitem__, Backoff(first=1.0))
    pool.hold()
    steps.start(partial(pool.run, heard))
    return steps, pool, heard


def test_held_the_pool_ends_a_load_or_a_batch_only_when_told() -> None:
    steps, pool, heard = directed()
    steps.advance(10.0)
    assert heard.events == []  # both loads came due at 2: held
    steps.call(lambda: pool.load_done(1))
    assert heard.of("ready") == [(10.0, "ready", 2, StartId(Origin.FIRST, 1), "fast@v1")]
    steps.call(lambda: pool.send(WorkerId(2), Run(B(1), ("x",))))
    steps.advance(11.0)
    assert heard.of("reply") == []  # due at 10.1: held
    steps.call(pool.let_go)  # everything held ends now, then on time
    assert [e[:3] for e in heard.events[1:]] == [(11.0, "ready", 1), (11.0, "reply", 2)]
    steps.call(lambda: pool.send(WorkerId(2), Run(B(2), ("y",))))
    steps.advance(12.0)
    assert heard.of("reply")[-1] == (11.1, "reply", 2, Ok(B(2), ("y",), 0.1), None)
    steps.close()


def test_a_death_heard_later_is_reported_then_and_restarts_its_slot_from_then() -> None:
    steps, pool, heard = directed()
    steps.call(lambda: [pool.load_done(0), pool.load_done(1)])
    steps.call(lambda: pool.die(WorkerId(1), heard=False))
    steps.call(lambda: pool.send(WorkerId(1), Run(B(1), ("x",))))  # lost: nothing raised
    steps.advance(5.0)
    assert heard.of("died") == [] and pool.unheard() == [WorkerId(1)]
    steps.call(pool.hear)
    assert heard.of("died") == [(5.0, "died", 1, "fast@v1", StartId(Origin.RESTART, 1))]
    steps.call(pool.let_go)
    steps.advance(9.0)  # the backoff (1 s) from the report, then the load (2 s)
    assert heard.of("ready")[-1] == (8.0, "ready", 3, StartId(Origin.RESTART, 1), "fast@v1")
    steps.close()


def test_a_batch_sent_to_a_worker_the_core_switched_away_breaks_the_contract() -> None:
    steps, pool, _ = directed()
    steps.call(lambda: [pool.load_done(0), pool.load_done(1)])
    steps.call(lambda: pool.switch(WorkerId(1), Load("slow@v1", "sim", 0.3),
                                   StartId(Origin.CORE, 1)))
    with pytest.raises(RuntimeError, match="switched away"):
        steps.call(lambda: pool.send(WorkerId(1), Run(B(1), ("x",))))
    with pytest.raises(RuntimeError, match="never started"):
        steps.call(lambda: pool.send(WorkerId(9), Run(B(2), ("x",))))
    steps.close()
