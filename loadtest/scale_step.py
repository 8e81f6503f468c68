"""A step in load on a pool that follows it (`--workers 1:4`): is paid kept within budget, is
free refused with a Retry-After that ends when the capacity it waits for is up, does the pool
grow to its maximum and come back to its minimum, and is every answer the right one?

    python -m loadtest.scale_step [--peak-rps 3000] [--max-batch 100] [--scale-down-delay-s 10]
        [--start fork|preload|spawn]

Starts a real server on 127.0.0.1 (`--workers 1:4`, the test model `tests.models_scaling:reverse`
which loads in 5 s, 100 ms batches, keys whose rate limits never bind: what refuses is
admission) and offers open-loop load, a quarter paid (`loadtest.probe`, every answer checked):
`--base-rps` for `--before-s`, `--peak-rps` for `--peak-s`, then `--base-rps` until the pool is
back to its minimum (at most `--after-max-s`). `--max-batch 40 --peak-rps 1200 --base-rps 40`
is the same step relative to what a worker drains, for a generator that cannot offer 3,000 RPS.
`--start` serves the model from a catalogue saying how its workers start: `preload` has the
pool's launcher do its 5 s load once, as it holds minilm's weights, so a worker added is a
fork of it; `spawn` is each worker a fresh interpreter paying the load, as before launchers.
Meanwhile /admin/workers and /metrics are sampled every `--sample-s`, and a watcher sends
`--watch-rps` free requests one by one, keeping each answer's time, status and Retry-After
(the probe keeps no headers). Exits 1 if a request was lost or wrong, or a paid one refused.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from failover.fleet import STARTS
from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult, percentile
from loadtest.server import fetch_metrics, running_server
from loadtest.watch import (
    ADMIN_KEY,
    FREE_BUDGET_S,
    FREE_KEY,
    PAID_BUDGET_S,
    PAID_KEY,
    Observed,
    Refusals,
    Sample,
    first_at,
    refusals,
    sample_pool,
    up_at,
    watch,
)

MODEL = "tests.models_scaling:reverse"
MAX_CONNECTIONS = 2048  # half the server's --max-connections
_FREELY = "".join(f"{k} = 1000000\n" for k in ("rate", "burst", "account_rate", "account_burst"))
# Rates far above any load here, tightened or not: what refuses is admission, not a bucket.
def keys_text(paid_budget_s: float = PAID_BUDGET_S) -> str:
    """The keys file: a paid and a free key, and an admin's."""
    return f"""anonymous = false
[admin]
keys = ["{ADMIN_KEY}"]
[[keys]]
key = "{PAID_KEY}"
tier = "paid"
[[keys]]
key = "{FREE_KEY}"
tier = "free"
[tiers.paid]
{_FREELY}budget_ms = {paid_budget_s * 1000:.0f}
[tiers.free]
{_FREELY}budget_ms = {FREE_BUDGET_S * 1000:.0f}
"""


def write_keys(directory: Path, paid_budget_s: float = PAID_BUDGET_S) -> Path:
    """The keys file, readable by its owner only (as the server asks). A paid budget other
    than the benchmarks' is for a test that asserts the order of tiers, not a latency."""
    path = directory / "scale-keys.toml"
    path.write_text(keys_text(paid_budget_s))
    path.chmod(0o600)
    return path


@dataclass(frozen=True, slots=True)
class StepPlan:
    base_rps: float = 100.0
    peak_rps: float = 3000.0
    paid_share: float = 0.25
    before_s: float = 4.0
    peak_s: float = 22.0
    after_max_s: float = 90.0  # the bound on waiting for the pool back at its minimum
    after_chunk_s: float = 5.0  # the load after the peak is offered in runs this long
    sample_s: float = 0.5
    watch_rps: float = 20.0
    min_workers: int = 1
    max_workers: int = 4
    scale_down_delay_s: float = 10.0
    max_batch: int = 100  # fewer: a worker drains less, and a lower rate asks for as many
    timeout_s: float = 10.0  # past the tiers' deadlines: a request without an answer is lost

    def server_args(self, keys: Path) -> list[str]:
        return ["--workers", f"{self.min_workers}:{self.max_workers}",
                "--scale-down-delay-s", str(self.scale_down_delay_s),
                *model_args(self.max_batch, keys)]


