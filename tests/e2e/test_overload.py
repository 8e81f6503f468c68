"""Deadlines, departed clients and admission at the real server's door."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import httpx
import pytest

from batchgate_client import AsyncClient, RetryPolicy
from loadtest.server import fetch_metrics, metric, running_server
from tests.e2e.helpers import metric_reaches, patient_keys, post_many, workers_in_state

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PAID = {"Authorization": "Bearer paid-demo-key"}


def leave_early(port: int) -> None:
    """Send a request and hang up before the answer."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        body = b'{"input": "gone"}'
        s.sendall(b"POST /v1/batchstring HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  b"paid-demo-key\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                  + body)


async def test_expired_and_abandoned_requests_never_reach_a_worker(tmp_path: Path) -> None:
    args = [*patient_keys(tmp_path), "--batch-latency-ms", "1000", "--max-wait-ms", "0"]
    with running_server(workers=1, args=args) as srv:
        async with anyio.create_task_group() as tg:
            first: list[httpx.Response] = []

            async def occupy() -> None:
                first.extend(await post_many(srv.url, [{"input": "first"}], PAID))

            tg.start_soon(occupy)
            await workers_in_state(srv.url, "busy", 1)  # "first" holds the only worker
            late = {**PAID, "X-Request-Timeout-Ms": "300"}
            (expired,) = await post_many(srv.url, [{"input": "late"}], late)
            await anyio.to_thread.run_sync(leave_early, srv.port)
        assert expired.status_code == 504
        assert expired.json()["error"]["code"] == "deadline_exceeded"
        assert first[0].json()["output"] == "tsrif"
        # The hung-up request is over too (a gateway once waited for it forever): counted.
        await metric_reaches(srv.url, 1, "batchgate_requests_total", tier="paid", code="499")
        async with AsyncClient(srv.url, "paid-demo-key") as client:
            assert await client.batchstring(["after"]) == ["retfa"]
        m = fetch_metrics(srv.url)
        assert metric(m, "batchgate_batch_size_sum") == 2  # only "first" and "after" ran


async def test_free_traffic_is_refused_fast_when_the_queue_is_deep() -> None:
    args = ["--keys", "examples/keys.toml", "--batch-latency-ms", "300"]
    with running_server(workers=1, args=args) as srv:
        free = {"Authorization": "Bearer free-demo-key"}
        responses = await post_many(srv.url, [{"input": f"f{i}"} for i in range(50)], free)
        refused = [r for r in responses if r.status_code == 503]
        assert refused and all(r.json()["error"]["code"] == "over_budget" for r in refused)
        assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
        async with AsyncClient(srv.url, "paid-demo-key", retry=RetryPolicy(1)) as client:
            assert await client.batchstring(["p"]) == ["p"]  # admitted at the first try
