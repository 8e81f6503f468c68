"""Event simulation of model placement: several models on a few contract workers, where a
switch costs a load.

Workers keep the contract (one batch of <= 100 items at a time, `BATCH_S` each, whatever its
size); a switch holds the worker `load_s` doing nothing. Each version has its own size-or-time
batcher with late binding: a batch is cut only for an idle worker of that version, when 100
items wait or the oldest has waited `MAX_WAIT_S`. Items are paid, with a deadline: one still
waiting at its deadline is dropped and counted as failed. Arrivals are one seeded Poisson
process split between the models, the split optionally rotating every `shift_s` (the hot model
moves on). Time jumps from event to event (an arrival, a batch's or a load's end, a cut or
expiry timer, the policy's `next_check`), so ten minutes at 2,000 items/s run in seconds and
every figure is exact and repeatable.

While some worker is idle (only an idle worker may switch), placement is consulted after the
cuts of every event but a bare arrival, and at most every `TURN_S` while arrivals alone come in
(the core's turn): both policies on the same schedule. The arrival rate each policy reads is a
decaying average (time constant `RATE_TAU_S`), as the batcher's `RateMeter` keeps. The first
model holds min_workers 1 (the catalogue's default), the others 0; loads are counted from the
initial placement on, which is not one.

    python -m loadtest.sim_models [--markdown] [--duration S] [--rates R,R] [--seed N]
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from failover.fleet.placement import (
    LruOnDemand,
    Placement,
    SwitchCost,
    VersionView,
    WorkerView,
    initial_placement,
)
from gpu_pool import WorkerId

BATCH_S = 0.1
MAX_BATCH = 100
MAX_WAIT_S = 0.05
TURN_S = 0.01
RATE_TAU_S = 1.0
IDLE_UNLOAD_S = 600.0
SPLIT = (0.80, 0.15, 0.05)
DEFAULT_RATES = (400.0, 2_000.0)
POLICIES: dict[str, Callable[[], Placement]] = {"switch-cost": SwitchCost,
                                                "lru-on-demand": LruOnDemand}

_IDLE, _BUSY, _LOADING = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Scenario:
    rate: float  # items/s, all models together
    shift_s: float = math.inf  # the split rotates by one model every shift_s
    split: tuple[float, ...] = SPLIT
    duration_s: float = 600.0
    workers: int = 4
    load_s: float = 2.0
    deadline_s: float = 5.0
    min_workers: tuple[int, ...] = (1, 0, 0)  # per model: the first is the catalogue's default
    seed: int = 1

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


@dataclass(frozen=True, slots=True)
class Outcome:
    policy: str
    scenario: Scenario
    arrivals: int
    answered: int
    failed: int  # dropped at their deadline, or left waiting at the end
    loads: int
    load_s: float  # worker-seconds spent loading
    batches: int
    largest_batch: int
    latencies: tuple[list[float], ...]  # per model, arrival to answer, sorted

    @property
    def loads_per_minute(self) -> float:
        return self.loads / (self.scenario.duration_s / 60)

    @property
    def lost_share(self) -> float:
        """Share of the pool's worker time spent loading."""
        return self.load_s / (self.scenario.workers * self.scenario.duration_s)

    def percentile(self, model: int, q: float) -> float:
        lat = self.latencies[model]
        if not lat:
            return math.nan
        return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))]


