"""A cell's Ray actors across a restart of its core: a core that dies abruptly (SIGKILL)
leaves them alive, and the next core of the cell attaches to them instead of loading the
model again; one still busy with the dead core's batch is claimed once that batch ends, or
replaced if it hangs; a core that stops cleanly leaves nothing on the cluster, nor, after a
while, does a cell that is gone entirely. Each core
here is a process running the pool as the core does (`loadtest.ray_attach`'s `core`)."""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")

import ray
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from gpu_pool import BatchId, CellIdentity, PoolSettings, RayPoolSettings, Run
from gpu_pool.ray_pool import RayPool
from loadtest.ray_attach import core_argv, core_env
from tests.gpu_pool.test_pool import Events
from tests.ray.lab import ROOT, SLOT, SLOW_LOAD_S, Lab
from tests.ray.models import STALE_BATCH_S

pytestmark = pytest.mark.anyio
SLOW = "tests.ray.slow_load:marking"
MARKING = "tests.ray.models:marking"


class Driver:
    """A core's process and its JSON lines."""

    def __init__(self, process: Process) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self._lines = BufferedByteReceiveStream(process.stdout)

    async def line(self, within: float = 60) -> dict[str, Any]:
        with anyio.fail_after(within):
            record: dict[str, Any] = json.loads(await self._lines.receive_until(b"\n", 1 << 20))
        return record

    async def send(self, slot: int, text: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(f"send {slot} {text}\n".encode())

    async def stop(self) -> int:
        """End of stdin: the pool stops cleanly; the exit status."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        with anyio.fail_after(30):
            return await self.process.wait()

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        with anyio.fail_after(10):
            await self.process.wait()


@asynccontextmanager
async def driver(
    lab: Lab, tmp_path: Path, cell: str, incarnation: int, model: str, workers: int = 1,
    ready_timeout: float = 30, orphan_after: float = 120,
) -> AsyncIterator[Driver]:
    argv = core_argv(lab.address, model, workers, ready_timeout, orphan_after)
    with (tmp_path / f"core-{incarnation}.log").open("wb") as log:
        process = await anyio.open_process(argv, env=core_env(cell, incarnation), cwd=ROOT,
                                           stderr=log)
    async with process:
        try:
            yield Driver(process)
        finally:
            if process.returncode is None:
                process.kill()


@pytest.fixture
def cell(lab: Lab) -> Iterator[str]:
    """A cell of its own for the test; whatever it leaves on the cluster is killed after."""
    name = f"t{secrets.token_hex(3)}"
    yield name
    namespace = CellIdentity(name).namespace
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == namespace:
            ray.kill(ray.get_actor(entry["name"], namespace=namespace))


def named(cell: str) -> list[str]:
    namespace = CellIdentity(cell).namespace
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace]


async def none_named(cell: str, within: float = 10) -> None:
    """Wait until no live actor is named in the cell's namespace (Ray's kills are async)."""
    with anyio.fail_after(within):
        while named(cell):  # noqa: ASYNC110 - Ray's control plane: poll it
            await anyio.sleep(0.05)


def alive(pid: int) -> bool:
    return any(a["Pid"] == pid and a["State"] == "ALIVE"
               for a in ray._private.state.actors().values())


async def file_appears(path: anyio.Path) -> None:
    with anyio.fail_after(30):
        while not await path.exists():  # noqa: ASYNC110 - written by the actor, another process
            await anyio.sleep(0.02)


def pids(status: dict[str, Any]) -> list[int]:
    return [w["pid"] for w in status["workers"]]


async def test_a_core_killed_leaves_its_actors_and_the_next_attaches_without_loading(
    lab: Lab, tmp_path: Path, cell: str
) -> None:
    async with driver(lab, tmp_path, cell, 0, SLOW, workers=2) as first:
        one = await first.line()
        assert one["attached"] == 0 and one["ready_s"] >= SLOW_LOAD_S  # each loaded it
        await first.kill()
    assert sorted(named(cell)) == sorted(one["actors"]) and len(one["actors"]) == 2
    async with driver(lab, tmp_path, cell, 1, SLOW, workers=2) as second:
        two = await second.line()
        assert (two["attached"], two["died"]) == (2, 0)
        assert two["ready_s"] < SLOW_LOAD_S  # no load this time
        assert pids(two) == pids(one) and two["actors"] == one["actors"]
        await second.send(1, "attached")
        assert (await second.line())["outputs"] == ["dehcatta"]
        assert await second.stop() == 0
    await none_named(cell)  # the clean stop killed them


async def test_a_pool_that_stops_kills_its_cells_detached_actors(lab: Lab, cell: str) -> None:
    settings = RayPoolSettings(PoolSettings(model="sim", workers=2), resources={SLOT: 1.0},
                               cell=CellIdentity(cell))
    events = Events()
    pool = RayPool(settings)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run, events)
        await events.wait_for(lambda: len(events.ready) == 2)
        actors = [a for a in ray._private.state.actors().values()
                  if a["State"] == "ALIVE" and a["Pid"] in {w.pid for w in pool.workers()}]
        assert len(named(cell)) == 2 and [a["IsDetached"] for a in actors] == [True, True]
        tg.cancel_scope.cancel()
    await none_named(cell)


async def test_an_actor_the_dead_core_left_running_a_batch_is_claimed_once_it_ends(
    lab: Lab, tmp_path: Path, cell: str
) -> None:
    begun = anyio.Path(tmp_path / "begun")
    async with driver(lab, tmp_path, cell, 0, MARKING) as first:
        one = await first.line()
        await first.send(0, f"SLOW:{begun}")
        await file_appears(begun)
        seen = time.monotonic()
        await first.kill()  # mid-batch: its answer has nowhere to go
    async with driver(lab, tmp_path, cell, 1, MARKING) as second:
        two = await second.line()
        assert time.monotonic() - seen >= STALE_BATCH_S - 0.1  # the old batch ran out first
        assert (two["attached"], two["died"]) == (1, 0) and pids(two) == pids(one)
        await second.send(0, "next")
        assert (await second.line())["outputs"] == ["txen"]  # its own answer, not the old
        assert await second.stop() == 0
    await none_named(cell)


async def test_an_actor_the_dead_core_left_hung_is_replaced_within_the_ready_timeout(
    lab: Lab, tmp_path: Path, cell: str
) -> None:
    begun = anyio.Path(tmp_path / "begun")
    async with driver(lab, tmp_path, cell, 0, MARKING) as first:
        one = await first.line()
        await first.send(0, f"HANG:{begun}")
        await file_appears(begun)
        await first.kill()
    async with driver(lab, tmp_path, cell, 1, MARKING, ready_timeout=2) as second:
        two = await second.line()
        assert (two["attached"], two["died"]) == (0, 1) and pids(two) != pids(one)
        assert not alive(pids(one)[0])  # killed, not left hanging on the cluster
        await second.send(0, "fresh")
        assert (await second.line())["outputs"] == ["hserf"]
        assert await second.stop() == 0
    await none_named(cell)


async def test_actors_no_core_comes_back_for_end_themselves_once_their_lease_lapses(
    lab: Lab, tmp_path: Path, cell: str
) -> None:
    lease = 2.0
    async with driver(lab, tmp_path, cell, 0, "sim", workers=2, orphan_after=lease) as first:
        await first.line()
        await anyio.sleep(lease)  # the time itself is the point: renewed, they stay
        assert len(named(cell)) == 2
        await first.kill()
    assert len(named(cell)) == 2  # left for a successor, for a while
    await none_named(cell, within=lease + 5)


async def test_a_claim_by_an_earlier_core_is_refused_and_takes_nothing(
    lab: Lab, cell: str
) -> None:
    def pool(incarnation: int) -> RayPool:
        return RayPool(RayPoolSettings(PoolSettings(model="sim", workers=1, restart=False),
                                       resources={SLOT: 1.0},
                                       cell=CellIdentity(cell, incarnation)))

    later, later_events = pool(1), Events()
    async with anyio.create_task_group() as tg:
        await tg.start(later.run, later_events)
        await later_events.wait_for(lambda: later_events.ready)
        earlier, earlier_events = pool(0), Events()  # a core that should be dead, is not
        await tg.start(earlier.run, earlier_events)
        await earlier_events.wait_for(lambda: earlier_events.died)
        assert earlier_events.ready == [] and earlier.workers()[0].state == "dead"
        (worker,) = later_events.ready
        later.send(worker, Run(BatchId(1), ("still mine",)))
        await later_events.wait_for(lambda: later_events.replies)
        assert later_events.died == [] and later.attached == 0
        tg.cancel_scope.cancel()
