"""The owner task against a fake pool with real behaviour, in exact virtual time.

The fake pool runs one batch at a time per worker for a fixed latency, answers each input
reversed, reports deaths (a crash or a kill) and restarts the dead under a new id. Every call
it gets, and every answer a waiter gets, goes into one log, so the tests read the order in
which the owner did things.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest
from anyio.abc import TaskGroup, TaskStatus

from batcher import (
    Closed,
    FlushPolicy,
    FlushReason,
    Item,
    ItemId,
    LoopClock,
    Tier,
)
from failover import (
    CoreOwner,
    CoreSettings,
    HangSettings,
    ShuttingDown,
    build_core,
)
from failover.hang import MIN_SAMPLES
from gpu_pool import DEFAULT_VERSION, Ok, Origin, PoolEvents, Run, StartId, WorkerId
from tests.fake_pools import ReportsWorkers
from tests.virtual import run_virtual

LATENCY = 0.1
MAX_WAIT = 0.05
RESTART_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class Call:
    """One line of the log: a pool call or event (`worker` set) or an answer (`worker` None)."""

    at: float
    kind: str  # ready, send, reply, crash, kill, died, settle
    worker: WorkerId | None
    texts: tuple[str, ...] = ()


class FakePool(ReportsWorkers):
    """`gpu_pool.Pool` in virtual time: one batch at a time per worker, `LATENCY` each."""

    def __init__(self, size: int, log: list[Call], clock: LoopClock) -> None:
        self._size, self._log, self._clock = size, log, clock
        self._ids = itertools.count(1)
        self._alive: dict[WorkerId, anyio.CancelScope | None] = {}  # the batch running, if any
        self._wedged: set[WorkerId] = set()
        self._changed = anyio.Event()
        self._crashes = 0
        self._events: PoolEvents | None = None
        self._tg: TaskGroup | None = None

    async def run(
        self, events: PoolEvents, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._events, self._tg = events, tg
                for index in range(self._size):
                    self._start(StartId(Origin.FIRST, index))
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None  # stopped: every worker is gone

    async def wait_ready(self, count: int, within: float) -> int:
        with anyio.move_on_after(within):
            while len(self._alive) < count:
                await self._changed.wait()
        return self.ready_count()

    def send(self, worker: WorkerId, run: Run) -> None:
        self._record("send", worker, run.inputs)
        if worker not in self._alive or self._tg is None:
            return  # its death is already reported, or the pool has stopped
        assert self._alive[worker] is None, f"worker {worker} got a batch while busy"
        self._alive[worker] = scope = anyio.CancelScope()
        self._tg.start_soon(self._run_batch, worker, run, scope)

    def kill(self, worker: WorkerId) -> None:
        self._record("kill", worker)
        self._die(worker)

    async def wait_calls(self, kind: str, count: int = 1) -> None:
        """Wait until the pool has logged `count` calls of `kind`."""
        while sum(1 for c in self._log if c.kind == kind) < count:
            await self._changed.wait()

    # -- what a test does to a worker --------------------------------------------------------
    def crash(self, worker: WorkerId) -> None:
        """Die mid-batch, like a segfaulting kernel."""
        self._record("crash", worker)
        self._crashes += 1
        self._die(worker)

    def wedge(self, worker: WorkerId) -> None:
        """The worker's batch never returns (a hung GPU)."""
        self._wedged.add(worker)

    # -- reading -----------------------------------------------------------------------------
    def holding(self) -> dict[WorkerId, anyio.CancelScope | None]:
        return self._alive

    @property
    def crashes(self) -> int:
        return self._crashes

    # -- inside ------------------------------------------------------------------------------
    def _start(self, start: StartId) -> None:
        assert self._events is not None
        worker = WorkerId(next(self._ids))
        self._alive[worker] = None
        self._record("ready", worker)
        self._events.worker_ready(worker, start, DEFAULT_VERSION)

    async def _restart(self, start: StartId) -> None:
        await anyio.sleep(RESTART_AFTER)
        self._start(start)

    async def _run_batch(self, worker: WorkerId, run: Run, scope: anyio.CancelScope) -> None:
        assert self._events is not None
        with scope:
            await anyio.sleep(LATENCY)
            if worker in self._wedged:
                await anyio.sleep_forever()
            outputs = tuple(text[::-1] for text in run.inputs)
            self._alive[worker] = None
            self._record("reply", worker, outputs)
            self._events.worker_reply(worker, Ok(run.batch_id, outputs, LATENCY))

    def _die(self, worker: WorkerId) -> None:
        if worker not in self._alive:
            return
        running = self._alive.pop(worker)
        if running is not None:
            running.cancel()
        assert self._events is not None and self._tg is not None
        self._record("died", worker)
        restart = StartId(Origin.RESTART, worker)
        self._events.worker_died(worker, DEFAULT_VERSION, restart)
        self._tg.start_soon(self._restart, restart)

    def _record(self, kind: str, worker: WorkerId, texts: tuple[str, ...] = ()) -> None:
        self._log.append(Call(self._clock.now(), kind, worker, texts))
        self._changed.set()
        self._changed = anyio.Event()


