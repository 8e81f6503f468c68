"""The client's retries against real servers: one whose admission refuses (the only worker
is busy with a long batch) and one that loses the worker running the request."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from batchgate_client import Client, Overloaded
from loadtest.server import RunningServer, fetch_metrics, running_server
from tests.api.metric_samples import total

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
KEYS = ["--keys", str(ROOT / "examples/keys.toml")]


def in_background(srv: RunningServer, key: str, texts: list[str]) -> threading.Thread:
    def send() -> None:
        with Client(srv.url, key) as client:
            client.batchstring(texts)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def busy_worker(srv: RunningServer) -> int:
    """The pid of a worker running a batch; polls the other process, bounded."""
    for _ in range(500):
        workers = httpx.get(srv.url + "/admin/workers",
                            headers={"Authorization": "Bearer admin-demo-key"}).json()
        busy = [w["pid"] for w in workers["workers"] if w["state"] == "busy"]
        if busy:
            return int(busy[0])
        time.sleep(0.01)
    raise AssertionError("no worker became busy")


def queued(srv: RunningServer, tier: str) -> None:
    """Returns once an item of `tier` waits in the queue; polls the server, bounded."""
    for _ in range(500):
        if total(fetch_metrics(srv.url), "batchgate_queue_depth", tier=tier) >= 1:
            return
        time.sleep(0.01)
    raise AssertionError(f"nothing of tier {tier} was queued")


def test_a_refused_call_is_retried_after_retry_after_until_admitted() -> None:
    # 3 s batches: the refusals below must come before the first batch ends (then "second"
    # runs, nothing is queued, and "late" is admitted at once), however loaded the machine.
    with running_server(workers=1, args=[*KEYS, "--batch-latency-ms", "3000"]) as srv:
        # The only worker busy and one paid item queued: admission refuses the free tier
        # (nothing queued ahead would always be admitted).
        occupy = in_background(srv, "paid-demo-key", ["first"])
        busy_worker(srv)
        waiting = in_background(srv, "paid-demo-key", ["second"])
        queued(srv, "paid")
        with pytest.raises(Overloaded):  # a deadline shorter than Retry-After: no retry
            Client(srv.url, "free-demo-key", timeout=0.5).batchstring(["x"])
        started = time.monotonic()
        assert Client(srv.url, "free-demo-key", timeout=15).batchstring(["late"]) == ["etal"]
        assert time.monotonic() - started >= 1.0  # it waited for Retry-After at least once
        occupy.join(timeout=10)
        waiting.join(timeout=10)
        refused = total(fetch_metrics(srv.url), "batchgate_rejected_total",
                         reason="over_budget", tier="free")
        assert refused >= 2


def test_a_call_whose_worker_dies_is_retried_on_another(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text((ROOT / "examples/keys.toml").read_text().replace(
        "budget_ms = 400", "budget_ms = 60000"))
    args = ["--keys", str(keys), "--batch-latency-ms", "1000", "--max-attempts", "1"]
    with running_server(workers=2, args=args) as srv:
        result: list[list[str]] = []
        thread = threading.Thread(target=lambda: result.append(
            Client(srv.url, "paid-demo-key", timeout=20).batchstring(["survivor"])))
        thread.start()
        os.kill(busy_worker(srv), signal.SIGKILL)
        thread.join(timeout=20)
        assert result == [["rovivrus"]]
        m = fetch_metrics(srv.url)
        assert total(m, "batchgate_worker_crashes_total") == 1
        assert total(m, "batchgate_requests_total", tier="paid", code="503") == 1
