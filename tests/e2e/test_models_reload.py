"""SIGHUP re-reads the models file while serving, end to end: a model added to the file is
served without a restart (same process, a's worker untouched); a file that fails to load
changes nothing and the log says why.

The new file also drops a model, whose worker takes the new one at once: a worker that has
just loaded stays a minimum time where it is, which a retired version's does not.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import RunningServer, running_server
from tests.e2e.test_models import (
    ADMIN,
    KEYS,
    PATIENT,
    V1,
    V2,
    ask,
    catalogue,
    models_view,
    wait_models,
    workers_holding,
)
from tests.e2e.test_models import gateways as gateways  # one process here
from tests.models_versions import v1, v2

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
A = f"""
[models.a]
[models.a.versions.v1]
spec = "{V1}"
load_s = 1
"""
BEFORE = A + f"""
[models.x]
[models.x.versions.v1]
spec = "{V1}"
load_s = 1
"""
AFTER = A + f"""
[models.b]
[models.b.versions.v1]
spec = "{V2}"
load_s = 1
"""


async def test_sighup_adds_a_model_without_a_restart_and_a_broken_file_changes_nothing(
    tmp_path: Path,
) -> None:
    args = [*KEYS, *catalogue(tmp_path, BEFORE)]
    path = anyio.Path(args[-1])
    with running_server(workers=2, args=args) as srv:
        assert await workers_holding(srv.url) == {"a@v1": 1, "x@v1": 1}
        pids = await worker_pids(srv.url)
        before = await models_view(srv.url)
        await path.write_text(AFTER.replace("[models.b.versions.v1]", "[models.b.versions.v1]\n"
                                      "cache = true"))  # an unknown key: refused whole
        os.kill(srv.pid, signal.SIGHUP)
        assert "models.b.versions.v1.cache: unknown key" in await logged(srv, "was not reloaded")
        assert await models_view(srv.url) == before
        assert (await ask(srv.url, "b")).json()["error"]["code"] == "unknown_model"

        await path.write_text(AFTER)
        os.kill(srv.pid, signal.SIGHUP)
        view = await wait_models(srv.url, lambda v: "b" in v)
        assert list(view) == ["a", "b"]
        assert [v["version"] for v in view["b"]["versions"]] == ["v1"]
        assert (await ask(srv.url, "x")).json()["error"]["code"] == "unknown_model"
        r = await ask(srv.url, "b", text="new", headers=PATIENT)  # waits for its load
        assert r.status_code == 200, r.text
        assert (r.json()["output"], r.json()["model"]) == (v2(["new"])[0], "b@v1")
        a = await ask(srv.url, "a", text="old")
        assert (a.json()["output"], a.json()["model"]) == (v1(["old"])[0], "a@v1")
        assert "models reloaded" in await logged(srv, "models reloaded")
        assert await workers_holding(srv.url) == {"a@v1": 1, "b@v1": 1}
        after = await worker_pids(srv.url)  # the same server: a's worker is one it had
        assert srv.process.poll() is None and after["a@v1"] == pids["a@v1"]


async def logged(srv: RunningServer, text: str) -> str:
    """The server's log line holding `text`, once written (polled: another process)."""
    with anyio.fail_after(10):
        while True:
            for line in (await anyio.Path(srv.log_path).read_text()).splitlines():
                if text in line:
                    return line
            await anyio.sleep(0.02)


async def worker_pids(url: str) -> dict[str, set[int]]:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=10) as client:
        workers = (await client.get("/admin/workers")).json()["workers"]
    out: dict[str, set[int]] = {}
    for w in workers:
        out.setdefault(w["version"], set()).add(w["pid"])
    return out
