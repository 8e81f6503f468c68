"""Fakes with real behaviour for the door's tests: a pool of workers that run one batch at a
time and answer each input reversed, a core that queues what it admits until the test
answers or fails it, a client that hangs up when told, and a collation a test waits on.

Everything waits through anyio, so the same fakes run in exact virtual time (trio's
`MockClock`, `tests.virtual`) and under uvicorn on asyncio's real clock.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

import anyio
from anyio.abc import TaskGroup, TaskStatus

from api.config import DEFAULT_TIERS, Principal
from api.http import Collation, Job
from batcher import BatchgateError, Item, Tier
from gpu_pool import DEFAULT_VERSION as ONE_VERSION
from gpu_pool import Ok, Origin, PoolEvents, Run, StartId, WorkerId
from tests.fake_pools import ReportsWorkers

WHO = Principal(Tier.PAID, "acme", "key-1")
ROOMY = {t: replace(p, rate=1e9, burst=1e9, account_rate=1e9, account_burst=1e9)
         for t, p in DEFAULT_TIERS.items()}  # limits no door test reaches
REPLAYED = ("Idempotent-Replayed", "true")


def keyed(text: str = "hello", key: str = "k-1", timeout: float = 10.0,
          who: Principal = WHO) -> Job:
    """A one-input job with an Idempotency-Key, its fingerprint the input's."""
    return Job(who, [text], True, timeout, (key, hashlib.sha256(text.encode()).digest()))


