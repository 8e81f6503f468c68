"""Slots holding different versions, and a switch while serving (issue 25): real spawned
workers running two versions of a test model (`tests.models_versions`) that answer
differently, so every answer says which version ran."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpu_pool import BatchId, Load, Ok, PoolSettings, Run, WorkerId, WorkerPool, stat_of
from tests.gpu_pool.test_pool import Events, asked

pytestmark = pytest.mark.anyio
V1 = Load("topics@v1", "tests.models_versions:v1")
V2 = Load("topics@v2", "tests.models_versions:v2")
CRASHES = Load("broken@v1", "tests.crash_on_import:batchstring")
SWITCH = asked(1)  # the start of the one switch a test asks for


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def versioned_pool(*loads: Load, **kw: Any) -> AsyncIterator[tuple[WorkerPool, Events]]:
    events = Events()
    settings = PoolSettings(model="sim", workers=len(loads), latency_floor=0.0,
                            restart_backoff=0.05, loads=loads, **kw)
    pool = WorkerPool(settings)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) >= len(loads))
        yield pool, events
        tg.cancel_scope.cancel()


async def answer(pool: WorkerPool, events: Events, worker: WorkerId, text: str) -> str:
    """Run a one-input batch on `worker` and return its output."""
    batch = BatchId(len(events.replies) + 1)
    pool.send(worker, Run(batch, (text,)))
    await events.wait_for(lambda: any(r.batch_id == batch for _, r in events.replies))
    (reply,) = [r for w, r in events.replies if r.batch_id == batch]
    assert isinstance(reply, Ok)
    return reply.outputs[0]


def alive(pid: int) -> bool:
    """Running: not gone, and not exited awaiting its parent's reaping (a launcher's fork)."""
    stat = stat_of(pid)
    return stat is not None and stat[0] != "Z"


class SpawnWatch:
    """The spawn context, noting at each new worker's spawn whether `watched` still lives,
    and setting `spawned`."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.watched: int | None = None
        self.alive_at_spawn: list[bool] = []
        self.spawned = anyio.Event()

    def Pipe(self) -> Any:  # multiprocessing's name
        return self.ctx.Pipe()

    def Process(self, *args: Any, **kwargs: Any) -> Any:
        if self.watched is not None:
            self.alive_at_spawn.append(alive(self.watched))
        self.spawned.set()
        return self.ctx.Process(*args, **kwargs)


def test_loads_are_one_per_worker() -> None:
    with pytest.raises(ValueError, match="one per worker"):
        PoolSettings(model="sim", workers=2, loads=(V1,))


def test_without_loads_every_slot_holds_the_one_model() -> None:
    s = PoolSettings(model="sim", workers=2)
    assert s.slot_loads() == (Load("default@v1", "sim"),) * 2
    assert s.floor(s.slot_loads()[0]) == 0.1  # sim's own, as --model sim has today


async def test_each_slot_starts_with_its_own_version_and_answers_from_it() -> None:
    async with versioned_pool(V1, V2) as (pool, events):
        by_version = {events.version_of(w): w for w in events.ready}
        assert set(by_version) == {"topics@v1", "topics@v2"}
        assert await answer(pool, events, by_version["topics@v1"], "abc") == "v1:cba"
        assert await answer(pool, events, by_version["topics@v2"], "abc") == "v2:ABC"
        assert sorted(w.version for w in pool.workers()) == ["topics@v1", "topics@v2"]


async def test_an_idle_worker_switches_under_a_new_id_and_no_death() -> None:
    async with versioned_pool(V1, launcher=False) as (pool, events):  # it watches spawns
        (old,) = events.ready
        old_pid = pool.workers()[0].pid
        assert old_pid is not None
        watch = SpawnWatch(pool._ctx)
        watch.watched, pool._ctx = old_pid, watch  # type: ignore[assignment]
        pool.switch(old, V2, SWITCH)
        assert pool.workers()[0].state == "switching"
        await events.wait_for(lambda: len(events.ready) == 2)
        new = events.ready[1]
        assert new != old and events.version_of(new) == "topics@v2"
        assert watch.alive_at_spawn == [False]  # the old process exited before the new one
        assert events.died == [] and pool.crashes == 0 and pool.switches == 1
        (info,) = pool.workers()
        assert (info.id, info.state, info.version, info.restarts) == (new, "ready", "topics@v2", 0)
        assert await answer(pool, events, new, "abc") == "v2:ABC"
        assert events.version_of(old) == "topics@v1"  # what the retired one came up with


async def test_the_switched_in_worker_is_up_for_the_start_the_core_gave() -> None:
    async with versioned_pool(V1) as (pool, events):
        pool.switch(events.ready[0], V2, SWITCH)
        await events.wait_for(lambda: len(events.ready) == 2)
        new = events.ready[1]
        assert (events.starts[new], events.held[new]) == (SWITCH, "topics@v2")


