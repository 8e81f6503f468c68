"""A guard's workers all killed under load: closed answers 503 guard_unavailable, open lets
the inputs through marked `Guard-Skipped`, both within the guard's timeout (issue 36).

    python -m loadtest.hostile_guard_kill --mode closed|open [--gateways 1|2] [--rps 100]
        [--duration 12] [--outage-at 3] [--outage-s 4]

Serves `topics` (`tests.models_logged:batchstring`, logging every input it runs) behind the
pre guard `safety` (`tests.models_guards:refuse_marker`: refuses BLOCKME), guard timeout
300 ms, two workers each, under `--rps` paid one-input requests a second, open loop, every 5th
with BLOCKME. From `--outage-at` for `--outage-s` every process of the guard's workers (pids
from GET /admin/workers) is SIGKILLed whenever up. Prints the answers before, during and
after the outage, the failed-guard answers' latency, which BLOCKME inputs the model ran and
the first plain 200 after the outage. Exits 1 if a claim fails.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import psutil

from loadtest.core_faults import admin_workers
from loadtest.server import code_of, running_server
from tests.models_logged import LOG_VARIABLE, expected

PAID = {"Authorization": "Bearer paid-demo-key", "X-Request-Timeout-Ms": "5000"}
DEADLINE_S = 5.0
GUARD = "safety@v1"
KILL_EVERY_S = 0.15
WITHIN_S = 1.5  # the claim: a failed guard's answer within its timeout plus a batch or so
CATALOGUE = """
[models.topics]
pre = ["safety"]
on_guard_failure = "{mode}"
guard_timeout_ms = 300
min_workers = 2
max_workers = 2
versions.v1.spec = "tests.models_logged:batchstring"
[models.safety]
min_workers = 2
max_workers = 2
versions.v1.spec = "tests.models_guards:refuse_marker"
"""


@dataclass(frozen=True)
class Answer:
    text: str
    sent_s: float  # from the load's start
    latency_s: float
    code: str  # "200", or status and code
    skipped: str | None  # the Guard-Skipped header
    output: str | None
    retry_after: bool


@dataclass
class KillRun:
    mode: str
    outage: tuple[float, float]  # from the load's start
    answers: list[Answer] = field(default_factory=list)
    kills: int = 0
    runs: Counter[str] = field(default_factory=Counter, repr=False)  # input -> model runs

    def phase(self, a: Answer) -> str:
        return "before" if a.sent_s < self.outage[0] else \
            "during" if a.sent_s < self.outage[1] else "after"

    def failed(self) -> list[Answer]:
        """The outage's failed-guard answers: 503 guard_unavailable, or 200 Guard-Skipped."""
        return [a for a in self.answers if self.phase(a) == "during" and (
            a.code == "503 guard_unavailable" if self.mode == "closed" else a.skipped)]

    def blocked_ran(self) -> list[str]:
        return sorted(t for t in self.runs if "BLOCKME" in t)

    def recovery_s(self) -> float | None:
        """From the outage's end to the first plain 200 (no guard skipped) sent after it."""
        firsts = [a.sent_s for a in self.answers if a.sent_s >= self.outage[1]
                  and a.code == "200" and not a.skipped]
        return min(firsts) - self.outage[1] if firsts else None

    def problems(self) -> list[str]:
        """Each claim that failed: an unexpected answer, a wrong or unguarded output, a slow
        or missing failed-guard answer, an input the guard did not allow run, no recovery."""
        down = {"503 guard_unavailable"} if self.mode == "closed" else set()
        out = [f"{a.code} for {a.text!r} ({self.phase(a)})" for a in self.answers if a.code
               not in {"200", "422 refused"} | (down if self.phase(a) != "before" else set())]
        out += [f"wrong output for {a.text!r}" for a in self.answers
                if a.code == "200" and a.output != expected(a.text)]
        out += [f"released {a.text!r} unguarded" for a in self.answers
                if "BLOCKME" in a.text and a.code == "200" and not a.skipped]
        out += [f"no Retry-After on {a.text!r}" for a in self.answers
                if a.code.startswith("503") and not a.retry_after]
        failed = self.failed()
        if not failed:
            out.append("no answer of the outage shows the guard failed")
        if failed and max(a.latency_s for a in failed) > WITHIN_S:
            out.append(f"a failed guard's answer took over {WITHIN_S} s")
        skipped = {a.text for a in self.answers if a.skipped}
        if self.mode == "closed":
            out += [f"Guard-Skipped in closed mode on {t!r}" for t in sorted(skipped)]
        out += [f"the model ran {t!r}, its guard not skipped" for t in self.blocked_ran()
                if t not in skipped]
        if self.recovery_s() is None:
            out.append("no plain 200 after the outage")
        return out