class _Run:
    """One policy through one scenario. Workers are numbered from 1 (WorkerId)."""

    def __init__(self, scenario: Scenario, policy: Placement, name: str) -> None:
        self.sc, self.policy, self.name = scenario, policy, name
        n = len(scenario.split)
        self.models = [f"m{i + 1}" for i in range(n)]
        self.keys = [f"{m}@v1" for m in self.models]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.queues: list[deque[float]] = [deque() for _ in range(n)]
        self.lat: list[list[float]] = [[] for _ in range(n)]
        self.fresh, self.ewma, self.rate_at = [0] * n, [0.0] * n, 0.0
        self.last = [-math.inf] * n
        self.loading, self.load_started = [0] * n, [math.inf] * n
        self.arrivals = self.answered = self.failed = self.loads = self.batches = 0
        self.largest, self.load_total = 0, 0.0
        self.now, self.dirty, self.decided, self.check_at = 0.0, False, -math.inf, math.inf
        self.state = [_IDLE] * scenario.workers
        self.ver = [-1] * scenario.workers
        self.ver = [self.index[k] for k in initial_placement(scenario.workers, self._versions())]
        self.until = [math.inf] * scenario.workers
        self.since = [0.0] * scenario.workers
        self.target = [-1] * scenario.workers
        self.rng = random.Random(scenario.seed)
        self.cums = [self._cumulative(k) for k in range(n)]
        self.shifting = math.isfinite(scenario.shift_s)
        self.next_t, self.next_v = 0.0, 0
        self._draw()

    def _cumulative(self, shift: int) -> list[float]:
        n, acc, out = len(self.sc.split), 0.0, []
        for i in range(n):
            acc += self.sc.split[(i - shift) % n]
            out.append(acc)
        out[-1] = math.inf  # float sums may fall short of 1
        return out

    def _draw(self) -> None:
        t = self.next_t + self.rng.expovariate(self.sc.rate)
        period = int(t // self.sc.shift_s) if self.shifting else 0
        cum = self.cums[period % len(self.cums)]
        self.next_t, self.next_v = t, bisect.bisect_right(cum, self.rng.random())

    def run(self) -> Outcome:
        end = self.sc.duration_s
        self._step(0.0)
        while True:
            due = self._next_event()
            if self.next_t < end and self.next_t < due:
                due = self._arrivals(due, end)
            if math.isinf(due) or (self.next_t >= end and self._quiet()):
                break
            self._step(due)
        self.failed += sum(len(q) for q in self.queues)
        return Outcome(self.name, self.sc, self.arrivals, self.answered, self.failed, self.loads,
                       self.load_total, self.batches, self.largest,
                       tuple(sorted(lat) for lat in self.lat))

    def _quiet(self) -> bool:
        return not any(self.queues) and _BUSY not in self.state

    def _idle_of(self, v: int) -> int:
        return next((w for w, s in enumerate(self.state) if s == _IDLE and self.ver[w] == v), -1)

    def _next_event(self) -> float:
        due = min(self.until)
        for v, q in enumerate(self.queues):
            if not q:
                continue
            due = min(due, q[0] + self.sc.deadline_s)
            if self._idle_of(v) >= 0:
                due = min(due, self.now if len(q) >= MAX_BATCH else q[0] + MAX_WAIT_S)
        if _IDLE in self.state:  # only an idle worker may switch
            due = min(due, self.check_at)
            if self.dirty:
                due = min(due, self.decided + TURN_S)
        return due

    def _arrivals(self, due: float, end: float) -> float:
        """Takes in the arrivals before `due`; returns when the next step is due."""
        any_idle = _IDLE in self.state
        idle = {self.ver[w] for w, s in enumerate(self.state) if s == _IDLE}
        while self.next_t < due and self.next_t < end:
            t, v = self.next_t, self.next_v
            q = self.queues[v]
            q.append(t)
            self.fresh[v] += 1
            self.last[v] = t
            self.arrivals += 1
            self._draw()
            if len(q) == 1:
                due = min(due, t + self.sc.deadline_s)
                if v in idle:
                    due = min(due, t + MAX_WAIT_S)
            elif len(q) >= MAX_BATCH and v in idle:
                return t
            if not self.dirty and any_idle:
                due = min(due, max(t, self.decided + TURN_S))
            self.dirty = True
        return due

    def _step(self, t: float) -> None:
        self.now = t
        for w, until in enumerate(self.until):
            if until <= t:
                self._finish(w, t)
        for q in self.queues:
            while q and q[0] + self.sc.deadline_s <= t:
                q.popleft()
                self.failed += 1
        self._cut(t)
        if _IDLE in self.state:
            self._place(t)

    def _finish(self, w: int, t: float) -> None:
        if self.state[w] == _LOADING:
            v = self.ver[w] = self.target[w]
            self.since[w] = t
            self.loading[v] -= 1
            if not self.loading[v]:
                self.load_started[v] = math.inf
        self.state[w], self.until[w] = _IDLE, math.inf

    def _cut(self, t: float) -> None:
        for v, q in enumerate(self.queues):
            while q and (len(q) >= MAX_BATCH or q[0] + MAX_WAIT_S <= t):
                w = self._idle_of(v)
                if w < 0:
                    break
                k = min(len(q), MAX_BATCH)
                done = t + BATCH_S
                lat = self.lat[v]
                for _ in range(k):
                    lat.append(done - q.popleft())
                self.state[w], self.until[w] = _BUSY, done
                self.batches += 1
                self.answered += k
                self.largest = max(self.largest, k)

    def _place(self, t: float) -> None:
        workers, versions = self._workers(), self._versions()
        switches = self.policy.decide(t, workers, versions)
        for sw in switches:
            w, v = int(sw.worker) - 1, self.index[sw.to]
            if self.state[w] != _IDLE or v == self.ver[w]:
                raise RuntimeError(f"placement switched worker {sw.worker}, busy or to its own")
            self.state[w], self.until[w], self.target[w] = _LOADING, t + self.sc.load_s, v
            if not self.loading[v]:
                self.load_started[v] = t
            self.loading[v] += 1
            self.loads += 1
            self.load_total += self.sc.load_s
        if switches:
            workers, versions = self._workers(), self._versions()
        self.check_at = self.policy.next_check(t, workers, versions)
        if self.check_at <= t:
            raise RuntimeError(f"next_check answered {self.check_at}, not after {t}")
        self.dirty, self.decided = False, t

    def _workers(self) -> list[WorkerView]:
        return [WorkerView(WorkerId(w + 1), self.keys[self.ver[w]], s == _IDLE, self.since[w])
                for w, s in enumerate(self.state) if s != _LOADING]

    def _versions(self) -> list[VersionView]:
        t = self.now
        decay = math.exp(-(t - self.rate_at) / RATE_TAU_S)
        self.rate_at = t
        out = []
        for v, q in enumerate(self.queues):
            self.ewma[v] = self.ewma[v] * decay + self.fresh[v]
            self.fresh[v] = 0
            resident = sum(1 for w, s in enumerate(self.state)
                           if s != _LOADING and self.ver[w] == v)
            oldest = q[0] if q else math.inf
            out.append(VersionView(
                version=self.keys[v], model=self.models[v], queued=len(q), paid=len(q),
                oldest=oldest, oldest_deadline=oldest + self.sc.deadline_s,
                rate=self.ewma[v] / RATE_TAU_S, last_arrival=self.last[v],
                loading=self.loading[v], load_s=self.sc.load_s,
                min_workers=self.sc.min_workers[v], max_workers=None,
                idle_unload_s=IDLE_UNLOAD_S, retired=False, resident=resident,
                load_started=self.load_started[v]))
        return out


def simulate(scenario: Scenario, policy: Placement, name: str = "") -> Outcome:
    return _Run(scenario, policy, name or type(policy).__name__).run()


def scenarios(rates: Sequence[float], duration_s: float, seed: int) -> list[Scenario]:
    """The issue's: 80/15/5 steady and rotating every 30 s, at each rate."""
    return [Scenario(rate, shift, duration_s=duration_s, seed=seed)
            for rate in rates for shift in (math.inf, 30.0)]


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}"


