"""Slots holding different versions, and a switch while serving, in the Ray pool (issue 25),
on the real cluster: two versions of a test model (`tests.models_versions`) that answer
differently; a switch retires the idle actor and starts one holding the other version
under a new id, never reporting a death; a cell's successor core claims a switched actor
and knows which version it holds."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

import ray

from gpu_pool import BatchId, CellIdentity, Load, Ok, PoolSettings, RayPoolSettings, Run, WorkerId
from gpu_pool.ray_pool import RayPool
from tests.gpu_pool.test_pool import Events, asked
from tests.ray.lab import SLOT, Lab

pytestmark = pytest.mark.anyio
V1 = Load("topics@v1", "tests.models_versions:v1")
V2 = Load("topics@v2", "tests.models_versions:v2")
CRASHES = Load("broken@v1", "tests.crash_on_import:batchstring")
SWITCH = asked(1)  # the start of the one switch a test asks for


def settings(*loads: Load, max_rss_mb: int | None = None, **kw: Any) -> RayPoolSettings:
    base = PoolSettings(model="sim", workers=len(loads), restart_backoff=0.05, loads=loads,
                        max_rss_mb=max_rss_mb)
    return RayPoolSettings(base, resources={SLOT: 1.0}, **kw)


@asynccontextmanager
async def running(pool: RayPool, workers: int) -> AsyncIterator[Events]:
    events = Events()
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) >= workers)
        yield events
        tg.cancel_scope.cancel()


async def answer(pool: RayPool, events: Events, worker: WorkerId, text: str) -> str:
    batch = BatchId(len(events.replies) + 1)
    pool.send(worker, Run(batch, (text,)))
    await events.wait_for(lambda: any(r.batch_id == batch for _, r in events.replies))
    (reply,) = [r for _, r in events.replies if r.batch_id == batch]
    assert isinstance(reply, Ok)
    return reply.outputs[0]


def actor_record(pid: int | None) -> dict[str, Any]:
    """Ray's record of the actor whose process was `pid` (State, StartTime, EndTime...)."""
    records: list[dict[str, Any]] = [
        a for a in ray._private.state.actors().values() if a["Pid"] == pid]
    (record,) = records
    return record


def actor_state(pid: int | None) -> str:
    return str(actor_record(pid)["State"])


async def test_each_actor_starts_with_its_slots_version_and_answers_from_it(lab: Lab) -> None:
    pool = RayPool(settings(V1, V2))
    async with running(pool, 2) as events:
        by_version = {events.version_of(w): w for w in events.ready}
        assert set(by_version) == {"topics@v1", "topics@v2"}
        assert await answer(pool, events, by_version["topics@v1"], "abc") == "v1:cba"
        assert await answer(pool, events, by_version["topics@v2"], "abc") == "v2:ABC"
        assert sorted(w.version for w in pool.workers()) == ["topics@v1", "topics@v2"]


async def test_an_idle_actor_switches_under_a_new_id_after_the_old_one_is_dead(
    lab: Lab,
) -> None:
    pool = RayPool(settings(V1))
    async with running(pool, 1) as events:
        (old,) = events.ready
        old_pid = pool.workers()[0].pid
        assert old_pid is not None
        pool.switch(old, V2, SWITCH)
        assert pool.workers()[0].state == "switching"
        await events.wait_for(lambda: len(events.ready) == 2)
        new = events.ready[1]
        assert new != old and events.version_of(new) == "topics@v2"
        assert events.version_of(old) == "topics@v1"
        old_actor, new_actor = actor_record(old_pid), actor_record(pool.workers()[0].pid)
        assert old_actor["State"] == "DEAD" and new_actor["State"] == "ALIVE"
        assert old_actor["EndTime"] <= new_actor["StartTime"]  # dead before the new one began
        assert events.died == [] and pool.crashes == 0 and pool.switches == 1
        assert pool.workers()[0].restarts == 0
        assert await answer(pool, events, new, "abc") == "v2:ABC"


