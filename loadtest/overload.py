"""Overload scenarios: does the front door keep paid traffic's SLA when demand outruns the pool?

    python -m loadtest.overload --scenario shed      # 1 worker, 500 paid/s + 1,000 free/s, 30 s
    python -m loadtest.overload --scenario gpu-loss  # 2 workers, 700 paid/s + 800 free/s,
                                                     # one worker SIGKILLed at 10 s, kept dead

Starts the real server (`sim` workers, the shipped example keys), offers open-loop paid and
free traffic, samples the server's queue depth and memory, and prints per tier: offered,
admitted, refused by status, p50/p95/p99 of admitted requests, p95 of refusals, peak queue
depth and peak server memory. Exits 1 if an admitted request was lost or answered wrongly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from loadtest.chaos import worker_pids
from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult
from loadtest.server import fetch_metrics, running_server


@dataclass(frozen=True, slots=True)
class Scenario:
    workers: int
    paid_rps: float
    free_rps: float
    duration: float
    kill_at: float | None  # seconds into the run: SIGKILL one worker, never restarted


SCENARIOS = {
    "shed": Scenario(workers=1, paid_rps=500, free_rps=1000, duration=30, kill_at=None),
    "gpu-loss": Scenario(workers=2, paid_rps=700, free_rps=800, duration=30, kill_at=10),
}


@dataclass
class Peaks:
    queue: float = 0.0
    rss_mb: float = 0.0


async def sample(url: str, pid: int, peaks: Peaks, until: float) -> None:
    """Peak queue depth (all lanes) and the gateway process's peak RSS, 4 times a second."""
    import psutil

    proc = psutil.Process(pid)
    while anyio.current_time() < until:
        m = await anyio.to_thread.run_sync(fetch_metrics, url)
        depth = sum(v for k, v in m.items() if k.startswith("batchgate_queue_depth{"))
        peaks.queue = max(peaks.queue, depth)
        peaks.rss_mb = max(peaks.rss_mb, proc.memory_info().rss / 2**20)
        await anyio.sleep(0.25)


async def kill_one_at(url: str, delay: float) -> None:
    await anyio.sleep(delay)
    busy, ready = await anyio.to_thread.run_sync(worker_pids, url)
    os.kill((busy or ready)[0], signal.SIGKILL)


async def run(url: str, pid: int, s: Scenario) -> tuple[ProbeResult, Peaks]:
    config = ProbeConfig(
        url=url, rps=s.paid_rps + s.free_rps, duration_s=s.duration, timeout_s=10.0, seed=7,
        classes=(
            TrafficClass.bearer("paid", "paid-demo-key", s.paid_rps),
            TrafficClass.bearer("free", "free-demo-key", s.free_rps),
        ),
    )
    peaks = Peaks()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sample, url, pid, peaks, anyio.current_time() + s.duration + 2)
        if s.kill_at is not None:
            tg.start_soon(kill_one_at, url, s.kill_at)
        result = await run_probe(config)
    return result, peaks


def report(name: str, s: Scenario, result: ProbeResult, peaks: Peaks) -> str:
    lines = [
        f"scenario {name}: {s.workers} worker(s), {s.paid_rps:.0f} paid/s + {s.free_rps:.0f} "
        f"free/s for {s.duration:.0f} s" + (f", one worker SIGKILLed at {s.kill_at:.0f} s"
                                            if s.kill_at is not None else ""),
        f"{'tier':<5} {'offered':>8} {'admitted':>9} {'refused':>8} {'by status':<22} "
        f"{'p50':>7} {'p95':>7} {'p99':>7} {'refusal p95':>12} {'wrong':>6} {'lost':>5}",
    ]
    for tier, c in result.classes.items():
        refused = {st: n for st, n in c.statuses.items() if st != 200}
        by_status = " ".join(f"{st}:{n}" for st, n in sorted(refused.items())) or "-"
        lat, ref = c.latency, c.refusal_latency
        lines.append(
            f"{tier:<5} {c.sent:>8} {c.ok:>9} {sum(refused.values()):>8} {by_status:<22} "
            f"{lat.p50 * 1e3:>6.0f}ms {lat.p95 * 1e3:>5.0f}ms {lat.p99 * 1e3:>5.0f}ms "
            f"{ref.p95 * 1e3:>10.1f}ms {c.wrong:>6} {c.lost:>5}"
        )
    behind = "fell behind" if result.generator_behind else "kept up"
    lines.append(f"peak queue depth {peaks.queue:.0f} items; peak server memory "
                 f"{peaks.rss_mb:.0f} MiB; generator {behind} (lag p95 "
                 f"{result.lag.p95 * 1e3:.1f} ms)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    p.add_argument("--duration", type=float, default=None, help="override seconds of load")
    a = p.parse_args(argv)
    failed = False
    for name in SCENARIOS if a.scenario == "all" else [a.scenario]:
        s = SCENARIOS[name]
        if a.duration is not None:
            s = Scenario(s.workers, s.paid_rps, s.free_rps, a.duration, s.kill_at)
        args = ["--keys", "examples/keys.toml", "--restart", "false"]
        with running_server(workers=s.workers, args=args) as srv:
            result, peaks = anyio.run(run, srv.url, srv.pid, s)
        print(report(name, s, result, peaks), flush=True)
        failed |= result.wrong > 0 or result.lost > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