class Recorder:
    """The waiter of every item: keeps each answer (duplicates too) and logs it."""

    def __init__(self, log: list[Call], clock: LoopClock) -> None:
        self._log, self._clock = log, clock
        self.results: dict[ItemId, list[str | BaseException]] = {}

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.results.setdefault(item.id, []).append(result)
        self._log.append(Call(self._clock.now(), "settle", None, (item.text,)))


@dataclass
class Observer:
    sent: list[tuple[int, FlushReason | None, float | None]] = field(default_factory=list)
    done: list[float] = field(default_factory=list)

    def batch_sent(self, size: int, reason: FlushReason | None, idle_gap: float | None,
                   version: str = "") -> None:
        self.sent.append((size, reason, idle_gap))

    def batch_done(self, seconds: float, version: str = "") -> None:
        self.done.append(seconds)


@dataclass
class Rig:
    owner: CoreOwner
    pool: FakePool
    sink: Recorder
    observer: Observer
    clock: LoopClock
    log: list[Call]
    items: list[Item] = field(default_factory=list)
    returned_at: float | None = None  # when `owner.run` returned
    stalled_at: float = 0.0

    def request(self, n: int, tier: Tier = Tier.FREE) -> list[Item]:
        now, start = self.clock.now(), len(self.items)
        new = [
            Item(ItemId(i), f"{tier.label}-{i}", tier, now, now + 10.0, self.sink, k)
            for k, i in enumerate(range(start, start + n))
        ]
        self.owner.admit(new, 10.0)
        self.items += new
        return new

    async def finish(self) -> None:
        self.owner.drain()
        await self.owner.wait_finished()

    def calls(self, kind: str) -> list[Call]:
        return [c for c in self.log if c.kind == kind]

    def sent_to(self, n: int = 0) -> WorkerId:
        """The worker the `n`th batch went to."""
        worker = self.calls("send")[n].worker
        assert worker is not None
        return worker

    def index(self, kind: str, texts: set[str]) -> list[int]:
        """Positions in the log of the `kind` calls that touch any of `texts`."""
        return [n for n, c in enumerate(self.log) if c.kind == kind and texts & set(c.texts)]


def play(
    scenario: Callable[[Rig], Awaitable[None]], workers: int, hang_timeout: float = 10.0,
    hang: HangSettings | None = None,
) -> Rig:
    """Run the pool and the owner in one task group, as the service does, around `scenario`."""

    async def main() -> Rig:
        clock, log = LoopClock(), list[Call]()
        core = build_core(CoreSettings(
            budgets=dict.fromkeys(Tier, 1e6), policy=FlushPolicy(max_batch=100, max_wait=MAX_WAIT),
            queue_capacity=10_000, initial_latency=LATENCY,
            hang=hang or HangSettings(hedge=False, kill_after=hang_timeout),
        ))
        pool, observer = FakePool(workers, log, clock), Observer()
        owner = CoreOwner(core, pool, clock, observer)
        rig = Rig(owner, pool, Recorder(log, clock), observer, clock, log)

        async def run_owner(*, task_status: TaskStatus[None]) -> None:
            await owner.run(task_status=task_status)
            rig.returned_at = clock.now()

        async with anyio.create_task_group() as tg:
            await tg.start(pool.run, owner)
            await tg.start(run_owner)
            assert await pool.wait_ready(workers, 1.0) == workers
            with anyio.fail_after(30):
                await scenario(rig)
            tg.cancel_scope.cancel()
        return rig

    return run_virtual(main)


