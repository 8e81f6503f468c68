"""The running core: the dispatch core, its owner, the pool and the idempotency store, built
from the settings; run in one task group, and drained on the way out.

The idempotency store is the memory store alone (`--state memory`), or the memory store in
front of a durable layer (`sqlite:PATH`, `redis://`) whose claims name this core: its
`CellIdentity`, given by whoever starts it (the cell's supervisor: the same cell for every
core it starts, one incarnation more at each restart; a single process: `BATCHGATE_CELL_ID`
read at the edge, else a random cell of its own, incarnation 0)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

import anyio
from anyio.abc import TaskStatus

from api.config import Settings, TierPolicy
from api.door.limits import pressure_factor
from api.door.overrides import Overrides
from api.door.state import build_state
from api.kept import (
    BackedStore,
    IdempotencyStore,
    MemoryIdempotencyStore,
    StateUnavailable,
    check_state_file,
)
from api.metrics import ScalingGauges, Snapshot, VersionGauges
from batcher import FlushPolicy, MonotonicClock, Tier, VersionKey
from failover import CoreObserver, CoreOwner, CoreSettings, DispatchCore, HangSettings, build_core
from failover.fleet import (
    REASONS,
    Capacity,
    CapacityGauges,
    Catalogue,
    CatalogueError,
    ModelCores,
    Scaler,
    ScalerSettings,
    SwitchCost,
    VersionStatus,
    check_fits,
    load_catalogue,
)
from gpu_pool import (
    CellIdentity,
    Load,
    Pool,
    PoolSettings,
    RayPoolSettings,
    Salvage,
    StartKind,
    WorkerInfo,
    WorkerPool,
    default_latency_floor,
    parse_resources,
    validate_spec,
)

log = logging.getLogger("batchgate.service")
UP = frozenset({"ready", "busy"})  # the states of a worker that serves
ON_DEMAND = frozenset({VersionStatus.COLD, VersionStatus.LOADING})  # loads when asked for
LOAD_REASONS = tuple(dict.fromkeys((*REASONS, "rollout")))  # placement's, and a rollout's


def check_core_settings(settings: Settings) -> None:
    """What only the core's packages can check (a gateway never loads them): the model
    spec or the catalogue, and the Ray resources. ValueError with a readable message."""
    check_fits(catalogue_of(settings), settings.workers.min, settings.workers.max)
    parse_resources(settings.ray_worker_resources)


def check_state(settings: Settings) -> None:
    """A `--state sqlite:` file opens, asked before any model loads (a Redis is asked
    when the service runs: it may come up after the server). ValueError naming the file
    and why not."""
    path = settings.state_spec().path
    if path is None:
        return
    try:
        check_state_file(path)
    except StateUnavailable as exc:
        raise ValueError(f"state {settings.state!r}: {exc}") from None


def catalogue_of(settings: Settings) -> Catalogue:
    """What is served: `--models`, else the one model `--model` names (CatalogueError,
    a ValueError, says what is wrong with a file)."""
    if settings.models is not None:
        return load_catalogue(settings.models)
    return Catalogue.single(validate_spec(settings.model))


def laid_over(overrides: Overrides, file: Catalogue, settings: Settings) -> Catalogue:
    """What a core starts serving: `file` with the admin's kept changes, or `file` alone
    where they no longer fit the pool (CatalogueError when the file itself does not)."""
    laid = overrides.merged(file)
    try:
        check_fits(laid.catalogue, settings.workers.min, settings.workers.max)
    except CatalogueError as exc:
        laid = overrides.bare(file, f"they do not fit the pool ({exc})")
        check_fits(file, settings.workers.min, settings.workers.max)
    overrides.take(laid)
    return laid.catalogue


def load_of(settings: Settings, catalogue: Catalogue, version: VersionKey) -> Load:
    """What a worker holding `version` loads, its batches padded to the flag's floor or
    else the spec's own."""
    _, config = catalogue.config_of(version)
    floor = (settings.batch_latency_ms / 1000 if settings.batch_latency_ms is not None
             else default_latency_floor(config.spec))
    return Load(version, config.spec, floor, spawn=config.start == "spawn",
                preload=config.start == "preload")


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


def core_settings(settings: Settings, tiers: dict[Tier, TierPolicy],
                  floor: float | None = None,
                  weights: Mapping[str, float] | None = None) -> CoreSettings:
    """`floor`: the batch latency of the version the core serves, if not the model's;
    `weights`: the accounts' fair-share weights (the keys file's)."""
    policy = FlushPolicy(max_batch=settings.max_batch, max_wait=settings.max_wait_ms / 1000,
                         idle_trigger=settings.idle_trigger,
                         max_batch_chars=settings.max_batch_chars)
    return CoreSettings(
        budgets={t: p.budget_ms / 1000 for t, p in tiers.items()}, policy=policy,
        queue_capacity=settings.queue_capacity,
        initial_latency=max(latency_floor(settings) if floor is None else floor, 0.01),
        max_attempts=settings.max_attempts, hang=hang_settings(settings),
        fair_share=settings.fair_share, weights=dict(weights or {}),
    )


