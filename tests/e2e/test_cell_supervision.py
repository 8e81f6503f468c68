"""What a cell's supervisor keeps for its children: the models and keys files last accepted
(a core that dies while the files on disk are broken starts again from them), and its
beats (a supervisor that stopped takes the cell out of a balancer's rotation)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import pytest

from loadtest.server import RunningServer, core_pid, is_ready, running_server
from tests.e2e.helpers import EXAMPLE_KEYS, PAID
from tests.e2e.test_models import ADMIN

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
MODELS = """
[models.a]
[models.a.versions.v1]
spec = "sim"
"""


@pytest.fixture
def gateways() -> int:
    """Only a cell has a supervisor: no single-process variant."""
    return 2


def files(tmp_path: Path) -> tuple[Path, Path]:
    models, keys = tmp_path / "models.toml", tmp_path / "keys.toml"
    models.write_text(MODELS)
    keys.write_text(EXAMPLE_KEYS.read_text())
    keys.chmod(0o600)
    return models, keys


async def new_core(srv: RunningServer, dead: int, within: float) -> int:
    """The pid of the core that follows `dead`, once it is up (polled, bounded)."""
    with anyio.fail_after(within):
        while True:
            pid = core_pid(srv)
            if pid not in (None, dead) and is_ready(srv.url):
                return pid
            await anyio.sleep(0.05)


async def test_a_core_that_dies_with_broken_files_on_disk_serves_the_accepted_ones(
    tmp_path: Path,
) -> None:
    models, keys = files(tmp_path)
    args = ["--gateways", "2", "--models", str(models), "--keys", str(keys)]
    with running_server(workers=1, args=args) as srv:
        models.write_text("[models.a\n")  # not TOML
        keys.write_text("[[keys]]\nkey = 'k'\ntier = 'gold'\n")
        os.kill(srv.pid, signal.SIGHUP)  # refused: serving goes on
        dead = core_pid(srv)
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        await new_core(srv, dead, within=15)  # before: a crash loop on a growing backoff
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            r = await client.post("/v1/batchstring", headers=PAID,
                                  json={"input": "abc", "model": "a"})
            assert (r.status_code, r.json()["output"]) == (200, "cba")
            view = (await client.get("/admin/models", headers=ADMIN)).json()
        refused = {Path(r["file"]).name: r["reason"] for r in view["refused_files"]}
        assert set(refused) == {"models.toml", "keys.toml"}
        assert "tier" in refused["keys.toml"] and str(models) in refused["models.toml"]
        assert "is refused" in srv.log_path.read_text()

        models.write_text(MODELS.replace("[models.a]", "[models.a]\nmin_workers = 1"))
        keys.write_text(EXAMPLE_KEYS.read_text())
        os.kill(srv.pid, signal.SIGHUP)  # accepted: nothing refused any more
        async with httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=10) as client:
            with anyio.fail_after(10):
                while view["refused_files"]:
                    await anyio.sleep(0.05)
                    view = (await client.get("/admin/models")).json()


def readiness(url: str, ready: bool, in_a_row: int, within: float) -> float:
    """Seconds until `in_a_row` /readyz answers in a row (new connections: either gateway)
    say `ready`; fails past `within`."""
    start, seen = time.monotonic(), 0
    while seen < in_a_row:
        assert time.monotonic() - start < within, f"/readyz not ready={ready} in {within} s"
        seen = seen + 1 if is_ready(url) == ready else 0
        if seen == 0:
            time.sleep(0.05)
    return time.monotonic() - start


def test_readyz_is_503_while_the_supervisor_is_stopped() -> None:
    with running_server(workers=1, args=["--gateways", "2"]) as srv:
        os.kill(srv.pid, signal.SIGSTOP)
        try:
            readiness(srv.url, False, in_a_row=8, within=6)  # both gateways, most likely
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        readiness(srv.url, True, in_a_row=8, within=6)
