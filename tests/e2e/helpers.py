"""What the end-to-end tests share: concurrent clients, polling the server's workers,
metrics and access log, and a keys file whose paid budget never refuses (for tests about
faults, not about admission)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx

from loadtest.server import RunningServer, fetch_metrics, metric

PAID = {"Authorization": "Bearer paid-demo-key"}
EXAMPLE_KEYS = Path(__file__).parents[2] / "examples" / "keys.toml"


async def post_many(url: str, bodies: list[dict[str, object]], headers: dict[str, str]
                    ) -> list[httpx.Response]:
    """POST every body at once, one connection each; the responses in the bodies' order."""
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        out: list[httpx.Response | None] = [None] * len(bodies)

        async def one(i: int) -> None:
            out[i] = await client.post("/v1/batchstring", json=bodies[i], headers=headers)

        async with anyio.create_task_group() as tg:
            for i in range(len(bodies)):
                tg.start_soon(one, i)
    return [r for r in out if r is not None]


async def workers_in_state(url: str, state: str, n: int) -> list[int]:
    """Wait until `n` workers report `state`; their pids. Polls the other process."""
    async with httpx.AsyncClient(base_url=url) as client:
        with anyio.fail_after(30):
            while True:
                r = await client.get("/admin/workers",
                                     headers={"Authorization": "Bearer admin-demo-key"})
                pids = [w["pid"] for w in r.json()["workers"] if w["state"] == state]
                if len(pids) >= n:
                    return pids
                await anyio.sleep(0.01)  # another process: poll it


async def metric_reaches(url: str, value: float, name: str, **labels: str) -> None:
    """Wait until the server's sample `name` (with `labels`) reaches `value`. Polls the other
    process: what a request leaves behind it is counted after its answer is written."""
    with anyio.fail_after(30):
        while metric(fetch_metrics(url), name, **labels) < value:  # noqa: ASYNC110
            await anyio.sleep(0.01)  # another process: poll it


def logged(srv: RunningServer, rid: str) -> dict[str, object]:
    """The access-log line of answer `rid`; it is written just after the answer is sent, so
    the log is polled for it, bounded."""
    for _ in range(500):
        for line in srv.log_path.read_text().splitlines():
            if line.startswith('{"time"') and f'"id":"{rid}"' in line:
                return dict(json.loads(line))
        time.sleep(0.01)
    raise AssertionError(f"no access-log line for {rid}")


def patient_keys(tmp_path: Path) -> list[str]:
    """`--keys` with the example keys, the paid budget raised so admission never refuses."""
    keys = tmp_path / "keys.toml"
    keys.write_text(EXAMPLE_KEYS.read_text().replace("budget_ms = 400", "budget_ms = 60000"))
    return ["--keys", str(keys)]
