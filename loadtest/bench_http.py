"""HTTP benchmark: the real server (`--model sim`), offered an open-loop load, one row a run.

Read every row against the physical limits: no answer before 100 ms, N workers answer at
most N x 1,000 items/s; the flush policy alone allows the figures in docs/benchmarks.md. The load
generator shares this machine's cores with the server (2 here): the `client cpu` column
and the `gen` flag say how much it took and whether it kept to its schedule.

`batch` is the model's mean time per batch; `ovh` what a batch costs beyond it, from the
core's cut to its handling of the answer (the pool's transport and the owner's wake-up),
the mean over the run. `--pools process ray` runs each rate on both pools; a `ray` server
starts a local Ray of one node, whose daemons (GCS, raylet, agents) count in the workers'
CPU with the actors. Each pool's per-batch overhead alone, one batch at a time through the
pool seam with nothing else running, follows the rows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from loadtest import pool_overhead as overhead
from loadtest.netns import loopback_only, rerun_isolated
from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult
from loadtest.server import (
    RunningServer,
    cpu_seconds,
    door_pid,
    fetch_metrics,
    metric,
    running_server,
)

DEFAULT_RATES = ("100@10", "100@2", "800@1", "1600@2")
KEYS_FILE = Path(__file__).resolve().parents[1] / "examples" / "keys.toml"
REASONS = ("full", "timeout", "idle", "retry")


@dataclass(frozen=True, slots=True)
class Scenario:
    rps: float
    workers: int
    idle_trigger: bool | None  # None: the server's default
    gateways: int = 1  # HTTP gateway processes in front of the core (1: a single process)
    pool: str = "process"  # or ray: actors in a local Ray the server starts

    @property
    def name(self) -> str:
        idle = {None: "", True: " idle=on", False: " idle=off"}[self.idle_trigger]
        cell = f" gw={self.gateways}" if self.gateways > 1 else ""
        ray = " ray" if self.pool == "ray" else ""
        return f"{self.rps:.0f}rps/{self.workers}w{idle}{cell}{ray}"


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    workers: int
    offered_rps: float
    sent_rps: float
    achieved_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_fill: float
    mean_batch_ms: float
    batch_overhead_ms: float  # per batch: held by a worker (cut to answer handled) less model
    flushes: dict[str, int]
    server_cpu_ms_per_req: float  # the core process (in a single process, all the HTTP too)
    gateway_cpu_ms_per_req: float  # the gateway processes together (0 in a single process)
    workers_cpu_ms_per_req: float
    client_cpu_pct: float
    ok: int
    wrong: int
    lost: int
    errors: int
    statuses: dict[int, int]
    error_kinds: dict[str, int]
    lag_p95_ms: float
    generator_behind: bool


def measure(
    s: Scenario, duration_s: float, warmup_s: float, key: str | None, keys_file: Path | None
) -> Row:
    """Start a server, warm it, then probe once between two reads of /metrics and CPU."""
    args = [] if s.idle_trigger is None else ["--idle-trigger", str(s.idle_trigger).lower()]
    args += ["--keys", str(keys_file)] if keys_file else []
    args += ["--gateways", str(s.gateways)]
    args += ["--pool", "ray", "--ray-worker-resources", RAY_SLOT] if s.pool == "ray" else []
    classes = (TrafficClass.bearer("paid" if key else "anonymous", key),)
    with running_server(s.workers, "sim", args, env={"BATCHGATE_ADMIN_KEY": ADMIN_KEY}) as srv:
        if warmup_s > 0:
            warm = ProbeConfig(srv.url, s.rps, warmup_s, classes=classes, timeout_s=5.0)
            asyncio.run(run_probe(warm))
        before = fetch_metrics(srv.url)  # scrapes stay outside the CPU window
        gateways = _gateway_pids(srv)
        cpu0 = _cpu(srv, gateways)
        client0 = time.process_time()
        cfg = ProbeConfig(srv.url, s.rps, duration_s, classes=classes, timeout_s=10.0)
        result = asyncio.run(run_probe(cfg))
        client = time.process_time() - client0
        cpu1 = _cpu(srv, gateways)
        after = fetch_metrics(srv.url)
    spent = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2])
    return _row(s, result, before, after, spent, client)


ADMIN_KEY = "bench-admin"
RAY_SLOT = "batchgate_slot"  # a local Ray started by the server declares one per worker


def _gateway_pids(srv: RunningServer) -> list[int]:
    request = urllib.request.Request(
        srv.url + "/admin/workers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return [g["pid"] for g in orjson.loads(resp.read())["gateways"] if g["pid"]]


def _cpu(srv: RunningServer, gateways: list[int]) -> tuple[float, float, float]:
    """CPU seconds of the core process, of its gateway processes, of its workers (in a
    cell the supervisor, which serves nothing, is not counted)."""
    core = door_pid(srv)
    return cpu_seconds(core), sum(cpu_seconds(pid) for pid in gateways), \
        cpu_seconds(core, children=True)


def _row(
    s: Scenario, r: ProbeResult, before: dict[str, float], after: dict[str, float],
    cpu: tuple[float, float, float], client: float,
) -> Row:
    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    batches = delta("batchgate_batch_size_count")
    answered = max(1, sum(r.statuses.values()))
    return Row(
        scenario=s.name, workers=s.workers, offered_rps=s.rps,
        sent_rps=r.sent / r.duration_s, achieved_rps=r.achieved_rps,
        p50_ms=r.latency.p50 * 1e3, p95_ms=r.latency.p95 * 1e3, p99_ms=r.latency.p99 * 1e3,
        mean_fill=delta("batchgate_batch_size_sum") / batches if batches else 0.0,
        mean_batch_ms=delta("batchgate_batch_duration_seconds_sum") * 1e3 / batches
        if batches else 0.0,
        # Both reads fall between runs, with no batch in flight: the difference is exact.
        batch_overhead_ms=(delta("batchgate_worker_busy_seconds_total")
                           - delta("batchgate_batch_duration_seconds_sum")) * 1e3 / batches
        if batches else 0.0,
        flushes={k: int(delta("batchgate_batch_flush_total", reason=k)) for k in REASONS},
        server_cpu_ms_per_req=cpu[0] * 1e3 / answered,
        gateway_cpu_ms_per_req=cpu[1] * 1e3 / answered,
        workers_cpu_ms_per_req=cpu[2] * 1e3 / answered,
        client_cpu_pct=100 * client / r.wall_s, ok=r.ok, wrong=r.wrong, lost=r.lost,
        errors=r.rejected + r.shed + r.lost, statuses=dict(r.statuses),
        error_kinds=dict(r.errors), lag_p95_ms=r.lag.p95 * 1e3,
        generator_behind=r.generator_behind,
    )


HEADER = (
    f"{'scenario':<20} {'wk':>2} {'offer':>6} {'sent':>6} {'achvd':>6} {'p50':>6} {'p95':>6} "
    f"{'p99':>6} {'fill':>5} {'batch':>5} {'ovh':>5} {'flush f/t/i/r':<17} {'srv ms/req':>10} "
    f"{'gw ms/req':>9} "
    f"{'wk ms/req':>9} {'cli cpu':>7} {'wrong':>5} {'lost':>5} {'err':>5} gen (lag p95)"
)


def format_row(r: Row) -> str:
    flush = "/".join(str(r.flushes[k]) for k in REASONS)
    gen = "BEHIND" if r.generator_behind else "ok"
    return (
        f"{r.scenario:<20} {r.workers:>2} {r.offered_rps:>6.0f} {r.sent_rps:>6.0f} "
        f"{r.achieved_rps:>6.0f} {r.p50_ms:>6.1f} {r.p95_ms:>6.1f} {r.p99_ms:>6.1f} "
        f"{r.mean_fill:>5.1f} {r.mean_batch_ms:>5.1f} {r.batch_overhead_ms:>5.2f} {flush:<17} "
        f"{r.server_cpu_ms_per_req:>10.3f} "
        f"{r.gateway_cpu_ms_per_req:>9.3f} "
        f"{r.workers_cpu_ms_per_req:>9.3f} {r.client_cpu_pct:>6.0f}% {r.wrong:>5} {r.lost:>5} "
        f"{r.errors:>5} {gen} ({r.lag_p95_ms:.1f} ms){_detail(r)}"
    )


def _detail(r: Row) -> str:
    """What the errors were: non-200 statuses and lost/shed kinds."""
    parts = [f"{s}:{n}" for s, n in sorted(r.statuses.items()) if s != 200]
    parts += [f"{k}:{n}" for k, n in sorted(r.error_kinds.items())]
    return f" [{' '.join(parts)}]" if parts else ""


def scenarios(rates: Sequence[str], workers: int, idle: str,
              gateways: Sequence[int] = (1,), pools: Sequence[str] = ("process",),
              ) -> list[Scenario]:
    """`RPS@WORKERS` specs (a bare RPS uses `workers`), each once per idle-trigger setting,
    gateway count and pool."""
    choices: dict[str, list[bool | None]] = {
        "default": [None], "on": [True], "off": [False], "both": [True, False]}
    settings = choices[idle]
    out = []
    for spec in rates:
        rps, _, w = spec.partition("@")
        out += [Scenario(float(rps), int(w or workers), t, g, pool) for t in settings
                for g in gateways for pool in pools]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_http", description=__doc__)
    p.add_argument("--rates", nargs="+", default=list(DEFAULT_RATES), metavar="RPS[@WORKERS]")
    p.add_argument("--workers", type=int, default=1, help="for rates given without @WORKERS")
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    p.add_argument("--quick", action="store_true", help="3 s runs, 1 s warm-up")
    p.add_argument("--idle-trigger", choices=["default", "on", "off", "both"], default="default")
    p.add_argument("--key", default="paid-demo-key", help="bearer key sent ('' for none)")
    p.add_argument("--keys-file", type=Path, default=KEYS_FILE, help="server's --keys")
    p.add_argument("--gateways", type=int, nargs="+", default=[1],
                   help="gateway process counts to run each rate with (serve --gateways)")
    p.add_argument("--pools", nargs="+", choices=["process", "ray"], default=["process"],
                   help="worker pools to run each rate with (serve --pool); ray runs the "
                        "whole benchmark in a network namespace where lo is all there is")
    p.add_argument("--overhead-batches", type=int, default=500,
                   help="with ray: batches timed for each pool's per-batch overhead (0: none)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the rows as JSON")
    a = p.parse_args(argv)
    if "ray" in a.pools and not loopback_only():
        return rerun_isolated("loadtest.bench_http", sys.argv[1:] if argv is None else argv)
    duration, warmup = (3.0, 1.0) if a.quick else (a.duration, a.warmup)
    rows: list[Row] = []
    print(f"open-loop Poisson, {duration:.0f} s per run after {warmup:.0f} s warm-up, key "
          f"{a.key or 'none'}; latency from the scheduled send; floor 100 ms, capacity "
          "1,000 items/s per worker; generator in this process, sharing the cores")
    print(HEADER, flush=True)
    for s in scenarios(a.rates, a.workers, a.idle_trigger, a.gateways, a.pools):
        rows.append(measure(s, duration, warmup, a.key or None, a.keys_file))
        print(format_row(rows[-1]), flush=True)
    if "ray" in a.pools and a.overhead_batches > 0:
        print("\nper-batch overhead: round trip of 100 strings minus model time, one worker")
        print(overhead.HEADER, flush=True)
        for kind in a.pools:
            print(overhead.format_overhead(overhead.measure(kind, a.overhead_batches)),
                  flush=True)
    if a.json:
        opts = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
        a.json.write_bytes(orjson.dumps([asdict(r) for r in rows], option=opts))
    return 1 if any(r.wrong or r.lost for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
