"""Async glue between the batcher, the in-flight table and the worker pool.

It is the batcher's `Workers` (idle count, submit) and the pool's `PoolEvents` (ready,
reply, died). Each event goes through the table, which decides; the dispatcher only
carries the returned actions out: answer items, re-queue items at the head of the retry
lane, run bisected groups, wake the batcher. A watchdog kills workers whose batch hangs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from batcher import Batcher, Clock, FlushReason, Item
from failover.errors import ContractViolation, ModelError, NoHealthyWorker
from failover.table import Actions, Dispatch, InFlightTable, TableStatistics
from gpu_pool import Err, Ok, Run, WorkerId

log = logging.getLogger("batchgate.dispatch")


class Pool(Protocol):
    """What the dispatcher needs of the worker pool."""

    def send(self, worker: WorkerId, run: Run) -> bool: ...

    def kill(self, worker: WorkerId) -> None: ...


class DispatchObserver(Protocol):
    """Hook for metrics: told of every batch; must be cheap and never raise."""

    def batch_started(self, size: int, reason: FlushReason | None) -> None: ...

    def batch_finished(self, size: int, seconds: float) -> None: ...


class _NoObserver:
    def batch_started(self, size: int, reason: FlushReason | None) -> None:
        pass

    def batch_finished(self, size: int, seconds: float) -> None:
        pass


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    table: TableStatistics
    hangs: int


class Dispatcher:
    def __init__(
        self,
        table: InFlightTable,
        clock: Clock,
        *,
        hang_timeout: float,
        observer: DispatchObserver | None = None,
    ) -> None:
        self._table = table
        self._clock = clock
        self._hang_timeout = hang_timeout
        self._observer: DispatchObserver = observer or _NoObserver()
        self._batcher: Batcher | None = None
        self._pool: Pool | None = None
        self._new_batch = anyio.Event()  # wakes the hang watchdog
        self._watching = False  # the watchdog sleeps on a deadline: new batches end later
        self._settled = anyio.Event()  # wakes wait_quiet
        self._hangs = 0

    def bind(self, batcher: Batcher, pool: Pool) -> None:
        """Wire the two neighbours (each needs the other, so this happens after both exist)."""
        self._batcher, self._pool = batcher, pool

    # -- batcher.Workers ---------------------------------------------------------------------
    def idle_count(self) -> int:
        return self._table.idle_count()

    def ready_count(self) -> int:
        return self._table.ready_count()

    def submit(self, items: list[Item], reason: FlushReason) -> None:
        dispatch = self._table.assign(items, self._clock.now(), self._hang_timeout)
        self._observer.batch_started(len(items), reason)
        self._send(dispatch)

    # -- gpu_pool.PoolEvents -----------------------------------------------------------------
    def worker_ready(self, worker: WorkerId) -> None:
        self._table.worker_up(worker)
        self._pump()

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        if isinstance(reply, Ok):
            actions = self._table.on_ok(worker, reply.batch_id, reply.outputs)
            if actions.deliver:
                self._observer.batch_finished(len(actions.deliver), reply.seconds)
        else:
            error_cls = ContractViolation if reply.kind == "contract" else ModelError
            if reply.kind == "contract":
                log.error("model broke the contract on batch %s: %s", reply.batch_id,
                          reply.message)
            actions = self._table.on_error(
                worker, reply.batch_id, error_cls(reply.error_type, reply.message)
            )
        self._apply(actions)

    def worker_died(self, worker: WorkerId) -> None:
        self._apply(self._table.on_worker_died(worker))

    # -- loops -------------------------------------------------------------------------------
    async def watch_hangs(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Kill the worker of any batch that outlives its hang deadline."""
        task_status.started()
        while True:
            self._new_batch = anyio.Event()
            deadline = self._table.next_hang_deadline()
            self._watching = deadline != math.inf
            with anyio.CancelScope(deadline=deadline):
                await self._new_batch.wait()
            if deadline != math.inf and self._clock.now() >= deadline:
                for worker in self._table.hung(self._clock.now()):
                    self._hangs += 1
                    assert self._pool is not None
                    self._pool.kill(worker)

    async def wait_quiet(self) -> None:
        """Wait until no batch is in flight and no bisected group waits (for draining)."""
        while not self._table.quiet():
            self._settled = anyio.Event()
            await self._settled.wait()

    def fail_pending(self) -> None:
        """Shutdown: answer groups that will never run."""
        for item in self._table.abandon_groups():
            item.settle(NoHealthyWorker("the server shut down before the item ran"))

    def statistics(self) -> DispatcherStatistics:
        return DispatcherStatistics(table=self._table.statistics(), hangs=self._hangs)

    # -- internals ---------------------------------------------------------------------------
    def _apply(self, actions: Actions) -> None:
        for item, result in actions.deliver:
            item.settle(result)
        if actions.retry:
            assert self._batcher is not None
            self._batcher.push_retry(actions.retry)
        self._pump()
        self._settled.set()

    def _pump(self) -> None:
        """Give idle workers to bisected groups first, then let the batcher cut batches."""
        while (group := self._table.next_group(self._clock.now(), self._hang_timeout)):
            self._observer.batch_started(len(group.texts), None)
            self._send(group)
        if self._batcher is not None and self._table.idle_count():
            self._batcher.wake()

    def _send(self, dispatch: Dispatch) -> None:
        assert self._pool is not None
        if not self._watching:  # a later batch can never move an armed deadline earlier
            self._new_batch.set()
        # A failed send reports the worker's death synchronously: the table re-routes.
        self._pool.send(dispatch.worker, Run(dispatch.batch_id, dispatch.texts))


__all__ = ["DispatchObserver", "Dispatcher", "DispatcherStatistics", "Pool"]
