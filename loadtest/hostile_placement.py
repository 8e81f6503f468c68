"""Hostile to placement (issue 40, item 3): a hot model's free backlog keeps every worker
busy while paid requests wait for a cold model.

    python -m loadtest.hostile_placement [--root DIR] [--free-rps 300] [--seconds 10]

Runs `batchgate serve --workers 2 --max-batch 10` (2 x 100 items/s) from this checkout or
`--root` with two `sim` models: `hot` and `cold` (min_workers 0, idle_unload_s 2). Once
`cold` has given its worker to `hot` (both workers hold hot), sends `--free-rps` free
requests/s to `hot` (more than the pool drains: both stay busy) and one paid request/s to
`cold` for `--seconds`, each with a 5 s deadline. Prints cold's answers by status and code,
their latencies, and what the workers hold at the end. Bounded: the load stops after
`--seconds`, each request after its deadline.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import anyio
import httpx

from loadtest.server import code_of, running_server

PAID = {"Authorization": "Bearer paid-demo-key", "X-Request-Timeout-Ms": "5000"}
FREE = {"Authorization": "Bearer free-demo-key", "X-Request-Timeout-Ms": "5000"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}
CATALOGUE = """
[models.hot]
[models.hot.versions.v1]
spec = "sim"
load_s = 0.5
[models.cold]
min_workers = 0
idle_unload_s = 2
[models.cold.versions.v1]
spec = "sim"
load_s = 0.5
"""


def holding(client: httpx.Client) -> Counter[str]:
    workers = client.get("/admin/workers", headers=ADMIN).json()["workers"]
    return Counter(w["version"] for w in workers if w["state"] in ("ready", "busy"))


async def offer(url: str, free_rps: float, seconds: float) -> tuple[Counter[str], list[float]]:
    cold: Counter[str] = Counter()
    took: list[float] = []
    limits = httpx.Limits(max_connections=400)
    async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:

        async def one(body: dict[str, str], headers: dict[str, str], keep: bool) -> None:
            t0 = time.monotonic()
            try:
                r = await client.post("/v1/batchstring", json=body, headers=headers)
            except httpx.HTTPError:
                if keep:
                    cold["lost"] += 1
                return
            if keep:
                cold[code_of(r)] += 1
                took.append(time.monotonic() - t0)

        async def paced(rps: float, model: str, headers: dict[str, str], keep: bool) -> None:
            async with anyio.create_task_group() as tg:
                began, n = time.monotonic(), 0
                while (elapsed := time.monotonic() - began) < seconds:
                    tg.start_soon(one, {"input": f"{model}{n}", "model": model}, headers, keep)
                    n += 1
                    await anyio.sleep(max(0.0, n / rps - elapsed))

        async with anyio.create_task_group() as tg:
            tg.start_soon(paced, free_rps, "hot", FREE, False)
            tg.start_soon(paced, 1.0, "cold", PAID, True)
    return cold, took


def run(root: Path, free_rps: float, seconds: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "models.toml"
        path.write_text(CATALOGUE)
        args = ["--keys", str(root / "examples" / "keys.toml"), "--models", str(path),
                "--max-batch", "10"]
        with running_server(workers=2, args=args, cwd=root) as srv, \
                httpx.Client(base_url=srv.url, timeout=10) as client:
            waited = time.monotonic()
            while holding(client) != Counter({"hot@v1": 2}):  # cold's idle unload
                if time.monotonic() - waited > 60:
                    raise SystemExit(f"cold never unloaded: {holding(client)}")
                time.sleep(0.2)  # another process: poll it
            cold, took = anyio.run(offer, srv.url, free_rps, seconds)
            took.sort()
            return {
                "root": str(root), "free_rps": free_rps, "seconds": seconds,
                "cold_paid": dict(cold),
                "cold_p50_s": round(took[len(took) // 2], 2) if took else None,
                "cold_max_s": round(took[-1], 2) if took else None,
                "holding_at_end": dict(holding(client)),
            }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parents[1])
    parser.add_argument("--free-rps", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    a = parser.parse_args(argv)
    print(json.dumps(run(a.root.resolve(), a.free_rps, a.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
