"""The running core: the dispatch core, its owner, the pool and the idempotency store, built
from the settings; run in one task group, and drained on the way out.

The idempotency store is the memory store alone (`--state memory`), or the memory store in
front of a durable layer (`sqlite:PATH`, `redis://`) whose claims name this core: its cell
(`BATCHGATE_CELL_ID`, the same for every core a cell's supervisor starts; a random one per
process by default) and its incarnation (`BATCHGATE_CORE_INCARNATION`, one more at each
restart; 0 by default)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import anyio
from anyio.abc import TaskStatus

from api.config import Settings, TierPolicy
from api.door.limits import pressure_factor
from api.metrics import Snapshot
from batcher import FlushPolicy, MonotonicClock, Tier
from failover import (
    CoreObserver,
    CoreOwner,
    CoreSettings,
    HangSettings,
    IdempotencyStore,
    MemoryIdempotencyStore,
    build_core,
)
from failover.state import (
    BackedStore,
    KeptState,
    Owner,
    RedisSettings,
    SqliteSettings,
    open_state,
)
from gpu_pool import (
    CellIdentity,
    Pool,
    PoolSettings,
    RayPoolSettings,
    WorkerInfo,
    WorkerPool,
    default_latency_floor,
    parse_resources,
    validate_spec,
)

log = logging.getLogger("batchgate.service")


def check_core_settings(settings: Settings) -> None:
    """What only the core's packages can check (a gateway never loads them): the model
    spec and the Ray resources. ValueError with a readable message."""
    validate_spec(settings.model)
    parse_resources(settings.ray_worker_resources)


def latency_floor(settings: Settings) -> float:
    """Seconds every batch is padded to: the flag's, else the model's own (`sim` emulates the
    contract's fixed GPU latency)."""
    if settings.batch_latency_ms is not None:
        return settings.batch_latency_ms / 1000
    return default_latency_floor(settings.model)


def hang_settings(settings: Settings) -> HangSettings:
    """When a stalled batch is re-run elsewhere, and when its worker is killed."""
    hedge = settings.hedge_after_ms
    kill = settings.hang_timeout_ms
    return HangSettings(hedge=hedge > 0, hedge_floor=hedge / 1000 if hedge > 0 else 0.5,
                        kill_after=None if kill is None else kill / 1000)


def core_settings(settings: Settings, tiers: dict[Tier, TierPolicy]) -> CoreSettings:
    policy = FlushPolicy(max_batch=settings.max_batch, max_wait=settings.max_wait_ms / 1000,
                         idle_trigger=settings.idle_trigger,
                         max_batch_chars=settings.max_batch_chars)
    return CoreSettings(
        budgets={t: p.budget_ms / 1000 for t, p in tiers.items()}, policy=policy,
        queue_capacity=settings.queue_capacity,
        initial_latency=max(latency_floor(settings), 0.01),
        max_attempts=settings.max_attempts, hang=hang_settings(settings),
    )


class Service:
    def __init__(
        self, settings: Settings, observer: CoreObserver, tiers: dict[Tier, TierPolicy],
        gpus: int = 0, pool: Pool | None = None,
    ) -> None:
        self.settings = settings
        self.clock = MonotonicClock()
        self.budgets = {t: p.budget_ms / 1000 for t, p in tiers.items()}
        self.pool: Pool = pool or build_pool(settings, gpus)
        core = build_core(core_settings(settings, tiers))
        self.core = CoreOwner(core, self.pool, self.clock, observer=observer)
        self.leaving = False  # SIGTERM seen: not ready, still serving (see `leave`)
        memory = MemoryIdempotencyStore(
            ttl=settings.idempotency_ttl_s, max_entries=settings.idempotency_max_entries,
            max_bytes=settings.idempotency_max_bytes,
            account_share=settings.idempotency_account_share,
        )
        durable = build_state(settings)
        self.kept = None if durable is None else BackedStore(memory, durable, self.clock)
        self.idempotency: IdempotencyStore = memory if self.kept is None else self.kept

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the pool and the core's owner; report started once the workers are ready
        (or fail loudly)."""
        async with anyio.create_task_group() as tg:
            if self.kept is not None:  # first: a locked state file stops the start
                await tg.start(self.kept.run)
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
        kill_after = hang_settings(self.settings).kill_after or 0.0
        with anyio.move_on_after(max(30.0, 2 * kill_after)):
            await self.core.wait_finished()
        self.core.abandon()
        if self.kept is not None:  # what landed last is stored, then the store closed
            await self.kept.drain()

    def pressure(self, tier: Tier) -> float:
        """Expected completion over the tier's budget: rate limits tighten as it nears 1."""
        return self.core.expected_wait(tier) / self.budgets[tier]

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
            wait = self.core.expected_wait(tier)
            gauges["estimated_wait_seconds"][name] = wait if wait != float("inf") else -1.0
            gauges["admission_factor"][name] = pressure_factor(self.pressure(tier))
        return Snapshot(
            core=self.core.statistics(),
            workers=self.pool.state_counts(),
            crashes=self.pool.crashes,
            # Both slot pools count them; the seam asks it of no pool.
            replacements=getattr(self.pool, "replacements", 0),
            tier_gauges=gauges,
            idempotency=self.idempotency.statistics(),
        )


def state_owner(environ: Mapping[str, str] = os.environ) -> Owner:
    """Who this core is to the durable layer, from the variables its supervisor sets.
    ValueError with a readable message."""
    identity = CellIdentity.from_env(environ)
    if identity is None:  # a process of its own: a cell of one core
        return Owner(os.urandom(6).hex(), 0)
    return Owner(identity.cell, identity.incarnation)


def build_state(settings: Settings, environ: Mapping[str, str] = os.environ
                ) -> KeptState | None:
    """The durable layer `--state` names (None for memory); connects to nothing yet."""
    spec = settings.state_spec()
    if spec.kind == "sqlite":
        assert spec.path is not None
        return open_state(SqliteSettings(
            spec.path, ttl=settings.idempotency_ttl_s,
            max_entries=settings.idempotency_max_entries,
            max_bytes=settings.idempotency_max_bytes))
    if spec.kind == "redis":
        return open_state(RedisSettings(spec.host, spec.port, spec.db, state_owner(environ),
                                        ttl=settings.idempotency_ttl_s))
    return None


def build_pool(settings: Settings, gpus: int) -> Pool:
    """The process pool, or with `--pool ray` the Ray pool (its module imports Ray, so only
    then)."""
    base = PoolSettings(
        model=settings.model,
        workers=settings.workers,
        latency_floor=latency_floor(settings),
        gpus=gpus,
        ready_timeout=settings.ready_timeout_s,
        restart=settings.restart,
        max_rss_mb=settings.worker_max_rss_mb,
    )
    if settings.pool == "process":
        return WorkerPool(base)
    from gpu_pool.ray_pool import RayPool

    resources = parse_resources(settings.ray_worker_resources)
    cell = CellIdentity.from_env(os.environ)  # None outside a cell: actors die with the process
    return RayPool(RayPoolSettings(base, address=settings.ray_address, resources=resources,
                                   cell=cell))


__all__ = ["Service", "build_pool", "build_state", "check_core_settings", "core_settings",
           "hang_settings", "latency_floor", "state_owner"]
