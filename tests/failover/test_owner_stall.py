"""The owner when its own loop stands still (the core process stopped, a long pause), in
exact virtual time: the mock clock jumps while no task runs, as a SIGSTOP looks from inside.

The fake pool's workers answer after `LATENCY`, and their answers are read one loop pass
after the timers that fall due with them, as uvloop reads a worker's pipe after it has run
the due timers: so a turn taken at once after the stall judges every batch without the
answers that came meanwhile.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import pytest
import trio
from anyio.abc import TaskGroup, TaskStatus
from trio.testing import MockClock

from batcher import FlushPolicy, Item, ItemId, LoopClock, Tier
from failover import CoreOwner, CoreSettings, HangSettings, build_core
from failover.owner import STALL_S
from gpu_pool import DEFAULT_VERSION, Ok, Origin, PoolEvents, Run, StartId, WorkerId
from tests.fake_pools import ReportsWorkers
from tests.virtual import run_virtual

LATENCY = 0.1
KILL_AFTER = 0.5
STALL = 15.0


class PipedPool(ReportsWorkers):
    """`gpu_pool.Pool` in virtual time: `LATENCY` a batch, answered through a pipe read one
    loop pass later; a wedged worker never answers; a killed one is gone for good."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.running: dict[WorkerId, Run | None] = {}
        self.wedged: set[WorkerId] = set()
        self.sent: list[tuple[float, WorkerId, Run]] = []
        self.killed: list[tuple[float, WorkerId]] = []
        self._scopes: dict[WorkerId, anyio.CancelScope] = {}
        self._events: PoolEvents | None = None
        self._tg: TaskGroup | None = None
        self._ids = itertools.count(1)
        self._changed = anyio.Event()
        self.started = 0  # batches the workers have begun

    async def run(self, events: PoolEvents, *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._events, self._tg = events, tg
            for index in range(self.size):
                worker = WorkerId(next(self._ids))
                self.running[worker] = None
                events.worker_ready(worker, StartId(Origin.FIRST, index), DEFAULT_VERSION)
            task_status.started()
            await anyio.sleep_forever()

    async def wait_ready(self, count: int, within: float) -> int:
        return self.ready_count()

    def holding(self) -> dict[WorkerId, Run | None]:
        return self.running

    @property
    def crashes(self) -> int:
        return len(self.killed)

    def send(self, worker: WorkerId, run: Run) -> None:
        assert self._tg is not None and self.running.get(worker, run) is None
        self.sent.append((anyio.current_time(), worker, run))
        self.running[worker] = run
        self._scopes[worker] = scope = anyio.CancelScope()
        self._tg.start_soon(self._run_batch, worker, run, scope)

    def kill(self, worker: WorkerId) -> None:
        assert self._events is not None
        self.killed.append((anyio.current_time(), worker))
        self._scopes.pop(worker).cancel()
        del self.running[worker]
        self._events.worker_died(worker, DEFAULT_VERSION, None)  # gone for good

    async def wait_running(self, count: int) -> None:
        """Until the workers have begun `count` batches."""
        while self.started < count:
            await self._changed.wait()

    async def _run_batch(self, worker: WorkerId, run: Run, scope: anyio.CancelScope) -> None:
        assert self._events is not None
        with scope:
            self.started += 1
            self._changed.set()
            self._changed = anyio.Event()
            await anyio.sleep(LATENCY)
            if worker in self.wedged:
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()  # in the pipe: read on the next pass
            self.running[worker] = None
            self._events.worker_reply(
                worker, Ok(run.batch_id, tuple(t[::-1] for t in run.inputs), LATENCY))


@dataclass
class Sink:
    results: dict[ItemId, list[str | BaseException]] = field(default_factory=dict)
    answered: anyio.Event = field(default_factory=anyio.Event)
    expected: int = 0

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.results.setdefault(item.id, []).append(result)
        if sum(map(len, self.results.values())) >= self.expected:
            self.answered.set()


@dataclass
class Rig:
    owner: CoreOwner
    pool: PipedPool
    sink: Sink
    items: list[Item] = field(default_factory=list)
    hangs: int = -1  # the core's count, once every item is answered

    def request(self, n: int) -> None:
        now = anyio.current_time()
        self.items += [Item(ItemId(len(self.items) + k), f"item-{len(self.items) + k}",
                            Tier.PAID, now, now + 60.0, self.sink, k) for k in range(n)]
        self.sink.expected = len(self.items)
        self.owner.admit(self.items[-n:], 60.0)


def play(scenario: Callable[[Rig], Awaitable[None]], workers: int = 2) -> Rig:
    async def main() -> Rig:
        clock = LoopClock()
        core = build_core(CoreSettings(
            budgets=dict.fromkeys(Tier, 1e6), policy=FlushPolicy(max_batch=100, max_wait=0.05),
            queue_capacity=1000, initial_latency=LATENCY,
            hang=HangSettings(hedge=False, kill_after=KILL_AFTER)))
        pool = PipedPool(workers)
        rig = Rig(CoreOwner(core, pool, clock), pool, Sink())
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run, rig.owner)
            await tg.start(rig.owner.run)
            with anyio.fail_after(STALL + 30):
                await scenario(rig)
                await rig.sink.answered.wait()
            rig.hangs = rig.owner.statistics().hangs
            tg.cancel_scope.cancel()
        return rig

    return run_virtual(main)


def stall(seconds: float) -> None:
    """The whole process stands still for `seconds`: time passes, no task runs."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, MockClock)
    clock.jump(seconds)


def answered_once_with_own_output(rig: Rig) -> bool:
    return all(rig.sink.results.get(i.id) == [i.text[::-1]] for i in rig.items)


def test_a_batch_answered_while_the_owner_s_loop_stood_still_kills_no_worker() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(10)
        await rig.pool.wait_running(1)
        stall(STALL)  # the worker answers 0.1 s in; its pipe is read after the stall

    rig = play(scenario)
    assert rig.pool.killed == [] and rig.hangs == 0
    assert len(rig.pool.sent) == 1 and answered_once_with_own_output(rig)


def test_a_worker_that_really_hangs_is_still_killed_after_a_stall_and_its_batch_reruns() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(10)
        await rig.pool.wait_running(1)
        rig.pool.wedged.add(rig.pool.sent[0][1])
        stall(STALL)

    rig = play(scenario)
    (sent_at, stuck, _), (again_at, other, _) = rig.pool.sent
    assert rig.pool.killed == [(again_at, stuck)] and other != stuck
    assert again_at >= sent_at + STALL and rig.hangs == 1
    assert answered_once_with_own_output(rig)


def test_a_wake_late_by_less_than_the_stall_threshold_moves_no_hang_limit() -> None:
    late = STALL_S / 2

    async def scenario(rig: Rig) -> None:
        rig.request(10)
        await rig.pool.wait_running(1)
        rig.pool.wedged.add(rig.pool.sent[0][1])
        stall(KILL_AFTER + late)  # the kill limit passes, and the owner wakes just after

    rig = play(scenario)
    (sent_at, stuck, _), _ = rig.pool.sent
    ((killed_at, killed),) = rig.pool.killed
    assert killed == stuck and killed_at == pytest.approx(sent_at + KILL_AFTER + late)