def build_capacity(settings: Settings, gpus: int) -> Capacity:
    """The pool's size: the scaling rule for `--workers MIN:MAX`; for a fixed pool a rule
    whose bounds are its size, which never scales but counts its restarts as workers on their
    way (the door's Retry-After says when they come). A pool of processes never holds more
    workers than the host has GPUs. ValueError with a readable message."""
    if settings.workers.scaling and settings.pool == "process" \
            and 0 < gpus < settings.workers.max:
        raise ValueError(f"workers {settings.workers} asks for up to {settings.workers.max} "
                         f"workers on this host, which has {gpus} GPUs")
    delay = settings.scale_down_delay_s
    # A peak is remembered no longer than the pool waits before it shrinks. What a worker
    # drains is no setting: each version's core measures it (`DispatchCore.throughput`).
    long = min(60.0, max(delay, 2.0))
    return Capacity(Scaler(ScalerSettings(
        min_workers=settings.workers.min, max_workers=settings.workers.max,
        scale_down_delay_s=delay, down_step_s=delay / 10,
        long_window_s=long, short_window_s=min(10.0, long / 2))))


class Service:
    def __init__(
        self, settings: Settings, observer: CoreObserver, tiers: dict[Tier, TierPolicy],
        pool: Pool | None = None, identity: CellIdentity | None = None,
        overrides: Overrides | None = None, weights: Mapping[str, float] | None = None,
    ) -> None:
        """`overrides`: the admin's changes kept over the models file (None: none yet,
        kept in memory); `weights`: the accounts' fair-share weights (`KeyRing.weights`)."""
        self.settings = settings
        self.clock = MonotonicClock()
        self.budgets = {t: p.budget_ms / 1000 for t, p in tiers.items()}
        self.overrides = overrides or Overrides(None)  # the admin's, over the file
        self.catalogue = catalogue = laid_over(self.overrides, catalogue_of(settings), settings)
        self.weights = dict(weights or {})  # the keys file's, as last read (`set_weights`)

        def make_core(version: VersionKey, serving: Catalogue) -> DispatchCore:
            try:
                floor: float | None = load_of(settings, serving, version).floor(None)
            except LookupError:  # gone from the catalogue: it only drains
                floor = None
            return build_core(core_settings(settings, tiers, floor, self.weights),
                              version=version)

        def load(version: VersionKey) -> Load:
            return load_of(settings, self.models.catalogue, version)

        started: list[Pool] = []  # the pool, once built: it needs the first starts placed

        def how(version: VersionKey) -> StartKind:
            """How the pool would start `version` now: its time is what a start costs."""
            try:
                return started[0].start_kind(load(version)) if started else StartKind.SPAWN
            except LookupError:  # gone from the catalogue
                return StartKind.SPAWN

        self.models = ModelCores(catalogue, make_core, SwitchCost(),
                                 build_capacity(settings, settings.gpus or 0),
                                 most=settings.workers.max, how=how)
        loads = tuple(load(v) for v in self.models.initial(settings.workers.min))
        self.models.starting([v.version for v in loads], self.clock.now())
        claimable = tuple(load(v) for v in catalogue.versions())
        self.salvage = Salvage()  # what a dead core's workers ran, for keyed requests
        self.pool: Pool = pool or build_pool(settings, loads, claimable, identity, self.salvage)
        started.append(self.pool)
        self.core = CoreOwner(self.models, self.pool, self.clock, observer=observer,
                              loads=load)
        self.leaving = False  # SIGTERM seen: not ready, still serving (see `leave`)
        memory = MemoryIdempotencyStore(
            ttl=settings.idempotency_ttl_s, max_entries=settings.idempotency_max_entries,
            max_bytes=settings.idempotency_max_bytes,
            account_share=settings.idempotency_account_share,
        )
        durable = build_state(settings)
        self.kept = None if durable is None else BackedStore(memory, durable, self.clock,
                                                             budgets=self.budgets)
        self.idempotency: IdempotencyStore = memory if self.kept is None else self.kept

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the pool and the core's owner; report started once the workers are ready
        (or fail loudly)."""
        async with anyio.create_task_group() as tg:
            if self.kept is not None:  # first: a locked state file stops the start
                await tg.start(self.kept.run)
            await tg.start(self.pool.run, self.core)
            await tg.start(self.core.run)
            ready = await self.pool.wait_ready(self.settings.workers.min,
                                               self.settings.ready_timeout_s)
            if ready == 0:
                raise RuntimeError(
                    f"no worker became ready within {self.settings.ready_timeout_s:.0f}s"
                )
            held = {w.version for w in self.pool.workers() if w.state in UP}
            cold = [v for v in self.catalogue.versions() if v not in held]
            log.info("%d of %d workers ready, holding %s%s", ready, self.settings.workers.min,
                     ", ".join(v for v in self.catalogue.versions() if v in held) or "nothing",
                     f" (loaded when asked: {', '.join(cold)})" if cold else "")
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

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The keys file read again (SIGHUP): the accounts' fair-share weights from now on,
        in the queues of every version (`ModelCores.set_weights`)."""
        if weights != self.weights:
            self.weights = dict(weights)
            self.models.set_weights(self.weights)
            log.info("fair-share weights now those of the keys file: %d accounts named",
                     len(self.weights))

    def pressure(self, tier: Tier) -> float:
        """Expected completion over the tier's budget: rate limits tighten as it nears 1."""
        return self.core.expected_wait(tier) / self.budgets[tier]

    @property
    def draining(self) -> bool:
        return self.core.draining

    def ready(self) -> bool:
        """Serving, and some model's serving version can serve: a worker holds it (as the
        pool says: the core hears of a worker a loop turn later), or it loads on demand
        (cold or loading, not failing, and a worker is up that it could load onto). A
        model gone cold is servable: a balancer that took the server out for it would
        keep out the request that wakes it."""
        if self.draining or self.leaving:
            return False
        up = {w.version for w in self.pool.workers() if w.state in UP}
        if not up:
            return False
        models = self.models
        serving = {VersionKey.of(name, version) for name in models.catalogue.models
                   if (version := models.serving_default(name)) is not None}
        return any(s.version in up or s.state in ON_DEMAND
                   for s in models.versions(self.clock.now()) if s.version in serving)

    def state_failing(self) -> str | None:
        """Why the `--state` store fails now (None: it answers, or there is none)."""
        return None if self.kept is None else self.kept.failing

    def leave(self) -> None:
        """Shutdown was asked for: say not-ready at once, while still serving (the drain
        delay), so that load balancers stop sending before the door closes."""
        self.leaving = True

    def workers(self) -> list[WorkerInfo]:
        return self.pool.workers()

    def capacity(self) -> CapacityGauges | None:
        """The pool's size as the scaling rule sees it (a fixed pool: its size)."""
        return self.models.capacity(self.clock.now())

    def snapshot(self) -> Snapshot:
        """What a scrape shows (the loads measured are told to the observer as they end,
        as batches are)."""
        gauges: dict[str, dict[str, float]] = {
            "estimated_wait_seconds": {},
            "admission_factor": {},
        }
        for tier in Tier:
            name = tier.label
            wait = self.core.expected_wait(tier)
            gauges["estimated_wait_seconds"][name] = wait if wait != float("inf") else -1.0
            gauges["admission_factor"][name] = pressure_factor(self.pressure(tier))
        models = self.models
        by_version = models.statistics_by_version(self.clock.now())
        failing = {s.version for s in models.versions(self.clock.now())
                   if s.state is VersionStatus.FAILING}
        loads: dict[tuple[str, str], int] = {
            (version, why): 0 for version in by_version for why in LOAD_REASONS}
        loads.update((counted, n) for counted, n in models.loads.items())
        capacity = self.capacity()
        return Snapshot(
            core=self.core.statistics(),
            workers=self.pool.state_counts(),
            crashes=self.pool.crashes,
            # Both slot pools count them; the seam asks it of no pool.
            replacements=getattr(self.pool, "replacements", 0),
            tier_gauges=gauges,
            idempotency=self.idempotency.statistics(),
            versions={version: VersionGauges(dict(stats.batcher.depth),
                                             stats.table.idle + stats.table.busy,
                                             version in failing)
                      for version, stats in by_version.items()},
            loads=loads,
            scaling=None if capacity is None else ScalingGauges(
                capacity.desired, capacity.starting, capacity.running, capacity.eta_s,
                capacity.events),
        )


