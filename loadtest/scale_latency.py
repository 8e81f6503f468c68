"""The workers the scaling rule asks for, at one steady load, for models whose batches take
25, 100 and 300 ms: does the pool follow what a worker really drains?

    python -m loadtest.scale_latency [--rps 126] [--max-batch 10] [--seconds 20]
                                     [--latencies-ms 25,100,300]

For each batch time, starts a real server on 127.0.0.1 (`sim` padded to the batch time with
`--batch-latency-ms`, `--workers 1:8`, `--max-batch`, a paid key whose rate limits never bind
and whose budget is 1 s), offers `--rps` single-input paid requests a second at fixed
intervals (open loop, `loadtest.probe`, every answer checked) for `--seconds`, and samples
`batchgate_workers_desired` from /metrics every `--sample-s`. Prints, per batch time, the
workers desired over the last `--tail-s` of the load (their median and range), the most it
asked for, the workers holding the model at the end, and what a pool sized at the rule's
target utilization (0.7) would need at the offered load and the nominal batch time.

The server's rate windows follow `--scale-down-delay-s` (a peak is remembered no longer
than that, the short window half of it), so a short delay lets a run settle in seconds.
A worker drains `--max-batch` items per batch: the default 10 keeps the generator at about
a hundred requests a second beside the server on two cores, the same load relative to a
worker as 100-item batches at ten times the rate. Each run takes about `--seconds` plus
the server's start and drain (a few seconds).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult
from loadtest.server import fetch_metrics, metric, running_server

PAID_KEY = "paid-latency-key"
TARGET_UTILIZATION = 0.7  # the rule's default: a pool planned so demand fills 70 % of it
_FREELY = "".join(f"{k} = 1000000\n" for k in ("rate", "burst", "account_rate", "account_burst"))
KEYS = f"""anonymous = false
[[keys]]
key = "{PAID_KEY}"
tier = "paid"
[tiers.paid]
{_FREELY}budget_ms = 1000
[tiers.free]
{_FREELY}budget_ms = 250
"""


@dataclass(frozen=True, slots=True)
class LatencyPlan:
    rps: float = 126.0  # single-input requests: items/s
    max_batch: int = 10
    seconds: float = 20.0  # of steady load
    tail_s: float = 6.0  # desired is read over the last this many seconds of it
    sample_s: float = 0.5
    min_workers: int = 1
    max_workers: int = 8
    scale_down_delay_s: float = 4.0

    def expected(self, batch_ms: float) -> int:
        """Workers the offered load needs at the target utilization, at the nominal batch
        time (within the bounds)."""
        per_worker = self.max_batch / (batch_ms / 1000)
        need = math.ceil(self.rps / (per_worker * TARGET_UTILIZATION) - 1e-9)
        return min(max(need, self.min_workers), self.max_workers)

    def server_args(self, batch_ms: float, keys: Path) -> list[str]:
        return ["--workers", f"{self.min_workers}:{self.max_workers}",
                "--batch-latency-ms", f"{batch_ms:g}", "--max-batch", str(self.max_batch),
                "--scale-down-delay-s", f"{self.scale_down_delay_s:g}",
                "--keys", str(keys), "--gateways", "1"]


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds since the load began
    desired: int
    resident: int


@dataclass(frozen=True, slots=True)
class LatencyRun:
    batch_ms: float
    samples: tuple[Sample, ...]
    probe: ProbeResult
    plan: LatencyPlan

    def tail(self) -> list[int]:
        """Workers desired over the last `tail_s` of the load."""
        start = self.plan.seconds - self.plan.tail_s
        return [s.desired for s in self.samples if s.at >= start] or [
            s.desired for s in self.samples[-1:]]

    @property
    def desired(self) -> float:
        return float(statistics.median(self.tail()))

    @property
    def most(self) -> int:
        return max((s.desired for s in self.samples), default=0)

    @property
    def resident(self) -> int:
        return self.samples[-1].resident if self.samples else 0


def write_keys(directory: Path) -> Path:
    """The keys file above, readable by its owner only (as the server asks)."""
    path = directory / "latency-keys.toml"
    path.write_text(KEYS)
    path.chmod(0o600)
    return path


async def sample(url: str, plan: LatencyPlan, began: float, out: list[Sample]) -> None:
    """Read /metrics every `sample_s` until the load has run `seconds`."""
    while (at := time.monotonic() - began) < plan.seconds:
        samples = await anyio.to_thread.run_sync(fetch_metrics, url)
        out.append(Sample(at, round(metric(samples, "batchgate_workers_desired")),
                          round(metric(samples, "batchgate_model_resident_workers"))))
        await anyio.sleep(plan.sample_s)


async def offer(url: str, plan: LatencyPlan, batch_ms: float) -> LatencyRun:
    """The steady load on one running server, its desired workers sampled meanwhile."""
    config = ProbeConfig(url=url, rps=plan.rps, duration_s=plan.seconds, arrival="fixed",
                         classes=(TrafficClass.bearer("paid", PAID_KEY),), timeout_s=5.0,
                         expected_latency_s=1.0, seed=1)
    samples: list[Sample] = []
    result: list[ProbeResult] = []

    async def probe() -> None:
        result.append(await run_probe(config))

    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(probe)
        tg.start_soon(sample, url, plan, began, samples)
    return LatencyRun(batch_ms, tuple(samples), result[0], plan)


def run_one(plan: LatencyPlan, batch_ms: float, keys: Path) -> LatencyRun:
    """One server with batches of `batch_ms`, under the plan's load."""
    with running_server(plan.min_workers, "sim", plan.server_args(batch_ms, keys),
                        ready_timeout_s=60) as srv:
        return anyio.run(offer, srv.url, plan, batch_ms)


