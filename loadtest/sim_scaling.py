"""Capacity that follows the load, in the simulator (`failover.sim`): a compressed day, the
real core under five pool policies, on the same seeded Poisson arrivals (paid and free
apart, one input per request).

Every policy runs the real door's admission (the default tiers' budgets and timeouts), the
real batcher, ledger and owner over contract workers (a batch of up to `MAX_BATCH` in
`BATCH_S`, a start in `start_s`); only the rule that sizes the pool changes, plugged into
the core's `Capacity`: `batchgate` (`failover.fleet.Scaler`, built as `--workers MIN:MAX
--scale-down-delay-s` builds it); `fixed-peak` (MIN = MAX = the busiest moment at the rule's
target utilization: the others' maximum); `fixed-fewest` (the busiest moment at full
batches: hindsight); `ray-serve-default` (`loadtest.sim_rules.RayServeDefault`, and no door:
admission past reach, requests wait until their timeout); `oracle`
(`loadtest.sim_rules.Oracle`). GPU-seconds count workers starting, up or restarting, over
the day.

Start kinds (`run_kinds`): batchgate again with the pool starting workers as a host with a
launcher and parking does (`failover.sim.pool.StartTimes`), beside today's single kind,
against the same oracle (today's). The times are a GPU host's (`HostStarts`), scaled into
the day as its start-up is: the day is `COMPRESSION` times shorter than the README's, so
its 30 s start-up (`Trace.start_s`) stands for a 120 s spawn. A fork takes the spawn's
share measured here of minilm forked from the launcher against spawned (0.30 s / 6.5 s,
about 0.046); a wake 2 s (a few GiB of weights host-to-GPU: vLLM reports 0.1-0.4 s for a
sleep-mode wake, llm-d about 3 s for a 64 GiB model); parked at most 2 (`--parked-max`'s
default).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

from api.config import DEFAULT_TIERS
from batcher import FlushPolicy, Tier
from failover import CoreSettings
from failover.fleet import Scaler, ScalerSettings
from failover.sim import ContractPool, Model, Outcome, Stream, Tally, World, simulate, varying
from failover.sim.pool import StartTimes
from loadtest.sim_rules import Oracle, RayServeDefault

BATCH_S, MAX_BATCH = 0.1, FlushPolicy().max_batch
CAPACITY = MAX_BATCH / BATCH_S  # items/s one worker drains at full batches
BUDGET = {t: p.budget_ms / 1000 for t, p in DEFAULT_TIERS.items()}
TIMEOUT = {t: p.timeout_ms / 1000 for t, p in DEFAULT_TIERS.items()}
POLICIES = ("batchgate", "fixed-peak", "fixed-fewest", "ray-serve-default", "oracle")
COMPRESSION = 4.0  # the README's day of 20 minutes run in 5: every time in it shrunk alike
FORK_SHARE = 0.30 / 6.5  # minilm forked from the launcher against spawned, measured here


@dataclass(frozen=True, slots=True)
class HostStarts:
    """A GPU host's start-up times, in its own seconds: a spawn (every import and the
    weights), a fork from the launcher, a parked worker's wake; and how many may park."""

    spawn_s: float = 120.0
    fork_s: float = 120.0 * FORK_SHARE
    wake_s: float = 2.0
    parked_max: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.spawn_s < math.inf or self.fork_s < 0 or self.wake_s < 0 \
                or self.parked_max < 1:
            raise ValueError("start times must be >= 0 (a spawn's > 0), parked_max >= 1")

    def kinds(self, scale: float) -> dict[str, StartTimes | None]:
        """The pool's start kinds to run, by name, times multiplied by `scale` (the
        simulation's seconds per host second): today's single kind (a spawn of the load
        time: None), a launcher's forks, forks and parked wakes."""
        fork, wake = self.fork_s * scale, self.wake_s * scale
        return {"spawn (today)": None, "+ fork": StartTimes(fork_s=fork),
                "+ fork, wake": StartTimes(fork_s=fork, wake_s=wake,
                                           parked_max=self.parked_max)}


@dataclass(frozen=True, slots=True)
class Trace:
    """The day: a raised cosine from `low` to `peak` and back, with a burst, and a start-up
    time; the default is the README's day of 20 minutes compressed to 5 (start-up, burst
    and the rule's scale-down delay shrunk alike, rates halved)."""

    low: float = 100.0
    peak: float = 4_000.0
    duration_s: float = 300.0
    burst_at_s: float = 105.0
    burst_s: float = 7.5
    burst: float = 2.0
    paid_share: float = 0.3
    start_s: float = 30.0  # a worker's start-up (its model's load time): a spawn, 120 s / 4
    scale_down_delay_s: float = 75.0  # the rule's --scale-down-delay-s
    seed: int = 1

    def rate(self, t: float) -> float:
        day = (1 - math.cos(2 * math.pi * t / self.duration_s)) / 2
        burst = self.burst if self.burst_at_s <= t < self.burst_at_s + self.burst_s else 1.0
        return (self.low + (self.peak - self.low) * day) * burst

    @property
    def top(self) -> float:
        """The busiest moment's rate (a bound: the burst at the day's peak)."""
        return self.peak * self.burst

    def busiest(self) -> float:
        """The busiest moment's rate, on a 10 ms grid."""
        return max(self.rate(k / 100) for k in range(round(self.duration_s * 100)))