def model_args(max_batch: int, keys: Path) -> list[str]:
    """The test model's batches take the contract's 100 ms, of at most `max_batch` items."""
    return ["--batch-latency-ms", "100", "--max-batch", str(max_batch), "--keys", str(keys)]


def mix(url: str, rps: float, seconds: float, paid_share: float = 0.25,
        timeout_s: float = 10.0) -> ProbeConfig:
    """Paid and free at `rps`, with connections for answers as slow as the paid budget: a
    client short of connections would queue requests itself, counted in their latency."""
    classes = (TrafficClass.bearer("paid", PAID_KEY, paid_share),
               TrafficClass.bearer("free", FREE_KEY, 1 - paid_share))
    return ProbeConfig(url=url, rps=rps, duration_s=seconds, classes=classes,
                       timeout_s=timeout_s, expected_latency_s=PAID_BUDGET_S,
                       max_connections=MAX_CONNECTIONS)


# -- the step ------------------------------------------------------------------------------------
@dataclass
class StepRun(Observed):
    plan: StepPlan = field(default_factory=StepPlan)
    step_at: float = 0.0  # the peak's first send (monotonic)
    peak_end: float = 0.0

    @property
    def peak(self) -> ProbeResult:
        return self.probes[1]

    def peak_refusals(self) -> Refusals:
        return refusals(self.watched, self.samples, self.step_at, self.peak_end,
                        self.slack_s)

    @property
    def slack_s(self) -> float:
        """A sample shows a change up to `sample_s` late; beside that, a free queue admitted
        before the capacity came drains within a second (refusals may go on that long), and
        a Retry-After is rounded up to whole seconds (it may miss the capacity by that much
        beside the rule's ±20 %)."""
        return 1.0 + self.plan.sample_s

    def asked_at(self) -> float | None:
        """The first sample with a start asked for: no refusal before knows when one comes."""
        return first_at(self.samples, lambda s: s.starting > 0, self.step_at)

    def reached_max(self) -> float | None:
        return up_at(self.samples, self.plan.max_workers, self.step_at)

    def at_min(self, s: Sample) -> bool:
        return s.running == s.desired == len(s.states) == self.plan.min_workers

    def back_to_min(self) -> float | None:
        return first_at(self.samples, self.at_min, self.peak_end)

    def first_retired(self) -> float | None:
        """The first sample after the peak with fewer workers running than at its most."""
        most = max((s.running for s in self.samples), default=0)
        return first_at(self.samples, lambda s: s.running < most, self.peak_end)


async def run_step(url: str, plan: StepPlan) -> StepRun:
    """Offer the step on the server at `url`; bounded by the plan's times plus timeouts."""
    run = StepRun([], [], [], plan=plan)
    done, seen = anyio.Event(), anyio.Event()
    bound = time.monotonic() + plan.before_s + 2 * plan.peak_s + plan.after_max_s + 60

    def load(rps: float, seconds: float) -> ProbeConfig:
        return mix(url, rps, seconds, plan.paid_share, plan.timeout_s)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_pool, url, plan.sample_s, bound, run.samples, done)
        run.probes.append(await run_probe(load(plan.base_rps, plan.before_s)))
        tg.start_soon(watch, url, plan.watch_rps, bound, plan.timeout_s, run.watched, seen)
        run.probes.append(await run_probe(load(plan.peak_rps, plan.peak_s)))
        run.peak_end = time.monotonic()
        run.step_at = run.peak_end - run.peak.wall_s
        while time.monotonic() < run.peak_end + plan.after_max_s:
            run.probes.append(await run_probe(load(plan.base_rps, plan.after_chunk_s)))
            seen.set()  # the watcher went on for a run after the peak: refusals may outlast it
            if run.samples and run.samples[-1].at > run.peak_end and run.at_min(run.samples[-1]):
                break
        done.set()
    run.metrics = await anyio.to_thread.run_sync(fetch_metrics, url)
    return run


# -- the report ----------------------------------------------------------------------------------
def _at(t: float | None, since: float, what: str = "s") -> str:
    return "never" if t is None else f"{t - since:+.1f} {what}"


