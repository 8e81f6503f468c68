"""One simulated run: the real core, its real owner and the real fleet, over contract
workers, called by seeded streams of requests, in virtual time.

The core is built as the service builds it (`api/door/service.py`): a dispatch core per
version (`failover.build_core`), the fleet's composite (`ModelCores`) with a placement
(`SwitchCost` unless told otherwise) and the pool's size decided by `Capacity` over a
scaling rule (a fixed pool: a rule whose bounds are its size). The `CoreOwner` drives it
and the `ContractPool` as it drives a real pool, reading the loop's clock (`LoopClock`).

The clock starts early enough for the first workers to load (their load time before 0),
so the day begins with them up; arrivals come in `[0, duration_s)`, each request admitted
as the door admits one (`Clients`). GPU-seconds count over the day; after it, the run waits
`drain_s` for the requests still open (None: until each is answered or given up at its
deadline) and then ends.

Starts take their model's load time, each a spawn; with `kinds` (`StartTimes`) the pool
forks and parks and wakes as a host with a launcher does, and the core is told how the
pool would start a version (`ModelCores(how=...)`, as the service wires it) so that it
expects the time of that kind.

A model may be guarded (`pre`, `post`, `guard_mode`: the catalogue's keys) by guard models
of the world, whose contract workers answer a verdict for each input (`Model.verdict`), so
a run measures what the guard stages cost with nothing but the policy in the way.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from batcher import LoopClock, Tier, VersionKey
from batcher.shared import Backoff
from failover import CoreOwner, CoreSettings, DispatchCore, build_core
from failover.fleet import (
    Capacity,
    Catalogue,
    ModelConfig,
    ModelCores,
    Placement,
    Scaler,
    ScalerSettings,
    SwitchCost,
    VersionConfig,
)
from failover.sim.arrivals import Stream, merged
from failover.sim.clients import Clients
from failover.sim.loop import run_virtual
from failover.sim.outcome import Outcome
from failover.sim.pool import ContractPool, Death, StartTimes
from failover.sim.record import Record
from gpu_pool import Load, Ok, Run, StartKind

VERSION = "v1"  # each simulated model has one version


@dataclass(frozen=True, slots=True)
class Model:
    """One model served (one version, `VERSION`): what its batches and loads take, and its
    bounds in the catalogue."""

    name: str = "default"
    batch_s: float = 0.1  # every batch, whatever its size
    load_s: float = 0.0  # a start or a switch spawned (also the catalogue's hint, if > 0)
    min_workers: int = 1
    max_workers: int | None = None
    idle_unload_s: float = 600.0
    pre: tuple[str, ...] = ()  # guard models of the world run before it, in order
    post: tuple[str, ...] = ()  # and after it
    guard_mode: str = "sequential"
    guard_timeout_s: float | None = None  # None: the catalogue's default
    verdict: Callable[[str], str] | None = None  # a guard: its answer for an input

    @property
    def version(self) -> VersionKey:
        return VersionKey.of(self.name, VERSION)

    def config(self) -> ModelConfig:
        hint = self.load_s if self.load_s > 0 else None
        config = ModelConfig(self.name, VERSION, {VERSION: VersionConfig(VERSION, "sim", hint)},
                             min_workers=self.min_workers, max_workers=self.max_workers,
                             idle_unload_s=self.idle_unload_s, pre=self.pre, post=self.post,
                             guard_mode=self.guard_mode)
        if self.guard_timeout_s is None:
            return config
        return dataclasses.replace(config, guard_timeout_s=self.guard_timeout_s)

    def answer(self, load: Load, run: Run) -> Ok:
        """A contract worker's answer: each input itself, or a guard's verdict on it."""
        verdict = self.verdict
        outputs = run.inputs if verdict is None else tuple(verdict(t) for t in run.inputs)
        return Ok(run.batch_id, outputs, load.floor(None))


Rule = Callable[[ContractPool], Scaler]
"""Makes the scaling rule `Capacity` asks (it may read the pool it sizes, as a baseline
that counts requests in flight does)."""


@dataclass(frozen=True, slots=True)
class World:
    """Everything one run is made of. `workers`: the pool's first slots (and a fixed pool's
    size when `rule` is None)."""

    streams: tuple[Stream, ...]
    duration_s: float
    core: CoreSettings
    models: tuple[Model, ...] = (Model(),)
    workers: int = 1
    placement: Callable[[], Placement] = SwitchCost
    rule: Rule | None = None
    deaths: tuple[Death, ...] = ()
    backoff: Backoff = field(default_factory=Backoff)
    measure_from: float = 0.0  # requests arriving earlier leave no latency (a warm-up)
    drain_s: float | None = None  # after the day; None: until every request is answered
    door: bool = True  # False: nothing refused, every request queued until its timeout
    seed: int = 1
    kinds: StartTimes | None = None  # forks, parking and wakes; None: every start a spawn

    def __post_init__(self) -> None:
        if not 0 < self.duration_s < math.inf or self.workers < 0 or not self.models:
            raise ValueError("a world needs a duration > 0, workers >= 0 and a model")
        names = [m.name for m in self.models]
        unknown = {s.model for s in self.streams} - {None, *names}
        if len(set(names)) != len(names) or unknown:
            raise ValueError(f"models named twice, or streams for no model: {unknown}")

    def model(self, version: VersionKey) -> Model:
        return next(m for m in self.models if m.version == version)

    def catalogue(self) -> Catalogue:
        return Catalogue({m.name: m.config() for m in self.models})


def simulate(world: World) -> Outcome:
    """Run `world` once; the same world gives the same outcome."""
    began = time.perf_counter()
    warm = max(m.load_s for m in world.models)
    outcome: Outcome = run_virtual(lambda: _Run(world).run(), start=-warm)
    return dataclasses.replace(outcome, wall_s=time.perf_counter() - began)


class _Run:
    def __init__(self, world: World) -> None:
        self.world = w = world
        self.clock = LoopClock()

        core = w.core if w.door else dataclasses.replace(
            w.core, budgets=dict.fromkeys(Tier, math.inf))

        def make_core(version: VersionKey, serving: Catalogue) -> DispatchCore:
            latency = w.model(version).batch_s
            return build_core(dataclasses.replace(core, initial_latency=latency),
                              version=version)

        def load(version: VersionKey) -> Load:
            return Load(version, "sim", w.model(version).batch_s)

        self.fills: dict[str, list[int]] = {m.name: [0, 0] for m in w.models}

        def answer(load: Load, run: Run) -> Ok:
            fill = self.fills[load.version.model]
            fill[0] += 1
            fill[1] += len(run.inputs)
            return w.model(load.version).answer(load, run)

        self.pool = pool = ContractPool([], lambda v: w.model(v).load_s, w.backoff, w.deaths,
                                        (0.0, w.duration_s), answer, w.kinds)
        rule = w.rule(pool) if w.rule is not None else Scaler(
            ScalerSettings(w.workers, max(w.workers, 1)))

        def how(version: VersionKey) -> StartKind:
            """How the pool would start `version` now (built first, unlike the service's:
            before it runs, every start is a first one, a spawn)."""
            return pool.start_kind(load(version))

        self.models = ModelCores(w.catalogue(), make_core, w.placement(), Capacity(rule),
                                 w.backoff, how=how)
        self.load = load
        self.record = Record(len(w.streams), self.clock, w.measure_from)

    async def run(self) -> Outcome:
        w, models, pool, clock = self.world, self.models, self.pool, self.clock
        first = [self.load(v) for v in models.initial(w.workers)]
        models.starting([f.version for f in first], clock.now())
        pool.first = first
        owner = CoreOwner(models, pool, clock, loads=self.load)
        clients = Clients(w.streams, merged(w.streams, w.duration_s, w.seed), self.record,
                          clock, w.door)
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run, owner)
            await tg.start(owner.run)
            await anyio.sleep_until(0.0)
            await clients.run(owner, w.duration_s + (math.inf if w.drain_s is None
                                                     else w.drain_s))
            tg.cancel_scope.cancel()
        self.record.close()
        end = max(clock.now(), w.duration_s)
        gauges = models.capacity(end)
        named = w.models[0].name  # what a stream naming no model calls
        return Outcome(
            tuple((s.model or named, s.tier) for s in w.streams), tuple(self.record.tallies),
            w.duration_s,
            pool.figures(end), dict(models.loads),
            {} if gauges is None else dict(gauges.events),
            sum(t.offered for t in self.record.tallies) + pool.counts.fired, 0.0,
            {m: items / batches for m, (batches, items) in self.fills.items() if batches})


__all__ = ["Model", "Rule", "World", "simulate"]