class FakePool(ReportsWorkers):
    """`gpu_pool.Pool`: `size` workers, each running one batch at a time for `latency`
    seconds and answering every input reversed. `hold()` keeps every batch running until
    `release()` (a busy GPU); with `up=False` no worker starts until `bring_up()` (a slow
    model load). `ran` lists every input a worker was sent, in the order sent."""

    def __init__(self, size: int = 1, latency: float = 0.01, up: bool = True) -> None:
        self.size, self.latency, self._up = size, latency, up
        self.ran: list[str] = []
        self.batches = 0
        self._ids = itertools.count(1)
        self._busy: dict[WorkerId, bool] = {}  # the live workers: running a batch?
        self._events: PoolEvents | None = None
        self._tg: TaskGroup | None = None
        self._held: anyio.Event | None = None
        self._changed: anyio.Event | None = None
        self._crashes = 0

    async def run(self, events: PoolEvents, *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._events, self._tg = events, tg
                if self._up:
                    self.bring_up()
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None  # stopped: every worker is gone
            self._busy.clear()

    def bring_up(self) -> None:
        """Start the workers (reported ready at once), each for its slot's first start."""
        for index in range(self.size):
            self._start(StartId(Origin.FIRST, index))

    async def wait_ready(self, count: int, within: float) -> int:
        with anyio.move_on_after(within):
            while len(self._busy) < count:
                await self._wait_changed()
        return self.ready_count()

    async def wait_batches(self, count: int) -> None:
        """Wait until `count` batches in all were sent to workers."""
        while self.batches < count:
            await self._wait_changed()

    def send(self, worker: WorkerId, run: Run) -> None:
        if worker not in self._busy or self._tg is None:
            return  # its death is already reported, or the pool has stopped
        assert not self._busy[worker], f"worker {worker} got a batch while busy"
        self._busy[worker] = True
        self.ran += run.inputs
        self.batches += 1
        self._tg.start_soon(self._run_batch, worker, run)
        self._changed_now()

    def kill(self, worker: WorkerId) -> None:
        if self._busy.pop(worker, None) is not None:
            assert self._events is not None
            restart = StartId(Origin.RESTART, worker)
            self._events.worker_died(worker, ONE_VERSION, restart)
            self._start(restart)  # restarted under a new id

    def hold(self) -> None:
        """Batches sent from now on run until `release()`."""
        self._held = anyio.Event()

    def release(self) -> None:
        if self._held is not None:
            self._held.set()
            self._held = None

    def holding(self) -> dict[WorkerId, bool | None]:
        return {w: True if busy else None for w, busy in self._busy.items()}

    @property
    def crashes(self) -> int:
        return self._crashes

    def _start(self, start: StartId) -> None:
        assert self._events is not None
        worker = WorkerId(next(self._ids))
        self._busy[worker] = False
        self._events.worker_ready(worker, start, ONE_VERSION)
        self._changed_now()

    async def _run_batch(self, worker: WorkerId, run: Run) -> None:
        await anyio.sleep(self.latency)
        if self._held is not None:
            await self._held.wait()
        if self._busy.get(worker) is not True:
            return  # killed meanwhile
        self._busy[worker] = False
        assert self._events is not None
        outputs = tuple(text[::-1] for text in run.inputs)
        self._events.worker_reply(worker, Ok(run.batch_id, outputs, self.latency))
        self._changed_now()

    async def _wait_changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _changed_now(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class QueueCore:
    """`api.door.Core` that queues what it admits until the test `answer`s (each input
    reversed) or `fail`s it; while `refusing` is set it refuses every request with it."""

    def __init__(self) -> None:
        self.queued: list[Item] = []
        self.cancelled: list[Item] = []
        self.refusing: BatchgateError | None = None

    def admit(self, items: list[Item], deadline_in: float, now: float) -> None:
        if self.refusing is not None:
            raise self.refusing
        self.queued += items

    def admit_all(self, requests: Sequence[tuple[list[Item], float]], now: float
                  ) -> list[BatchgateError | None]:
        refusals: list[BatchgateError | None] = []
        for items, deadline_in in requests:
            try:
                self.admit(items, deadline_in, now)
                refusals.append(None)
            except BatchgateError as exc:
                refusals.append(exc)
        return refusals

    def resolve(self, model: str | None, sticky: str | None) -> str:
        return ONE_VERSION

    def cancel(self, item: Item) -> None:
        if any(queued is item for queued in self.queued):
            self.queued = [queued for queued in self.queued if queued is not item]
            self.cancelled.append(item)

    def answer(self) -> None:
        self._settle(lambda item: item.text[::-1])

    def fail(self, error: BaseException) -> None:
        self._settle(lambda item: error)

    def _settle(self, result: Callable[[Item], str | BaseException]) -> None:
        queued, self.queued = self.queued, []
        for item in queued:
            item.sink.item_done(item, result(item))


class Client:
    """A `ClientWatch`: the client hangs up when the test says."""

    def __init__(self) -> None:
        self._leave: Callable[[], object] | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        self._leave = leave

    def unwatch(self) -> None:
        self._leave = None

    def hang_up(self) -> None:
        if self._leave is not None:
            self._leave()


class Waiter(Collation):
    """A job's collation as a test waits on it (`over`); `Collation` says what ends it."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.over: anyio.Event | None = None
        self._ended = False

    def ended(self) -> None:
        self._ended = True
        if self.over is not None:
            self.over.set()

    async def wait(self) -> None:
        if not self._ended:
            self.over = anyio.Event()
            await self.over.wait()




class BatchCore:
    """`api.door.Core` whose items wait queued until the test `start`s a batch of them (each
    then counts a flight, as the in-flight table marks it), which it then `finish`es (each
    input reversed) or `fail`s. Cancelled items leave the queue; a cancelled item in a batch
    is still settled when the batch ends, as the dispatch core settles it."""

    def __init__(self) -> None:
        self.queued: list[Item] = []
        self.running: list[Item] = []
        self.cancelled: list[Item] = []
        self.ran: list[str] = []  # every input a batch ran

    def admit(self, items: list[Item], deadline_in: float, now: float) -> None:
        self.queued += items

    def resolve(self, model: str | None, sticky: str | None) -> str:
        return ONE_VERSION

    def admit_all(self, requests: Sequence[tuple[list[Item], float]], now: float
                  ) -> list[BatchgateError | None]:
        for items, deadline_in in requests:
            self.admit(items, deadline_in, now)
        return [None] * len(requests)

    def cancel(self, item: Item) -> None:
        item.cancelled = True
        self.cancelled.append(item)
        self.queued = [queued for queued in self.queued if queued is not item]

    def start(self, count: int | None = None) -> None:
        """Cut a batch of the first `count` queued items (all by default)."""
        batch, self.queued = self.queued[:count], self.queued[len(self.queued[:count]):]
        for item in batch:
            item.flights += 1
        self.running += batch
        self.ran += [item.text for item in batch]

    def finish(self) -> None:
        self._settle(lambda item: item.text[::-1])

    def fail(self, error: BaseException) -> None:
        self._settle(lambda item: error)

    def _settle(self, result: object) -> None:
        running, self.running = self.running, []
        for item in running:
            item.flights -= 1
            item.done = True
        for item in running:
            item.sink.item_done(item, result(item))  # type: ignore[operator]


__all__ = ["REPLAYED", "ROOMY", "WHO", "BatchCore", "Client", "FakePool", "QueueCore", "Waiter",
           "keyed"]
