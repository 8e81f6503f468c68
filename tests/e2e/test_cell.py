"""A cell: two gateway processes in front of one core (`--gateways 2`), over real HTTP."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from api.cell import SCRATCH_PREFIX, sweep_scratch
from loadtest.server import fetch_metrics, metric, parse_metrics, running_server
from tests.e2e.helpers import EXAMPLE_KEYS

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PAID = {"Authorization": "Bearer paid-demo-key"}
FREE = {"Authorization": "Bearer free-demo-key"}
ADMIN = {"Authorization": "Bearer admin-demo-key"}


@pytest.fixture
def gateways() -> int:
    """This module starts its own cells: no single-process variant."""
    return 2


def roomy_keys(tmp_path: Path) -> list[str]:
    """Example keys with budgets no test load reaches (this is about order, not refusal)."""
    keys = tmp_path / "keys.toml"
    text = EXAMPLE_KEYS.read_text()
    keys.write_text(text.replace("budget_ms = 400", "budget_ms = 60000")
                    .replace("budget_ms = 250", "budget_ms = 60000"))
    return ["--keys", str(keys)]


@asynccontextmanager
async def pinned_clients(
    url: str, per_gateway: int
) -> AsyncIterator[dict[int, list[httpx.AsyncClient]]]:
    """One-connection clients grouped by the gateway that accepted each connection (told by
    its /healthz); at least `per_gateway` for each of the two gateways."""
    async with AsyncExitStack() as stack:
        by_gateway: dict[int, list[httpx.AsyncClient]] = {0: [], 1: []}
        with anyio.fail_after(30):
            while min(len(c) for c in by_gateway.values()) < per_gateway:
                client = await stack.enter_async_context(httpx.AsyncClient(
                    base_url=url, timeout=30, limits=httpx.Limits(max_connections=1)))
                slot = (await client.get("/healthz")).json()["gateway"]
                by_gateway[slot].append(client)
        yield by_gateway


async def until(url: str, condition: Callable[[dict[str, float]], bool]) -> None:
    """Returns once the server's /metrics meets `condition`; polls, bounded."""
    with anyio.fail_after(30):
        async with httpx.AsyncClient(base_url=url) as client:
            while True:
                if condition(parse_metrics((await client.get("/metrics")).text)):
                    return
                await anyio.sleep(0.01)  # another process: poll it


async def test_paid_requests_at_one_gateway_overtake_free_ones_queued_at_another(
    tmp_path: Path,
) -> None:
    args = ["--gateways", "2", "--max-batch", "1", "--batch-latency-ms", "200",
            *roomy_keys(tmp_path)]
    with running_server(workers=1, args=args) as srv:
        async with pinned_clients(srv.url, 5) as by_gateway:
            done: list[str] = []

            async def send(client: httpx.AsyncClient, text: str, headers: dict[str, str]) -> None:
                r = await client.post("/v1/batchstring", json={"input": text}, headers=headers)
                assert r.status_code == 200 and r.json()["output"] == text[::-1], r.text
                done.append(text)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send, by_gateway[0][0], "first", FREE)  # occupies the worker
                await until(srv.url, lambda m: metric(m, "batchgate_workers", state="busy") == 1)
                for i, client in enumerate(by_gateway[0][1:5]):  # free ones queue first...
                    tg.start_soon(send, client, f"free-{i}", FREE)
                await until(srv.url,
                            lambda m: metric(m, "batchgate_queue_depth", tier="free") == 4)
                for i, client in enumerate(by_gateway[1][:4]):  # ...then paid ones arrive
                    tg.start_soon(send, client, f"paid-{i}", PAID)
    assert done[0] == "first"
    assert {t[:4] for t in done[1:5]} == {"paid"} and {t[:4] for t in done[5:]} == {"free"}


async def test_a_gateway_killed_under_load_is_restarted_and_nothing_runs_twice() -> None:
    with running_server(workers=2, args=["--gateways", "2", "--keys", str(EXAMPLE_KEYS)]) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as admin:
            before = (await admin.get("/admin/workers", headers=ADMIN)).json()["gateways"]
        victim = before[1]["pid"]
        answers: list[tuple[str, httpx.Response | None]] = []

        async def one(i: int) -> None:
            text = f"load-{i:04d}"
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
                try:
                    r = await client.post("/v1/batchstring", json={"input": text}, headers=PAID)
                except httpx.TransportError:  # its gateway died under it
                    r = None
                answers.append((text, r))

        async with anyio.create_task_group() as tg:
            for i in range(400):
                tg.start_soon(one, i)
                if i == 150:
                    os.kill(victim, signal.SIGKILL)
                await anyio.sleep(0.005)
        ok = [(t, r) for t, r in answers if r is not None and r.status_code == 200]
        assert all(r.json()["output"] == t[::-1] for t, r in ok)
        assert len(ok) >= 300  # the other gateway (and the restarted one) kept serving
        assert metric(fetch_metrics(srv.url), "batchgate_batch_size_sum") <= 400  # none twice
        async with httpx.AsyncClient(base_url=srv.url) as admin:
            with anyio.fail_after(30):
                while True:
                    after = (await admin.get("/admin/workers", headers=ADMIN)).json()["gateways"]
                    if after[1]["state"] == "running" and after[1]["pid"] != victim:
                        break
                    await anyio.sleep(0.05)  # another process: poll it
        assert after[1]["restarts"] == 1


async def test_metrics_of_every_process_are_in_one_scrape() -> None:
    with running_server(workers=1, args=["--gateways", "2", "--keys", str(EXAMPLE_KEYS)]) as srv:
        async with pinned_clients(srv.url, 1) as by_gateway:
            for slot in (0, 1):
                r = await by_gateway[slot][0].post("/v1/batchstring", json={"input": "x"},
                                                   headers=PAID)
                assert r.status_code == 200
        m = fetch_metrics(srv.url)
        assert metric(m, "batchgate_requests_total", tier="paid", code="200") == 2
        assert metric(m, "batchgate_batch_size_sum") == 2  # the core's own histograms
        assert metric(m, "batchgate_workers", state="ready") == 1  # and its gauges


def test_every_process_of_the_cell_exits_when_its_supervisor_dies() -> None:
    import psutil

    with running_server(workers=2, args=["--gateways", "2", "--keys", str(EXAMPLE_KEYS)]) as srv:
        children = psutil.Process(srv.process.pid).children(recursive=True)
        assert len(children) >= 5  # the core, two gateways, two workers
        os.kill(srv.process.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
    # Killed outright, the supervisor never removed its scratch folder: the next cell does.
    tmp = Path(tempfile.gettempdir())
    left = list(tmp.glob(f"{SCRATCH_PREFIX}{srv.process.pid}-*"))
    assert len(left) == 1 and (left[0] / "metrics").is_dir()
    assert left[0] in sweep_scratch(tmp)
    assert not left[0].exists()
