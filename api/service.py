"""The running service: builds the dispatch core, its owner and the pool from settings, runs
them in one task group, takes requests in, and drains on the way out."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import cast

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
    Item,
    ItemId,
    ItemSink,
    MonotonicClock,
    Tier,
    TierQueues,
)
from failover import (
    BatchTimes,
    CoreOwner,
    DispatchCore,
    IdempotencyStore,
    InFlightTable,
    MemoryIdempotencyStore,
)
from gpu_pool import (
    Pool,
    PoolSettings,
    RayPoolSettings,
    WorkerInfo,
    WorkerPool,
    parse_resources,
)

log = logging.getLogger("batchgate.service")


class Service:
    def __init__(
        self, settings: Settings, metrics: Metrics, tiers: dict[Tier, TierPolicy], gpus: int = 0,
        pool: Pool | None = None,
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
        policy = FlushPolicy(
            max_batch=settings.max_batch,
            max_wait=settings.max_wait_ms / 1000,
            idle_trigger=settings.idle_trigger,
        )
        queues = TierQueues(dict.fromkeys(Tier, settings.queue_capacity))
        core = DispatchCore(
            Batcher(queues, policy, self.admission),
            InFlightTable(max_attempts=settings.max_attempts, times=BatchTimes(settings.hang)),
            self.admission,
        )
        self.pool: Pool = pool or build_pool(settings, gpus)
        self.core = CoreOwner(core, self.pool, self.clock, observer=metrics)
        self.leaving = False  # SIGTERM seen: not ready, still serving (see `leave`)
        self.idempotency: IdempotencyStore = MemoryIdempotencyStore(
            ttl=settings.idempotency_ttl_s, max_entries=settings.idempotency_max_entries,
            max_bytes=settings.idempotency_max_bytes,
            account_share=settings.idempotency_account_share,
        )
        metrics.watch(self.snapshot)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the pool and the core's owner; report started once the workers are ready
        (or fail loudly)."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.pool.run, self.core)
            await tg.start(self.core.run)
            ready = await self.pool.wait_ready(self.settings.workers,
                                               self.settings.ready_timeout_s)
            if ready == 0:
                raise RuntimeError(
                    f"no worker became ready within {self.settings.ready_timeout_s:.0f}s"
                )
            log.info("%d of %d workers ready (model %s)", ready, self.settings.workers,
                     self.settings.model)
            task_status.started()

    async def drain(self) -> None:
        """Stop accepting, finish what is queued and running; the caller then stops loops."""
        self.core.drain()
        with anyio.move_on_after(max(30.0, 2 * (self.settings.hang.kill_after or 0.0))):
            await self.core.wait_finished()
        self.core.abandon()

    def new_items(
        self, texts: Sequence[str], tier: Tier, now: float, timeout: float, sink: ItemSink
    ) -> list[Item]:
        deadline = now + timeout
        ids = self._ids
        if len(texts) == 1:  # most requests
            return [Item(cast(ItemId, next(ids)), texts[0], tier, now, deadline, sink)]
        return [
            Item(cast(ItemId, next(ids)), text, tier, now, deadline, sink, index)
            for index, text in enumerate(texts)
        ]

    def expected_wait(self, tier: Tier) -> float:
        """Expected completion time of a new item of `tier` (seconds; inf with no worker)."""
        return self.core.expected_wait(tier)

    def pressure(self, tier: Tier) -> float:
        """Expected completion over the tier's budget: rate limits tighten as it nears 1."""
        return self.expected_wait(tier) / self.admission.budget(tier)

    @property
    def draining(self) -> bool:
        return self.core.draining

    def ready(self) -> bool:
        return not (self.draining or self.leaving) and self.pool.ready_count() > 0

    def leave(self) -> None:
        """Shutdown was asked for: say not-ready at once, while still serving (the drain
        delay), so that load balancers stop sending before the door closes."""
        self.leaving = True

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
            core=self.core.statistics(),
            workers=self.pool.state_counts(),
            crashes=self.pool.crashes,
            tier_gauges=gauges,
            idempotency=self.idempotency.statistics(),
        )


def build_pool(settings: Settings, gpus: int) -> Pool:
    """The process pool, or with `--pool ray` the Ray pool (its module imports Ray, so only
    then)."""
    base = PoolSettings(
        model=settings.model,
        workers=settings.workers,
        latency_floor=settings.latency_floor,
        gpus=gpus,
        ready_timeout=settings.ready_timeout_s,
        restart=settings.restart,
    )
    if settings.pool == "process":
        return WorkerPool(base)
    from gpu_pool.ray_pool import RayPool

    resources = parse_resources(settings.ray_worker_resources)
    return RayPool(RayPoolSettings(base, address=settings.ray_address, resources=resources))


__all__ = ["Service", "build_pool"]
