"""`batchgate serve --pool ray` drains on SIGTERM as it does with the process pool. Ray's
driver installs a failure handler of its own for SIGTERM (and others) when it connects,
which passes the signal on but arms an alarm that aborts the process (SIGABRT) a few
seconds later, in the middle of a drain; the pool puts back what the process had."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

from loadtest.probe import ProbeConfig, TrafficClass, run_probe
from loadtest.probe_results import ProbeResult
from loadtest.server import fetch_metrics, metric, start_server, stop_server
from tests.e2e.helpers import patient_keys
from tests.ray.lab import Lab

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
DRAIN_DELAY_S = 6.0  # longer than Ray's alarm (3 s): a drain it would cut off
LOAD_S = 2.5  # the load ends well inside the delay, even sent late by a generator that a
# busy machine holds back: a request sent once the delay is over may be refused, rightly
PAID = (TrafficClass.bearer("paid", "paid-demo-key"),)


async def test_sigterm_under_load_says_not_ready_answers_everything_inside_and_exits_0(
    lab: Lab, tmp_path: Path
) -> None:
    args = [*lab.serve_args(), *patient_keys(tmp_path), "--batch-latency-ms", "300",
            "--drain-delay-s", str(DRAIN_DELAY_S)]
    srv = start_server(2, "sim", args)
    try:
        results: list[ProbeResult] = []
        load = ProbeConfig(srv.url, 60, LOAD_S, classes=PAID, timeout_s=10)
        async with (anyio.create_task_group() as tg,
                    httpx.AsyncClient(base_url=srv.url, timeout=10) as kept):
            tg.start_soon(lambda: _collect(load, results))  # ends inside the drain delay
            with anyio.fail_after(10):  # another process: poll its metrics until it runs
                while metric(fetch_metrics(srv.url), "batchgate_batch_size_count") < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            os.kill(srv.pid, signal.SIGTERM)
            with anyio.fail_after(1):  # at once, well inside the delay
                while (ready := await kept.get("/readyz")).status_code == 200:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            assert ready.status_code == 503 and ready.json()["draining"] is True
        (r,) = results
        assert r.sent > 0 and (r.ok, r.wrong, r.lost, dict(r.statuses)) == (
            r.sent, 0, 0, {200: r.sent})
        await anyio.to_thread.run_sync(lambda: srv.process.wait(timeout=30))
    finally:
        leftovers = stop_server(srv)
    log = srv.log_path.read_text(errors="replace")
    assert srv.process.returncode == 0, log[-3000:]
    assert leftovers == [] and "draining" in log and "SIGTERM received" not in log, log[-3000:]
    srv.log_path.unlink()  # read; a failure above keeps it


async def _collect(config: ProbeConfig, out: list[ProbeResult]) -> None:
    out.append(await run_probe(config))
