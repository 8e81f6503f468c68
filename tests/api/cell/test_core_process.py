"""The supervisor's watch over the core process: a first core that never comes up ends the
cell, one that dies once up is replaced at once by the next incarnation, the leave and the
drain reach the core in that order, and the orphans a dead core leaves are ended."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from api.cell import Child, CoreTarget, core_process
from api.config import Settings
from tests.api.cell.cores import dies_before_ready, first_dies_once_up, serves

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the supervisor watches sentinels with the loop's add_reader


def core(tmp_path: Path, target: CoreTarget, changed: Callable[[], None] = lambda: None
         ) -> Child:
    return core_process(Settings(model="sim"), str(tmp_path / "link.sock"), "cell-a", changed,
                        target=target)


def events(tmp_path: Path) -> list[str]:
    path = tmp_path / "events"
    return path.read_text().split() if path.exists() else []


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.01)  # another process: poll it


async def test_a_first_core_that_dies_before_it_is_up_is_not_restarted(tmp_path: Path) -> None:
    process = core(tmp_path, dies_before_ready)
    assert await process.start() is False
    assert process.info()["state"] == "stopped" and process.restarts == 0
    assert events(tmp_path) == ["0:died"]


async def test_a_core_that_dies_once_up_is_replaced_by_the_next_incarnation(
    tmp_path: Path,
) -> None:
    changes: list[dict[str, object]] = []
    process: Child | None = None

    def changed() -> None:
        assert process is not None
        changes.append(process.info())

    process = core(tmp_path, first_dies_once_up, changed)
    assert await process.start() is True
    await until(lambda: events(tmp_path)[-1:] == ["1:up"] and process.state == "running")
    assert events(tmp_path) == ["0:up", "0:died", "1:up"]
    info = process.info()
    assert info["restarts"] == 1 and info["incarnation"] == 1
    assert [c["state"] for c in changes] == ["starting", "running", "restarting", "starting",
                                             "running"]
    process.leave()
    await until(lambda: "1:left" in events(tmp_path))
    with anyio.fail_after(30):
        await process.stop()
    assert events(tmp_path)[-2:] == ["1:left", "1:drained"]
    assert process.state == "stopped" and process.restarts == 1  # no restart after a drain


async def test_a_core_that_comes_up_after_the_leave_began_is_told_at_once(
    tmp_path: Path,
) -> None:
    process = core(tmp_path, first_dies_once_up)
    process.leave()  # before any core is up: nothing to signal yet
    assert await process.start() is True
    await until(lambda: "1:left" in events(tmp_path))
    with anyio.fail_after(30):
        await process.stop()
    assert events(tmp_path) == ["0:up", "0:died", "1:up", "1:left", "1:drained"]


async def test_stopping_before_the_leave_still_leaves_first(tmp_path: Path) -> None:
    process = core(tmp_path, serves)
    assert await process.start() is True
    with anyio.fail_after(30):
        await process.stop()
    assert events(tmp_path) == ["0:up", "0:drained"]


def test_the_orphans_a_dead_core_leaves_are_ended_and_reaped() -> None:
    """In a process of its own: a subreaper's orphans are all its children."""
    script = textwrap.dedent("""
        import subprocess, sys, os
        from api.cell.supervisor import become_subreaper, end_orphans
        become_subreaper()
        # a "core" that starts a "worker" stuck for good, then dies
        core = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys; p = subprocess.Popen(['sleep', '600']); print(p.pid)"],
            stdout=subprocess.PIPE, text=True)
        orphan = int(core.stdout.readline())
        core.wait()
        ended = end_orphans()
        alive = os.path.exists(f"/proc/{orphan}")
        print(orphan in ended, alive)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_a_dead_cores_workers_listening_for_the_next_are_spared_until_the_cell_stops(
        tmp_path: Path) -> None:
    """A worker with its socket in the workers folder waits for the next core; one still
    loading (no socket) is ended; as the cell stops, all are."""
    script = textwrap.dedent(f"""
        import subprocess, sys, os
        from pathlib import Path
        from api.cell.supervisor import become_subreaper, end_orphans
        become_subreaper()
        core = subprocess.Popen([sys.executable, "-c",
            "import subprocess; a = subprocess.Popen(['sleep', '600']);"
            "b = subprocess.Popen(['sleep', '600']); print(a.pid, b.pid)"],
            stdout=subprocess.PIPE, text=True)
        listening, loading = map(int, core.stdout.readline().split())
        core.wait()
        spare = Path({str(tmp_path)!r})
        (spare / f"0-{{listening}}.sock").touch()
        first = end_orphans(spare)
        print(first == [loading], os.path.exists(f"/proc/{{listening}}"))
        print(end_orphans() == [listening], os.path.exists(f"/proc/{{listening}}"))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "True", "False"], out.stderr
