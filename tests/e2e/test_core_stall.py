"""A cell whose core process stops answering with its link open (SIGSTOPped: a stuck turn
looks the same from a gateway): each gateway answers its waiting requests 503
`core_unavailable` with Retry-After at their timeout plus the backstop's margin, on the
direct way and the ASGI way alike, instead of holding them; once the core runs again the
cell serves, and it still shuts down cleanly."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import pytest

from api.gateway import BACKSTOP_MARGIN_S
from loadtest.server import core_pid, running_server, stop_server
from tests.e2e.helpers import PAID, patient_keys

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
TIMEOUT_S = 2.0
BOUND_S = 6.0  # the timeout, the margin, and a busy machine: past it (+5 s), a hang


@pytest.fixture
def gateways() -> int:
    """This module starts its own cell: no single-process variant."""
    return 2


async def post_timed(client: httpx.AsyncClient, headers: dict[str, str],
                     into: dict[str, tuple[httpx.Response, float]], way: str) -> None:
    started = time.monotonic()
    r = await client.post("/v1/batchstring", json={"input": way}, headers={
        **PAID, **headers, "X-Request-Timeout-Ms": str(int(TIMEOUT_S * 1000))})
    into[way] = (r, time.monotonic() - started)


async def test_a_stopped_core_costs_each_waiting_request_a_503_by_its_backstop(
    tmp_path: Path,
) -> None:
    args = ["--gateways", "2", *patient_keys(tmp_path)]
    with running_server(workers=1, args=args) as srv:
        answers: dict[str, tuple[httpx.Response, float]] = {}
        limits = httpx.Limits(max_connections=2)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30, limits=limits) as client:
            core = core_pid(srv) or 0
            os.kill(core, signal.SIGSTOP)
            try:
                with anyio.fail_after(BOUND_S + 5):  # a hang fails here, not in CI's timeout
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(post_timed, client, {}, answers, "direct")
                        tg.start_soon(post_timed, client, {"Idempotency-Key": "stall-1"},
                                      answers, "asgi")  # a keyed request takes ASGI's way
            finally:
                os.kill(core, signal.SIGCONT)
            # Both came while the core stood still (it goes on only after them): no answer
            # waited for it; none came before the timeout and the margin had passed.
            for way, (r, waited) in answers.items():
                assert r.status_code == 503, (way, r.text)
                assert r.json()["error"]["code"] == "core_unavailable", way
                assert r.headers["retry-after"] == "1", way
                assert waited >= TIMEOUT_S + BACKSTOP_MARGIN_S, (way, waited)
            assert sorted(answers) == ["asgi", "direct"]
            again = await client.post("/v1/batchstring", json={"input": "again"}, headers=PAID)
            assert again.status_code == 200 and again.json()["output"] == "niaga"
        assert stop_server(srv) == []
        assert srv.process.returncode in (0, -signal.SIGTERM)
