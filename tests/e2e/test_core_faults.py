"""The core process of a cell dies (SIGKILL) or stands still (SIGSTOP) under load: the
supervisor starts another, the gateways hold their clients and send their jobs again, and
every request is answered, correctly, once (`loadtest.core_faults` offers the load)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.core_faults import admin_workers, run_faults
from loadtest.server import core_pid, fetch_metrics, metric, running_server, stop_server
from tests.e2e.helpers import EXAMPLE_KEYS, PAID

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
CELL = ["--gateways", "2", "--keys", str(EXAMPLE_KEYS)]


@pytest.fixture
def gateways() -> int:
    """Only a cell has a core process of its own: no single-process variant."""
    return 2


async def test_the_core_killed_twice_under_load_loses_no_request() -> None:
    with running_server(workers=2, args=CELL) as srv:
        before = admin_workers(srv.url)
        first_core = core_pid(srv)
        plain, keyed, away = await run_faults(srv, rps=150, duration=7, faults=2, every=2.5,
                                              first_at=1.5)
        for probe in (plain, keyed):
            assert probe.sent == probe.scheduled > 0
            assert (probe.ok, probe.wrong, probe.lost) == (probe.sent, 0, 0), probe
            assert dict(probe.statuses) == {200: probe.sent}
        assert len(away) == 2
        after = admin_workers(srv.url)
        assert after["gateways"] == before["gateways"]  # never restarted, same pids
        core = after["core"]
        assert isinstance(core, dict)
        assert core["restarts"] == 2 and core["pid"] not in (first_core, None)
        assert metric(fetch_metrics(srv.url), "batchgate_resubmitted_total") >= 1
        assert stop_server(srv) == []  # no process left after SIGTERM
        assert srv.process.returncode == 0


async def test_the_core_stopped_three_seconds_under_load_answers_every_request() -> None:
    with running_server(workers=2, args=CELL) as srv:
        plain, keyed, away = await run_faults(srv, rps=100, duration=6, faults=1, every=1.5,
                                              sig="STOP", stop_s=3.0)
        for probe in (plain, keyed):
            assert (probe.ok, probe.wrong, probe.lost) == (probe.sent, 0, 0), probe
            assert dict(probe.statuses) == {200: probe.sent}
        assert away[0] >= 3.0
        core = admin_workers(srv.url)["core"]
        assert isinstance(core, dict) and core["restarts"] == 0


@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_a_keyed_request_gets_the_same_answer_across_a_core_s_death(
    state: str, tmp_path: Path,
) -> None:
    """Keys in flight when the core dies are resubmitted; keys answered before it run
    again with the memory store (it died with the core: the same output, a new answer id)
    and replay from the file with `--state sqlite:PATH` (the very same answer)."""
    args = [*CELL, "--state", f"sqlite:{tmp_path / 'kept.db'}"] if state == "sqlite" else CELL
    with running_server(workers=2, args=args) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30,
                                     limits=httpx.Limits(max_connections=64)) as client:
            async def post(i: int) -> httpx.Response:
                return await client.post("/v1/batchstring", json={"input": f"k-{i:03d}"},
                                         headers={**PAID, "Idempotency-Key": f"key-{i}"})

            firsts: dict[int, httpx.Response] = {}

            async def first(i: int) -> None:
                firsts[i] = await post(i)

            async with anyio.create_task_group() as tg:
                for i in range(120):
                    tg.start_soon(first, i)
                    if i == 60:
                        os.kill(core_pid(srv) or 0, signal.SIGKILL)
                    await anyio.sleep(0.01)
            retries = [await post(i) for i in range(120)]
        assert all(r.status_code == 200 for r in [*firsts.values(), *retries])
        assert all(retries[i].json()["output"] == firsts[i].json()["output"]
                   == f"k-{i:03d}"[::-1] for i in range(120))
        replayed = [i for i in range(120) if retries[i].headers.get("Idempotent-Replayed")]
        if state == "sqlite":  # every answer outlived the core: the same bytes again
            assert replayed == list(range(120))
            assert all(retries[i].content == firsts[i].content for i in range(120))
        else:  # those answered by the new core replay; the earlier ones ran again
            assert 0 < len(replayed) < 120
