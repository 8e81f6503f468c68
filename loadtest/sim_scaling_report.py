"""What `loadtest.sim_scaling` prints: the table of the policies over the compressed day, and
the issue's targets for batchgate's rule.

Free refusals' Retry-After is set against two real waits: `next` (until the door next admits
a free request: it reopens at the next batch cut even while short of workers) and `calm`
(until free refusals stop: when the capacity they were told of came). The second is the
issue's, and it is given apart for the refusals of the burst: a burst shorter than a start-up
ends before any worker it asks for can come (those starts are taken back), so the capacity a
refusal there was told of never comes, and nothing known at the time says when the burst ends.

Run: python -m loadtest.sim_scaling_report [--markdown] [--seed N] [--min-workers N]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence

from batcher import Tier
from loadtest.sim_scaling import Outcome, Trace, arrivals, run_all

PHASES: dict[str, Callable[[Trace], Callable[[float], bool]]] = {
    "all": lambda tr: lambda t: True,
    "outside the burst": lambda tr: lambda t: not tr.burst_at_s <= t < tr.burst_at_s + tr.burst_s,
    "in the burst": lambda tr: lambda t: tr.burst_at_s <= t < tr.burst_at_s + tr.burst_s,
}


def table(outs: Sequence[Outcome], markdown: bool, trace: Trace | None = None) -> str:
    trace = trace or Trace()
    floor = next((o.gpu_s for o in outs if o.policy == "oracle"), math.nan)
    head = ["policy", "workers", "GPU-s", "x oracle", "peak", "starts/stops", "paid P95 ms",
            "paid over budget", "free refused", "free dropped", "RA ±20% (next)",
            "RA ±20% (calm, outside the burst)", "RA ±20% (calm, in the burst)"]
    rows = []
    for o in outs:
        fits = [o.retry_fit("next"),
                o.retry_fit("calm", when=PHASES["outside the burst"](trace)),
                o.retry_fit("calm", when=PHASES["in the burst"](trace))]
        rows.append([o.policy, o.workers, f"{o.gpu_s:,.0f}", f"{o.gpu_s / floor:.2f}",
                     str(o.peak), f"{o.started}/{o.stopped}",
                     f"{o.percentile(Tier.PAID, 0.95) * 1000:.0f}", f"{o.over(Tier.PAID):,}",
                     f"{o.refused[Tier.FREE]:,}", f"{o.dropped[Tier.FREE]:,}"]
                    + [f"{share * 100:.1f} % of {n:,} (median x{median:.3g})" if n else "-"
                       for share, median, n in fits])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in [head, *rows])


def verdicts(outs: Sequence[Outcome], within: float = 0.2, share: float = 0.9,
             trace: Trace | None = None) -> list[str]:
    """The issue's targets, for batchgate: >= 40 % fewer GPU-seconds than a fixed pool, 0 paid
    over budget, Retry-After within `within` of the real wait (for `share` of refusals)."""
    trace = trace or Trace()
    by = {o.policy: o for o in outs}
    if (ours := by.get("batchgate")) is None:
        return []
    lines = [f"GPU-seconds {(1 - ours.gpu_s / o.gpu_s) * 100:.1f} % fewer than {o.policy} "
             f"({o.workers} workers; target >= 40 %): {_held(ours.gpu_s <= 0.6 * o.gpu_s)}"
             for o in outs if o.policy.startswith("fixed")]
    over = ours.over(Tier.PAID)
    lines.append(f"paid over budget {over} (target 0): {_held(not over)}")
    for kind in ours.waits:
        for phase, when in PHASES.items():
            fit, median, n = ours.retry_fit(kind, within, when(trace))
            lines.append(f"Retry-After within ±{within * 100:.0f} % of the real wait ({kind}, "
                         f"{phase}): {fit * 100:.1f} % of {n:,} refusals, median ratio "
                         f"{median:.3g} (target: {share * 100:.0f} % of them): "
                         + (_held(fit >= share) if n else "no refusals"))
    return lines


def _held(ok: bool) -> str:
    return "holds" if ok else "does not hold"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.sim_scaling_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--markdown", action="store_true", help="a README-ready markdown table")
    args = p.parse_args(argv)
    began = time.perf_counter()
    trace = Trace(seed=args.seed)
    arr = arrivals(trace)
    outs = run_all(arr, args.min_workers, jobs=2)
    print(table(outs, args.markdown, trace), end="\n\n")
    for line in verdicts(outs, trace=trace):
        print(f"- {line}" if args.markdown else line)
    print(f"\n{sum(map(sum, arr.counts)):,} requests, the busiest moment {arr.top:,.0f}/s; "
          f"{time.perf_counter() - began:.1f} s")
    return 0


__all__ = ["PHASES", "main", "table", "verdicts"]

if __name__ == "__main__":
    sys.exit(main())
