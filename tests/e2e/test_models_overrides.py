"""The admin's changes to the catalogue last, end to end: a version retired by `DELETE
/admin/models/{name}/versions/{version}` stays retired when SIGHUP re-reads the models file
(which still says it is live) and, in a cell, when its core is killed and another starts
from the same file."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from loadtest.server import RunningServer, core_pid, running_server
from tests.e2e.test_cell_supervision import new_core
from tests.e2e.test_models import ADMIN, KEYS, V1, V2, ask, catalogue, models_view, wait_models

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
MODELS = f"""
[models.a]
default = "v1"
[models.a.versions.v1]
spec = "{V1}"
load_s = 1
[models.a.versions.v2]
spec = "{V2}"
load_s = 1
"""
CHANGED = MODELS.replace('default = "v1"', 'default = "v1"\nidle_unload_s = 300')


async def retire_v2(srv: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as client:
        r = await client.delete("/admin/models/a/versions/v2")
    assert r.status_code == 200, r.text


async def assert_v2_retired(srv: RunningServer) -> None:
    (v2,) = [v for v in (await models_view(srv.url))["a"]["versions"] if v["version"] == "v2"]
    assert (v2["state"], v2["retired_by_admin"]) == ("retired", True)
    r = await ask(srv.url, "a@v2")
    assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_model")


async def test_a_version_retired_by_the_admin_stays_retired_across_a_sighup(
    tmp_path: Path,
) -> None:
    args = [*KEYS, *catalogue(tmp_path, MODELS)]
    with running_server(workers=1, args=args) as srv:
        await retire_v2(srv)
        await assert_v2_retired(srv)
        (tmp_path / "models.toml").write_text(CHANGED)  # a's v2 still live in the file
        os.kill(srv.pid, signal.SIGHUP)
        await wait_models(srv.url, lambda view: view["a"]["idle_unload_s"] == 300)  # read
        await assert_v2_retired(srv)


async def test_a_version_retired_by_the_admin_stays_retired_when_the_core_dies(
    tmp_path: Path, gateways: int,
) -> None:
    if gateways == 1:
        pytest.skip("only a cell has a core that its supervisor starts again")
    args = [*KEYS, *catalogue(tmp_path, MODELS)]
    with running_server(workers=1, args=args) as srv:
        await retire_v2(srv)
        dead = core_pid(srv)
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        await new_core(srv, dead, within=60)
        await assert_v2_retired(srv)


async def test_the_admins_changes_dropped_serve_the_file_again(
    tmp_path: Path, gateways: int,
) -> None:
    """A version retired by mistake comes back without a restart (in a cell, the request
    crosses the link to the core)."""
    args = [*KEYS, *catalogue(tmp_path, MODELS)]
    with running_server(workers=2, args=args) as srv:  # one for v2 beside v1
        await retire_v2(srv)
        await assert_v2_retired(srv)
        async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as client:
            r = await client.delete("/admin/models/a/overrides")
            assert r.status_code == 200, r.text
            refused = await client.delete("/admin/models/nope/overrides")
            assert refused.status_code == 404
            assert refused.json()["error"]["code"] == "not_found"
        (v2,) = [v for v in (await models_view(srv.url))["a"]["versions"]
                 if v["version"] == "v2"]
        assert (v2["state"], v2["retired_by_admin"]) == ("cold", False)
        first = await ask(srv.url, "a@v2")  # starts its load on the second worker
        if first.status_code != 200:  # its load outlasts the request's deadline
            assert first.json()["error"]["code"] == "model_loading", first.text
            await wait_models(srv.url, lambda view: any(
                v["version"] == "v2" and v["state"] == "resident"
                for v in view["a"]["versions"]))
            r = await ask(srv.url, "a@v2")
            assert r.status_code == 200, r.text
