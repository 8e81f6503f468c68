"""Sweeping the scratch folders that cells killed outright left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from api.cell import SCRATCH_PREFIX, sweep_scratch


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
