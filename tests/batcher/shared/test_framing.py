"""The framed-message transport: multiprocessing's frames, read whole however the bytes are
split, and `Framed` sending each loop turn's messages as one frame, or each on its own."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from batcher.shared import READ_CHUNK, Framed, FrameReader, frame

pytestmark = pytest.mark.anyio
BIG = [f"{i:04d}" + "x" * 10_000 for i in range(500)]  # 5 MB: many times a socket buffer


@pytest.fixture(params=[{}, {"use_uvloop": True}], ids=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both loops: a cell's core runs on uvloop, whose transports are its own."""
    return "asyncio", request.param


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    small = [("first", 1), "x" * 300, None]
    for messages, steps in ((small, (1, 7, 100)), ([*small, BIG], (4096, 1 << 20, 10**9))):
        data = b"".join(frame(m) for m in messages)
        for step in steps:
            reader, got = FrameReader(), []
            for start in range(0, len(data), step):
                got += reader.feed(data[start:start + step])
            assert got == messages


def test_a_frame_is_what_a_multiprocessing_connection_reads_and_writes() -> None:
    ours, theirs = multiprocessing.Pipe()
    os.write(ours.fileno(), frame(("run", 1, ["a"])))
    assert theirs.recv() == ("run", 1, ["a"])
    theirs.send(("ok", 1, ["a"]))
    assert FrameReader().feed(os.read(ours.fileno(), READ_CHUNK)) == [("ok", 1, ["a"])]
    ours.close()
    theirs.close()


def test_the_long_form_of_a_frame_header_is_read_as_multiprocessing_writes_it() -> None:
    payload = pickle.dumps("long")  # the form of 2 GiB and more, on a short payload
    data = struct.pack("!i", -1) + struct.pack("!Q", len(payload)) + payload
    reader = FrameReader()
    assert reader.feed(data[:9]) == [] and reader.feed(data[9:]) == ["long"]
    ours, theirs = multiprocessing.Pipe()
    os.write(ours.fileno(), data)
    assert theirs.recv() == "long"
    ours.close()
    theirs.close()


def test_a_long_frame_gets_a_buffer_of_its_own_and_the_reader_shrinks_back_after() -> None:
    reader, data = FrameReader(), frame(BIG)
    reader.feed(data[:READ_CHUNK])
    room = reader.get_buffer()
    assert len(room) == len(data) - READ_CHUNK  # the rest of the frame, read in place
    room[:] = data[READ_CHUNK:]
    assert reader.filled(len(room)) == [BIG]
    assert len(reader.get_buffer()) == READ_CHUNK


class Recorder(Framed):
    """Keeps what arrives, a list per call of `received`."""

    def __init__(self, coalesce: bool = True) -> None:
        super().__init__()
        self.coalesce = coalesce
        self.got: list[list[Any]] = []

    def received(self, messages: list[Any]) -> None:
        self.got.append(messages)


@asynccontextmanager
async def linked(coalesce: bool) -> AsyncIterator[tuple[Recorder, Recorder]]:
    """Two `Framed` ends over a real socketpair, connected."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    _, left = await loop.connect_accepted_socket(lambda: Recorder(coalesce), sock=a)
    _, right = await loop.connect_accepted_socket(lambda: Recorder(coalesce), sock=b)
    try:
        yield left, right
    finally:
        for end in (left, right):
            if end.transport is not None:
                end.transport.close()


async def wait_until_got(end: Recorder, count: int) -> None:
    with anyio.fail_after(10):
        while sum(map(len, end.got)) < count:  # noqa: ASYNC110 (the transport delivers)
            await asyncio.sleep(0.001)


async def test_what_is_sent_in_one_turn_arrives_as_one_frame_in_order() -> None:
    async with linked(coalesce=True) as (left, right):
        left.send(("run", 1))
        left.send_all([("run", 2), ("cancel", 1)])
        await asyncio.sleep(0)  # the turn ends: its frame leaves
        left.send(("run", 3))
        await wait_until_got(right, 4)
        assert right.got == [[("run", 1), ("run", 2), ("cancel", 1)], [("run", 3)]]


async def test_without_coalescing_each_message_is_a_frame_written_at_once() -> None:
    async with linked(coalesce=False) as (left, right):
        left.send(("run", 1))
        left.send_all([BIG, "after"])
        # Handed to the transport now, not at the turn's end: what the socket took is gone,
        # the rest waits in the transport's buffer for the peer to read.
        assert left.transport is not None and left.transport.get_write_buffer_size() > 0
        await wait_until_got(right, 3)
        assert [m for frame_messages in right.got for m in frame_messages] == \
            [("run", 1), BIG, "after"]


async def test_nothing_is_written_once_the_transport_is_gone() -> None:
    async with linked(coalesce=True) as (left, right):
        assert left.transport is not None
        left.transport.close()
        await asyncio.sleep(0)
        left.send(("run", 1))  # dropped, not an error: the connection is gone
        await asyncio.sleep(0.01)
        assert left.transport is None and right.got == []
