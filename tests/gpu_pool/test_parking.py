"""Parked workers (real processes, real time): a worker let go by a switch or a retire keeps
its process, holding what it loaded, until a start of its version wakes it; bounded in
count and in host memory, the oldest given up first; gone with the pool."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import anyio
import pytest

from gpu_pool import Load, StartKind, WorkerId, WorkerPool, stat_of
from tests.gpu_pool.test_launcher import pid_of
from tests.gpu_pool.test_pool import Events, asked, running_pool
from tests.gpu_pool.test_scale import gone
from tests.gpu_pool.test_switch import alive, answer

pytestmark = pytest.mark.anyio
V1 = Load("topics@v1", "tests.models_versions:v1", 0.0)
V2 = Load("topics@v2", "tests.models_versions:v2", 0.0)
V3 = Load("other@v1", "sim", 0.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def until(pool: WorkerPool, condition: Callable[[], object]) -> None:
    """Until `condition` holds, looked at whenever what is parked changes."""
    with anyio.fail_after(30):
        while not condition():
            await pool.parking().wait()


def settled(pool: WorkerPool) -> bool:
    """Every parked worker said it parked (its memory measured)."""
    return bool(pool.parked()) and all(rss is not None for _, _, rss in pool.parked())


async def switched(pool: WorkerPool, events: Events, load: Load, number: int) -> WorkerId:
    """Switch the newest worker to `load`; the worker that comes up for it."""
    pool.switch(events.ready[-1], load, asked(number))
    await events.wait_for(lambda: events.starts.get(events.ready[-1]) == asked(number))
    return events.ready[-1]


@pytest.mark.parametrize("parked_max", [1, 2])
async def test_a_worker_switched_away_parks_and_a_switch_back_wakes_it(parked_max: int) -> None:
    # With one parked at most, the switch back parks V2 beside V1 a moment: V1 is spared,
    # woken, and V2 stays.
    async with running_pool("sim", loads=(V1,), parked_max=parked_max) as (pool, events):
        (first,) = events.ready
        pid = pid_of(pool, first)
        second = await switched(pool, events, V2, 1)
        assert events.how[second] is StartKind.FORK and pid_of(pool, second) != pid
        assert [(load, parked) for load, parked, _ in pool.parked()] == [(V1, pid)]
        assert pool.start_kind(V1) is StartKind.WAKE and pool.start_kind(V2) is \
            StartKind.FORK
        assert await answer(pool, events, second, "ab") == "v2:AB"
        third = await switched(pool, events, V1, 2)
        assert events.how[third] is StartKind.WAKE and pid_of(pool, third) == pid
        assert await answer(pool, events, third, "ab") == "v1:ba"  # what it held, not V2
        assert [load for load, _, _ in pool.parked()] == [V2]
        assert events.died == [] and pool.crashes == 0


async def test_a_retired_worker_parks_and_a_worker_added_for_its_version_wakes_it() -> None:
    async with running_pool("sim", workers=2, loads=(V1, V2), parked_max=1) as (pool, events):
        by_version = {events.held[w]: w for w in events.ready}
        pid = pid_of(pool, by_version["topics@v2"])
        slot = next(w.slot for w in pool.workers() if w.id == by_version["topics@v2"])
        pool.retire(by_version["topics@v2"])
        await until(pool, lambda: settled(pool))
        await gone(pool, slot)
        assert pool.ready_count() == 1 and [w.version for w in pool.workers()] == \
            ["topics@v1"]
        pool.add(V2, asked(1))
        await events.wait_for(lambda: len(events.ready) == 3)
        woken = events.ready[-1]
        assert events.how[woken] is StartKind.WAKE and pid_of(pool, woken) == pid
        assert await answer(pool, events, woken, "x") == "v2:X"


async def test_past_parked_max_the_oldest_parked_exits() -> None:
    async with running_pool("sim", loads=(V1,), parked_max=1) as (pool, events):
        oldest = pid_of(pool, events.ready[0])
        await switched(pool, events, V2, 1)  # V1 parks
        newer = pid_of(pool, events.ready[-1])
        await switched(pool, events, V3, 2)  # V2 parks: V1, the oldest, goes
        assert [(load, pid) for load, pid, _ in pool.parked()] == [(V2, newer)]
        await until(pool, lambda: not alive(oldest))
        assert pool.start_kind(V1) is StartKind.FORK  # nothing of it left to wake


async def test_past_the_host_memory_budget_the_parked_exits() -> None:
    async with running_pool("sim", loads=(V1,), parked_max=4, parked_ram_mb=1) as (
            pool, events):
        pid = pid_of(pool, events.ready[0])
        await switched(pool, events, V2, 1)
        # It said it parked, holding more than 1 MiB: given up at once.
        await until(pool, lambda: not pool.parked() and not alive(pid))


async def test_a_parked_worker_that_dies_is_no_death_and_is_not_woken() -> None:
    async with running_pool("sim", loads=(V1,), parked_max=2) as (pool, events):
        pid = pid_of(pool, events.ready[0])
        await switched(pool, events, V2, 1)
        await until(pool, lambda: settled(pool))
        os.kill(pid, signal.SIGKILL)
        await until(pool, lambda: not pool.parked())
        back = await switched(pool, events, V1, 2)
        assert events.how[back] is StartKind.FORK and pid_of(pool, back) != pid
        assert events.died == [] and pool.crashes == 0


async def test_parked_workers_end_with_the_pool() -> None:
    async with running_pool("sim", loads=(V1,), parked_max=2) as (pool, events):
        await switched(pool, events, V2, 1)
        parked = [pid for _, pid, _ in pool.parked()]
        assert len(parked) == 1
    assert all(stat_of(pid) is None for pid in parked)  # exited and reaped


async def test_without_parking_a_switched_worker_exits() -> None:
    async with running_pool("sim", loads=(V1,)) as (pool, events):
        pid = pid_of(pool, events.ready[0])
        await switched(pool, events, V2, 1)
        assert pool.parked() == [] and not alive(pid)