async def test_a_busy_worker_does_not_switch() -> None:
    async with versioned_pool(Load("slow@v1", "sim", latency_floor=0.3)) as (pool, events):
        (worker,) = events.ready
        pool.send(worker, Run(BatchId(1), ("abc",)))
        pool.switch(worker, V2, SWITCH)
        assert pool.workers()[0].state == "busy" and pool.switches == 0
        await events.wait_for(lambda: events.replies)
        assert events.replies[0][0] == worker and events.ready == [worker]
        assert events.version_of(worker) == "slow@v1" and pool.workers()[0].state == "ready"


async def test_a_dead_worker_does_not_switch_and_restarts_holding_its_version() -> None:
    async with versioned_pool(V1) as (pool, events):
        (dead,) = events.ready
        pid = pool.workers()[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await events.wait_for(lambda: events.died == [dead])
        pool.switch(dead, V2, SWITCH)
        assert pool.switches == 0
        await events.wait_for(lambda: len(events.ready) == 2)
        assert events.version_of(events.ready[1]) == "topics@v1"
        assert events.version_of(dead) == "topics@v1"  # what its death said it held


async def test_a_restart_after_a_switch_keeps_the_new_version() -> None:
    async with versioned_pool(V1) as (pool, events):
        pool.switch(events.ready[0], V2, SWITCH)
        await events.wait_for(lambda: len(events.ready) == 2)
        pid = pool.workers()[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await events.wait_for(lambda: len(events.ready) == 3)
        assert events.died == [events.ready[1]]
        assert await answer(pool, events, events.ready[2], "x") == "v2:X"


async def test_a_new_version_that_crashes_at_load_is_a_death_and_keeps_restarting() -> None:
    async with versioned_pool(V1) as (pool, events):
        (old,) = events.ready
        pool.switch(old, CRASHES, SWITCH)
        with anyio.fail_after(30):
            while pool.workers()[0].restarts < 2:
                await events.changed.wait()
        assert old not in events.died and len(events.died) >= 2
        assert all(events.version_of(w) == "broken@v1" for w in events.died)
        assert pool.crashes >= 2 and pool._slots[0].failures >= 2  # the backoff grows
        assert pool.workers()[0].version == "broken@v1" and pool.ready_count() == 0


async def test_a_new_version_that_crashes_once_comes_up_after_its_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHGATE_TEST_CRASH_ONCE", str(tmp_path / "crashed"))
    once = Load("flaky@v1", "tests.crash_once_on_import:batchstring")
    async with versioned_pool(V1) as (pool, events):
        (old,) = events.ready
        pool.switch(old, once, SWITCH)
        await events.wait_for(lambda: len(events.ready) == 2)
        (dead,) = events.died
        assert dead not in (old, events.ready[1]) and events.version_of(dead) == "flaky@v1"
        assert events.version_of(events.ready[1]) == "flaky@v1"
        assert pool.workers()[0].restarts == 1 and pool.crashes == 1


async def test_a_switch_that_dies_while_loading_is_retried_under_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHGATE_TEST_CRASH_ONCE", str(tmp_path / "crashed"))
    async with versioned_pool(V1) as (pool, events):
        pool.switch(events.ready[0], Load("flaky@v1", "tests.crash_once_on_import:batchstring"),
                    SWITCH)
        await events.wait_for(lambda: len(events.ready) == 2)
        (dead,) = events.died
        assert events.restarts == {dead: SWITCH} and events.starts[events.ready[1]] == SWITCH


@pytest.mark.parametrize("when", ["before_its_spawn", "while_it_loads"])
async def test_a_worker_being_replaced_for_its_memory_switches_too(when: str) -> None:
    # Over the bound after every batch: replaced as its answer comes, which the core sees
    # idle. Switched before the new process is spawned, that one loads the new version;
    # switched while it loads the old one, it is let go once up and another one starts.
    leaky = Load("leak@v1", "tests.models:leak")
    async with versioned_pool(leaky, max_rss_mb=1, launcher=False) as (pool, events):
        (worker,) = events.ready
        watch = SpawnWatch(pool._ctx)
        pool._ctx = watch  # type: ignore[assignment]
        assert await answer(pool, events, worker, "a") == "a"
        if when == "while_it_loads":
            with anyio.fail_after(10):
                await watch.spawned.wait()
        else:
            assert not watch.spawned.is_set()
        pool.switch(worker, V2, SWITCH)
        assert pool.switches == 1
        await events.wait_for(lambda: len(events.ready) == 2)
        new = events.ready[1]
        assert events.version_of(new) == "topics@v2" and events.died == []
        assert await answer(pool, events, new, "ab") == "v2:AB"
        assert pool.crashes == 0 and pool.workers()[0].restarts == 0


async def test_stop_ends_a_switch_under_way_and_starts_nothing_more() -> None:
    async with versioned_pool(V1) as (pool, events):
        pid = pool.workers()[0].pid
        pool.switch(events.ready[0], V2, SWITCH)
        await pool.stop()
        assert pid is not None and not alive(pid)
        assert pool.pids == [] and events.ready == events.ready[:1]