def scaler_settings(trace: Trace, min_workers: int, max_workers: int) -> ScalerSettings:
    """The rule as the service builds it for `--workers MIN:MAX --scale-down-delay-s D`
    (api/door/service.py `build_capacity`)."""
    delay = trace.scale_down_delay_s
    long = min(60.0, max(delay, 2.0))
    return ScalerSettings(min_workers, max_workers, scale_down_delay_s=delay,
                          down_step_s=delay / 10, long_window_s=long,
                          short_window_s=min(10.0, long / 2))


def world(trace: Trace, workers: int, rule: Callable[[ContractPool], Scaler] | None,
          door: bool = True, kinds: StartTimes | None = None) -> World:
    """The day's world: stream `PAID` then stream `FREE`, each with its tier's timeout. With
    no `door` (Ray Serve) both queue in one tier, oldest first, as one queue of requests.
    `kinds`: the pool's forks and wakes (None: every start a spawn of `start_s`)."""
    streams = tuple(
        Stream(varying(partial(_share_of, trace, share), trace.top * share), None,
               tier if door else Tier.PAID, timeout_s=TIMEOUT[tier])
        for tier, share in ((Tier.PAID, trace.paid_share), (Tier.FREE, 1 - trace.paid_share)))
    return World(streams, trace.duration_s, CoreSettings(budgets=BUDGET),
                 (Model(batch_s=BATCH_S, load_s=trace.start_s),), workers, rule=rule,
                 door=door, seed=trace.seed, kinds=kinds)


def _share_of(trace: Trace, share: float, t: float) -> float:
    return share * trace.rate(t)


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    workers: str  # the bounds, or the fixed count
    outcome: Outcome

    def tier(self, tier: Tier) -> Tally:
        """What the callers of `tier` saw (its stream, whatever queue it used)."""
        return self.outcome.tallies[tier]


def run(trace: Trace, name: str, min_workers: int = 1,
        settings: ScalerSettings | None = None, kinds: StartTimes | None = None,
        label: str | None = None) -> Result:
    """Policy `name` through the day; the scaling ones between `min_workers` and the pool
    the busiest moment needs at the rule's target utilization (`settings`' bounds if given).
    `kinds`: batchgate's pool forks and wakes (the others start as today); `label`: the
    row's name (the policy's if None)."""
    rule = settings or scaler_settings(trace, min_workers, 1)
    top = math.ceil(trace.busiest() / (CAPACITY * rule.target_utilization) - 1e-9)
    if settings is None:
        rule = dataclasses.replace(rule, max_workers=max(top, min_workers, 1))
    bounds = f"{rule.min_workers}:{rule.max_workers}"
    if name == "batchgate":
        return Result(label or name, bounds, simulate(world(
            trace, rule.min_workers, lambda pool: Scaler(rule), kinds=kinds)))
    if kinds is not None:
        raise ValueError("start kinds are batchgate's alone")
    if name in ("fixed-peak", "fixed-fewest"):
        n = top if name == "fixed-peak" else math.ceil(trace.busiest() / CAPACITY - 1e-9)
        return Result(name, str(n), simulate(world(trace, n, None)))
    if name == "ray-serve-default":
        def ray(pool: ContractPool) -> Scaler:
            return RayServeDefault(rule.min_workers, rule.max_workers,
                                   lambda queued: queued + pool.in_flight())

        return Result(name, bounds, simulate(world(trace, rule.min_workers, ray, door=False)))
    if name == "oracle":
        oracle = Oracle(trace.rate, trace.duration_s, CAPACITY, rule, trace.start_s)
        return Result(name, bounds, simulate(world(trace, oracle.held(0.0),
                                                    lambda pool: oracle)))
    raise ValueError(f"no policy {name!r} (policies: {', '.join(POLICIES)})")


def run_all(trace: Trace, names: Sequence[str] = POLICIES, min_workers: int = 1,
            settings: ScalerSettings | None = None, jobs: int = 1) -> list[Result]:
    """Each policy through the same day, `jobs` at a time."""
    one = partial(_run_named, trace, min_workers, settings)
    if jobs < 2:
        return list(map(one, names))
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(one, names))


def _run_named(trace: Trace, min_workers: int, settings: ScalerSettings | None,
               name: str) -> Result:
    return run(trace, name, min_workers, settings)


def run_kinds(trace: Trace, host: HostStarts = HostStarts(), min_workers: int = 1,
              jobs: int = 1) -> list[Result]:
    """Batchgate through the day with each of `host`'s start kinds (scaled so that its spawn
    takes the day's `start_s`), then the oracle (today's: the one floor all are read
    against), `jobs` at a time."""
    scale = trace.start_s / host.spawn_s
    runs = [(f"batchgate {label}", "batchgate", kinds)
            for label, kinds in host.kinds(scale).items()] + [("oracle", "oracle", None)]
    one = partial(_run_kind, trace, min_workers)
    if jobs < 2:
        return list(map(one, runs))
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(one, runs))


def _run_kind(trace: Trace, min_workers: int,
              labelled: tuple[str, str, StartTimes | None]) -> Result:
    label, name, kinds = labelled
    return run(trace, name, min_workers, kinds=kinds, label=label)


__all__ = ["BUDGET", "CAPACITY", "COMPRESSION", "FORK_SHARE", "POLICIES", "HostStarts",
           "Result", "Trace", "run", "run_all", "run_kinds", "scaler_settings", "world"]
