"""Hostile: the core process of a cell stops (SIGSTOP) with a batch on a worker, then goes on.

    python -m loadtest.hostile_stall [--root DIR] [--stall-s 15] [--short-stall-s 1.3]

Runs `batchgate serve --gateways 2` (two `sim` workers, 200 ms batches) from this checkout
or `--root`, teaches it its batch times, and then:

1. stops the core for `--short-stall-s`, less than a request's timeout plus the gateway's
   backstop margin, with a request of `X-Request-Timeout-Ms: 1000` sent just after the stop:
   its answer and when it came (its time ran out while the core stood still);
2. stops the core for `--stall-s` while one of its workers runs a batch, and sends a request
   of `X-Request-Timeout-Ms: 1000` and a `/readyz` probe every 100 ms: when the first 503 or
   504 came to each; then continues it and says whether the watchdog killed a worker whose
   batch only looked long (worker pids before and after, the hang and hedge counters).

Every wait is bounded; a run takes about 12 s plus the stalls.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import httpx

from loadtest.server import RunningServer, fetch_metrics, metric, running_server

PAID = {"Authorization": "Bearer paid-demo-key"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}
TIMEOUT_MS = 1000
BATCH_MS = 200
LEARN_BATCHES = 20  # past the pool's 16 before its hang limits are learned
PROBE_EVERY_S = 0.1


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    code: str
    after_s: float  # from the stop


def patient_keys(root: Path, folder: Path) -> Path:
    """The example keys with a paid budget admission never refuses under (a test of faults)."""
    keys = folder / "keys.toml"
    text = (root / "examples" / "keys.toml").read_text()
    keys.write_text(text.replace("budget_ms = 400", "budget_ms = 60000"))
    return keys


def code_of(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "-"


async def post(client: httpx.AsyncClient, text: str, t0: float, timeout_ms: int) -> Answer:
    r = await client.post("/v1/batchstring", json={"input": text},
                          headers={**PAID, "X-Request-Timeout-Ms": str(timeout_ms)})
    return Answer(r.status_code, code_of(r), time.monotonic() - t0)


async def workers(client: httpx.AsyncClient) -> list[dict[str, object]]:
    r = await client.get("/admin/workers", headers=ADMIN)
    r.raise_for_status()
    return list(r.json()["workers"])


async def wait_busy(client: httpx.AsyncClient) -> None:
    """Until a worker holds a batch (polled: another process's state)."""
    with anyio.fail_after(10):
        while True:
            if any(w["state"] == "busy" for w in await workers(client)):
                return
            await anyio.sleep(0.005)


async def wait_ready(client: httpx.AsyncClient, bound_s: float = 30.0) -> None:
    with anyio.fail_after(bound_s):
        while True:
            if (await client.get("/readyz")).status_code == 200:
                return
            await anyio.sleep(0.05)


def counters(url: str) -> tuple[float, float]:
    samples = fetch_metrics(url)
    return (metric(samples, "batchgate_worker_hangs_total"),
            metric(samples, "batchgate_batch_hedges_total"))


async def short_stall(srv: RunningServer, client: httpx.AsyncClient, stall_s: float) -> Answer:
    os.kill(srv.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            out: list[Answer] = []

            async def one() -> None:
                out.append(await post(client, "short", t0, TIMEOUT_MS))

            tg.start_soon(one)
            await anyio.sleep(stall_s)  # the scenario's stall, on the real clock
            os.kill(srv.pid, signal.SIGCONT)
    finally:
        os.kill(srv.pid, signal.SIGCONT)
    return out[0]


async def probe_ready(client: httpx.AsyncClient, t0: float, until: float,
                      first: list[float]) -> None:
    """A /readyz probe every `PROBE_EVERY_S` until `until` or the first 503 answered."""

    async def one() -> None:
        try:
            r = await client.get("/readyz")
        except httpx.HTTPError:
            return
        if r.status_code == 503 and not first:
            first.append(time.monotonic() - t0)

    async with anyio.create_task_group() as tg:
        while not first and time.monotonic() < until:
            tg.start_soon(one)
            await anyio.sleep(PROBE_EVERY_S)


async def long_stall(srv: RunningServer, client: httpx.AsyncClient, stall_s: float
                     ) -> dict[str, object]:
    pids = sorted(int(str(w["pid"])) for w in await workers(client))
    hangs, hedges = counters(srv.url)
    answers: dict[str, Answer] = {}
    ready_503: list[float] = []
    resumed = 0.0
    async with anyio.create_task_group() as tg:
        async def keep(name: str, text: str, timeout_ms: int) -> None:
            answers[name] = await post(client, text, t0, timeout_ms)

        t0 = time.monotonic()
        tg.start_soon(keep, "in_flight", "running", 60_000)
        await wait_busy(client)
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            tg.start_soon(keep, "timed", "timed", TIMEOUT_MS)
            tg.start_soon(probe_ready, client, t0, t0 + stall_s, ready_503)
            await anyio.sleep(stall_s)  # the scenario's stall, on the real clock
        finally:
            os.kill(srv.pid, signal.SIGCONT)
            resumed = time.monotonic() - t0
    await wait_ready(client)
    ready_again = time.monotonic() - t0
    again = await post(client, "again", t0, 10_000)
    await anyio.sleep(1.0)  # a watchdog kill comes at the core's first turns, if at all
    pids_after = sorted(int(str(w["pid"])) for w in await workers(client))
    hangs_after, hedges_after = counters(srv.url)
    return {
        "timed": answers["timed"], "in_flight": answers["in_flight"], "again": again,
        "ready_503_s": ready_503[0] if ready_503 else None, "resumed_s": resumed,
        "ready_again_s": ready_again, "pids": pids, "pids_after": pids_after,
        "hangs": hangs_after - hangs, "hedges": hedges_after - hedges,
    }


async def scenario(srv: RunningServer, short_s: float, stall_s: float) -> dict[str, object]:
    limits = httpx.Limits(max_connections=400)
    async with httpx.AsyncClient(base_url=srv.url, timeout=stall_s + 30,
                                 limits=limits) as client:
        for n in range(LEARN_BATCHES):
            r = await client.post("/v1/batchstring", json={"input": f"learn-{n}"}, headers=PAID)
            r.raise_for_status()
        short = await short_stall(srv, client, short_s)
        await wait_ready(client)
        return {"short": short, **await long_stall(srv, client, stall_s)}


def show(key: str, a: object) -> str:
    if isinstance(a, Answer):
        return f"{a.status} {a.code} after {a.after_s:.2f} s"
    if key.endswith("_s") and isinstance(a, float):
        return f"{a:.2f} s"
    if isinstance(a, float):
        return f"{a:g}"
    return str(a)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.hostile_stall", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                   help="the checkout to run the server from")
    p.add_argument("--stall-s", type=float, default=15.0)
    p.add_argument("--short-stall-s", type=float, default=1.3)
    a = p.parse_args(argv)
    root = a.root.resolve()
    with tempfile.TemporaryDirectory() as folder:
        args = ["--gateways", "2", "--keys", str(patient_keys(root, Path(folder))),
                "--batch-latency-ms", str(BATCH_MS)]
        with running_server(workers=2, args=args, cwd=root) as srv:
            out = anyio.run(scenario, srv, a.short_stall_s, a.stall_s)
    print(f"root {root}; stalls {a.short_stall_s:g} s and {a.stall_s:g} s; "
          f"X-Request-Timeout-Ms {TIMEOUT_MS}")
    labels = {
        "short": f"request across the {a.short_stall_s:g} s stall",
        "timed": f"request sent into the {a.stall_s:g} s stall",
        "in_flight": "request whose batch ran during the stall",
        "ready_503_s": "first /readyz 503 (from the stop)",
        "resumed_s": "SIGCONT (from the stop)",
        "ready_again_s": "/readyz 200 again (from the stop)",
        "again": "a request after SIGCONT (from the stop)",
        "pids": "worker pids before",
        "pids_after": "worker pids after",
        "hangs": "workers killed as hung",
        "hedges": "batches hedged",
    }
    for key, label in labels.items():
        print(f"  {label:45s} {show(key, out[key])}")
    print(json.dumps({k: asdict(v) if isinstance(v, Answer) else v for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