async def _kill_guard(server_url: str, run: KillRun, began: float) -> None:
    """SIGKILL every process of the guard's workers, again and again through the outage."""
    await anyio.sleep_until(began + run.outage[0])
    while anyio.current_time() < began + run.outage[1]:
        listed = (await anyio.to_thread.run_sync(admin_workers, server_url))["workers"]
        assert isinstance(listed, list)
        for w in listed:
            if w["version"] == GUARD and w["pid"]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc = psutil.Process(int(w["pid"]))
                    for p in [*proc.children(recursive=True), proc]:
                        p.send_signal(signal.SIGKILL)
                        run.kills += 1
        await anyio.sleep(KILL_EVERY_S)


async def offer(url: str, run: KillRun, rps: float, duration: float) -> None:
    """Open-loop load on `url` while the guard is killed; fills `run` but its run log."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S * 3, limits=limits) as client:

        async def one(n: int, at: float) -> None:
            text = f"BLOCKME-{n}" if n % 5 == 4 else f"t-{n}"
            sent = time.monotonic()
            try:
                r = await client.post("/v1/batchstring", json={"model": "topics", "input": text},
                                      headers=PAID)
            except httpx.HTTPError as exc:
                run.answers.append(Answer(text, at, time.monotonic() - sent,
                                          type(exc).__name__, None, None, False))
                return
            output = r.json().get("output") if r.status_code == 200 else None
            run.answers.append(Answer(text, at, time.monotonic() - sent, code_of(r),
                                      r.headers.get("Guard-Skipped"), output,
                                      "Retry-After" in r.headers))

        began = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_kill_guard, url, run, began)
            for n in range(int(rps * duration)):
                await anyio.sleep_until(began + n / rps)
                tg.start_soon(one, n, n / rps)


def measure(mode: str, gateways: int = 1, rps: float = 100.0, duration: float = 12.0,
            outage_at: float = 3.0, outage_s: float = 4.0) -> KillRun:
    """One scenario on a fresh server: its answers, its kills and what its model ran."""
    run = KillRun(mode, (outage_at, outage_at + outage_s))
    with tempfile.TemporaryDirectory(prefix="guard-kill-") as folder:
        models, log = Path(folder) / "models.toml", Path(folder) / "runs.log"
        models.write_text(CATALOGUE.format(mode=mode))
        keys = Path(__file__).parents[1] / "examples" / "keys.toml"
        args = ["--gateways", str(gateways), "--models", str(models), "--keys", str(keys)]
        with running_server(4, "sim", args, env={LOG_VARIABLE: str(log)}) as server:
            anyio.run(offer, server.url, run, rps, duration)
        if log.exists():
            run.runs = Counter(line.partition("\t")[2] for line in log.read_text().splitlines())
    return run


def report(run: KillRun) -> str:
    lines = [f"mode {run.mode}: outage {run.outage[0]:.1f}-{run.outage[1]:.1f} s, "
             f"{run.kills} SIGKILLs"]
    for phase in ("before", "during", "after"):
        counts = Counter(a.code + (" Guard-Skipped" if a.skipped else "")
                         for a in run.answers if run.phase(a) == phase)
        lines.append(f"{phase:>6}: " + (" | ".join(f"{k}: {v}" for k, v in
                                                   sorted(counts.items())) or "-"))
    failed = sorted(a.latency_s for a in run.failed()) or [float("nan")]
    what = "503 guard_unavailable" if run.mode == "closed" else "200 Guard-Skipped"
    lines.append(f"outage's {what}: {len(run.failed())}, latency P50 "
                 f"{failed[len(failed) // 2]:.3f} s P95 {failed[int(0.95 * len(failed))]:.3f} s "
                 f"max {failed[-1]:.3f} s (deadline {DEADLINE_S:.0f} s)")
    released = sum(1 for a in run.answers if "BLOCKME" in a.text and a.code == "200")
    phases = {a.text: run.phase(a) for a in run.answers}
    ran = Counter(phases.get(t, "?") for t in run.blocked_ran())
    lines.append(f"BLOCKME inputs answered 200: {released}, run by the model: "
                 f"{len(run.blocked_ran())} (sent before/during/after the outage: "
                 f"{ran['before']}/{ran['during']}/{ran['after']})")
    recovery = run.recovery_s()
    lines.append("first plain 200 sent after the outage: "
                 + ("never" if recovery is None else f"{recovery:.2f} s after its end"))
    problems = run.problems()
    lines += [f"  {p}" for p in problems[:10]]
    lines.append("CLAIMS HOLD" if not problems else f"CLAIMS FAIL ({len(problems)})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.hostile_guard_kill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["closed", "open"], required=True)
    p.add_argument("--gateways", type=int, choices=[1, 2], default=1)
    p.add_argument("--rps", type=float, default=100.0)
    p.add_argument("--duration", type=float, default=12.0, help="seconds of load")
    p.add_argument("--outage-at", type=float, default=3.0, help="seconds into the load")
    p.add_argument("--outage-s", type=float, default=4.0)
    a = p.parse_args(argv)
    run = measure(a.mode, a.gateways, a.rps, a.duration, a.outage_at, a.outage_s)
    print(report(run))
    return 0 if not run.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
