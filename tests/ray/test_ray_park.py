"""Parked actors in the Ray pool, on the real cluster: an actor let go by a switch or a
retire keeps its process, holding what it loaded, until a start of its version wakes it;
bounded in count, the oldest killed first; one that dies is dropped, no death; gone with
the pool."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from gpu_pool import Load, PoolSettings, RayPoolSettings, StartKind
from gpu_pool.ray_pool import RayPool
from tests.gpu_pool.test_pool import asked
from tests.ray.lab import SLOT, Lab, kill_actor
from tests.ray.test_ray_switch import V1, V2, actor_state, answer, running

pytestmark = pytest.mark.anyio
V3 = Load("other@v1", "sim")


def settings(*loads: Load, parked_max: int) -> RayPoolSettings:
    base = PoolSettings(model="sim", workers=len(loads), restart_backoff=0.05, loads=loads,
                        parked_max=parked_max)
    return RayPoolSettings(base, resources={SLOT: 1.0})


async def until(condition: Callable[[], object]) -> None:
    """Until `condition` holds (Ray's records change unannounced: looked at often)."""
    with anyio.fail_after(30):
        while True:
            if condition():
                return
            await anyio.sleep(0.05)


def parked(pool: RayPool) -> list[tuple[Load, int]]:
    return [(load, pid) for load, pid, _ in pool.parked()]


async def test_a_switched_away_actor_parks_and_a_switch_back_wakes_it(lab: Lab) -> None:
    # With one parked at most, the switch back parks V2 beside V1 a moment: V1 is spared,
    # woken, and V2 stays.
    pool = RayPool(settings(V1, parked_max=1))
    async with running(pool, 1) as events:
        (first,) = events.ready
        pid = pool.workers()[0].pid
        assert pid is not None
        pool.switch(first, V2, asked(1))
        await events.wait_for(lambda: len(events.ready) == 2)
        second = events.ready[1]
        assert events.how[second] is StartKind.SPAWN and pool.workers()[0].pid != pid
        assert parked(pool) == [(V1, pid)] and actor_state(pid) == "ALIVE"
        assert pool.start_kind(V1) is StartKind.WAKE and pool.start_kind(V2) is \
            StartKind.SPAWN
        assert await answer(pool, events, second, "ab") == "v2:AB"
        pool.switch(second, V1, asked(2))
        await events.wait_for(lambda: len(events.ready) == 3)
        third = events.ready[2]
        assert events.how[third] is StartKind.WAKE and pool.workers()[0].pid == pid
        assert (events.starts[third], events.held[third]) == (asked(2), "topics@v1")
        assert await answer(pool, events, third, "ab") == "v1:ba"  # what it held, not V2
        assert [load for load, _ in parked(pool)] == [V2]
        assert events.died == [] and pool.crashes == 0
        kill_actor(pid)  # woken, its death is seen (its first claim's sentinel call)
        await events.wait_for(lambda: events.died == [third])


async def test_past_parked_max_the_oldest_parked_actor_is_killed(lab: Lab) -> None:
    pool = RayPool(settings(V1, parked_max=1))
    async with running(pool, 1) as events:
        oldest = pool.workers()[0].pid
        pool.switch(events.ready[-1], V2, asked(1))  # V1 parks
        await events.wait_for(lambda: len(events.ready) == 2)
        newer = pool.workers()[0].pid
        assert newer is not None
        pool.switch(events.ready[-1], V3, asked(2))  # V2 parks: V1, the oldest, goes
        await events.wait_for(lambda: len(events.ready) == 3)
        assert parked(pool) == [(V2, newer)]
        await until(lambda: actor_state(oldest) == "DEAD")
        assert pool.start_kind(V1) is StartKind.SPAWN  # nothing of it left to wake
        kill_actor(newer)  # a parked actor that dies is dropped: no death, not woken
        await until(lambda: not pool.parked())
        assert pool.start_kind(V2) is StartKind.SPAWN
        assert events.died == [] and pool.crashes == 0


async def test_a_retired_actor_parks_a_worker_added_wakes_it_and_none_outlives_the_pool(
    lab: Lab,
) -> None:
    pool = RayPool(settings(V1, V2, parked_max=2))
    async with running(pool, 2) as events:
        by_version = {events.held[w]: w for w in events.ready}
        pids = {w.version: w.pid for w in pool.workers()}
        pool.retire(by_version["topics@v2"])
        await until(lambda: len(pool.workers()) == 1)
        assert parked(pool) == [(V2, pids["topics@v2"])]
        pool.add(V2, asked(1))
        await events.wait_for(lambda: len(events.ready) == 3)
        woken = events.ready[-1]
        assert events.how[woken] is StartKind.WAKE and pool.parked() == []
        assert await answer(pool, events, woken, "x") == "v2:X"
        pool.switch(woken, V3, asked(2))  # it parks again
        await events.wait_for(lambda: len(events.ready) == 4)
        left = [pid for _, pid in parked(pool)]
        assert left == [pids["topics@v2"]]
    await until(lambda: all(actor_state(pid) == "DEAD" for pid in left))
    assert pool.parked() == []