def texts(items: list[Item]) -> set[str]:
    return {i.text for i in items}


def assert_each_answered_once_with_its_output(rig: Rig) -> None:
    for item in rig.items:
        assert rig.sink.results.get(item.id) == [item.text[::-1]], f"item {item.id}"


# -- answers -----------------------------------------------------------------------------------
def test_every_admitted_item_is_answered_once_with_its_own_output() -> None:
    async def scenario(rig: Rig) -> None:
        for k in range(40):
            rig.request(1 + k * 7 % 23, Tier.PAID if k % 3 == 0 else Tier.FREE)
            await anyio.sleep(0.013)
        await rig.finish()

    rig = play(scenario, workers=3)
    assert len(rig.items) > 300 and len(rig.calls("send")) > 3
    assert_each_answered_once_with_its_output(rig)


def test_a_cancelled_item_is_never_sent_nor_answered() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(100)  # fills the one worker
        gone = rig.request(3)[1]
        rig.owner.cancel(gone)
        await rig.finish()

    rig = play(scenario, workers=1)
    gone = rig.items[101]
    assert not rig.index("send", {gone.text}) and gone.id not in rig.sink.results
    assert len(rig.sink.results) == 102


# -- order of actions --------------------------------------------------------------------------
async def full_batch_then_a_queued_one(rig: Rig) -> None:
    rig.request(100)  # FULL at t=0
    await anyio.sleep(0.01)
    rig.request(30)  # waits for the worker: past max_wait when it comes back at 0.1
    await rig.finish()


def test_a_reply_with_work_queued_sends_the_next_batch_before_settling_the_finished() -> None:
    rig = play(full_batch_then_a_queued_one, workers=1)
    first, second = texts(rig.items[:100]), texts(rig.items[100:])
    (send_second,) = rig.index("send", second)
    assert send_second < min(rig.index("settle", first))
    assert rig.log[send_second].at == rig.calls("reply")[0].at
    assert_each_answered_once_with_its_output(rig)


def test_a_turns_end_is_told_once_its_batches_are_out_and_its_items_settled() -> None:
    async def scenario(rig: Rig) -> None:
        def told() -> None:
            rig.log.append(Call(rig.clock.now(), "turn_over", None))

        off = rig.owner.after_turns(told)
        rig.request(100)  # FULL at t=0
        await anyio.sleep(0.01)
        rig.request(30)  # sent in the turn of the first batch's reply
        await rig.pool.wait_calls("send", 2)  # that turn is over
        off()  # the second batch's reply comes in a turn that is not told
        await rig.finish()

    rig = play(scenario, workers=1)
    first, second = texts(rig.items[:100]), texts(rig.items[100:])
    (send_second,) = rig.index("send", second)
    over = [n for n, c in enumerate(rig.log) if c.kind == "turn_over"]
    # The reply's turn: the next batch out, the finished one settled, then the turn's end.
    after_reply = [n for n in over if n > max(rig.index("settle", first))]
    assert after_reply and send_second < max(rig.index("settle", first)) < after_reply[0]
    assert rig.log[after_reply[0]].at == rig.calls("reply")[0].at
    assert max(over) < min(rig.index("settle", second))  # none after `off`
    assert_each_answered_once_with_its_output(rig)


def test_the_observer_sees_no_idle_gap_for_a_batch_cut_at_its_workers_reply() -> None:
    rig = play(full_batch_then_a_queued_one, workers=1)
    assert rig.observer.sent == [(100, FlushReason.FULL, None), (30, FlushReason.TIMEOUT, 0.0)]
    assert rig.observer.done == [LATENCY, LATENCY]


# -- faults ------------------------------------------------------------------------------------
def test_items_of_a_worker_crashed_mid_batch_rerun_on_another_and_are_answered_once() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(100)
        await anyio.sleep(0.05)
        rig.pool.crash(rig.sent_to(0))
        await rig.finish()

    rig = play(scenario, workers=2)
    first, again = rig.calls("send")
    assert again.texts == first.texts and again.worker != first.worker
    assert again.at == pytest.approx(0.05)
    assert rig.observer.sent[1] == (100, None, None)  # a group run again, not a cut
    assert_each_answered_once_with_its_output(rig)
    assert all(c.at == pytest.approx(0.05 + LATENCY) for c in rig.calls("settle"))


