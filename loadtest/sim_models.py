"""Model placement in the simulator (`failover.sim`): several models on a few contract
workers, where a switch costs a load, placed by `SwitchCost` or by the LRU-on-demand
baseline plugged in as the core's `Placement`.

The real core serves (`ModelCores` with a dispatch core per model, its owner, the paid
tier's default budget and timeout: `api.config.DEFAULT_TIERS`), over contract workers: a
batch of up to 100 takes `BATCH_S` whatever its size, one at a time; a switch holds the
worker `load_s`. Requests of one input each, all paid, come as one seeded Poisson stream per
model, the split between them optionally rotating every `shift_s` (the hot model moves on).
The first model holds min_workers 1 (the catalogue's default), the others 0; the initial
placement gives each model a worker where the pool allows, and loads count from there on.
`failed` counts every request not answered: refused at the door (over budget, or its model
cold past its deadline), or given up at its deadline.

    python -m loadtest.sim_models [--markdown] [--duration S] [--rates R,R] [--seed N]
        [--jobs N] [--kinds [--load-s S] [--fork-s S] [--wake-s S] [--parked-max N]]

`--kinds`: the rotating split only, each policy with today's single kind of start (a switch
spawns, `load_s`) beside a pool with a launcher and parking (`failover.sim.pool.StartTimes`):
a switch away parks the worker, a switch back wakes it, any other start forks. The times are
a GPU host's shares of its spawn (`loadtest.sim_scaling.HostStarts`: a fork 0.30 s / 6.5 s of
it, as minilm measured here; a wake 2 s of a 120 s spawn), scaled so that the spawn is
`load_s`: with the default 2 s, a fork 0.09 s and a wake 0.03 s.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

from api.config import DEFAULT_TIERS
from batcher import Tier
from failover import CoreSettings
from failover.fleet import LruOnDemand, Placement, SwitchCost
from failover.sim import Model, Outcome, Stream, Tally, World, constant, simulate, varying
from failover.sim.outcome import ms
from failover.sim.pool import StartTimes
from loadtest.sim_scaling import HostStarts

BATCH_S = 0.1
SPLIT = (0.80, 0.15, 0.05)
DEFAULT_RATES = (400.0, 2_000.0)
POLICIES: dict[str, Callable[[], Placement]] = {"switch-cost": SwitchCost,
                                                "lru-on-demand": LruOnDemand}
HOST = HostStarts()  # a GPU host's start-ups, whose shares of its spawn `--kinds` takes


@dataclass(frozen=True, slots=True)
class Scenario:
    rate: float  # items/s, all models together
    shift_s: float = math.inf  # the split rotates by one model every shift_s
    split: tuple[float, ...] = SPLIT
    duration_s: float = 300.0
    workers: int = 4
    load_s: float = 2.0
    min_workers: tuple[int, ...] = (1, 0, 0)  # per model: the first is the catalogue's default
    seed: int = 1
    kinds: StartTimes | None = None  # forks and parked wakes; None: every start a spawn

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration_s <= 0 or self.workers < 1 or self.shift_s <= 0:
            raise ValueError("rate, duration_s, shift_s must be > 0 and workers >= 1")
        if len(self.min_workers) != len(self.split) or abs(sum(self.split) - 1) > 1e-9:
            raise ValueError("split must sum to 1, with one min_workers per model")

    @property
    def name(self) -> str:
        split = "/".join(f"{share * 100:g}" for share in self.split)
        if math.isinf(self.shift_s):
            return f"{split} steady"
        return f"{split} rotating every {self.shift_s:g} s"

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(f"m{i + 1}" for i in range(len(self.split)))

    def share(self, model: int, t: float) -> float:
        """Model `model`'s share of the traffic at `t`."""
        shift = 0 if math.isinf(self.shift_s) else int(t // self.shift_s)
        return self.split[(model - shift) % len(self.split)]

    def world(self, placement: Callable[[], Placement]) -> World:
        paid = DEFAULT_TIERS[Tier.PAID]
        core = CoreSettings(budgets={t: p.budget_ms / 1000 for t, p in DEFAULT_TIERS.items()})
        models = tuple(Model(name, BATCH_S, self.load_s, floor)
                       for name, floor in zip(self.models, self.min_workers, strict=True))
        top = self.rate * max(self.split)
        streams = tuple(
            Stream(constant(self.rate * self.split[i]) if math.isinf(self.shift_s) else
                   varying(partial(_rate, self, i), top), name, Tier.PAID,
                   timeout_s=paid.timeout_ms / 1000)
            for i, name in enumerate(self.models))
        return World(streams, self.duration_s, core, models, self.workers, placement,
                     seed=self.seed, kinds=self.kinds)

    @property
    def starts(self) -> str:
        """How its pool starts workers: spawns only, or forks and wakes too."""
        kinds = self.kinds
        if kinds is None:
            return "spawn"
        return "+".join(["fork"] * (kinds.fork_s is not None)
                        + ["wake"] * (kinds.parked_max > 0)) or "spawn"


def _rate(scenario: Scenario, model: int, t: float) -> float:
    return scenario.rate * scenario.share(model, t)


@dataclass(frozen=True, slots=True)
class Result:
    """One policy through one scenario."""

    policy: str
    scenario: Scenario
    outcome: Outcome

    @property
    def loads(self) -> int:
        return self.outcome.loads_total

    @property
    def loads_per_minute(self) -> float:
        return self.loads / (self.scenario.duration_s / 60)

    @property
    def wakes_per_minute(self) -> float:
        return self.outcome.pool.wakes / (self.scenario.duration_s / 60)

    @property
    def forks_per_minute(self) -> float:
        return self.outcome.pool.forks / (self.scenario.duration_s / 60)

    @property
    def lost_share(self) -> float:
        """Share of the pool's worker time spent loading."""
        return self.outcome.pool.switch_s / (self.scenario.workers * self.scenario.duration_s)

    def model(self, index: int) -> Tally:
        return self.outcome.tally(model=self.scenario.models[index])

    @property
    def failed(self) -> int:
        every = self.outcome.tally()
        return every.offered - every.answered


def run(scenario: Scenario, policy: str) -> Result:
    return Result(policy, scenario, simulate(scenario.world(POLICIES[policy])))


def scenarios(rates: Sequence[float], duration_s: float, seed: int) -> list[Scenario]:
    """The issue's: 80/15/5 steady and rotating every 30 s, at each rate."""
    return [Scenario(rate, shift, duration_s=duration_s, seed=seed)
            for rate in rates for shift in (math.inf, 30.0)]


def host_kinds(load_s: float, host: HostStarts = HOST) -> StartTimes:
    """`host`'s fork and wake, scaled as its spawn is to `load_s` (a switch spawned today)."""
    scale = load_s / host.spawn_s
    return StartTimes(fork_s=host.fork_s * scale, wake_s=host.wake_s * scale,
                      parked_max=host.parked_max)


def kinds_scenarios(rates: Sequence[float], duration_s: float, seed: int,
                    kinds: StartTimes, load_s: float = 2.0) -> list[Scenario]:
    """The rotating split (every 30 s) at each rate, started as today and with `kinds`."""
    return [Scenario(rate, 30.0, duration_s=duration_s, load_s=load_s, seed=seed, kinds=k)
            for rate in rates for k in (None, kinds)]


def run_all(scenarios: Sequence[Scenario], jobs: int = 1) -> list[Result]:
    """Every policy through every scenario, `jobs` at a time."""
    pairs = [(sc, name) for sc in scenarios for name in POLICIES]
    if jobs < 2:
        return [run(sc, name) for sc, name in pairs]
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(_run_pair, pairs))


