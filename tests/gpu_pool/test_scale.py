"""The process pool grows and shrinks while it serves (issue 26): workers added come up and
answer; a retired one exits and is gone, never reported dead; a start taken back is ended
and never comes up; a new worker whose model fails to load dies and is retried with backoff;
each new worker is pinned to a device no other slot holds. Real spawned workers."""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
import pytest

from gpu_pool import BatchId, Load, PoolSettings, Run, WorkerConfig, WorkerId, WorkerPool
from tests.gpu_pool.test_pool import Events, asked, running_pool
from tests.gpu_pool.test_switch import alive, answer

pytestmark = pytest.mark.anyio
SIM = Load("default@v1", "sim", latency_floor=0.0)
SLOW = Load("slow@v2", "tests.models_slow:v2")  # takes `LOAD_S` to load
BROKEN = Load("broken@v1", "tests.crash_on_import:batchstring")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Spawns:
    """The spawn context, noting each new worker's config and process, and setting
    `started` (a thread's event: the pool starts processes in a thread) once one runs."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.configs: list[WorkerConfig] = []
        self.processes: list[Any] = []
        self.started = threading.Event()

    def Pipe(self) -> Any:  # multiprocessing's name
        return self.ctx.Pipe()

    def Process(self, *args: Any, **kwargs: Any) -> Any:
        self.configs.append(kwargs["args"][1])
        process = self.ctx.Process(*args, **kwargs)
        start = process.start

        def started() -> None:
            del process.start  # the child gets the process pickled: no closure in it
            start()
            self.started.set()

        process.start = started
        self.processes.append(process)
        return process


def watch_spawns(pool: WorkerPool) -> Spawns:
    spawns = Spawns(pool._ctx)
    pool._ctx = spawns  # type: ignore[assignment]
    return spawns


async def gone(pool: WorkerPool, slot: int) -> None:
    """Wait until slot `slot` has left what the pool reports."""
    with anyio.fail_after(20):
        while any(w.slot == slot for w in pool.workers()):
            await pool._slots.changed().wait()


def pid_of(pool: WorkerPool, worker: WorkerId) -> int:
    (pid,) = [w.pid for w in pool.workers() if w.id == worker]
    assert pid is not None
    return pid


async def test_workers_added_come_up_in_new_slots_and_answer() -> None:
    async with running_pool("sim") as (pool, events):
        pool.add(SIM, asked(1))
        pool.add(SIM, asked(2))
        assert pool.state_counts()["starting"] == 2 and len(pool.workers()) == 3
        await events.wait_for(lambda: len(events.ready) == 3)
        assert sorted(w.slot for w in pool.workers()) == [0, 1, 2]
        assert pool.ready_count() == 3 and len(set(events.ready)) == 3
        for worker in events.ready[1:]:
            assert await answer(pool, events, worker, "abc") == "cba"
        assert events.died == [] and pool.crashes == 0


async def test_workers_added_come_up_for_the_starts_the_core_gave_and_stay() -> None:
    async with running_pool("sim") as (pool, events):
        pool.add(SIM, asked(1))
        pool.add(SIM, asked(2))
        await events.wait_for(lambda: len(events.ready) == 3)
        assert {w.slot: events.starts[WorkerId(w.id)] for w in pool.workers()
                if w.slot > 0} == {1: asked(1), 2: asked(2)}
        assert not pool.cancel_start(asked(1))  # up: nothing to take back
        assert pool.ready_count() == 3 and pool.state_counts()["stopped"] == 0


async def test_a_retired_worker_exits_its_slot_is_removed_and_no_death_is_reported() -> None:
    async with running_pool("sim", workers=2) as (pool, events):
        first, second = events.ready
        pid = pid_of(pool, second)
        slot = next(w.slot for w in pool.workers() if w.id == second)
        pool.retire(second)
        assert pool.ready_count() == 1 and pool.state_counts()["stopped"] == 1
        await gone(pool, slot)
        assert not alive(pid) and [w.id for w in pool.workers()] == [first]
        assert await answer(pool, events, first, "ab") == "ba"
        assert events.died == [] and pool.crashes == 0 and pool.pids == [pid_of(pool, first)]


async def test_a_busy_or_unknown_worker_is_not_retired() -> None:
    async with running_pool("sim") as (pool, events):
        (worker,) = events.ready
        pool.retire(WorkerId(999))
        pool.send(worker, Run(BatchId(1), ("abc",)))
        pool.retire(worker)  # busy
        await events.wait_for(lambda: events.replies)
        assert [w.id for w in pool.workers()] == [worker] and pool.ready_count() == 1
        assert await answer(pool, events, worker, "ab") == "ba"


async def test_a_start_taken_back_while_it_loads_is_killed_and_never_comes_up() -> None:
    async with running_pool("sim", launcher=False) as (pool, events):
        spawns = watch_spawns(pool)
        pool.add(SLOW, asked(1))
        assert await anyio.to_thread.run_sync(spawns.started.wait, 10)
        pid = spawns.processes[0].pid
        assert pool.cancel_start(asked(1))  # while it loads, its pipe watched or not yet
        await gone(pool, 1)
        assert not alive(pid) and not pool.cancel_start(asked(1))
        assert len(events.ready) == 1 and events.died == [] and pool.crashes == 0


async def test_a_start_taken_back_before_its_spawn_never_spawns() -> None:
    async with running_pool("sim", launcher=False) as (pool, events):
        spawns = watch_spawns(pool)
        pool.add(SLOW, asked(1))
        assert pool.cancel_start(asked(1))
        await gone(pool, 1)
        pool.add(SIM, asked(2))  # spawned after any spawn the first could have made
        await events.wait_for(lambda: len(events.ready) == 2)
        assert [c.version for c in spawns.configs] == ["default@v1"]
        assert events.died == [] and [w.slot for w in pool.workers()] == [0, 2]


async def test_the_start_taken_back_is_the_one_named_not_another_of_its_version() -> None:
    async with running_pool("sim") as (pool, events):
        pool.add(SLOW, asked(1))
        pool.add(SLOW, asked(2))
        assert pool.cancel_start(asked(1))
        await gone(pool, 1)
        await events.wait_for(lambda: len(events.ready) == 2)
        assert events.starts[events.ready[1]] == asked(2)
        assert [w.slot for w in pool.workers()] == [0, 2] and events.died == []


async def test_a_new_worker_that_fails_to_load_dies_is_retried_then_taken_back() -> None:
    async with running_pool("sim") as (pool, events):
        pool.add(BROKEN, asked(1))
        with anyio.fail_after(20):
            while len(events.died) < 3:
                await events.changed.wait()
        assert all(events.version_of(w) == "broken@v1" for w in events.died)
        broken = pool._slots[1]
        assert broken.restarts >= 2 and broken.failures >= 3 and len(events.ready) == 1
        assert pool.cancel_start(asked(1))
        await gone(pool, 1)
        deaths = len(events.died)
        # A start asked after it: were the broken one restarted, it would die first.
        pool.add(SIM, asked(2))
        await events.wait_for(lambda: len(events.ready) == 2)
        assert len(events.died) == deaths and pool.crashes == deaths


async def test_a_new_worker_is_pinned_to_the_lowest_device_no_slot_holds() -> None:
    events = Events()
    pool = WorkerPool(PoolSettings(model="sim", workers=2, gpus=3, latency_floor=0.0,
                                   launcher=False))
    spawns = watch_spawns(pool)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) == 2)
        pool.add(SIM, asked(1))
        await events.wait_for(lambda: len(events.ready) == 3)
        (first,) = [w.id for w in pool.workers() if w.slot == 0]
        pool.retire(WorkerId(first))  # device 0
        await gone(pool, 0)
        pool.add(SIM, asked(2))
        await events.wait_for(lambda: len(events.ready) == 4)
        tg.cancel_scope.cancel()
    assert [c.gpu for c in spawns.configs] == [0, 1, 2, 0]
    cpus = os.cpu_count() or 1
    assert [c.threads for c in spawns.configs] == [max(1, cpus // n) for n in (2, 2, 3, 3)]


@pytest.mark.parametrize("when", ["before_its_spawn", "while_it_loads"])
async def test_a_worker_being_replaced_for_its_memory_retires_too(when: str) -> None:
    # Over the bound after every batch: replaced as its answer comes, which the core sees
    # idle. Retired then, the replacement is never spawned, or is killed as it loads.
    leaky = Load("leak@v1", "tests.models:leak")
    async with running_pool("sim", workers=2, max_rss_mb=1, loads=(SIM, leaky),
                            launcher=False) as (
            pool, events):
        (worker,) = [w.id for w in pool.workers() if w.version == "leak@v1"]
        spawns = watch_spawns(pool)
        assert await answer(pool, events, WorkerId(worker), "a") == "a"
        if when == "while_it_loads":
            assert await anyio.to_thread.run_sync(spawns.started.wait, 10)
        else:
            assert spawns.configs == []
        pool.retire(WorkerId(worker))
        await gone(pool, 1)
        assert len(spawns.processes) == (when == "while_it_loads")
        assert all(not alive(p.pid) for p in spawns.processes)
        assert events.died == [] and pool.crashes == 0 and len(events.ready) == 2