def run_all(plan: LatencyPlan, latencies_ms: Sequence[float]) -> list[LatencyRun]:
    with tempfile.TemporaryDirectory() as tmp:
        keys = write_keys(Path(tmp))
        return [run_one(plan, ms, keys) for ms in latencies_ms]


def report(runs: Sequence[LatencyRun]) -> list[str]:
    plan = runs[0].plan
    lines = [f"steady load {plan.rps:g} items/s (paid, fixed intervals) for {plan.seconds:g} s, "
             f"--workers {plan.min_workers}:{plan.max_workers}, --max-batch {plan.max_batch}; "
             f"desired over the last {plan.tail_s:g} s",
             "batch ms  desired (median, range)  most asked  resident at end  needed at 70 %"
             "  answered  refused  lost"]
    for r in runs:
        tail, p = r.tail(), r.probe
        lines.append(
            f"{r.batch_ms:8g}  {r.desired:7g} ({min(tail)}-{max(tail)}){'':12}{r.most:10d}"
            f"  {r.resident:15d}  {plan.expected(r.batch_ms):14d}  {p.ok:8d}  {p.rejected:7d}"
            f"  {p.lost:4d}")
    base = next((r for r in runs if r.batch_ms == 100), None)
    if base is not None and base.desired > 0:
        ratios = ", ".join(f"{r.batch_ms:g} ms x{r.desired / base.desired:.2f}"
                           for r in runs if r is not base)
        lines.append(f"against 100 ms: {ratios}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scale_latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = LatencyPlan()
    p.add_argument("--rps", type=float, default=d.rps)
    p.add_argument("--max-batch", type=int, default=d.max_batch)
    p.add_argument("--seconds", type=float, default=d.seconds)
    p.add_argument("--tail-s", type=float, default=d.tail_s)
    p.add_argument("--sample-s", type=float, default=d.sample_s)
    p.add_argument("--scale-down-delay-s", type=float, default=d.scale_down_delay_s)
    p.add_argument("--latencies-ms", default="25,100,300")
    a = p.parse_args(argv)
    plan = LatencyPlan(rps=a.rps, max_batch=a.max_batch, seconds=a.seconds, tail_s=a.tail_s,
                       sample_s=a.sample_s, scale_down_delay_s=a.scale_down_delay_s)
    runs = run_all(plan, [float(x) for x in a.latencies_ms.split(",")])
    print("\n".join(report(runs)))
    return 1 if any(r.probe.lost or r.probe.wrong for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
