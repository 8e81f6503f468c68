"""Keyed requests in flight when a cell's core dies: does the model run them twice, and does
every worker reload? (issue 40, item 5)

    python -m loadtest.hostile_core_death [--root DIR] [--state memory|sqlite] [--rps 40]
        [--duration 20] [--kills 2] [--every 6] [--workers 2] [--expect-attach]

Runs a cell (`--gateways 2`, `--workers`, the example keys) from this checkout or `--root`
(another checkout, to compare) serving `tests.models_logged:batchstring` (slow batches;
every input it runs is written to a run log), with kept answers in memory or in SQLite.
Offers `--rps` paid requests a second, open loop, for `--duration`: one input each, half
with an Idempotency-Key of their own (`k-<n>`), half plain (`p-<n>`). Meanwhile the core is
SIGKILLed `--kills` times, `--every` seconds apart. Prints the answers by status, the wrong
ones, each kill's time from SIGKILL to /readyz 200 and to every worker up, with the workers'
pids before and after it (the same pids: the new core attached to them, nothing reloaded),
and from the run log how many keyed and plain inputs ran more than once (a plain request may
legitimately run twice). Exits 1 if an answer was not 200 and right, if a keyed input ran
twice, or, with `--expect-attach`, if a kill changed a worker's pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import urllib.error
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

from loadtest.core_faults import admin_workers
from loadtest.server import RunningServer, code_of, core_pid, is_ready, running_server
from tests.models_logged import LOG_VARIABLE, expected

MODEL = "tests.models_logged:batchstring"
PAID = {"Authorization": "Bearer paid-demo-key"}
UP = ("ready", "busy")
BOUND_S = 60.0  # the longest any one wait here may take
POLL_S = 0.02
ROOT = Path(__file__).parents[1]


@dataclass
class Kill:
    away_s: float  # from SIGKILL to /readyz 200 with another core
    up_s: float  # from SIGKILL to every worker up again
    pids_before: list[int]
    pids_after: list[int]

    @property
    def attached(self) -> bool:
        return self.pids_before == self.pids_after


@dataclass
class DeathRun:
    answers: Counter[str] = field(default_factory=Counter)  # "200", or status and code
    wrong: list[str] = field(default_factory=list)  # inputs answered 200 with another output
    kills: list[Kill] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter, repr=False)  # input -> model runs

    def twice(self, prefix: str) -> int:
        """Inputs starting with `prefix` that the model ran more than once."""
        return sum(1 for text, n in self.runs.items() if text.startswith(prefix) and n > 1)

    def clean(self, expect_attach: bool) -> bool:
        return set(self.answers) <= {"200"} and not self.wrong and self.twice("k-") == 0 \
            and (not expect_attach or all(k.attached for k in self.kills))


def worker_pids(url: str, workers: int) -> list[int]:
    """The pids of the pool's workers once `workers` of them are up, sorted (bounded). A
    gateway not yet linked to the restarted core answers 503: none of them is up to it yet
    (`/readyz` was answered by another gateway of the cell)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        try:
            listed = admin_workers(url)["workers"]
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise
            listed = []
        assert isinstance(listed, list)
        pids = sorted(int(w["pid"]) for w in listed if w["state"] in UP and w["pid"])
        if len(pids) >= workers or time.monotonic() > deadline:
            return pids
        time.sleep(POLL_S)  # another process: poll it


def _back(server: RunningServer, pid: int) -> bool:
    return core_pid(server) not in (pid, None) and is_ready(server.url)


async def _kill(server: RunningServer, workers: int) -> Kill:
    before = await anyio.to_thread.run_sync(worker_pids, server.url, workers)
    pid = core_pid(server)
    if pid is None:
        raise RuntimeError("no core process found")
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with anyio.fail_after(BOUND_S):
        while not await anyio.to_thread.run_sync(_back, server, pid):  # noqa: ASYNC110
            await anyio.sleep(POLL_S)  # another process: poll it
    away = time.monotonic() - started
    after = await anyio.to_thread.run_sync(worker_pids, server.url, workers)
    return Kill(away, time.monotonic() - started, before, after)


