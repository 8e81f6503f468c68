"""The running gateway: builds batcher, dispatcher and pool from settings, runs their loops
in one task group, takes requests in, and drains on the way out."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import anyio
from anyio.abc import TaskStatus

from api.limits import pressure_factor
from api.metrics import Metrics, Snapshot
from api.settings import Settings
from api.tiers import TierPolicy
from batcher import (
    Admission,
    AdmissionSettings,
    Batcher,
    FlushPolicy,
    FlushReason,
    Item,
    ItemId,
    ItemSink,
    MonotonicClock,
    Tier,
    TierQueues,
)
from failover import (
    Dispatcher,
    IdempotencyStore,
    InFlightTable,
    MemoryIdempotencyStore,
    NoHealthyWorker,
)
from gpu_pool import PoolSettings, WorkerInfo, WorkerPool

log = logging.getLogger("batchgate.service")


class _Observers:
    """Batch events go to the metrics and to admission's latency estimate."""

    def __init__(self, metrics: Metrics, admission: Admission) -> None:
        self._metrics, self._admission = metrics, admission

    def batch_started(self, size: int, reason: FlushReason | None) -> None:
        self._metrics.batch_started(size, reason)

    def batch_finished(self, size: int, seconds: float) -> None:
        self._metrics.batch_finished(size, seconds)
        self._admission.observe_batch(seconds)


class Service:
    def __init__(
        self, settings: Settings, metrics: Metrics, tiers: dict[Tier, TierPolicy], gpus: int = 0
    ) -> None:
        self.settings = settings
        self.tiers = tiers
        self.clock = MonotonicClock()
        self._ids = itertools.count(1)
        self.admission = Admission(
            AdmissionSettings(
                budgets={t: p.budget_ms / 1000 for t, p in tiers.items()},
                max_batch=settings.max_batch,
                initial_latency=max(settings.latency_floor, 0.01),
            )
        )
        self.table = InFlightTable(max_attempts=settings.max_attempts)
        self.dispatcher = Dispatcher(
            self.table, self.clock, hang_timeout=settings.hang_timeout,
            observer=_Observers(metrics, self.admission),
        )
        policy = FlushPolicy(
            max_batch=settings.max_batch,
            max_wait=settings.max_wait_ms / 1000,
            idle_trigger=settings.idle_trigger,
        )
        queues = TierQueues(dict.fromkeys(Tier, settings.queue_capacity))
        self.batcher = Batcher(queues, policy, self.clock, self.dispatcher, self.admission)
        self.pool = WorkerPool(
            PoolSettings(
                model=settings.model,
                workers=settings.workers,
                latency_floor=settings.latency_floor,
                gpus=gpus,
                ready_timeout=settings.ready_timeout_s,
                restart=settings.restart,
            ),
            events=self.dispatcher,
        )
        self.dispatcher.bind(self.batcher, self.pool)
        self.idempotency: IdempotencyStore = MemoryIdempotencyStore(
            ttl=settings.idempotency_ttl_s, max_entries=settings.idempotency_max_entries
        )
        self._batcher_done = anyio.Event()
        metrics.watch(self.snapshot)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every loop; report started once the workers are ready (or fail loudly)."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.pool.run)
            await tg.start(self.dispatcher.watch_hangs)
            ready = await self.pool.wait_ready(self.settings.workers,
                                               self.settings.ready_timeout_s)
            if ready == 0:
                raise RuntimeError(
                    f"no worker became ready within {self.settings.ready_timeout_s:.0f}s"
                )
            log.info("%d of %d workers ready (model %s)", ready, self.settings.workers,
                     self.settings.model)
            await tg.start(self._run_batcher)
            task_status.started()

    async def _run_batcher(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await self.batcher.run(task_status=task_status)
        finally:
            self._batcher_done.set()

    async def drain(self) -> None:
        """Stop accepting, finish what is queued and running; the caller then stops loops."""
        self.batcher.drain()
        with anyio.move_on_after(max(30.0, 2 * self.settings.hang_timeout)):
            await self._batcher_done.wait()  # the queue is empty
            await self.dispatcher.wait_quiet()  # and nothing is in flight
        self.dispatcher.fail_pending()
        for item in self.batcher.queues.drain():
            item.settle(NoHealthyWorker("the server shut down before the item ran"))

    def new_items(
        self, texts: Sequence[str], tier: Tier, now: float, timeout: float, sink: ItemSink
    ) -> list[Item]:
        deadline = now + timeout
        return [
            Item(ItemId(next(self._ids)), text, tier, now, deadline, sink, index)
            for index, text in enumerate(texts)
        ]

    def expected_wait(self, tier: Tier) -> float:
        """Expected completion time of a new item of `tier` (seconds; inf with no worker)."""
        return self.batcher.expected_wait(tier)

    def pressure(self, tier: Tier) -> float:
        """Expected completion over the tier's budget: rate limits tighten as it nears 1."""
        return self.expected_wait(tier) / self.admission.budget(tier)

    @property
    def draining(self) -> bool:
        return self.batcher.draining

    def ready(self) -> bool:
        return not self.draining and self.pool.ready_count() > 0

    def workers(self) -> list[WorkerInfo]:
        return self.pool.workers()

    def snapshot(self) -> Snapshot:
        gauges: dict[str, dict[str, float]] = {
            "estimated_wait_seconds": {},
            "admission_factor": {},
        }
        for tier in Tier:
            name = tier.label
            wait = self.expected_wait(tier)
            gauges["estimated_wait_seconds"][name] = wait if wait != float("inf") else -1.0
            gauges["admission_factor"][name] = pressure_factor(self.pressure(tier))
        return Snapshot(
            batcher=self.batcher.statistics(),
            dispatcher=self.dispatcher.statistics(),
            workers=self.pool.state_counts(),
            crashes=self.pool.crashes,
            tier_gauges=gauges,
            batch_latency=self.admission.batch_latency,
        )


__all__ = ["Service"]
