"""What ran is kept (issue 28, item 15): a keyed request whose deadline passes while its
batch runs is answered 504, its batch finishes, and the answer is kept, so a retry with the
same Idempotency-Key replays it and the model runs once. One that never started keeps
nothing: the retry runs it. Real servers, a single process and a cell of two gateways (the
keyed path runs in the core either way); `tests.models:counting` counts every run."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import running_server
from tests.e2e.helpers import PAID

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
KEYS = ["--keys", "examples/keys.toml"]
SLOW = ["--model", "tests.models:counting", "--batch-latency-ms", "2000"]  # 2 s a batch
SHORT = {"X-Request-Timeout-Ms": "600"}  # passes while a batch runs


async def test_a_keyed_request_that_times_out_mid_batch_is_kept_and_its_retry_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = tmp_path / "runs.txt"
    monkeypatch.setenv("BATCHGATE_TEST_COUNT_FILE", str(count))
    with running_server(workers=1, args=[*KEYS, *SLOW]) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            async def post(**headers: str) -> httpx.Response:
                return await client.post("/v1/batchstring", json={"input": "slow"},
                                         headers={**PAID, "Idempotency-Key": "k-1", **headers})

            first = await post(**SHORT)
            assert first.status_code == 504, first.text
            assert count.read_text().splitlines() == ["slow"]  # it is running (or ran)
            retry = await post()  # joins the batch still running, or replays its answer
            again = await post()
        for answer in (retry, again):
            assert answer.status_code == 200, answer.text
            assert answer.json()["output"] == "wols"
            assert answer.headers["idempotent-replayed"] == "true"
        assert retry.json()["id"] == again.json()["id"]
        assert count.read_text().splitlines() == ["slow"]  # the model ran once


async def test_a_keyed_request_that_times_out_queued_keeps_nothing_and_its_retry_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = tmp_path / "runs.txt"
    monkeypatch.setenv("BATCHGATE_TEST_COUNT_FILE", str(count))
    with running_server(workers=1, args=[*KEYS, *SLOW]) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            keyed = {**PAID, "Idempotency-Key": "k-2"}
            blocker: list[httpx.Response] = []

            async def block() -> None:  # holds the one worker for 2 s
                blocker.append(await client.post("/v1/batchstring", json={"input": "first"},
                                                  headers=PAID))

            async with anyio.create_task_group() as tg:
                tg.start_soon(block)
                await counted(count, 1)
                first = await client.post("/v1/batchstring", json={"input": "queued"},
                                          headers={**keyed, **SHORT})
            assert first.status_code == 504, first.text
            assert blocker[0].status_code == 200
            retry = await client.post("/v1/batchstring", json={"input": "queued"},
                                      headers=keyed)
        assert retry.status_code == 200 and retry.json()["output"] == "deueuq"
        assert "idempotent-replayed" not in retry.headers
        assert count.read_text().splitlines() == ["first", "queued"]  # it ran once: now


async def counted(count: Path, n: int) -> None:
    """Wait until the model has run `n` inputs: another process, so its file is polled."""
    path = anyio.Path(count)
    with anyio.fail_after(30):
        while not await path.exists() or len((await path.read_text()).splitlines()) < n:  # noqa: ASYNC110
            await anyio.sleep(0.01)  # another process: poll it
