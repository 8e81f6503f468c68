"""A cell whose core process stands still (SIGSTOP) while one of its workers runs a batch,
for longer than a request's timeout but less than the timeout plus the gateway's backstop
margin, then goes on (SIGCONT):

- a request's deadline runs from when its gateway sent it, not from when the core read it:
  one sent into the stall with `X-Request-Timeout-Ms: 1000` gets the 504
  `deadline_exceeded` a single process gives, on the direct way and through ASGI alike,
  and its connection then serves the next request with that request's own answer;
- `/readyz` turns 503 while the core is silent, without waiting for it;
- the batch that ran during the stall is answered, and its worker is not killed as hung:
  the stall was the core's, not the worker's."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import core_pid, fetch_metrics, metric, running_server, stop_server
from tests.e2e.helpers import PAID, patient_keys, workers_in_state

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
TIMEOUT_MS = 1000
STALL_S = 1.5  # past the timeout and the hang limit; short of the timeout plus the margin
ARGS = ["--gateways", "2", "--batch-latency-ms", "200", "--hang-timeout-ms", "1000"]
ADMIN = {"Authorization": "Bearer admin-demo-key"}


@pytest.fixture
def gateways() -> int:
    """This module starts its own cell: no single-process variant."""
    return 2


async def workers_up(client: httpx.AsyncClient) -> list[tuple[int, int]]:
    """(id, pid) of each worker that is up: a killed one is gone, or back under a new id."""
    r = await client.get("/admin/workers", headers=ADMIN)
    return sorted((w["id"], w["pid"]) for w in r.json()["workers"]
                  if w["state"] in ("ready", "busy"))


async def wait_busy(client: httpx.AsyncClient) -> None:
    """Until a worker holds a batch (another process: polled, bounded)."""
    with anyio.fail_after(10):
        while True:
            r = await client.get("/admin/workers", headers=ADMIN)
            if any(w["state"] == "busy" for w in r.json()["workers"]):
                return
            await anyio.sleep(0.005)


async def post(client: httpx.AsyncClient, text: str, into: dict[str, httpx.Response],
               headers: dict[str, str]) -> None:
    into[text] = await client.post("/v1/batchstring", json={"input": text},
                                   headers={**PAID, **headers})


async def probe_ready(client: httpx.AsyncClient, into: dict[str, tuple[int, float]]) -> None:
    r = await client.get("/readyz")
    into["readyz"] = (r.status_code, time.monotonic())  # when it was answered


async def test_a_stalled_core_times_requests_from_their_arrival_and_kills_no_worker(
    tmp_path: Path,
) -> None:
    timed = {"X-Request-Timeout-Ms": str(TIMEOUT_MS)}
    with running_server(workers=2, args=[*ARGS, *patient_keys(tmp_path)]) as srv:
        limits = httpx.Limits(max_connections=8)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30, limits=limits) as client, \
                httpx.AsyncClient(base_url=srv.url, timeout=30,
                                  limits=httpx.Limits(max_connections=1)) as one_connection:
            await workers_in_state(srv.url, "ready", 2)
            workers = await workers_up(client)
            answers: dict[str, httpx.Response] = {}
            ready: dict[str, tuple[int, float]] = {}
            with anyio.fail_after(20):  # a hang fails here, not in CI's timeout
                async with anyio.create_task_group() as tg:
                    tg.start_soon(post, client, "running", answers, {})
                    await wait_busy(client)
                    core = core_pid(srv) or 0
                    os.kill(core, signal.SIGSTOP)
                    try:
                        tg.start_soon(post, one_connection, "direct", answers, timed)
                        tg.start_soon(post, client, "asgi", answers,
                                      {**timed, "Idempotency-Key": "stalled-1"})
                        tg.start_soon(probe_ready, client, ready)
                        await anyio.sleep(STALL_S)  # the stall's length: the scenario
                    finally:
                        os.kill(core, signal.SIGCONT)
                        continued = time.monotonic()
            status, answered = ready["readyz"]
            assert status == 503 and answered < continued, ready  # while the core stood still
            for way in ("direct", "asgi"):
                r = answers[way]
                assert r.status_code == 504, (way, r.text)
                assert r.json()["error"]["code"] == "deadline_exceeded", way
            assert answers["running"].status_code == 200
            assert answers["running"].json()["output"] == "gninnur"
            await post(one_connection, "again", answers, {})  # on the direct 504's connection
            assert answers["again"].status_code == 200
            assert answers["again"].json()["output"] == "niaga"
            assert await workers_up(client) == workers
            samples = fetch_metrics(srv.url)
            assert metric(samples, "batchgate_worker_hangs_total") == 0
            assert metric(samples, "batchgate_worker_crashes_total") == 0
        assert stop_server(srv) == []
