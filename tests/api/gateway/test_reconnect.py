"""A gateway outlives its core: when the link closes (the core process died), every job it
holds waits for the next core, which the gateway connects to and sends them all again with
their own deadlines; a job sent meanwhile goes with them; a withdrawn one goes nowhere;
nothing is answered twice; calls fail at once, so the gateway says it is not ready.

The cores here are scripted Unix servers on one path, as the cell's link is: a test kills
one (closes its connections and stops listening) and starts another in its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from api.config import Principal
from api.gateway import RemoteCore, run_message
from api.gateway.frames import HOST_CLOCK, Message
from api.http import Answered, Job, Outcome, Rendered, StatusCall
from batcher import Tier

pytestmark = pytest.mark.anyio
WHO = Principal(Tier.PAID, "acme", "paid-demo-key")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ScriptedCore:
    """Reads the link's frames; keeps every message; answers runs only when `answering`."""

    def __init__(self, path: str, answering: bool) -> None:
        self.path, self.answering = path, answering
        self.heard: list[Message] = []
        self.changed = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError,
                                 asyncio.CancelledError):
            while True:
                (size,) = struct.unpack("!i", await reader.readexactly(4))
                messages: list[Message] = pickle.loads(await reader.readexactly(size))
                self.heard += messages
                self.changed.set()
                answers = [("ok", m[1], [m[5][0][::-1]], (0.0,), 0.1, (1,), 1)
                           for m in messages if m[0] == "run" and self.answering]
                if answers:
                    data = pickle.dumps(answers)
                    writer.write(struct.pack("!i", len(data)) + data)

    def kill(self) -> None:
        """As the core process dying: its connections close, nothing listens."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()

    def runs(self) -> list[Message]:
        return [m for m in self.heard if m[0] == "run"]

    async def wait_heard(self, condition: Callable[[list[Message]], bool]) -> None:
        with anyio.fail_after(5):
            while not condition(self.heard):
                self.changed.clear()
                await self.changed.wait()


class Got:
    """A receiver that keeps every answer it gets."""

    def __init__(self) -> None:
        self.answers: list[Outcome] = []
        self.changed = asyncio.Event()

    def answered(self, outcome: Outcome) -> None:
        self.answers.append(outcome)
        self.changed.set()

    async def wait(self) -> None:
        with anyio.fail_after(5):
            while not self.answers:
                self.changed.clear()
                await self.changed.wait()


def job(text: str, timeout: float = 30.0) -> Job:
    return Job(WHO, [text], True, timeout)


async def linked(tmp_path: Path, answering: bool,
                 resubmitted: Callable[[int], None] | None = None,
                 ) -> tuple[str, ScriptedCore, RemoteCore]:
    """A core on the link's path, and a gateway's remote connected to it."""
    path = str(tmp_path / "link.sock")
    core = ScriptedCore(path, answering)
    await core.start()
    remote = RemoteCore(path, resubmitted=resubmitted)
    await remote.connect()
    return path, core, remote


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.005)  # the remote's reconnect loop runs between these


async def test_held_jobs_go_again_to_the_next_core_with_their_own_deadlines(
    tmp_path: Path,
) -> None:
    again: list[int] = []
    path, first, remote = await linked(tmp_path, answering=False, resubmitted=again.append)
    held = [Got() for _ in range(3)]
    rids = [remote.submit(job(f"held-{i}"), got) for i, got in enumerate(held)]
    await first.wait_heard(lambda heard: len(heard) == 3)
    sent = {m[1]: m for m in first.runs()}
    first.kill()
    await until(lambda: not remote.connected)
    # not ready while no core is there
    assert (await remote.status(StatusCall.READY))["ready"] is False
    late = Got()
    late_rid = remote.submit(job("meanwhile"), late)  # sent with the others, later
    withdrawn = remote.submit(job("withdrawn"), Got())
    remote.withdraw(withdrawn)  # its client left during the outage: sent nowhere

    second = ScriptedCore(path, answering=True)
    await second.start()
    for got in [*held, late]:
        await got.wait()
    resent = {m[1]: m for m in second.runs()}
    assert set(resent) == {*rids, late_rid}
    for rid in rids:  # the same job, the same deadline on the host's clock
        assert resent[rid] == sent[rid]
    assert [got.answers for got in held] == [
        [Answered(["0-dleh"], (0.0,), 0.1, (1,), 1)],
        [Answered(["1-dleh"], (0.0,), 0.1, (1,), 1)],
        [Answered(["2-dleh"], (0.0,), 0.1, (1,), 1)],
    ]
    assert late.answers == [Answered(["elihwnaem"], (0.0,), 0.1, (1,), 1)]
    assert again == [3]  # the three the dead core had; the late one was never sent before
    assert not remote.jobs
    remote.close()
    second.kill()


async def test_an_answer_the_dead_core_wrote_is_taken_and_never_sent_again(
    tmp_path: Path,
) -> None:
    path, first, remote = await linked(tmp_path, answering=True)
    got = Got()
    remote.submit(job("done"), got)
    await got.wait()
    first.kill()
    await until(lambda: not remote.connected)
    second = ScriptedCore(path, answering=True)
    await second.start()
    await until(lambda: remote.connected)
    assert second.runs() == []  # answered once: nothing left to send
    assert len(got.answers) == 1
    remote.close()
    second.kill()


async def test_calls_in_flight_fail_when_the_core_goes(tmp_path: Path) -> None:
    _, first, remote = await linked(tmp_path, answering=False)
    async with anyio.create_task_group() as tg:
        outcome: list[object] = []

        async def ask() -> None:
            outcome.append(await remote.status(StatusCall.READY))

        tg.start_soon(ask)
        await first.wait_heard(lambda heard: any(m[0] == "call" for m in heard))
        first.kill()
    assert outcome == [{"ready": False, "workers_ready": 0, "draining": True}]
    remote.close()


async def test_closing_the_remote_ends_every_held_job_503_and_refuses_new_ones(
    tmp_path: Path,
) -> None:
    _, first, remote = await linked(tmp_path, answering=False)
    got = Got()
    remote.submit(job("held"), got)
    await first.wait_heard(lambda heard: len(heard) == 1)
    first.kill()
    await until(lambda: not remote.connected)
    remote.close()  # the gateway is stopping: no core will come
    assert len(got.answers) == 1
    answer = got.answers[0]
    assert isinstance(answer, Rendered) and answer.status == 503
    assert b"core_unavailable" in answer.body
    with pytest.raises(Exception, match="gone"):
        remote.submit(job("after"), Got())


async def test_a_job_whose_deadline_passed_during_the_outage_is_sent_as_it_was(
    tmp_path: Path,
) -> None:
    """The core, not the gateway, answers a job late (504, never a run): its deadline on
    the host's clock travels with it."""
    path, first, remote = await linked(tmp_path, answering=False)
    rid = remote.submit(job("short", timeout=0.05), Got())
    await first.wait_heard(lambda heard: len(heard) == 1)
    first.kill()
    await until(lambda: not remote.connected)
    await until(lambda: HOST_CLOCK() > first.runs()[0][7])  # its deadline passes
    second = ScriptedCore(path, answering=False)
    await second.start()
    await second.wait_heard(lambda heard: len(heard) == 1)
    assert second.runs()[0] == first.runs()[0]
    assert second.runs()[0][7] < HOST_CLOCK()
    assert run_message(rid, job("short", 0.05))[:7] == second.runs()[0][:7]
    remote.close()
    second.kill()