def test_the_hang_watchdog_kills_a_worker_stuck_past_hang_timeout() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(10)
        await rig.pool.wait_calls("send")
        rig.pool.wedge(rig.sent_to(0))
        await rig.finish()
        assert rig.owner.statistics().hangs == 1

    rig = play(scenario, workers=2, hang_timeout=0.5)
    stuck = rig.sent_to(0)
    (kill,) = rig.calls("kill")
    assert kill.worker == stuck and kill.at == pytest.approx(0.5)
    (again,) = rig.calls("send")[1:]
    assert again.worker != stuck and again.at == pytest.approx(0.5)
    assert_each_answered_once_with_its_output(rig)


def test_a_stalled_batch_is_answered_by_another_worker_long_before_its_worker_is_killed() -> None:
    async def scenario(rig: Rig) -> None:
        for _ in range(MIN_SAMPLES):  # the pool learns that batches take 100 ms
            rig.request(100)
        await rig.pool.wait_calls("reply", MIN_SAMPLES)
        rig.request(10, Tier.PAID)  # a free batch is not hedged on the pool's last worker
        await rig.pool.wait_calls("send", MIN_SAMPLES + 1)
        rig.stalled_at = rig.clock.now()
        rig.pool.wedge(rig.sent_to(MIN_SAMPLES))
        await rig.pool.wait_calls("kill")
        await rig.finish()
        assert rig.owner.statistics().table.hedges == 1

    rig = play(scenario, workers=2, hang=HangSettings())
    stuck, t0 = rig.sent_to(MIN_SAMPLES), rig.stalled_at
    hedge = rig.calls("send")[MIN_SAMPLES + 1]
    assert hedge.worker != stuck and hedge.at == pytest.approx(t0 + 0.5)
    assert hedge.texts == rig.calls("send")[MIN_SAMPLES].texts
    last = rig.items[-10:]
    answered = [c.at for c in rig.calls("settle") if c.texts[0] in {i.text for i in last}]
    assert answered == pytest.approx([t0 + 0.5 + LATENCY] * 10)
    (kill,) = rig.calls("kill")
    assert kill.worker == stuck and kill.at == pytest.approx(t0 + 5.0)
    assert_each_answered_once_with_its_output(rig)


def test_batches_within_hang_timeout_are_never_killed() -> None:
    async def scenario(rig: Rig) -> None:
        for _ in range(10):
            rig.request(100)
        await rig.finish()

    rig = play(scenario, workers=2, hang_timeout=LATENCY * 1.01)
    assert rig.calls("kill") == [] and len(rig.calls("send")) == 10
    assert_each_answered_once_with_its_output(rig)


# -- shutdown ----------------------------------------------------------------------------------
def test_drain_finishes_queued_and_in_flight_work_then_run_returns() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(100)  # in flight
        rig.request(30)  # queued behind it
        await rig.finish()
        with pytest.raises(Closed):
            rig.request(1)

    rig = play(scenario, workers=1)
    assert rig.returned_at == pytest.approx(2 * LATENCY)
    assert [len(c.texts) for c in rig.calls("send")] == [100, 30]
    assert_each_answered_once_with_its_output(rig)


def test_abandon_answers_what_never_ran_with_no_healthy_worker() -> None:
    async def scenario(rig: Rig) -> None:
        rig.request(100)
        await rig.pool.wait_calls("send")
        rig.pool.wedge(rig.sent_to(0))
        rig.request(20)
        rig.owner.drain()
        with anyio.move_on_after(1.0):
            await rig.owner.wait_finished()
        assert rig.returned_at is None and rig.sink.results == {}  # the wedged batch holds it
        rig.owner.abandon()
        await anyio.sleep(5.0)  # past the hang deadline: nothing more is answered

    rig = play(scenario, workers=1, hang_timeout=5.0)
    for item in rig.items:
        (result,) = rig.sink.results[item.id]
        assert isinstance(result, ShuttingDown)