def _run_pair(pair: tuple[Scenario, str]) -> Result:
    return run(*pair)


def table(results: Sequence[Result], markdown: bool, kinds: bool = False) -> str:
    """One row per result; `kinds`: with how its pool starts and its wakes and forks."""
    models = len(results[0].scenario.split) if results else 0
    head = (["policy", "scenario", "items/s"] + (["starts"] if kinds else []) + ["loads/min"]
            + (["wakes/min", "forks/min"] if kinds else []) + ["lost %"]
            + [f"m{i + 1} P50/P95 ms" for i in range(models)] + ["failed", "items"])
    rows = [[r.policy, r.scenario.name, f"{r.scenario.rate:g}"]
            + ([r.scenario.starts] if kinds else []) + [f"{r.loads_per_minute:.1f}"]
            + ([f"{r.wakes_per_minute:.1f}", f"{r.forks_per_minute:.1f}"] if kinds else [])
            + [f"{r.lost_share * 100:.1f}"]
            + [f"{ms(r.model(i).percentile(0.5))}/{ms(r.model(i).percentile(0.95))}"
               for i in range(models)]
            + [str(r.failed), str(r.outcome.offered)] for r in results]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(wd) for c, wd in zip(row, widths, strict=True)).rstrip()
                     for row in [head, *rows])


