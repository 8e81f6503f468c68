"""Hostile inputs against the pool (issue 28, items 2-4): paid traffic beside one sender of
inputs that hang, raise or kill.

    python -m loadtest.hostile_pool [--root DIR] [--scenario hang|poison|killer|all]
                                    [--seconds 30] [--paid-rps 10]

Each scenario runs `batchgate serve` from this checkout or `--root` with a test model of
`tests/models.py` (every batch padded to 100 ms, the contract's latency) and the example
keys (paid budget 400 ms), warms it with 20 batches (the workers' batch times learned, as on
a server that has been serving), sends paid requests open-loop
at `--paid-rps` for `--seconds`, and beside them one anonymous (free) sender:

- hang: `tests.models:hang` on 2 workers, `{"input": "hang-1"}` every 5 s (free deadline);
- poison: `tests.models:poison` on 1 worker, `POISON-<n>` at 2, 5 and 10 per second;
- killer: `tests.models:killer` on 2 workers, a fresh `kill-<n>` every 3 s.

It prints, per run, the paid requests answered 200, their P50/P95, the non-200s by status
and code, what the hostile requests got, and the pool's crashes and hangs. Every loop is
bounded; a scenario takes about `--seconds` plus start-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import httpx

from loadtest.server import code_of, fetch_metrics, metric, running_server

PAID = {"Authorization": "Bearer paid-demo-key"}
WARM_BATCHES = 20  # past the 16 answered batches the hang detector learns from
BATCH_MS = 100  # every batch padded to the contract's GPU latency
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    scenario: str
    hostile_rate: float
    paid_sent: int = 0
    paid_ok: int = 0
    paid_p50_ms: float = 0.0
    paid_p95_ms: float = 0.0
    paid_within_budget: int = 0
    paid_errors: dict[str, int] = field(default_factory=dict)
    hostile: dict[str, int] = field(default_factory=dict)
    crashes: float = 0.0
    hangs: float = 0.0


async def drive(url: str, seconds: float, paid_rps: float, hostile_every: float,
                hostile_text: str) -> tuple[list[tuple[float, str]], Counter[str]]:
    paid: list[tuple[float, str]] = []
    hostile: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        for n in range(WARM_BATCHES):  # warm workers: the pool has learned its batch times
            await client.post("/v1/batchstring", json={"input": f"warm-{n}"}, headers=PAID)

        async def one_paid(n: int) -> None:
            start = time.monotonic()
            try:
                r = await client.post("/v1/batchstring", json={"input": f"paid-{n}"},
                                      headers=PAID)
                code = code_of(r)
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            paid.append((time.monotonic() - start, code))

        async def one_hostile(n: int) -> None:
            try:
                r = await client.post("/v1/batchstring",
                                      json={"input": hostile_text.format(n=n)})
                hostile[code_of(r)] += 1
            except httpx.HTTPError as exc:
                hostile[type(exc).__name__] += 1

        async with anyio.create_task_group() as tg:
            start = time.monotonic()
            n_paid = n_hostile = 0
            while (now := time.monotonic() - start) < seconds:
                if n_hostile * hostile_every <= now:
                    tg.start_soon(one_hostile, n_hostile)
                    n_hostile += 1
                if n_paid / paid_rps <= now:
                    tg.start_soon(one_paid, n_paid)
                    n_paid += 1
                await anyio.sleep(min(1 / paid_rps, 0.01))
    return paid, hostile


def run_one(root: Path, scenario: str, model: str, workers: int, hostile_every: float,
            text: str, seconds: float, paid_rps: float) -> Run:
    keys = root / "examples" / "keys.toml"
    args = ["--keys", str(keys), "--batch-latency-ms", str(BATCH_MS)]
    with running_server(workers, model, args, cwd=root,
                        env={"PYTHONPATH": str(root)}) as srv:
        paid, hostile = anyio.run(drive, srv.url, seconds, paid_rps, hostile_every, text)
        samples = fetch_metrics(srv.url)
    ok = sorted(t for t, code in paid if code == "200")
    q = statistics.quantiles(ok, n=20) if len(ok) >= 2 else [0.0] * 19
    return Run(
        scenario=scenario, hostile_rate=round(1 / hostile_every, 2), paid_sent=len(paid),
        paid_ok=len(ok), paid_p50_ms=round(statistics.median(ok) * 1e3, 1) if ok else 0.0,
        paid_p95_ms=round(q[18] * 1e3, 1), paid_within_budget=sum(t <= 0.4 for t in ok),
        paid_errors=dict(Counter(code for _, code in paid if code != "200")),
        hostile=dict(hostile),
        crashes=metric(samples, "batchgate_worker_crashes_total"),
        hangs=metric(samples, "batchgate_worker_hangs_total"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--scenario", choices=("hang", "poison", "killer", "all"),
                        default="all")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--paid-rps", type=float, default=10.0)
    args = parser.parse_args(argv)
    plans = {
        "hang": [("tests.models:hang", 2, 5.0, "hang-1")],
        "poison": [("tests.models:poison", 1, 1 / rate, "POISON-{n}") for rate in (2, 5, 10)],
        "killer": [("tests.models:killer", 2, 3.0, "kill-{n}")],
    }
    chosen = list(plans) if args.scenario == "all" else [args.scenario]
    for scenario in chosen:
        for model, workers, every, text in plans[scenario]:
            run = run_one(args.root.resolve(), scenario, model, workers, every, text,
                          args.seconds, args.paid_rps)
            print(json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
