"""Sweeping the scratch folders that cells killed outright left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from api.cell import SCRATCH_PREFIX, ChildState, Gateways, sweep_scratch
from api.config import Settings
from batcher.shared import Backoff
from tests.api.cell.dying import exit_at_once

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the supervisor watches sentinels with the loop's add_reader


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def scratch(root: Path, name: str) -> Path:
    folder = root / f"{SCRATCH_PREFIX}{name}"
    (folder / "metrics").mkdir(parents=True)
    return folder


def test_only_a_dead_cores_unserved_folder_is_swept(tmp_path: Path) -> None:
    dead = dead_pid()
    stale = scratch(tmp_path, f"{dead}-abc")
    live = scratch(tmp_path, f"{os.getpid()}-abc")  # its core is still running
    unnamed = scratch(tmp_path, "abcdefgh")  # not named for a pid: not a cell's to judge
    served = scratch(tmp_path, f"{dead}-def")  # a dead pid here, yet its link is served
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(served / "link.sock"))
        listener.listen()
        assert sweep_scratch(tmp_path) == [stale]
    assert not stale.exists()
    assert live.is_dir() and unnamed.is_dir() and served.is_dir()


class Counted:
    """Says when the gateway has been spawned `until` times (each spawn is up at once)."""

    def __init__(self, until: int) -> None:
        self.until, self.spawns, self.enough = until, 0, anyio.Event()
        self.gateways: Gateways | None = None

    def changed(self) -> None:
        assert self.gateways is not None
        if self.gateways.children[0].state is ChildState.RUNNING:
            self.spawns += 1
            if self.spawns == self.until:
                self.enough.set()


async def test_a_gateway_that_keeps_dying_is_restarted_ever_later(tmp_path: Path) -> None:
    """The pool's backoff: each death in a row waits twice as long, up to the cap."""
    backoff = Backoff(first=0.05, cap=0.2, stable_after=60.0)
    with socket.socket() as sock:
        counted = Counted(5)
        gateways = counted.gateways = Gateways(
            Settings(model="sim", gateways=1), str(tmp_path / "link"), [sock], backoff=backoff,
            target=exit_at_once, changed=counted.changed)
        await gateways.start()
        with anyio.fail_after(60):
            await counted.enough.wait()
        info = gateways.info()[0]
        assert info["restarts"] == 4 and info["state"] == ChildState.RUNNING.value
        assert gateways.children[0].failures == 4 and backoff.delay(4) == 0.2
        await gateways.stop()
        assert gateways.info()[0]["state"] == ChildState.STOPPED.value
