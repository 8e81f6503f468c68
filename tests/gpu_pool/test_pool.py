"""The supervisor with real spawned worker processes (sim and test models, real time)."""

from __future__ import annotations

import errno
import os
import pickle
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from batcher.shared import Backoff
from gpu_pool import (
    DEFAULT_VERSION,
    BatchId,
    Err,
    Ok,
    Origin,
    PoolSettings,
    Ready,
    Run,
    StartId,
    StartKind,
    Stop,
    WorkerId,
    WorkerPool,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Events:
    """Records what the pool reports; each kind of event can be awaited. Besides the order
    of events: the start each ready ended and the version it held (`starts`, `held`), the
    start each death said its slot carries out and the version it held (`restarts`,
    `lost`)."""

    def __init__(self) -> None:
        self.ready: list[WorkerId] = []
        self.starts: dict[WorkerId, StartId] = {}
        self.held: dict[WorkerId, str] = {}
        self.how: dict[WorkerId, StartKind] = {}  # how each came up
        self.replies: list[tuple[WorkerId, Ok | Err]] = []
        self.died: list[WorkerId] = []
        self.restarts: dict[WorkerId, StartId | None] = {}
        self.lost: dict[WorkerId, str] = {}
        self.changed = anyio.Event()

    def _bump(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def worker_ready(self, worker: WorkerId, start: StartId, version: str,
                     how: StartKind = StartKind.SPAWN) -> None:
        self.ready.append(worker)
        self.how[worker] = how
        self.starts[worker], self.held[worker] = start, version
        self._bump()

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        self.replies.append((worker, reply))
        self._bump()

    def worker_died(self, worker: WorkerId, version: str, restart: StartId | None) -> None:
        self.died.append(worker)
        self.restarts[worker], self.lost[worker] = restart, version
        self._bump()

    def version_of(self, worker: WorkerId) -> str | None:
        """The version the events of `worker` carried (its ready's and its death's agree);
        None if none was reported."""
        said = {self.held.get(worker), self.lost.get(worker)} - {None}
        assert len(said) <= 1, f"worker {worker}: ready holding {self.held[worker]}, " \
                               f"dead holding {self.lost[worker]}"
        return next(iter(said), None)

    async def wait_for(self, condition: object) -> None:
        with anyio.fail_after(60):
            while not condition():  # type: ignore[operator]
                await self.changed.wait()


def asked(number: int) -> StartId:
    """The `number`th start a test asks for as the core would (a switch, a worker added)."""
    return StartId(Origin.CORE, number)


@asynccontextmanager
async def running_pool(model: str, workers: int = 1, **kw: object) -> AsyncIterator[
    tuple[WorkerPool, Events]
]:
    events = Events()
    kw.setdefault("restart_backoff", 0.05)
    settings = PoolSettings(model=model, workers=workers, latency_floor=0.0,
                            **kw)  # type: ignore[arg-type]
    pool = WorkerPool(settings)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) >= workers)
        yield pool, events
        tg.cancel_scope.cancel()


def test_messages_survive_a_pickle_round_trip() -> None:
    for msg in (Ready(1, "cpu"), Run(BatchId(3), ("a", "b")), Ok(BatchId(3), ("b",), 0.1),
                Err(BatchId(3), "model", "ValueError", "x"), Stop()):
        assert pickle.loads(pickle.dumps(msg)) == msg


async def test_a_batch_comes_back_in_order() -> None:
    async with running_pool("sim") as (pool, events):
        w = events.ready[0]
        pool.send(w, Run(BatchId(1), ("abc", "de")))
        await events.wait_for(lambda: events.replies)
        assert events.replies[0] == (w, Ok(BatchId(1), ("cba", "ed"), events.replies[0][1].seconds))  # type: ignore[union-attr]


async def test_a_model_exception_is_an_error_and_the_worker_lives() -> None:
    async with running_pool("tests.models:poison") as (pool, events):
        w = events.ready[0]
        pool.send(w, Run(BatchId(1), ("POISON",)))
        await events.wait_for(lambda: events.replies)
        reply = events.replies[0][1]
        assert isinstance(reply, Err) and reply.error_type == "ValueError"
        pool.send(w, Run(BatchId(2), ("ok",)))
        await events.wait_for(lambda: len(events.replies) == 2)
        assert events.died == []


async def test_a_contract_breach_is_reported_as_such() -> None:
    async with running_pool("tests.models:short_by_one") as (pool, events):
        pool.send(events.ready[0], Run(BatchId(1), ("a", "b")))
        await events.wait_for(lambda: events.replies)
        reply = events.replies[0][1]
        assert isinstance(reply, Err) and reply.kind == "contract"


async def test_sigkill_is_seen_at_once_and_the_slot_restarts() -> None:
    async with running_pool("sim") as (pool, events):
        first = events.ready[0]
        (info,) = pool.workers()
        assert info.pid is not None
        os.kill(info.pid, signal.SIGKILL)
        await events.wait_for(lambda: events.died == [first] and len(events.ready) == 2)
        (info,) = pool.workers()
        assert info.state == "ready" and info.restarts == 1 and info.id != first


