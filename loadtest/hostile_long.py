"""Hostile: long free requests beside steady paid traffic, on a model slow on long inputs.

    python -m loadtest.hostile_long [--root DIR] [--duration-s 30] [--paid-rps 10]

Runs `batchgate serve --model tests.models:slowlong --workers 2` (8 s per MB of input,
0.1 s at least) with the example keys from this checkout or `--root`, and offers, open-loop:
paid requests of one short input at `--paid-rps` (key `paid-demo-key`, budget 400 ms), and
every `--free-every-s` an anonymous (free) request of 100 inputs of 10,000 characters, the
first one second in. Prints, for paid: answered 200 (and wrong outputs), P50/P95/P99/max of
the 200s, how many within the budget, the rest by status and code; for each free request:
its status, code and time. Every wait is bounded; a run takes the duration plus ~20 s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import httpx

from loadtest.server import running_server

PAID = {"Authorization": "Bearer paid-demo-key"}
PAID_BUDGET_S = 0.4
LONG = "x" * 10_000
CLIENT_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Answer:
    sent_s: float  # from the start
    status: int  # 0: no answer (the client's timeout or a connection error)
    code: str
    seconds: float
    right: bool = True


def code_of(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "-"


async def post(client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str],
               t0: float, out: list[Answer], expect: object) -> None:
    sent = time.monotonic()
    try:
        r = await client.post("/v1/batchstring", json=body, headers=headers)
    except httpx.HTTPError as exc:
        out.append(Answer(sent - t0, 0, type(exc).__name__, time.monotonic() - sent, False))
        return
    seconds = time.monotonic() - sent
    right = r.status_code != 200 or r.json().get("output", r.json().get("outputs")) == expect
    out.append(Answer(sent - t0, r.status_code, code_of(r), seconds, right))


async def offer(url: str, duration_s: float, paid_rps: float, free_every_s: float
                ) -> tuple[list[Answer], list[Answer]]:
    paid: list[Answer] = []
    free: list[Answer] = []
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        schedule = sorted(
            [(k / paid_rps, "paid", k) for k in range(int(duration_s * paid_rps))]
            + [(1.0 + k * free_every_s, "free", k)
               for k in range(math.ceil((duration_s - 1.0) / free_every_s))])
        with anyio.fail_after(duration_s + CLIENT_TIMEOUT_S + 10):
            async with anyio.create_task_group() as tg:
                t0 = time.monotonic()
                for at, kind, k in schedule:
                    await anyio.sleep(max(0.0, t0 + at - time.monotonic()))  # open loop
                    body: dict[str, object]
                    headers: dict[str, str]
                    expect: object
                    if kind == "paid":
                        text = f"paid-{k}"
                        body, headers, out, expect = {"input": text}, PAID, paid, text[::-1]
                    else:  # anonymous: the free tier
                        body, headers, out, expect = {"inputs": [LONG] * 100}, {}, free, [
                            LONG] * 100
                    tg.start_soon(post, client, body, headers, t0, out, expect)
    return sorted(paid, key=lambda a: a.sent_s), sorted(free, key=lambda a: a.sent_s)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(paid: list[Answer], free: list[Answer]) -> dict[str, object]:
    ok = [a.seconds for a in paid if a.status == 200]
    return {
        "paid_sent": len(paid),
        "paid_200": len(ok),
        "paid_wrong": sum(1 for a in paid if not a.right),
        "paid_p50_ms": percentile(ok, 0.5) * 1000,
        "paid_p95_ms": percentile(ok, 0.95) * 1000,
        "paid_p99_ms": percentile(ok, 0.99) * 1000,
        "paid_max_ms": max(ok, default=math.nan) * 1000,
        "paid_within_budget": sum(1 for s in ok if s <= PAID_BUDGET_S),
        "paid_not_200": dict(Counter(f"{a.status} {a.code}" for a in paid if a.status != 200)),
        "free": [f"{a.status} {a.code} {a.seconds * 1000:.0f} ms" for a in free],
        "free_wrong": sum(1 for a in free if not a.right),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.hostile_long", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).parents[1],
                   help="the checkout to run the server from")
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--paid-rps", type=float, default=10.0)
    p.add_argument("--free-every-s", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", type=Path, metavar="OUT", help="also write every answer as JSON")
    a = p.parse_args(argv)
    if not (0 < a.duration_s <= 90 and 0 < a.paid_rps <= 200 and a.free_every_s > 0):
        p.error("duration-s within (0, 90], paid-rps within (0, 200], free-every-s > 0")
    root = a.root.resolve()
    args = ["--keys", str(root / "examples" / "keys.toml")]
    with running_server(workers=a.workers, model="tests.models:slowlong", args=args,
                        cwd=root) as srv:
        paid, free = anyio.run(offer, srv.url, a.duration_s, a.paid_rps, a.free_every_s)
    out = summary(paid, free)
    print(f"root {root}; slowlong on {a.workers} workers; {a.duration_s:g} s: paid "
          f"{a.paid_rps:g}/s (budget {PAID_BUDGET_S * 1000:.0f} ms), free 100 x 10,000 "
          f"characters every {a.free_every_s:g} s")
    for key, value in out.items():
        shown = f"{value:.0f}" if isinstance(value, float) else value
        print(f"  {key:20s} {shown}")
    if a.json:
        a.json.write_text(json.dumps({"summary": out, "paid": [asdict(x) for x in paid],
                                      "free": [asdict(x) for x in free]}))
    return 0 if out["paid_wrong"] == 0 and out["free_wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
