"""The parent's pipe end against a real `multiprocessing.Connection`: messages far larger
than the socket buffer go both ways without blocking the loop, in order, and the worker's
end going away is reported once, at once."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import anyio
import pytest

from batcher.shared import READ_CHUNK
from gpu_pool.pipe import WorkerPipe, open_pipe

pytestmark = pytest.mark.anyio
BIG = [f"{i:04d}" + "x" * 10_000 for i in range(500)]  # 5 MB: many times the buffer


@pytest.fixture(params=[{}, {"use_uvloop": True}], ids=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both loops: a cell's core runs on uvloop, whose transports are its own."""
    return "asyncio", request.param


class Watch:
    """What the pipe reports: the messages of each call, and how often it was lost."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.lost = 0

    @property
    def messages(self) -> list[Any]:
        return [m for call in self.calls for m in call]

    def on_lost(self) -> None:
        self.lost += 1

    async def until(self, condition: Callable[[], bool]) -> None:
        with anyio.fail_after(10):
            while not condition():  # noqa: ASYNC110 (the transport's callbacks change it)
                await asyncio.sleep(0.001)


async def opened() -> tuple[WorkerPipe, Connection, Watch]:
    ours, theirs = multiprocessing.Pipe()
    watch = Watch()
    pipe = await open_pipe(ours, watch.calls.append, watch.on_lost)
    assert ours.closed  # the pipe holds its own descriptor now
    return pipe, theirs, watch


def in_thread(work: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=work)
    thread.start()
    return thread


async def test_a_message_larger_than_the_pipe_reaches_a_blocking_connection() -> None:
    pipe, theirs, watch = await opened()
    pipe.send(BIG)  # no one reads yet: it returns at once, the rest waiting for the pipe
    pipe.send("after")  # queued behind the first, never interleaved with it
    assert pipe.transport is not None and pipe.transport.get_write_buffer_size() > 0
    received: list[object] = []
    reading = in_thread(lambda: received.extend([theirs.recv(), theirs.recv()]))
    await watch.until(lambda: not reading.is_alive())
    assert received == [BIG, "after"] and not watch.lost
    pipe.close()
    theirs.close()


async def test_a_long_reply_is_read_in_pieces_and_eof_is_reported_once() -> None:
    pipe, theirs, watch = await opened()

    def write_and_close() -> None:
        theirs.send(BIG)
        theirs.close()

    writing = in_thread(write_and_close)
    await watch.until(lambda: watch.lost > 0)
    writing.join()
    assert watch.messages == [BIG] and watch.lost == 1
    assert pipe.transport is None


async def test_a_reply_longer_than_one_read_arrives_whole() -> None:
    pipe, theirs, watch = await opened()
    reply = "y" * (READ_CHUNK + READ_CHUNK // 4)  # more than one read, less than the buffer
    in_thread(lambda: theirs.send(reply)).join(10)
    await watch.until(lambda: bool(watch.calls))
    assert watch.calls == [[reply]] and not watch.lost  # not mistaken for the end
    theirs.close()
    await watch.until(lambda: watch.lost > 0)
    pipe.close()


async def test_a_write_to_a_closed_peer_reports_a_broken_pipe_once() -> None:
    pipe, theirs, watch = await opened()
    theirs.close()
    pipe.send("hello")
    await watch.until(lambda: watch.lost > 0)
    pipe.send("again")  # closed now: nothing more is tried or reported
    await asyncio.sleep(0.01)
    assert watch.lost == 1


async def test_closing_our_end_is_the_workers_eof_and_reports_nothing() -> None:
    pipe, theirs, watch = await opened()
    pipe.close()
    await asyncio.sleep(0.01)
    with pytest.raises(EOFError):
        theirs.recv()
    assert watch.lost == 0
    theirs.close()