async def test_the_first_workers_come_up_for_their_slots_first_starts() -> None:
    async with running_pool("sim", workers=2) as (pool, events):
        assert {w.id: events.starts[WorkerId(w.id)] for w in pool.workers()} == {
            w.id: StartId(Origin.FIRST, w.slot) for w in pool.workers()}
        assert set(events.held.values()) == {DEFAULT_VERSION}


async def test_a_worker_that_dies_once_up_is_restarted_under_a_start_named_for_it() -> None:
    async with running_pool("sim") as (pool, events):
        (first,) = events.ready
        pid = pool.workers()[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await events.wait_for(lambda: len(events.ready) == 2)
        restart = StartId(Origin.RESTART, first)
        assert events.restarts == {first: restart} and events.lost[first] == DEFAULT_VERSION
        assert events.starts[events.ready[1]] == restart


async def test_a_worker_that_dies_while_loading_is_retried_under_the_same_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHGATE_TEST_CRASH_ONCE", str(tmp_path / "crashed"))
    async with running_pool("tests.crash_once_on_import:batchstring") as (_pool, events):
        (dead,) = events.died
        first = StartId(Origin.FIRST, 0)
        assert events.restarts == {dead: first} and events.starts[events.ready[0]] == first


async def test_a_slot_that_does_not_start_again_reports_no_restart() -> None:
    async with running_pool("sim", restart=False) as (pool, events):
        (first,) = events.ready
        pid = pool.workers()[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await events.wait_for(lambda: events.died)
        assert events.restarts == {first: None}


async def test_workers_that_stop_with_the_pool_report_no_restart() -> None:
    async with running_pool("sim", workers=2) as (pool, events):
        await pool.stop()
        assert sorted(events.died) == sorted(events.ready)
        assert set(events.restarts.values()) == {None}


async def test_a_crash_mid_batch_reports_the_death_not_an_answer() -> None:
    async with running_pool("tests.models:crash_on_marker") as (pool, events):
        w = events.ready[0]
        pool.send(w, Run(BatchId(1), ("CRASH",)))
        await events.wait_for(lambda: events.died)
        assert events.replies == [] and events.died == [w]


async def test_no_restart_keeps_a_dead_slot_dead() -> None:
    async with running_pool("sim", restart=False) as (pool, events):
        pid = pool.workers()[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await events.wait_for(lambda: events.died)
        assert pool.ready_count() == 0 and pool.workers()[0].state == "dead"


async def test_stop_leaves_no_worker_process_behind() -> None:
    async with running_pool("sim", workers=2) as (pool, _events):
        pids = pool.pids
        await pool.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_settings_restart_times_make_the_pools_backoff() -> None:
    s = PoolSettings(model="sim", workers=1, restart_backoff=0.5, restart_backoff_max=30.0,
                     stable_after=60.0)
    assert s.backoff == Backoff(first=0.5, cap=30.0, stable_after=60.0)


async def test_a_worker_that_dies_while_loading_is_retried_with_growing_backoff() -> None:
    events = Events()
    settings = PoolSettings(model="tests.crash_on_import:batchstring", workers=1,
                            restart_backoff=0.05)
    pool = WorkerPool(settings)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        with anyio.fail_after(30):
            while pool.workers()[0].restarts < 3:
                await events.changed.wait()  # each death is reported
        assert events.ready == [] and pool.ready_count() == 0
        assert pool._slots[0].failures >= 3  # each death before READY counts toward the backoff
        tg.cancel_scope.cancel()


async def test_a_worker_that_dies_while_loading_does_not_hold_start_up_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHGATE_TEST_CRASH_ONCE", str(tmp_path / "crashed"))
    settings = PoolSettings(model="tests.crash_once_on_import:batchstring", workers=2,
                            restart_backoff=600.0)  # the dead one stays down for this test
    pool = WorkerPool(settings)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, Events())
        with anyio.fail_after(60):  # far below `within`: it returns when start-up settles
            assert await pool.wait_ready(2, within=3600) == 1
        assert (tmp_path / "crashed").exists()
        tg.cancel_scope.cancel()


class PipesRunOut:
    """The spawn context with its first `failures` Pipe() calls refused as EMFILE (the
    process is out of descriptors), as `ulimit -n` made them in production."""

    def __init__(self, ctx: Any, failures: int) -> None:
        self.ctx, self.left = ctx, failures

    def Pipe(self) -> Any:  # multiprocessing's name
        if self.left > 0:
            self.left -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return self.ctx.Pipe()

    def Process(self, *args: Any, **kwargs: Any) -> Any:
        return self.ctx.Process(*args, **kwargs)


async def test_a_restart_that_fails_is_retried_with_backoff_until_it_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_pool("sim") as (pool, events):
        pool._ctx = PipesRunOut(pool._ctx, failures=2)  # type: ignore[assignment]
        (info,) = pool.workers()
        assert info.pid is not None
        os.kill(info.pid, signal.SIGKILL)
        await events.wait_for(lambda: len(events.ready) == 2)  # back, after two refusals
        assert len(events.died) == 1
        refused = [r for r in caplog.records if "could not start a worker" in r.message]
        assert len(refused) == 2
        assert pool.ready_count() == 1 and pool.workers()[0].restarts == 3
