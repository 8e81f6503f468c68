"""`--state sqlite:PATH` end to end: keyed requests answered, the whole server SIGKILLed
(every process of its group: the core, its workers, a cell's gateways), a new server
started on the same file; the retries of the keys answered before are replayed from the
file, identical, and the model does not run them again (`tests.models:counting` counts
every run). A single process and a cell of two gateways: the file is the core's either way,
and a cell's core opens it after a crash of the whole cell as a single process does."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import core_pid, running_server
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


async def test_a_core_that_starts_again_on_a_broken_file_serves_plain_requests(
        tmp_path: Path, gateways: int) -> None:
    if gateways == 1:
        pytest.skip("only a cell starts a core again; a server's first start refuses the "
                    "file (tests/e2e/test_serve_startup.py)")
    path = tmp_path / "kept.db"
    args = [*KEYS, "--gateways", "2", "--state", f"sqlite:{path}"]
    with running_server(workers=1, args=args) as srv:
        assert (await post(srv.url, "ab", "k-1")).status_code == 200
        path.write_bytes(b"no database " * 1000)  # and its WAL gone: nothing to mend it
        for left in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{path}{left}")
        dead = core_pid(srv)
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        async with httpx.AsyncClient(base_url=srv.url, headers=PAID, timeout=10) as client:
            with anyio.fail_after(15):  # before: 503 for the whole growing backoff
                while True:
                    if core_pid(srv) not in (None, dead) and (await client.post(
                            "/v1/batchstring", json={"input": "cd"})).status_code == 200:
                        break
                    await anyio.sleep(0.05)
            keyed = await post(srv.url, "ef", "k-2")
        assert (keyed.status_code, keyed.json()["error"]["code"]) == (503, "state_unavailable")
        assert "exited before it was ready" not in srv.log_path.read_text()
