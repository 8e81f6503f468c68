"""What `loadtest.sim_scaling` prints: the table of the policies over the compressed day on
the real core, and the targets for batchgate's rule.

Run: python -m loadtest.sim_scaling_report [--markdown] [--seed N] [--min-workers N] [--jobs N]
         [--kinds [--spawn-s S] [--fork-s S] [--wake-s S] [--parked-max N]]

`--kinds`: batchgate alone, with today's single kind of start (every start a spawn) beside
a launcher's forks and forks with parked wakes, read against the oracle (`run_kinds`). The
times are a GPU host's, in its seconds, scaled into the compressed day as its start-up is
(divided by `COMPRESSION`, 4: the 120 s spawn is the day's 30 s).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

from batcher import Tier
from loadtest.sim_scaling import (
    BUDGET,
    COMPRESSION,
    FORK_SHARE,
    HostStarts,
    Result,
    Trace,
    run_all,
    run_kinds,
)

HEAD = ["policy", "workers", "GPU-s", "x oracle", "peak", "starts/stops", "paid P95 ms",
        "paid over budget", "free refused", "free dropped"]


def row(r: Result, floor: float) -> list[str]:
    pool = r.outcome.pool
    paid, free = r.tier(Tier.PAID), r.tier(Tier.FREE)
    dropped = sum(free.failed.values()) + free.unanswered
    return [r.policy, r.workers, f"{pool.gpu_s:,.0f}", f"{pool.gpu_s / floor:.2f}",
            str(pool.peak), f"{pool.started}/{pool.stopped}",
            f"{paid.percentile(0.95) * 1000:.0f}", f"{paid.over(BUDGET[Tier.PAID]):,}",
            f"{sum(free.refused.values()):,}", f"{dropped:,}"]


def table(results: Sequence[Result], markdown: bool, kinds: bool = False) -> str:
    """One row per result; `kinds`: with how its pool's starts came up (spawn/fork/wake)."""
    floor = next((r.outcome.pool.gpu_s for r in results if r.policy == "oracle"), math.nan)
    head = [*HEAD, "spawn/fork/wake"] if kinds else HEAD
    rows = [row(r, floor) + ([_kinds(r)] if kinds else []) for r in results]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in [head, *rows])


def _kinds(r: Result) -> str:
    pool = r.outcome.pool
    return f"{pool.spawns}/{pool.forks}/{pool.wakes}"


def kinds_note(host: HostStarts, trace: Trace) -> str:
    """How the host's times were scaled into the day."""
    scale = trace.start_s / host.spawn_s
    return (f"start-ups on a GPU host, scaled by 1/{1 / scale:g} as the day is: spawn "
            f"{host.spawn_s:g} s -> {trace.start_s:g} s; fork {host.fork_s:.2f} s (the spawn "
            f"x {FORK_SHARE:.3f}, minilm forked/spawned here 0.30 s/6.5 s) -> "
            f"{host.fork_s * scale:.2f} s; wake {host.wake_s:g} s (weights host-to-GPU) -> "
            f"{host.wake_s * scale:.2f} s; parked at most {host.parked_max}; "
            f"x oracle against today's oracle (spawns)")


def verdicts(results: Sequence[Result]) -> list[str]:
    """The targets, for batchgate: >= 40 % fewer GPU-seconds than a fixed pool, 0 paid over
    budget."""
    by = {r.policy: r for r in results}
    if (ours := by.get("batchgate")) is None:
        return []
    gpu_s = ours.outcome.pool.gpu_s
    lines = [f"GPU-seconds {(1 - gpu_s / r.outcome.pool.gpu_s) * 100:.1f} % fewer than "
             f"{r.policy} ({r.workers} workers; target >= 40 %): "
             f"{_held(gpu_s <= 0.6 * r.outcome.pool.gpu_s)}"
             for r in results if r.policy.startswith("fixed")]
    over = ours.tier(Tier.PAID).over(BUDGET[Tier.PAID])
    lines.append(f"paid over budget {over} (target 0): {_held(not over)}")
    return lines


def _held(ok: bool) -> str:
    return "holds" if ok else "does not hold"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.sim_scaling_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="policies run at a time (processes)")
    p.add_argument("--markdown", action="store_true", help="a markdown table")
    host = HostStarts()
    p.add_argument("--kinds", action="store_true",
                   help="batchgate with each kind of start (spawn; + fork; + fork and parked "
                        "wake) against the oracle, instead of the policies")
    p.add_argument("--spawn-s", type=float, default=host.spawn_s,
                   help=f"a spawn on the GPU host, s (the day's start-up x {COMPRESSION:g}; "
                        "default %(default)g)")
    p.add_argument("--fork-s", type=float, default=None,
                   help=f"a fork from the launcher on the host (default: the spawn x "
                        f"{FORK_SHARE:.3f})")
    p.add_argument("--wake-s", type=float, default=host.wake_s,
                   help="a parked worker's wake on the host, s (default %(default)g: weights "
                        "host-to-GPU)")
    p.add_argument("--parked-max", type=int, default=host.parked_max,
                   help="workers parked at most (default %(default)s)")
    args = p.parse_args(argv)
    began = time.perf_counter()
    if args.kinds:
        fork_s = args.spawn_s * FORK_SHARE if args.fork_s is None else args.fork_s
        host = HostStarts(args.spawn_s, fork_s, args.wake_s, args.parked_max)
        trace = Trace(seed=args.seed, start_s=args.spawn_s / COMPRESSION)
        results = run_kinds(trace, host, args.min_workers, args.jobs)
        print(table(results, args.markdown, kinds=True), end="\n\n")
        print(f"- {kinds_note(host, trace)}" if args.markdown else kinds_note(host, trace))
    else:
        trace = Trace(seed=args.seed)
        results = run_all(trace, min_workers=args.min_workers, jobs=args.jobs)
        print(table(results, args.markdown), end="\n\n")
        for line in verdicts(results):
            print(f"- {line}" if args.markdown else line)
    offered = results[0].outcome.offered
    events = sum(r.outcome.events for r in results)
    cpu = sum(r.outcome.wall_s for r in results)
    print(f"\n{offered:,} requests a policy, the busiest moment {trace.busiest():,.0f}/s; "
          f"{events:,} events in {cpu:.1f} s of CPU ({events / cpu:,.0f} events/s), "
          f"{time.perf_counter() - began:.1f} s in all")
    return 0


__all__ = ["HEAD", "kinds_note", "main", "row", "table", "verdicts"]

if __name__ == "__main__":
    sys.exit(main())
