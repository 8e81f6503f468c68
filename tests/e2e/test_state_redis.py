"""`--state redis://` end to end: two servers (two cells) share one real Redis that the
test starts. A key answered on one is replayed on the other, and the model ran it once;
with Redis stopped, requests without a key are still answered and keyed ones get 503
`state_unavailable` while it is out, not an answer that waited for it; Redis started again
on the same port, keyed requests work again, neither server restarted.

A single process only: the keyed path is the core's, which a cell's gateways reach through
the same door (tests/failover/state/test_keyed_durable.py holds it in detail)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from loadtest.server import metric, parse_metrics, running_server
from tests.e2e.helpers import PAID
from tests.redis_server import running_redis

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
ONE_DOOR = "the kept answers are the core's: a cell's gateways add nothing to what is shared"
COUNTING = "tests.models:counting"


def runs(count: Path) -> list[str]:
    return count.read_text().splitlines() if count.exists() else []


async def post(client: httpx.AsyncClient, text: str, key: str | None = None
               ) -> httpx.Response:
    headers = PAID if key is None else {**PAID, "Idempotency-Key": key}
    return await client.post("/v1/batchstring", json={"input": text}, headers=headers)


async def test_two_cells_share_kept_answers_and_ride_out_a_redis_outage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gateways: int) -> None:
    if gateways > 1:
        pytest.skip(ONE_DOOR)
    count = tmp_path / "runs.txt"
    monkeypatch.setenv("BATCHGATE_TEST_COUNT_FILE", str(count))
    with running_redis(tmp_path / "redis") as redis:
        args = ["--keys", "examples/keys.toml", "--state", redis.url]
        with running_server(1, COUNTING, args, env={"BATCHGATE_CELL_ID": "cell-a"}) as a, \
                running_server(1, COUNTING, args, env={"BATCHGATE_CELL_ID": "cell-b"}) as b:
            async with httpx.AsyncClient(base_url=a.url, timeout=30) as on_a, \
                    httpx.AsyncClient(base_url=b.url, timeout=30) as on_b:
                first = await post(on_a, "hello", "k-1")
                replayed = await post(on_b, "hello", "k-1")
                assert first.status_code == 200 and "idempotent-replayed" not in first.headers
                assert replayed.status_code == 200 and replayed.content == first.content
                assert replayed.headers["idempotent-replayed"] == "true"
                assert runs(count) == ["hello"]  # ran once, on a

                redis.stop()
                for client in (on_a, on_b):
                    assert (await post(client, "plain")).json()["output"] == "nialp"
                    refused = await post(client, "keyed", "k-2")  # Redis is still out
                    assert refused.status_code == 503 and "retry-after" in refused.headers
                    assert refused.json()["error"]["code"] == "state_unavailable"

                for client in (on_a, on_b):
                    samples = parse_metrics((await client.get("/metrics")).text)
                    assert metric(samples, "batchgate_state_errors_total", part="kept") == 1

                redis.start()  # the same port, empty
                again = await post(on_b, "keyed", "k-2")
                assert again.status_code == 200 and again.json()["output"] == "deyek"
                assert (await post(on_a, "keyed", "k-2")).content == again.content
            assert a.process.poll() is None and b.process.poll() is None
    assert sorted(runs(count)) == ["hello", "keyed", "plain", "plain"]


async def test_a_slow_redis_delays_keyed_requests_and_leaves_plain_ones_in_budget(
        tmp_path: Path, gateways: int) -> None:
    if gateways > 1:
        pytest.skip(ONE_DOOR)
    with running_redis(tmp_path / "redis") as redis, running_server(
            1, "sim", ["--keys", "examples/keys.toml", "--state", redis.url]) as srv:
        assert redis.process is not None
        pid = redis.process.pid
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            assert (await post(client, "warm", "k-0")).status_code == 200  # connected
            os.kill(pid, signal.SIGSTOP)  # Redis answers again in 1.5 s: slow, not gone
            resume = threading.Timer(1.5, os.kill, (pid, signal.SIGCONT))
            resume.start()
            try:
                started = time.monotonic()
                plain = await post(client, "plain")
                took = time.monotonic() - started
                keyed = await post(client, "keyed", "k-1")
            finally:
                resume.cancel()
                os.kill(pid, signal.SIGCONT)
    assert keyed.status_code == 200, keyed.text  # before: 503 state_unavailable at 0.5 s
    assert plain.status_code == 200
    assert took < 0.5  # before: its rate check waited the fixed 0.5 s for Redis
