"""`--state sqlite:PATH` end to end: keyed requests answered, the whole server SIGKILLed
(every process of its group: the core, its workers, a cell's gateways), a new server
started on the same file; the retries of the keys answered before are replayed from the
file, identical, and the model does not run them again (`tests.models:counting` counts
every run). A single process and a cell of two gateways: the file is the core's either way,
and a cell's core opens it after a crash of the whole cell as a single process does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from loadtest.server import running_server
from tests.e2e.helpers import PAID

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
KEYS = ["--keys", "examples/keys.toml"]
COUNTING = "tests.models:counting"


def runs(count: Path) -> list[str]:
    return count.read_text().splitlines() if count.exists() else []


async def post(url: str, text: str, key: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.post("/v1/batchstring", json={"input": text},
                                 headers={**PAID, "Idempotency-Key": key})


async def test_keys_answered_before_the_server_is_killed_are_replayed_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    count = tmp_path / "runs.txt"
    monkeypatch.setenv("BATCHGATE_TEST_COUNT_FILE", str(count))
    args = [*KEYS, "--state", f"sqlite:{tmp_path / 'kept.db'}"]
    texts = [f"text-{n}" for n in range(5)]
    with running_server(workers=1, model=COUNTING, args=args) as first:
        before = [await post(first.url, text, f"key-{n}") for n, text in enumerate(texts)]
        os.killpg(first.pid, signal.SIGKILL)  # the server's own session: its group
        first.process.wait(timeout=10)
    assert [r.status_code for r in before] == [200] * 5
    assert sorted(runs(count)) == texts
    with running_server(workers=1, model=COUNTING, args=args) as second:
        after = [await post(second.url, text, f"key-{n}") for n, text in enumerate(texts)]
        fresh = await post(second.url, "new", "key-new")
    for old, new in zip(before, after, strict=True):
        assert new.status_code == 200 and new.headers["idempotent-replayed"] == "true"
        assert new.content == old.content  # the same answer: its id too
    assert fresh.status_code == 200 and "idempotent-replayed" not in fresh.headers
    assert sorted(runs(count)) == sorted([*texts, "new"])  # none of the five ran again