def verdicts(results: Sequence[Result]) -> list[str]:
    """The target, per scenario: at most a tenth of the baseline's loads at the same or
    better P95 for every model."""
    out = []
    pairs: dict[tuple[str, float], dict[str, Result]] = {}
    for r in results:
        pairs.setdefault((r.scenario.name, r.scenario.rate), {})[r.policy] = r
    for (name, rate), by in pairs.items():
        ours, base = by.get("switch-cost"), by.get("lru-on-demand")
        if ours is None or base is None:
            continue
        loads_ok = ours.loads * 10 <= base.loads
        worse = [f"m{i + 1}" for i in range(len(ours.scenario.split))
                 if ours.model(i).percentile(0.95) > base.model(i).percentile(0.95)]
        missed = ([] if loads_ok else ["loads"]) + ([] if not worse else ["P95"])
        held = "holds" if not missed else f"does not hold ({', '.join(missed)})"
        out.append(f"{name} at {rate:g}/s: {ours.loads} loads against {base.loads} "
                   f"(a tenth: {base.loads / 10:g}); P95 worse for "
                   f"{', '.join(worse) or 'no model'}; target {held}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.sim_models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES),
                   help="total items/s, comma-separated")
    p.add_argument("--duration", type=float, default=300.0, help="simulated seconds each")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (processes)")
    p.add_argument("--markdown", action="store_true", help="a markdown table")
    p.add_argument("--kinds", action="store_true",
                   help="the rotating split, started as today and with forks and parked wakes")
    p.add_argument("--load-s", type=float, default=2.0,
                   help="a start spawned: a switch's load today (with --kinds)")
    p.add_argument("--fork-s", type=float, default=None,
                   help="a fork (default: the host's share of its spawn, of --load-s)")
    p.add_argument("--wake-s", type=float, default=None,
                   help="a parked worker's wake (default: the host's share, of --load-s)")
    p.add_argument("--parked-max", type=int, default=HOST.parked_max,
                   help="workers parked at most")
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r]
    if args.kinds:
        scaled = host_kinds(args.load_s)
        kinds = StartTimes(scaled.fork_s if args.fork_s is None else args.fork_s,
                           scaled.wake_s if args.wake_s is None else args.wake_s,
                           args.parked_max)
        results = run_all(kinds_scenarios(rates, args.duration, args.seed, kinds,
                                          args.load_s), args.jobs)
        order = list(POLICIES)  # each policy's two rows side by side, today's first
        results.sort(key=lambda r: (r.scenario.rate, order.index(r.policy)))
        print(table(results, args.markdown, kinds=True))
        note = (f"a spawn {args.load_s:g} s (a switch today); with kinds a fork "
                f"{kinds.fork_s:.3f} s, a wake {kinds.wake_s:.3f} s, parked at most "
                f"{kinds.parked_max} (a GPU host's 120 s spawn, 5.5 s fork, 2 s wake, scaled "
                f"by {args.load_s:g}/120 unless given)")
        print(f"\n- {note}" if args.markdown else f"\n{note}")
    else:
        results = run_all(scenarios(rates, args.duration, args.seed), args.jobs)
        print(table(results, args.markdown))
        print()
        for line in verdicts(results):
            print(f"- {line}" if args.markdown else line)
    wall = sum(r.outcome.wall_s for r in results)
    events = sum(r.outcome.events for r in results)
    print(f"\n{len(results)} runs: {events:,} events in {wall:.1f} s of CPU "
          f"({events / wall:,.0f} events/s)")
    return 0


__all__ = ["POLICIES", "Result", "Scenario", "host_kinds", "kinds_scenarios", "main", "run",
           "run_all", "scenarios", "table", "verdicts"]

if __name__ == "__main__":
    sys.exit(main())
