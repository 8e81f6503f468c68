"""The batching loop: joins the tier queues, the flush policy and the free workers.

It forms a batch only when a worker is free and the policy says so, then hands it to the
`Workers` seam synchronously; everything slow happens elsewhere. It sleeps until the one
event that can change its decision: an arrival that matters, a worker coming free, or the
oldest item's `max_wait` running out.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from batcher.admission import Admission, RateMeter
from batcher.clock import Clock
from batcher.errors import DeadlineExceeded
from batcher.policy import FlushPolicy
from batcher.queues import TierQueues
from batcher.types import FlushReason, Item, Tier


class Workers(Protocol):
    """What the batcher needs of the pool: how many are idle, and a way to hand one a batch."""

    def idle_count(self) -> int: ...

    def ready_count(self) -> int:
        """Workers up (idle or busy): the pool's capacity right now."""

    def submit(self, items: list[Item], reason: FlushReason) -> None:
        """Start `items` (1..max_batch) on an idle worker; called only while one is idle."""


class Closed(Exception):
    """Raised by `put_nowait` once the batcher drains: no new work is accepted."""


@dataclass(frozen=True, slots=True)
class BatcherStatistics:
    pending: int
    depth: dict[str, int]
    batches: int
    items: int
    flushes: dict[str, int]
    expired: int
    draining: bool


class Batcher:
    def __init__(
        self,
        queues: TierQueues,
        policy: FlushPolicy,
        clock: Clock,
        workers: Workers,
        admission: Admission | None = None,
    ) -> None:
        self._queues = queues
        self._admission = admission
        self._arrivals = {tier: RateMeter() for tier in Tier}
        self._above = {tier: tuple(t for t in Tier if t < tier) for tier in Tier}
        self._policy = policy
        self._clock = clock
        self._workers = workers
        self._wakeup = anyio.Event()
        self._draining = False
        self._batches = 0
        self._items = 0
        self._expired = 0
        self._flushes: Counter[FlushReason] = Counter()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queues(self) -> TierQueues:
        return self._queues

    def admit(self, items: list[Item], deadline_in: float) -> None:
        """Admit a request's items together or refuse them all.

        Raises `Closed` while draining, `Overloaded` when admission control refuses, and
        `QueueFull` at the tier's hard cap; on any refusal no item is queued.
        """
        if self._draining:
            raise Closed("the server is shutting down")
        tier = items[0].tier
        now = self._clock.now()
        if self._admission is not None:
            ahead = self._queues.depth_through(tier) + len(items) - 1
            self._admission.check(
                tier, ahead, self._workers.ready_count(), deadline_in, self._overtaking(tier, now)
            )
        self._queues.ensure_room(tier, len(items))  # all or nothing
        self._arrivals[tier].add(len(items), now)
        for item in items:
            self._put(item, now)

    def expected_wait(self, tier: Tier) -> float:
        """Admission's estimate for a new item of `tier` now (inf with no worker ready)."""
        if self._admission is None:
            return 0.0
        return self._admission.estimate(
            self._queues.depth_through(tier), self._workers.ready_count(),
            self._overtaking(tier, self._clock.now()),
        )

    def _overtaking(self, tier: Tier, now: float) -> float:
        """Items/s arriving in tiers that will be served before `tier`."""
        return sum(self._arrivals[t].rate(now) for t in self._above[tier])

    def put_nowait(self, item: Item) -> None:
        """Queue an item; raise `Closed` while draining, `QueueFull` at the tier's cap."""
        if self._draining:
            raise Closed("the server is shutting down")
        self._put(item, self._clock.now())

    def _put(self, item: Item, now: float) -> None:
        item.enqueued = now
        was_empty = len(self._queues) == 0
        self._queues.put_nowait(item)
        # Only wake the loop when this arrival can change its decision.
        idle = self._workers.idle_count()
        if idle and (
            was_empty
            or len(self._queues) >= self._policy.max_batch
            or (self._policy.idle_trigger and idle > 1)
        ):
            self._wakeup.set()

    def cancel(self, item: Item) -> None:
        """The waiter gave up (client gone, deadline passed): never run this item."""
        self._queues.cancel(item)

    def push_retry(self, items: list[Item]) -> None:
        """Re-queue the items of a failed batch ahead of everything else."""
        now = self._clock.now()
        for item in items:
            item.enqueued = now
        self._queues.push_retry(items)
        self._wakeup.set()

    def wake(self) -> None:
        """A worker came free (or back to life): reconsider at once."""
        self._wakeup.set()

    def drain(self) -> None:
        """Stop accepting; the loop flushes what is queued at once and then returns."""
        self._draining = True
        self._wakeup.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._flush_ready()
            if self._draining and len(self._queues) == 0:
                return
            self._wakeup = anyio.Event()
            with anyio.CancelScope(deadline=self._next_timer()):
                await self._wakeup.wait()

    def statistics(self) -> BatcherStatistics:
        q = self._queues.statistics()
        return BatcherStatistics(
            pending=q.total,
            depth=q.depth,
            batches=self._batches,
            items=self._items,
            flushes={r.value: self._flushes[r] for r in FlushReason},
            expired=self._expired,
            draining=self._draining,
        )

    def _flush_ready(self) -> None:
        while True:
            idle = self._workers.idle_count()
            oldest = self._queues.oldest()
            if idle <= 0 or oldest is None:
                return
            now = self._clock.now()
            reason = self._policy.decide(
                pending=len(self._queues),
                oldest_enqueued=-math.inf if self._draining else oldest.enqueued,
                now=now,
                idle_workers=idle,
                retry=self._queues.has_retry(),
            )
            if reason is None:
                return
            batch, expired = self._queues.pop_batch(self._policy.max_batch, now)
            for item in expired:
                self._expired += 1
                item.settle(DeadlineExceeded("the request's deadline passed while queued"))
            if batch:
                for item in batch:
                    item.dispatched = now
                self._batches += 1
                self._items += len(batch)
                self._flushes[reason] += 1
                self._workers.submit(batch, reason)

    def _next_timer(self) -> float:
        if self._workers.idle_count() <= 0:
            return math.inf
        oldest = self._queues.oldest()
        if oldest is None:
            return math.inf
        return self._policy.due(oldest.enqueued)


__all__ = ["Batcher", "BatcherStatistics", "Closed", "Workers"]
