"""Four workers under load, two of them SIGKILLed while their model refuses to load (a lost
device), then loads succeed again: is paid kept within its budget, is free shed with a
Retry-After that points no later than the pool's return, is the pool back to four, and is
every answer the right one?

    python -m loadtest.scale_outage [--rps 800] [--max-batch 40] [--outage-s 8]

Starts a real server on 127.0.0.1 (`--workers 4`, the test model `tests.models_scaling:reverse`
which loads in 5 s, 100 ms batches of at most `--max-batch`, keys whose rate limits never
bind) and offers `--rps` (a quarter paid) for `--load-s`; `--before-s` in, the model starts
refusing to load (a marker file, `tests.models_scaling.REFUSE_ENV`), two running workers are
SIGKILLed, and `--outage-s` later loads succeed again. The pool is sampled and free requests
are watched one by one (`loadtest.scale_step`). Prints paid latency against the budget, the
free refusals' Retry-After against the time the pool was back, and how soon refusals stopped
after it: the figures tests/e2e/test_scaling_faults.py leaves to this command. Exits 1 if a
request was lost or wrong, or a paid one refused.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from loadtest.scale_step import MODEL, mix, model_args, write_keys
from loadtest.server import running_server
from loadtest.watch import ADMIN, PAID_BUDGET_S, Observed, offer_watching, up_at
from tests.models_scaling import REFUSE_ENV  # importing it loads nothing (its load is lazy)


@dataclass(frozen=True, slots=True)
class OutagePlan:
    workers: int = 4
    max_batch: int = 40
    rps: float = 800.0  # half the pool's capacity at 40-item batches: all two workers drain
    before_s: float = 3.0  # load before the fault
    outage_s: float = 8.0  # the marker file stays this long: every restart meanwhile fails
    load_s: float = 26.0  # the whole load: the outage and the restarts after it
    sample_s: float = 0.5

    @property
    def slack_s(self) -> float:
        """A Retry-After's rounding up to whole seconds, a sample's lateness."""
        return 1.0 + self.sample_s


@dataclass
class Outage:
    plan: OutagePlan
    seen: Observed
    began: float  # the load's first send (monotonic)
    killed: list[int]
    killed_at: float
    healed_at: float  # the marker removed: loads succeed again
    back_at: float | None  # all workers running again

    def shed(self) -> list[tuple[float, float, float | None]]:
        """The watched free refusals during the outage: (sent, answered, Retry-After)."""
        return [(w.sent, w.answered, w.retry_after) for w in self.seen.watched
                if self.killed_at <= w.sent <= self.healed_at and w.status == 503]


async def pids_up(url: str) -> list[int]:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=5) as client:
        workers = (await client.get("/admin/workers")).json()["workers"]
    return [int(w["pid"]) for w in workers if w["state"] in ("ready", "busy")]


async def run_outage(url: str, marker: Path, plan: OutagePlan) -> Outage:
    """Offer the load on the server at `url` (started with `REFUSE_ENV` naming `marker`) and
    cause the outage meanwhile; bounded by the plan's times plus the probe's timeouts."""
    times: dict[str, float] = {}
    killed: list[int] = []

    async def fault() -> None:
        await anyio.sleep(plan.before_s)
        await anyio.Path(marker).touch()  # from now on the model refuses to load
        pids = await pids_up(url)
        assert len(pids) == plan.workers, pids
        for pid in pids[:2]:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        times["killed"] = time.monotonic()
        await anyio.sleep(plan.outage_s)
        await anyio.Path(marker).unlink()
        times["healed"] = time.monotonic()

    seen, began = await offer_watching(url, mix(url, plan.rps, plan.load_s), fault,
                                       plan.sample_s)
    back = up_at(seen.samples, plan.workers, times["healed"])
    return Outage(plan, seen, began, killed, times["killed"], times["healed"], back)


def server_args(plan: OutagePlan, keys: Path) -> list[str]:
    return ["--workers", str(plan.workers), *model_args(plan.max_batch, keys), "--gateways", "1"]


def report(run: Outage, margin_s: float = 0.1) -> str:
    p, seen = run.plan, run.seen
    paid = seen.probes[0].classes["paid"]
    lat = paid.latency
    shed = run.shed()
    since = run.killed_at
    lines = [
        f"server: --workers {p.workers}, {MODEL} (loads in 5 s), 100 ms batches of at most "
        f"{p.max_batch}; load {p.rps:g} RPS x {p.load_s:g} s, two workers killed at "
        f"{run.killed_at - run.began:+.1f} s, loads refused for {p.outage_s:g} s",
        f"paid: refused {seen.refused('paid')} {seen.rejected('paid')}; P50/P95/P99/max "
        f"{lat.p50 * 1e3:.0f} {lat.p95 * 1e3:.0f} {lat.p99 * 1e3:.0f} {lat.max * 1e3:.0f} ms "
        f"against the {PAID_BUDGET_S * 1e3:.0f} ms budget + {margin_s * 1e3:.0f} ms: "
        f"{'within' if lat.p99 <= PAID_BUDGET_S + margin_s else 'OVER'}",
        f"pool: back to {p.workers} "
        + ("never" if run.back_at is None else f"{run.back_at - run.healed_at:+.1f} s after "
                                               "loads succeeded again"),
        f"free shed during the outage: {len(shed)}, Retry-After values "
        f"{dict(sorted(Counter(ra for _, _, ra in shed).items()))}",
    ]
    if run.back_at is not None and shed:
        errors = sorted(a + (ra or 0) - run.back_at for _, a, ra in shed)
        lines.append(f"  refusal + Retry-After - the pool back: min {errors[0]:+.1f} s, "
                     f"max {errors[-1]:+.1f} s (past it by more than {p.slack_s:.1f} s: "
                     f"{sum(e > p.slack_s for e in errors)})")
        refused = [w.sent for w in seen.watched if w.status == 503 and w.sent > since]
        last = max(refused, default=None)
        lines.append("  free refusals stopped " + (
            "before the pool was back" if last is None or last <= run.back_at
            else f"{last - run.back_at:+.1f} s after the pool was back"))
    lines.append(f"lost {seen.lost}, wrong {seen.wrong}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scale_outage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = OutagePlan()
    for name in ("rps", "before_s", "outage_s", "load_s"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    p.add_argument("--max-batch", type=int, default=defaults.max_batch)
    a = p.parse_args(argv)
    plan = OutagePlan(max_batch=a.max_batch, rps=a.rps, before_s=a.before_s,
                      outage_s=a.outage_s, load_s=a.load_s)
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp) / "refuse-load"
        args = server_args(plan, write_keys(Path(tmp)))
        with running_server(plan.workers, MODEL, args, ready_timeout_s=120,
                            env={REFUSE_ENV: str(marker)}) as srv:
            run = anyio.run(run_outage, srv.url, marker, plan)
    print(report(run))
    seen = run.seen
    return 0 if seen.lost == 0 and seen.wrong == 0 and seen.refused("paid") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