def build_pool(settings: Settings, loads: tuple[Load, ...] = (),
               claimable: tuple[Load, ...] = (), identity: CellIdentity | None = None,
               salvage: Salvage | None = None) -> Pool:
    """The process pool, or with `--pool ray` the Ray pool (its module imports Ray, so only
    then); `loads`: what each slot starts with (none: `--model` on every one); `claimable`:
    the versions a cell's restarted core takes over from live workers or actors; `identity`:
    the cell's (None: the workers die with this process); `salvage`: where attached
    workers' keyed answers go."""
    base = PoolSettings(
        model=settings.model,
        workers=settings.workers.min,
        loads=loads,
        latency_floor=latency_floor(settings),
        gpus=settings.gpus or 0,  # None: not asked of torch (a test, a Ray pool): the CPU
        ready_timeout=settings.ready_timeout_s,
        restart=settings.restart,
        max_rss_mb=settings.worker_max_rss_mb,
        otlp_endpoint=settings.otlp_endpoint,
        launcher=settings.launcher,
        parked_max=settings.parked_max,
        parked_ram_mb=settings.parked_ram_mb,
    )
    if settings.pool == "process":
        attach = None if identity is None else identity.workers
        return WorkerPool(replace(base, attach=attach, claimable=claimable), salvage)
    from gpu_pool.ray_pool import RayPool

    resources = parse_resources(settings.ray_worker_resources)
    return RayPool(RayPoolSettings(base, address=settings.ray_address, resources=resources,
                                   cell=identity, claimable=claimable,
                                   max_workers=settings.workers.max))


__all__ = ["Service", "build_pool", "check_core_settings", "check_state", "core_settings",
           "hang_settings", "latency_floor"]
