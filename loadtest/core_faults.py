"""The core process of a cell killed (or stopped) under load: nothing may be lost.

    python -m loadtest.core_faults --rps 600 --duration 30 --faults 3 --every 10
    python -m loadtest.core_faults --rps 600 --duration 12 --faults 1 --signal STOP --stop-s 3

Starts a real cell (`--gateways 2`, `sim` workers, example keys) on 127.0.0.1 and offers two
open-loop probes at once (`loadtest.probe`: every answer checked), half the rate each: plain
requests, and requests that each carry an Idempotency-Key of their own. Meanwhile the core
process is SIGKILLed `--faults` times, `--every` seconds apart (or SIGSTOPped for `--stop-s`
and continued). Prints both probes' results, how long each core was away (from the signal to
/readyz 200 again), the gateways' resubmissions, and whether every process of the cell was
gone after SIGTERM. Exits 1 if any request was lost, wrong or refused, if a gateway was
restarted, or if a process was left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult, format_result
from loadtest.server import (
    RunningServer,
    core_pid,
    fetch_metrics,
    is_ready,
    metric,
    start_server,
    stop_server,
)

ADMIN = {"Authorization": "Bearer admin-demo-key"}
EXAMPLE_KEYS = Path(__file__).parents[1] / "examples" / "keys.toml"
POLL_S = 0.02


@dataclass
class FaultRun:
    plain: ProbeResult
    keyed: ProbeResult
    away_s: list[float]  # per fault: from the signal to /readyz 200 again
    resubmitted: float
    gateway_restarts: int
    core_restarts: int
    left_behind: list[int] = field(default_factory=list)
    exit_code: int | None = None

    @property
    def clean(self) -> bool:
        probes = (self.plain, self.keyed)
        return all(p.lost == 0 and p.wrong == 0 and p.rejected == 0 for p in probes) \
            and self.gateway_restarts == 0 and not self.left_behind and self.exit_code == 0


def admin_workers(url: str) -> dict[str, object]:
    request = urllib.request.Request(url + "/admin/workers", headers=ADMIN)
    with urllib.request.urlopen(request, timeout=5) as resp:
        body: dict[str, object] = json.load(resp)
    return body


async def _fault(server: RunningServer, sig: str, stop_s: float) -> float:
    """One fault on the current core; seconds until the cell is ready again."""
    pid = core_pid(server)
    if pid is None:
        raise RuntimeError("no core process found")
    started = time.monotonic()
    if sig == "KILL":
        os.kill(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGSTOP)
        await anyio.sleep(stop_s)  # the fault itself lasts this long
        os.kill(pid, signal.SIGCONT)
    with anyio.fail_after(60):
        while not await anyio.to_thread.run_sync(_back, server, pid, sig):  # noqa: ASYNC110
            await anyio.sleep(POLL_S)  # another process: poll it
    return time.monotonic() - started


def _back(server: RunningServer, pid: int, sig: str) -> bool:
    """Ready again, with another core after a kill."""
    return (sig != "KILL" or core_pid(server) not in (pid, None)) and is_ready(server.url)


async def run_faults(server: RunningServer, rps: float, duration: float, faults: int,
                     every: float, sig: str = "KILL", stop_s: float = 3.0,
                     first_at: float | None = None, timeout_s: float = 15.0,
                     ) -> tuple[ProbeResult, ProbeResult, list[float]]:
    """Offer the load on `server` and fault its core meanwhile; both probes' results and how
    long each fault kept the cell unready."""
    paid = (TrafficClass.bearer("paid", "paid-demo-key"),)
    common = {"url": server.url, "rps": rps / 2, "duration_s": duration, "seed": 7,
              "timeout_s": timeout_s, "classes": paid}
    results: dict[str, ProbeResult] = {}
    away: list[float] = []

    async def probe(name: str, config: ProbeConfig) -> None:
        results[name] = await run_probe(config)

    async def faulting() -> None:
        await anyio.sleep(first_at if first_at is not None else every)
        for i in range(faults):
            if i:
                await anyio.sleep(every)
            away.append(await _fault(server, sig, stop_s))

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe, "plain", ProbeConfig(**common))  # type: ignore[arg-type]
        tg.start_soon(probe, "keyed", ProbeConfig(**common, idempotency=True))  # type: ignore[arg-type]
        tg.start_soon(faulting)
    return results["plain"], results["keyed"], away


def measure(rps: float, duration: float, faults: int, every: float, sig: str, stop_s: float,
            workers: int, model: str, extra: Sequence[str] = ()) -> FaultRun:
    server = start_server(workers, model, ["--gateways", "2", "--keys", str(EXAMPLE_KEYS),
                                           *extra], ready_timeout_s=180)
    try:
        before = admin_workers(server.url)["gateways"]
        plain, keyed, away = anyio.run(run_faults, server, rps, duration, faults, every, sig,
                                       stop_s)
        after = admin_workers(server.url)
        gateways = after["gateways"]
        assert isinstance(before, list) and isinstance(gateways, list)
        restarts = sum(int(g["restarts"]) for g in gateways)
        if [g["pid"] for g in gateways] != [g["pid"] for g in before]:
            restarts = max(restarts, 1)
        core = after.get("core")
        core_restarts = int(core["restarts"]) if isinstance(core, dict) else -1
        resubmitted = metric(fetch_metrics(server.url), "batchgate_resubmitted_total")
    finally:
        left = stop_server(server)
    run = FaultRun(plain, keyed, away, resubmitted, restarts, core_restarts, left,
                   server.process.returncode)
    server.log_path.unlink(missing_ok=True)
    return run


def report(run: FaultRun) -> str:
    away = " ".join(f"{s:.2f}" for s in run.away_s) or "-"
    return "\n".join([
        "plain requests:", format_result(run.plain), "",
        "keyed requests:", format_result(run.keyed), "",
        f"core away (signal to /readyz 200), s: {away}",
        f"core restarts: {run.core_restarts}   gateway restarts: {run.gateway_restarts}   "
        f"jobs resubmitted: {run.resubmitted:.0f}",
        f"exit code after SIGTERM: {run.exit_code}   processes left behind: "
        f"{run.left_behind or 'none'}",
        "CLEAN" if run.clean else "NOT CLEAN",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.core_faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rps", type=float, default=600.0, help="both probes together")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--faults", type=int, default=3)
    p.add_argument("--every", type=float, default=10.0, help="seconds between faults")
    p.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    p.add_argument("--stop-s", type=float, default=3.0, help="how long a STOP lasts")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="sim")
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more flag for the server, e.g. --server-arg=--state=sqlite:/tmp/s")
    a = p.parse_args(argv)
    run = measure(a.rps, a.duration, a.faults, a.every, a.signal, a.stop_s, a.workers, a.model,
                  a.server_arg)
    print(report(run))
    return 0 if run.clean else 1


if __name__ == "__main__":
    sys.exit(main())
