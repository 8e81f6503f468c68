"""A worker over `--worker-max-rss-mb` is replaced between batches (issue 28, item 13): a real
server runs `tests.models:leak` (20 MB kept per batch). Every request is answered 200, the
worker's pid changes while its id stays, its resident set stays bounded, and the
replacement is no crash: none counted, no batch re-routed, each one said in the log."""

from __future__ import annotations

import httpx
import pytest

from gpu_pool.memory import MIB, resident_bytes
from loadtest.server import fetch_metrics, metric, running_server
from tests.e2e.helpers import PAID
from tests.gpu_pool.test_pool_memory import LEAK, ROOM_MB, fresh_worker_mb

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
ADMIN = {"Authorization": "Bearer admin-demo-key"}
PATIENT = {**PAID, "X-Request-Timeout-Ms": "60000"}  # one request waits for the new one


async def test_a_leaking_worker_is_replaced_between_batches_and_every_request_answered(
        gateways: int) -> None:
    if gateways > 1:
        pytest.skip("the pool lives in the core process: a cell's front door adds nothing")
    bound_mb = await fresh_worker_mb() + ROOM_MB  # over it every ~5 batches
    args = ["--keys", "examples/keys.toml", "--worker-max-rss-mb", str(bound_mb)]
    with running_server(workers=1, model=LEAK, args=args) as srv:
        pids: list[int] = []
        ids: set[int] = set()
        peak = 0
        async with httpx.AsyncClient(base_url=srv.url, timeout=90) as client:
            for n in range(15):  # 300 MB leaked in all: three times the room
                answer = await client.post("/v1/batchstring", json={"input": f"leak-{n}"},
                                           headers=PATIENT)
                assert answer.status_code == 200, answer.text
                assert answer.json()["output"] == f"leak-{n}"[::-1]
                (worker,) = (await client.get("/admin/workers", headers=ADMIN)).json()[
                    "workers"]
                ids.add(worker["id"])
                if worker["pid"] not in pids:
                    pids.append(worker["pid"])
                peak = max(peak, resident_bytes(worker["pid"]) or 0)
        assert len(pids) >= 3, pids  # replaced at least twice, a new process each time
        assert len(ids) == 1 and worker["restarts"] == 0  # the same worker to the core
        assert peak <= (bound_mb + 25) * MIB, peak // MIB  # one batch past the bound at most
        m = fetch_metrics(srv.url)
        replaced = metric(m, "batchgate_worker_replacements_total")
        assert len(pids) - 1 <= replaced <= len(pids)  # the last may still be loading
        assert metric(m, "batchgate_worker_crashes_total") == 0
        assert metric(m, "batchgate_batch_reroutes_total") == 0
        assert srv.log_tail(2000).count(f"over --worker-max-rss-mb {bound_mb}") == replaced
