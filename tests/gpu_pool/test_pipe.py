"""The parent's pipe end against a real `multiprocessing.Connection`: messages far larger
than the socket buffer go both ways without blocking the loop, in order."""

from __future__ import annotations

import multiprocessing
import threading

import anyio
import anyio.lowlevel
import pytest

from gpu_pool.pipe import READ_CHUNK, FrameReader, PipeEnd, frame

pytestmark = pytest.mark.anyio
BIG = [f"{i:04d}" + "x" * 10_000 for i in range(500)]  # 5 MB: many times the buffer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    small = [("first", 1), "x" * 300, None]
    for messages, steps in ((small, (1, 7, 100)), ([*small, BIG], (4096, 1 << 20, 10**9))):
        data = b"".join(frame(m) for m in messages)
        for step in steps:
            reader, got = FrameReader(), []
            for start in range(0, len(data), step):
                got += reader.feed(data[start:start + step])
            assert got == messages


async def test_a_message_larger_than_the_pipe_reaches_a_blocking_connection() -> None:
    ours, theirs = multiprocessing.Pipe()
    broken: list[bool] = []
    end = PipeEnd(ours.fileno(), lambda: broken.append(True))
    end.send(BIG)  # no one reads yet: it returns at once, the rest waiting for the pipe
    end.send("after")  # queued behind the first, never interleaved with it
    assert end.pending > 0
    received: list[object] = []
    reading = threading.Thread(target=lambda: received.extend([theirs.recv(), theirs.recv()]))
    reading.start()
    with anyio.fail_after(10):
        while end.pending:  # noqa: ASYNC110 (the loop's writer callback drains it)
            await anyio.sleep(0.001)
    await anyio.to_thread.run_sync(reading.join)
    assert received == [BIG, "after"] and not broken
    end.close()
    ours.close()
    theirs.close()


async def test_a_long_reply_is_read_in_pieces_and_eof_is_reported() -> None:
    ours, theirs = multiprocessing.Pipe()
    end = PipeEnd(ours.fileno(), lambda: None)
    writing = threading.Thread(target=lambda: (theirs.send(BIG), theirs.close()))
    writing.start()
    got: list[object] = []
    with anyio.fail_after(10), pytest.raises(EOFError):
        while True:
            got += end.read()
            await anyio.lowlevel.checkpoint()
    writing.join()
    assert got == [BIG]
    ours.close()


def test_a_reply_longer_than_one_read_arrives_in_one_call() -> None:
    ours, theirs = multiprocessing.Pipe()
    end = PipeEnd(ours.fileno(), lambda: None)
    reply = "y" * (READ_CHUNK + READ_CHUNK // 4)  # more than one read, less than the buffer
    writing = threading.Thread(target=lambda: theirs.send(reply))
    writing.start()
    writing.join(10)
    assert not writing.is_alive()  # all of it is in the socket's buffer now
    assert end.read() == [reply]
    assert end.read() == []  # nothing more, and not mistaken for the end
    theirs.close()
    with pytest.raises(EOFError):
        end.read()
    ours.close()


async def test_a_write_to_a_closed_peer_reports_a_broken_pipe() -> None:
    ours, theirs = multiprocessing.Pipe()
    theirs.close()
    broken: list[bool] = []
    end = PipeEnd(ours.fileno(), lambda: broken.append(True))
    end.send("hello")
    assert broken == [True]
    end.send("again")  # closed now: nothing more is tried or reported
    assert broken == [True]
    ours.close()
