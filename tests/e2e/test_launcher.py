"""The pool's launcher under faults, with a real server: SIGKILLed under load it loses no
request, the workers it forked serve on, and a worker that dies meanwhile still comes back
(spawned until a launcher is up again)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from gpu_pool import stat_of
from loadtest.server import fetch_metrics, metric, running_server
from tests.e2e.helpers import patient_keys, post_many, workers_in_state

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
PAID = {"Authorization": "Bearer paid-demo-key"}


def launchers_of(server: int) -> list[int]:
    """The server's live descendants named as its launcher is (`gpu_pool.launcher`): its
    child in a single process, its core's in a cell."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        stat = stat_of(int(entry)) if entry.isdigit() else None
        if stat is None or stat[0] == "Z":
            continue
        try:
            names[int(entry)] = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        parents[int(entry)] = stat[1]

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == server:
                return True
        return False

    return [pid for pid, name in names.items() if name == "bg-launcher" and under(pid)]


async def test_the_launcher_killed_under_load_loses_nothing_and_starts_keep_working(
        tmp_path: Path) -> None:
    args = [*patient_keys(tmp_path), "--batch-latency-ms", "300", "--max-wait-ms", "50"]
    with running_server(workers=2, args=args) as srv:
        (launcher,) = launchers_of(srv.pid)
        texts = [f"launch-{i}-{os.urandom(3).hex()}" for i in range(60)]
        results: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:
            async def send() -> None:
                results.extend(await post_many(srv.url, [{"input": t} for t in texts], PAID))

            tg.start_soon(send)
            (busy, *_) = await workers_in_state(srv.url, "busy", 1)
            os.kill(launcher, signal.SIGKILL)
            os.kill(busy, signal.SIGKILL)  # its slot must start a worker meanwhile
        assert [r.status_code for r in results] == [200] * len(texts)
        assert [r.json()["output"] for r in results] == [t[::-1] for t in texts]
        pids = await workers_in_state(srv.url, "ready", 2)
        assert busy not in pids
        with anyio.fail_after(30):  # a launcher is back: the next start is a fork again
            while not launchers_of(srv.pid):  # noqa: ASYNC110 (another process)
                await anyio.sleep(0.05)
        assert launchers_of(srv.pid) != [launcher]
        assert metric(fetch_metrics(srv.url), "batchgate_worker_crashes_total") == 1
