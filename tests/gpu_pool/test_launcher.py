"""Workers forked from the pool's launcher (real processes, real time): each start goes
through it, a worker outlives it, its death falls back to spawning until it is back, and
a version that opts out is spawned."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import anyio
import pytest

from gpu_pool import BatchId, Load, Run, StartKind, WorkerPool, stat_of
from gpu_pool.launcher import Up
from tests.gpu_pool.test_pool import asked, running_pool
from tests.gpu_pool.test_switch import alive, answer

pytestmark = pytest.mark.anyio
SIM = Load("sim@v1", "sim", 0.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def parent_of(pid: int) -> int:
    stat = stat_of(pid)
    assert stat is not None, f"pid {pid} is gone"
    return stat[1]


def launcher_pid(pool: WorkerPool) -> int:
    assert pool.launcher is not None and pool.launcher.up is not None
    return pool.launcher.up.pid


def pid_of(pool: WorkerPool, worker: int) -> int:
    pid = next(w.pid for w in pool.workers() if w.id == worker)
    assert pid is not None
    return pid


async def launcher_until(pool: WorkerPool, condition: Callable[[Up | None], bool]) -> None:
    """Until what the launcher says (None: it is not up) meets `condition`."""
    launcher = pool.launcher
    assert launcher is not None
    with anyio.fail_after(30):
        while not condition(launcher.up):
            await launcher.changed().wait()


async def test_every_start_is_a_fork_of_the_launcher_and_answers() -> None:
    async with running_pool("sim", workers=2, loads=(SIM, SIM)) as (pool, events):
        launcher = launcher_pid(pool)
        first = list(events.ready)
        # The first starts waited for its preload: measured as the spawns they cost.
        assert [events.how[w] for w in first] == [StartKind.SPAWN] * 2
        assert all(parent_of(pid_of(pool, w)) == launcher for w in first)
        pool.add(SIM, asked(1))
        await events.wait_for(lambda: len(events.ready) == 3)
        added = events.ready[-1]
        assert events.how[added] is StartKind.FORK
        assert parent_of(pid_of(pool, added)) == launcher
        assert await answer(pool, events, added, "abc") == "cba"
        assert events.died == []


async def test_a_forked_worker_killed_mid_batch_is_a_death_and_its_slot_forks_again() -> None:
    async with running_pool("tests.models:hang") as (pool, events):
        (worker,) = events.ready
        pid = pid_of(pool, worker)
        pool.send(worker, Run(BatchId(1), ("hang",)))
        os.kill(pid, signal.SIGKILL)
        await events.wait_for(lambda: events.died == [worker] and len(events.ready) == 2)
        assert events.replies == []  # its batch is the core's to run again
        again = events.ready[-1]
        assert events.how[again] is StartKind.FORK
        assert parent_of(pid_of(pool, again)) == launcher_pid(pool)


async def test_workers_outlive_the_launcher_and_starts_spawn_until_it_is_back() -> None:
    async with running_pool("sim", loads=(SIM,)) as (pool, events):
        (worker,) = events.ready
        dead = launcher_pid(pool)
        os.kill(dead, signal.SIGKILL)
        await launcher_until(pool, lambda up: up is None)
        assert await answer(pool, events, worker, "ab") == "ba"  # untouched
        await launcher_until(pool, lambda up: up is not None and up.pid != dead)
        back = launcher_pid(pool)
        pool.add(SIM, asked(1))
        await events.wait_for(lambda: len(events.ready) == 2)
        added = events.ready[-1]
        assert events.how[added] is StartKind.FORK
        assert parent_of(pid_of(pool, added)) == back
        assert events.died == [] and pool.crashes == 0


async def test_a_start_while_no_launcher_is_up_is_spawned() -> None:
    async with running_pool("sim", loads=(SIM,), restart_backoff=30.0) as (pool, events):
        dead = launcher_pid(pool)
        os.kill(dead, signal.SIGKILL)
        await launcher_until(pool, lambda up: up is None)
        pool.add(SIM, asked(1))
        await events.wait_for(lambda: len(events.ready) == 2)
        added = events.ready[-1]
        assert events.how[added] is StartKind.SPAWN
        assert parent_of(pid_of(pool, added)) == os.getpid()


async def test_a_version_that_opts_out_is_spawned() -> None:
    spawned = Load("sim@v2", "sim", 0.0, spawn=True)
    async with running_pool("sim", loads=(SIM,)) as (pool, events):
        assert pool.start_kind(spawned) is StartKind.SPAWN
        assert pool.start_kind(SIM) is StartKind.FORK
        pool.add(spawned, asked(1))
        await events.wait_for(lambda: len(events.ready) == 2)
        added = events.ready[-1]
        assert events.how[added] is StartKind.SPAWN
        assert parent_of(pid_of(pool, added)) == os.getpid()


async def test_the_launcher_ends_with_the_pool_and_reaps_its_workers() -> None:
    async with running_pool("sim", workers=2, loads=(SIM, SIM)) as (pool, events):
        launcher = launcher_pid(pool)
        pids = [pid_of(pool, w) for w in events.ready]
    assert not alive(launcher)
    assert all(stat_of(pid) is None for pid in pids)  # exited and reaped: no zombie left


async def test_the_launcher_holds_minilm_and_a_fork_labels_as_a_spawn_would() -> None:
    minilm = Load("topics@v1", "minilm")
    async with running_pool("minilm", loads=(minilm,)) as (pool, events):
        assert pool.launcher is not None and pool.launcher.up is not None
        assert pool.launcher.up.held == ("minilm",) and pool.launcher.up.threads == 0
        pool.add(minilm, asked(1))
        await events.wait_for(lambda: len(events.ready) == 2)
        added = events.ready[-1]
        assert events.how[added] is StartKind.FORK
        assert await answer(pool, events, added, "The striker scored twice in the final") \
            == "sports"


async def test_a_users_function_that_opts_in_is_looked_up_by_the_launcher_once() -> None:
    held = Load("topics@v1", "tests.models_versions:v1", 0.0, preload=True)
    plain = Load("topics@v2", "tests.models_versions:v2", 0.0)
    async with running_pool("sim", workers=2, loads=(held, plain)) as (pool, events):
        assert pool.launcher is not None and pool.launcher.up is not None
        assert pool.launcher.up.held == ("tests.models_versions:v1",)  # not v2: not asked
        pool.add(held, asked(1))
        await events.wait_for(lambda: len(events.ready) == 3)
        added = events.ready[-1]
        assert events.how[added] is StartKind.FORK
        assert await answer(pool, events, added, "ab") == "v1:ba"


def test_a_spawned_version_is_not_preloaded() -> None:
    with pytest.raises(ValueError, match="not preloaded"):
        Load("topics@v1", "tests.models_versions:v1", spawn=True, preload=True)