async def offer(server: RunningServer, run: DeathRun, rps: float, duration: float,
                kills: int, every: float, workers: int) -> None:
    """Open-loop load on `server` while its core is killed; fills `run` but its run log."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=server.url, timeout=BOUND_S, limits=limits) as client:

        async def one(n: int) -> None:
            keyed = n % 2 == 0
            text = f"{'k' if keyed else 'p'}-{n}"
            headers = {**PAID, "Idempotency-Key": text} if keyed else PAID
            try:
                r = await client.post("/v1/batchstring", json={"input": text}, headers=headers)
            except httpx.HTTPError as exc:
                run.answers[type(exc).__name__] += 1
                return
            run.answers[code_of(r)] += 1
            if r.status_code == 200 and r.json().get("output") != expected(text):
                run.wrong.append(text)

        async def killing() -> None:
            for i in range(kills):
                await anyio.sleep_until(began + (i + 1) * every)
                run.kills.append(await _kill(server, workers))

        began = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(killing)
            for n in range(int(rps * duration)):
                await anyio.sleep_until(began + n / rps)
                tg.start_soon(one, n)


def read_runs(path: Path) -> Counter[str]:
    runs: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            runs[line.partition("\t")[2]] += 1
    return runs


def measure(root: Path = ROOT, state: str = "memory", rps: float = 40.0, duration: float = 20.0,
            kills: int = 2, every: float = 6.0, workers: int = 2) -> DeathRun:
    """One scenario on a fresh cell: its answers, its kills and what its model ran."""
    run = DeathRun()
    with tempfile.TemporaryDirectory(prefix="core-death-") as folder:
        log = Path(folder) / "runs.log"
        args = ["--gateways", "2", "--keys", str(root / "examples" / "keys.toml")]
        if state == "sqlite":
            args += ["--state", f"sqlite:{Path(folder) / 'state.db'}"]
        with running_server(workers, MODEL, args, ready_timeout_s=BOUND_S * 3,
                            env={LOG_VARIABLE: str(log)}, cwd=root) as server:
            anyio.run(offer, server, run, rps, duration, kills, every, workers)
        run.runs = read_runs(log)
    return run


def report(run: DeathRun, expect_attach: bool) -> str:
    answers = " ".join(f"{k}: {v}" for k, v in sorted(run.answers.items())) or "-"
    lines = [f"answers: {answers}   wrong outputs: {len(run.wrong)} {run.wrong[:5]}"]
    for i, k in enumerate(run.kills, 1):
        lines.append(f"kill {i}: SIGKILL to /readyz 200 {k.away_s:.2f} s, to workers up "
                     f"{k.up_s:.2f} s   workers before {k.pids_before} after {k.pids_after} "
                     f"({'attached' if k.attached else 'reloaded'})")
    keyed = sum(1 for t in run.runs if t.startswith("k-"))
    plain = sum(1 for t in run.runs if t.startswith("p-"))
    lines += [
        f"run log: {sum(run.runs.values())} inputs run, {keyed} keyed and {plain} plain "
        "distinct",
        f"keyed inputs run more than once: {run.twice('k-')}   "
        f"plain inputs run more than once: {run.twice('p-')}",
        "CLEAN" if run.clean(expect_attach) else "NOT CLEAN",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.hostile_core_death", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the checkout whose server runs (default: this one)")
    p.add_argument("--state", choices=["memory", "sqlite"], default="memory")
    p.add_argument("--rps", type=float, default=40.0)
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--every", type=float, default=6.0, help="seconds between kills")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--expect-attach", action="store_true",
                   help="fail if a kill changed a worker's pid")
    a = p.parse_args(argv)
    run = measure(a.root.resolve(), a.state, a.rps, a.duration, a.kills, a.every, a.workers)
    print(report(run, a.expect_attach))
    return 0 if run.clean(a.expect_attach) else 1


if __name__ == "__main__":
    sys.exit(main())
