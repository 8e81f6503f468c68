"""Capacity planner (`batchgate plan`): how many GPUs a load needs, checked against the
real dispatch core. It runs on the runtime dependencies alone (no load-test package).

`ceil(items/s / (max_batch / batch_latency))` is the floor. Poisson bursts need more, so each
count runs through the project's own core (`failover.sim`: the real core and its owner in
virtual time, idle trigger on) against contract workers that take exactly the batch latency;
the smallest whose P95 (per request, arrival to last output) meets the target wins. A
saturated count never does: its queue grows without bound, whatever a window shows. A count
simulates at most `MAX_REQUESTS` arrivals, to bound the planner's CPU.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import batcher as b
from api.config import Parser
from failover import CoreSettings
from failover.sim import Model, Stream, World, given
from failover.sim import simulate as run_world

TOLERANCE_S = 1e-6  # float noise in virtual time: a 100 ms batch may read 100.0000001 ms
WARMUP_S = 1.0  # requests arriving earlier find an empty pool: not measured
MAX_REQUESTS = 50_000  # per count: ~2 s of CPU; past it the simulated window shrinks

# The front door's CPU per request, as docs/benchmarks.md's HTTP and link benchmarks measure it
# on the 2-core machine of its results (`loadtest.bench_http`, `loadtest.bench_link`), rounded up:
# a GPU host's cores are usually faster, so this errs on the safe side.
GATEWAY_CPU_MS = 0.13  # per request, in a gateway process: HTTP, JSON, keys, its link end
# Per request in the core process of a cell (door, core, link, pool IPC); it falls with load
# as the gateways' frames carry more jobs each.
CORE_CPU_MS = 0.05
SINGLE_CPU_MS = 0.13  # per request when one process does it all (--gateways 1)
CORE_CPU_MS_PER_ITEM = 0.012  # per further input of a request, in the core
BUSY = 0.6  # the share of a core each process is planned at, so queues in it stay short


@dataclass(frozen=True, slots=True)
class FrontDoor:
    """The CPU the HTTP side needs at a load: gateway processes, and cores in all."""

    gateways: int  # 1: the single process (no link)
    cores: int  # gateways + the core process (1 in a single process)
    core_load: float  # the core process's share of one core


@dataclass(frozen=True, slots=True)
class Simulation:
    """One candidate worker count; seconds."""

    workers: int
    utilisation: float
    p50: float = math.inf
    p95: float = math.inf
    mean_fill: float = 0.0

    @property
    def saturated(self) -> bool:
        return self.utilisation >= 1.0

    def meets(self, target: float) -> bool:
        return not self.saturated and self.p95 <= target + TOLERANCE_S


@dataclass(frozen=True, slots=True)
class PlanResult:
    rps: float
    inputs: int  # per request
    max_batch: int
    batch_latency_s: float
    target_s: float
    floor: int
    spares: int
    chosen: Simulation | None  # None: unreachable, and `unreachable` says why
    tried: tuple[Simulation, ...]
    duration_s: float  # virtual seconds simulated per count
    cost_per_million: float | None
    unreachable: str | None = None
    front: FrontDoor | None = None

    @property
    def gpus(self) -> int | None:
        return None if self.chosen is None else self.chosen.workers + self.spares


def floor_gpus(rps: float, max_batch: int, batch_latency_ms: float, inputs: int = 1) -> int:
    """`ceil(items/s / (max_batch / batch_latency))`; rounded first so 10.0000001 stays 10."""
    return max(1, math.ceil(round(rps * inputs * batch_latency_ms / (max_batch * 1000), 9)))


def front_door(rps: float, inputs: int = 1) -> FrontDoor:
    """Gateways and cores for `rps` requests/s of `inputs` inputs, from the measured CPU per
    request: one process while it stays under `BUSY` of a core, else a cell."""
    extra = (inputs - 1) * CORE_CPU_MS_PER_ITEM
    single = rps * (SINGLE_CPU_MS + extra) / 1000
    if single <= BUSY:
        return FrontDoor(1, 1, single)
    gateways = max(2, math.ceil(rps * GATEWAY_CPU_MS / 1000 / BUSY))
    return FrontDoor(gateways, gateways + 1, rps * (CORE_CPU_MS + extra) / 1000)


def poisson(rps: float, duration: float, seed: int) -> list[float]:
    """Arrival times in [0, duration) of a Poisson process of rate `rps`."""
    rng, t, out = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(rps)) < duration:
        out.append(t)
    return out


def simulate(arrivals: list[float], workers: int, policy: b.FlushPolicy, latency: float,
             inputs: int, duration: float) -> Simulation:
    """Run the real core over `arrivals` (non-empty, within `duration`) in virtual time,
    admission past reach (this measures batching), every request answered."""
    settings = CoreSettings.unbounded(policy, latency, max(1, len(arrivals) * inputs))
    outcome = run_world(World(
        (Stream(given(arrivals), inputs=inputs),), duration, settings,
        models=(Model(batch_s=latency),), workers=workers,
        measure_from=min(WARMUP_S, duration / 5)))
    requests = outcome.tally()
    util = len(arrivals) * inputs / duration * latency / (workers * policy.max_batch)
    return Simulation(workers, util, requests.percentile(0.5), requests.percentile(0.95),
                      outcome.pool.fill)


def plan(
    rps: float, p95_ms: float = 500.0, max_batch: int = b.MAX_BATCH,
    batch_latency_ms: float = 100.0, inputs_per_request: int = 1, spare_gpus: int = 0,
    gpu_hour_cost: float | None = None, duration_s: float = 20.0, seed: int = 1,
) -> PlanResult:
    """Smallest worker count, searched upward from the floor, whose simulated P95 meets
    `p95_ms`; then `spare_gpus` on top. ValueError on a bad argument."""
    _validate(rps, p95_ms, max_batch, batch_latency_ms, inputs_per_request, spare_gpus,
              gpu_hour_cost, duration_s)
    floor = floor_gpus(rps, max_batch, batch_latency_ms, inputs_per_request)
    target, latency, items = p95_ms / 1000, batch_latency_ms / 1000, rps * inputs_per_request
    window = min(max(duration_s, 200 / rps), MAX_REQUESTS / rps)  # 200 to 50,000 arrivals
    policy = b.FlushPolicy(max_batch=max_batch, idle_trigger=True)  # max_wait: 50 ms default
    tried: dict[int, Simulation] = {}
    arrivals: list[float] = []

    def trial(n: int) -> Simulation:
        if n not in tried:
            util = items * latency / (n * max_batch)
            arrivals[:] = arrivals or poisson(rps, window, seed)
            tried[n] = (Simulation(n, util) if util >= 1.0 or not arrivals  # don't simulate
                        else simulate(arrivals, n, policy, latency, inputs_per_request, window))
        return tried[n]

    chosen, why = None, None
    if target + TOLERANCE_S < latency:
        why = f"every request waits at least one batch latency ({batch_latency_ms:g} ms)"
    elif (chosen := _search(trial, floor, target)) is None:
        why = f"no count up to {max(tried)} GPUs meets it"
    cost = None
    if chosen is not None and gpu_hour_cost is not None:
        cost = (chosen.workers + spare_gpus) * gpu_hour_cost / (items * 3600) * 1e6
    return PlanResult(rps, inputs_per_request, max_batch, latency, target, floor, spare_gpus,
                      chosen, tuple(tried[n] for n in sorted(tried)), window, cost, why,
                      front_door(rps, inputs_per_request))


def _search(trial: Callable[[int], Simulation], floor: int, target: float) -> Simulation | None:
    """Step up from the floor by 1, 2, 4, ... until a count meets the target, then bisect
    back to the smallest that does (P95 falls as workers are added)."""
    low, n, step, limit = floor - 1, floor, 1, 4 * floor + 64  # `low` misses the target
    while not trial(n).meets(target):
        if n >= limit:
            return None
        low, n, step = n, min(limit, n + step), step * 2
    while n - low > 1:
        mid = (low + n) // 2
        low, n = (low, mid) if trial(mid).meets(target) else (mid, n)
    return trial(n)


def _validate(rps: float, p95_ms: float, max_batch: int, batch_latency_ms: float,
              inputs: int, spares: int, cost: float | None, duration_s: float) -> None:
    for ok, message in [
        (0 < rps < math.inf, f"rps must be > 0, got {rps}"),
        (0 < p95_ms < math.inf, f"p95-ms must be > 0, got {p95_ms}"),
        (1 <= max_batch <= b.MAX_BATCH, f"max-batch must be within 1..100, got {max_batch}"),
        (0 < batch_latency_ms < math.inf, f"batch-latency-ms must be > 0, got {batch_latency_ms}"),
        (1 <= inputs <= b.MAX_BATCH, f"inputs-per-request must be within 1..100, got {inputs}"),
        (spares >= 0, f"spare-gpus must be >= 0, got {spares}"),
        (cost is None or 0 <= cost < math.inf, f"gpu-hour-cost must be >= 0, got {cost}"),
        (0 < duration_s <= 3600, f"duration-s must be within (0, 3600], got {duration_s}"),
    ]:
        if not ok:
            raise ValueError(message)


def format_plan(r: PlanResult) -> str:
    """`key: value` lines (bare numbers) to parse, `#` lines giving the reasoning."""
    per_gpu = r.max_batch / r.batch_latency_s
    lines = [
        f"# {r.rps:g} requests/s x {r.inputs} input(s), P95 target {r.target_s * 1e3:g} ms, "
        f"{r.max_batch} items a batch in {r.batch_latency_s * 1e3:g} ms ({per_gpu:g}/s per GPU)",
        f"# floor = ceil({r.rps * r.inputs:g} / {per_gpu:g}); then the real batcher, Poisson "
        f"arrivals, {r.duration_s:g} virtual seconds per count",
        f"floor: {r.floor}",
    ]
    for s in r.tried:
        head = f"# {s.workers} GPU{'s' if s.workers > 1 else ''}: "
        lines.append(head + f"saturated (load {s.utilisation:.0%} of capacity)" if s.saturated
                     else head + f"p50 {s.p50 * 1e3:.1f} ms, p95 {s.p95 * 1e3:.1f} ms, fill "
                     f"{s.mean_fill:.1f}, load {s.utilisation:.0%}: "
                     f"{'meets' if s.meets(r.target_s) else 'misses'}")
    if (c := r.chosen) is not None:
        lines += [f"chosen: {c.workers}", f"spare_gpus: {r.spares}", f"gpus: {r.gpus}",
                  f"simulated_p95_ms: {c.p95 * 1e3:.1f}", f"simulated_p50_ms: {c.p50 * 1e3:.1f}",
                  f"mean_fill: {c.mean_fill:.1f}", f"simulated_s: {r.duration_s:g}"]
        if r.cost_per_million is not None:
            lines.append(f"cost_per_million: {r.cost_per_million:.4f}")
    if (f := r.front) is not None:
        lines += [
            f"# front door: {SINGLE_CPU_MS:g} ms of CPU per request in one process; in a cell "
            f"{GATEWAY_CPU_MS:g} ms per request in a gateway and {CORE_CPU_MS:g} ms in the "
            f"core; each process planned at {BUSY:.0%} of a core",
            f"gateways: {f.gateways}", f"front_door_cores: {f.cores}",
            f"core_process_load: {f.core_load:.2f}",
        ]
        if f.core_load > BUSY:
            lines.append(f"# the one core process would be {f.core_load:.0%} busy: past "
                         "what one host's front door serves; split the traffic over hosts")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The planner's flags, for `batchgate plan` and `python -m api.plan` alike."""
    add = parser.add_argument
    add("--rps", type=float, required=True, help="requests per second to serve")
    add("--p95-ms", type=float, default=500.0, help="P95 target per request (default 500)")
    add("--max-batch", type=int, default=b.MAX_BATCH, help="items per batch (default 100)")
    add("--batch-latency-ms", type=float, default=100.0, help="time per batch (default 100)")
    add("--inputs-per-request", type=int, default=1, help="inputs per request (default 1)")
    add("--spare-gpus", type=int, default=0, help="GPUs added for failures (default 0)")
    add("--gpu-hour-cost", type=float, default=None, help="price of one GPU-hour")
    add("--duration-s", type=float, default=20.0, help="virtual seconds per count (default 20)")
    add("--seed", type=int, default=1, help="seed of the arrival schedule (default 1)")


def run_args(args: argparse.Namespace, prog: str = "plan") -> int:
    """Plan from parsed flags and print: 0 planned, 1 target unreachable, 2 bad value."""
    try:
        r = plan(args.rps, args.p95_ms, args.max_batch, args.batch_latency_ms,
                 args.inputs_per_request, args.spare_gpus, args.gpu_hour_cost, args.duration_s,
                 args.seed)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(r))
    if r.unreachable is not None:
        print(f"{prog}: error: P95 target {args.p95_ms:g} ms is unreachable: {r.unreachable}",
              file=sys.stderr)
    return 0 if r.unreachable is None else 1


def main(argv: Sequence[str] | None = None, prog: str = "python -m api.plan") -> int:
    parser = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag (the one line is printed) or --help
        return exc.code if isinstance(exc.code, int) else 2
    return run_args(args, parser.prog)


__all__ = ["FrontDoor", "PlanResult", "Simulation", "add_arguments", "floor_gpus",
           "format_plan", "front_door", "main", "plan", "poisson", "run_args", "simulate"]

if __name__ == "__main__":
    sys.exit(main())
