"""What `loadtest.sim_scaling` prints: the table of the policies over the compressed day on
the real core, and the targets for batchgate's rule.

Run: python -m loadtest.sim_scaling_report [--markdown] [--seed N] [--min-workers N] [--jobs N]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

from batcher import Tier
from loadtest.sim_scaling import BUDGET, Result, Trace, run_all

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


def table(results: Sequence[Result], markdown: bool) -> str:
    floor = next((r.outcome.pool.gpu_s for r in results if r.policy == "oracle"), math.nan)
    rows = [row(r, floor) for r in results]
    if markdown:
        lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [HEAD, *rows]) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in [HEAD, *rows])


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
    args = p.parse_args(argv)
    began = time.perf_counter()
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


__all__ = ["HEAD", "main", "row", "table", "verdicts"]

if __name__ == "__main__":
    sys.exit(main())