def timeline(run: StepRun, verbose: bool = False) -> list[str]:
    """The pool's samples where its counts changed (`verbose`: every one), from the step."""
    lines, last = [], None
    for s in run.samples:
        key = (s.desired, s.starting, s.running, len(s.states))
        if key != last or verbose:
            lines.append(f"  {s.at - run.step_at:+7.1f} s  desired {s.desired}  starting "
                         f"{s.starting}  running {s.running}  slots {len(s.states)}  "
                         f"next up in {s.eta_s:4.1f} s  queued paid {s.queued[0]:5d} free "
                         f"{s.queued[1]:5d}")
            last = key
    return lines


def retry_lines(run: StepRun, share: float = 0.2) -> list[str]:
    r = run.peak_refusals()
    if not r.refused:
        return ["  no watched free request was refused"]
    lines = [f"  watched free refused: {len(r.refused)}, codes "
             f"{dict(Counter(w.code for w in r.refused))}, Retry-After values "
             f"{dict(sorted(Counter(w.retry_after for w in r.refused).items()))}"]
    if r.came is None or r.last is None:
        return [*lines, "  the capacity that ended them was never seen running"]
    slack, asked = run.slack_s, run.asked_at() or math.inf
    fits = sorted(r.fits, key=lambda f: f.refused)
    errors = sorted(f.error for f in fits)
    after = [f for f in fits if f.refused >= asked]
    lines += [f"  refusals stopped at {_at(r.last, run.step_at)}, with {r.count} running, "
              f"first running at {_at(r.came, run.step_at)}",
              f"  refusal + Retry-After - that time: median {percentile(errors, 0.5):+.1f} s, "
              f"min {errors[0]:+.1f} s, max {errors[-1]:+.1f} s; within ±{share:.0%} of the "
              f"wait + {slack:.1f} s: {sum(f.within(share, slack) for f in fits)} of {len(fits)};"
              f" of those after the first start was asked ({_at(asked, run.step_at)}): "
              f"{sum(f.within(share, slack) for f in after)} of {len(after)}"]
    lines += [f"    refused {f.refused - run.step_at:+6.1f} s  Retry-After {f.retry_after:3.0f}"
              f" s  capacity came after {f.wait:5.1f} s" for f in fits[:: max(1, len(fits) // 8)]]
    return lines


def timing_lines(run: StepRun, margin_s: float = 0.1) -> list[str]:
    """The figures tests/e2e/test_scaling.py leaves to this command (they depend on how busy
    the machine is): paid P99 against its budget (`margin_s` for the generator's lateness and
    loopback HTTP), and how long free refusals went on once the pool was at its maximum."""
    p99, total = run.peak.classes["paid"].latency.p99, run.total("paid", "ok")
    over = run.over_budget("request_duration")
    lines = [f"  paid P99 {p99 * 1e3:.0f} ms against the {PAID_BUDGET_S * 1e3:.0f} ms budget + "
             f"{margin_s * 1e3:.0f} ms: {'within' if p99 <= PAID_BUDGET_S + margin_s else 'OVER'};"
             f" over the budget by the server's clock: {over} of {total} "
             f"({over / max(total, 1):.1%}, the rule's aim is at most 1 %)"]
    r, four = run.peak_refusals(), run.reached_max()
    if r.last is None or four is None:
        return [*lines, "  free refusals against the pool at its maximum: "
                        f"{'no refusal' if r.last is None else 'the maximum never came'}"]
    return [*lines, f"  free refusals went on {r.last - four:+.1f} s past the pool at "
                    f"{run.plan.max_workers} (the queue admitted before it drains; within "
                    f"{run.slack_s:.1f} s on a quiet machine)"]


def report(run: StepRun, verbose: bool = False) -> str:
    p, peak = run.plan, run.peak
    paid, free = peak.classes["paid"], peak.classes["free"]
    lat = paid.latency
    return "\n".join([
        f"server: --workers {p.min_workers}:{p.max_workers} --scale-down-delay-s "
        f"{p.scale_down_delay_s:g}, {MODEL} (loads in 5 s), 100 ms batches of at most "
        f"{p.max_batch}",
        f"load: {p.base_rps:g} RPS x {p.before_s:g} s, {p.peak_rps:g} RPS x {p.peak_s:g} s "
        f"({p.paid_share:.0%} paid), {p.base_rps:g} RPS until back to {p.min_workers} "
        f"(at most {p.after_max_s:g} s: {len(run.probes) - 2} runs of {p.after_chunk_s:g} s)",
        f"peak: sent {peak.sent} in {peak.wall_s:.1f} s ({peak.sent / peak.wall_s:.0f} RPS "
        f"sent), generator lag p95 {peak.lag.p95 * 1e3:.1f} ms max {peak.lag.max * 1e3:.0f} ms"
        + (" (FELL BEHIND)" if peak.generator_behind else ""),
        f"paid, whole run: sent {run.total('paid', 'sent')}, 200 {run.total('paid', 'ok')}, "
        f"refused {run.refused('paid')} {run.rejected('paid')}; over the "
        f"{PAID_BUDGET_S * 1e3:.0f} ms budget by the server's clock: "
        f"{run.over_budget('request_duration')} answered, "
        f"{run.over_budget('queue_wait')} queued",
        f"paid, peak: statuses {dict(paid.statuses)}; P50/P95/P99/max {lat.p50 * 1e3:.0f} "
        f"{lat.p95 * 1e3:.0f} {lat.p99 * 1e3:.0f} {lat.max * 1e3:.0f} ms",
        f"free, whole run: sent {run.total('free', 'sent')}, 200 {run.total('free', 'ok')}, "
        f"refused {run.refused('free')} {run.rejected('free')}; peak statuses "
        f"{dict(free.statuses)}, admitted P95/P99 {free.latency.p95 * 1e3:.0f} "
        f"{free.latency.p99 * 1e3:.0f} ms",
        "free refusals watched one by one (Retry-After vs the capacity that ended them):",
        *retry_lines(run),
        "what depends on the machine's pace:", *timing_lines(run),
        f"pool: {p.max_workers} running at {_at(run.reached_max(), run.step_at)}; first "
        f"retired {_at(run.first_retired(), run.peak_end, 's after the peak')}; back to "
        f"{p.min_workers} {_at(run.back_to_min(), run.peak_end, 's after the peak')}",
        "pool timeline (from the step):", *timeline(run, verbose),
        f"batches longer than 150 ms (server's histogram): {run.slow_batches()}",
        f"errors {[dict(r.errors) for r in run.probes if r.errors]}, watched "
        f"{dict(Counter(w.code for w in run.watched if w.status == 0))}; "
        f"lost {run.lost}, wrong {run.wrong}",
    ])


FLAGS = ("base_rps", "peak_rps", "before_s", "peak_s", "after_max_s", "scale_down_delay_s",
         "max_batch", "sample_s", "watch_rps", "paid_share")  # the plan's fields a flag sets


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scale_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in FLAGS:
        default = getattr(StepPlan(), name)
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default,
                       help=f"default {default}")
    p.add_argument("--gateways", type=int, default=1)
    p.add_argument("--start", choices=STARTS, default=None,
                   help="how the model's workers start (its catalogue's `start`): forked from "
                   "the launcher (the default), `preload`: its load done once in the launcher "
                   "(a model whose weights the launcher holds, as minilm's), or spawned")
    p.add_argument("--verbose", action="store_true", help="every sample in the timeline")
    a = p.parse_args(argv)
    plan = StepPlan(**{name: getattr(a, name) for name in FLAGS})
    with tempfile.TemporaryDirectory() as tmp:
        args = [*plan.server_args(write_keys(Path(tmp))), "--gateways", str(a.gateways)]
        if a.start is not None:  # the one model, as a catalogue saying how it starts
            models = Path(tmp) / "models.toml"
            models.write_text(f'[models.default.versions.v1]\nspec = "{MODEL}"\n'
                              f'start = "{a.start}"\n')
            args += ["--models", str(models)]
        with running_server(plan.min_workers, MODEL, args, ready_timeout_s=120) as srv:
            run = anyio.run(run_step, srv.url, plan)
    print(f"workers start: {a.start or 'as --model does (forked, the load paid by each)'}")
    print(report(run, a.verbose))
    return 0 if run.lost == 0 and run.wrong == 0 and run.refused("paid") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