def table(outcomes: Sequence[Outcome], markdown: bool) -> str:
    models = len(outcomes[0].latencies) if outcomes else 0
    head = (["policy", "scenario", "items/s", "loads/min", "lost %"]
            + [f"m{i + 1} P50/P95 ms" for i in range(models)] + ["failed", "items"])
    rows = [[o.policy, o.scenario.name, f"{o.scenario.rate:g}", f"{o.loads_per_minute:.1f}",
             f"{o.lost_share * 100:.1f}"]
            + [f"{_ms(o.percentile(i, 0.5))}/{_ms(o.percentile(i, 0.95))}"
               for i in range(models)]
            + [str(o.failed), str(o.arrivals)] for o in outcomes]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(wd) for c, wd in zip(r, widths, strict=True)).rstrip()
                     for r in [head, *rows])


def verdicts(outcomes: Sequence[Outcome]) -> list[str]:
    """The issue's target, per scenario: at most a tenth of the baseline's loads at the same
    or better P95 for every model."""
    out = []
    pairs: dict[tuple[str, float], dict[str, Outcome]] = {}
    for o in outcomes:
        pairs.setdefault((o.scenario.name, o.scenario.rate), {})[o.policy] = o
    for (name, rate), by in pairs.items():
        ours, base = by.get("switch-cost"), by.get("lru-on-demand")
        if ours is None or base is None:
            continue
        loads_ok = ours.loads * 10 <= base.loads
        worse = [f"m{i + 1}" for i in range(len(ours.latencies))
                 if ours.percentile(i, 0.95) > base.percentile(i, 0.95)]
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
    p.add_argument("--duration", type=float, default=600.0, help="simulated seconds each")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--markdown", action="store_true", help="a README-ready markdown table")
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r]
    outcomes = [simulate(sc, make(), name) for sc in scenarios(rates, args.duration, args.seed)
                for name, make in POLICIES.items()]
    print(table(outcomes, args.markdown))
    print()
    for line in verdicts(outcomes):
        print(f"- {line}" if args.markdown else line)
    return 0


__all__ = ["Outcome", "Scenario", "main", "scenarios", "simulate", "table", "verdicts"]

if __name__ == "__main__":
    sys.exit(main())