async def test_the_switched_in_actor_is_up_for_the_start_the_core_gave(lab: Lab) -> None:
    pool = RayPool(settings(V1))
    async with running(pool, 1) as events:
        pool.switch(events.ready[0], V2, SWITCH)
        await events.wait_for(lambda: len(events.ready) == 2)
        new = events.ready[1]
        assert (events.starts[new], events.held[new]) == (SWITCH, "topics@v2")


async def test_a_busy_actor_does_not_switch(lab: Lab) -> None:
    pool = RayPool(settings(Load("slow@v1", "sim", latency_floor=0.5)))
    async with running(pool, 1) as events:
        (worker,) = events.ready
        pool.send(worker, Run(BatchId(1), ("abc",)))
        pool.switch(worker, V2, SWITCH)
        assert pool.workers()[0].state == "busy" and pool.switches == 0
        await events.wait_for(lambda: events.replies)
        assert events.ready == [worker] and events.version_of(worker) == "slow@v1"


async def test_a_new_version_that_crashes_at_load_is_a_death_and_restarts_holding_it(
    lab: Lab,
) -> None:
    pool = RayPool(settings(V1))
    async with running(pool, 1) as events:
        (old,) = events.ready
        pool.switch(old, CRASHES, SWITCH)
        with anyio.fail_after(60):
            while pool.workers()[0].restarts < 2:
                await events.changed.wait()
        assert old not in events.died and len(events.died) >= 1
        assert all(events.version_of(w) == "broken@v1" for w in events.died)
        assert pool.workers()[0].version == "broken@v1" and pool.ready_count() == 0


async def test_a_switch_that_dies_while_loading_is_retried_under_its_start(lab: Lab) -> None:
    pool = RayPool(settings(V1))
    async with running(pool, 1) as events:
        pool.switch(events.ready[0], CRASHES, SWITCH)
        await events.wait_for(lambda: len(events.died) >= 2)
        assert set(events.restarts.values()) == {SWITCH}
        assert {events.lost[w] for w in events.died} == {"broken@v1"}


@pytest.mark.parametrize("claimable", [True, False])
async def test_a_successor_core_claims_a_switched_actor_only_if_it_names_its_version(
    lab: Lab, claimable: bool,
) -> None:
    cell = f"t{secrets.token_hex(3)}"
    first = RayPool(settings(V1, cell=CellIdentity(cell, 0)))
    async with running(first, 1) as events:
        first.switch(events.ready[0], V2, SWITCH)
        await events.wait_for(lambda: len(events.ready) == 2)
        switched_pid = first.workers()[0].pid
        first._slots[0].actor = None  # dies abruptly: its stop kills nothing
    also = (V2,) if claimable else ()
    second = RayPool(settings(V1, cell=CellIdentity(cell, 1), claimable=also))
    async with running(second, 1) as events:
        (worker,) = events.ready
        if claimable:  # attached: its version is the switched one, no load again
            assert second.attached == 1 and second.workers()[0].pid == switched_pid
            assert events.version_of(worker) == "topics@v2"
            assert await answer(second, events, worker, "ab") == "v2:AB"
        else:  # replaced by one holding the slot's own version, the other one killed
            assert second.attached == 0 and events.version_of(worker) == "topics@v1"
            assert actor_state(switched_pid) == "DEAD"
            assert await answer(second, events, worker, "ab") == "v1:ba"


async def test_an_actor_being_replaced_for_its_memory_switches_too(lab: Lab) -> None:
    # Over the bound after every batch: replaced as its answer comes, which the core sees
    # idle; the switch takes the replacement over, whichever point it has reached.
    pool = RayPool(settings(Load("leak@v1", "tests.models:leak"), max_rss_mb=1))
    async with running(pool, 1) as events:
        (worker,) = events.ready
        assert await answer(pool, events, worker, "a") == "a"
        pool.switch(worker, V2, SWITCH)
        assert pool.switches == 1
        await events.wait_for(lambda: len(events.ready) == 2)
        new = events.ready[1]
        assert events.version_of(new) == "topics@v2" and events.died == []
        assert await answer(pool, events, new, "ab") == "v2:AB"
        assert pool.crashes == 0 and pool.workers()[0].restarts == 0
