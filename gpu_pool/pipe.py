"""The parent's end of a worker's pipe, read and written without ever blocking the loop.

The worker keeps a plain `multiprocessing.Connection`; this end speaks the same framing on
the raw descriptor, non-blocking. `Connection.send` and `recv` on a descriptor that the
event loop watches (uvloop makes it non-blocking) fail with EAGAIN as soon as a message
outgrows the socket buffer: a batch of 100 inputs of 10,000 characters (1 MB) was taken
for the worker's death on every try, and the pool crash-looped. Here a long message is
written as the pipe drains and read as it arrives, in pieces.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from collections.abc import Callable

_SIZE = struct.Struct("!i")  # multiprocessing.connection's frame header
_LONG_SIZE = struct.Struct("!Q")  # after a size of -1, for frames of 2 GiB and more
READ_CHUNK = 1 << 16
"""Bytes asked of one read. A read allocates all it asks for before it shrinks to what came:
with a 1 MiB ask a 2.5 KB reply took 16-18 us to read in a tight loop (2.8 with 64 KiB),
and the core's handling of a reply at 10,000 items/s about 100 us more. A long reply takes
a few reads of this size in one call instead."""


def frame(message: object) -> bytes:
    """`message` as `Connection.recv` on the other end expects it."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > 0x7FFFFFFF:
        return _SIZE.pack(-1) + _LONG_SIZE.pack(len(payload)) + payload
    return _SIZE.pack(len(payload)) + payload


class FrameReader:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[object]:
        buffer = self._buffer
        buffer += data
        messages: list[object] = []
        while len(buffer) >= _SIZE.size:
            (size,) = _SIZE.unpack_from(buffer)
            start = _SIZE.size
            if size == -1:
                if len(buffer) < start + _LONG_SIZE.size:
                    break
                (size,) = _LONG_SIZE.unpack_from(buffer, start)
                start += _LONG_SIZE.size
            end = start + size
            if len(buffer) < end:
                break
            messages.append(pickle.loads(bytes(buffer[start:end])))
            del buffer[:end]
        return messages


class PipeEnd:
    """A worker's pipe on the parent's side: `send` queues what the pipe cannot take yet
    and the loop writes it as it drains; `read` returns the messages that arrived.

    A broken pipe is reported through `on_broken` (from `send`, at once, or later from the
    loop's writer callback); the caller treats it as the worker's death."""

    def __init__(self, fd: int, on_broken: Callable[[], None]) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._on_broken = on_broken
        self._pending = bytearray()
        self._reader = FrameReader()
        self._closed = False

    def send(self, message: object) -> None:
        if self._closed:
            return
        data = frame(message)
        if self._pending:  # behind what is already waiting: keep the frames in order
            self._pending += data
            return
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            written = 0
        except OSError:
            self._broken()
            return
        if written < len(data):
            self._pending += data[written:]
            asyncio.get_running_loop().add_writer(self._fd, self._drain)

    @property
    def pending(self) -> int:
        """Bytes queued and not yet taken by the pipe."""
        return len(self._pending)

    def read(self) -> list[object]:
        """Whatever whole messages have arrived; raises EOFError when the worker's end is
        closed (it exited) and nothing arrived before that."""
        chunks: list[bytes] = []
        while True:
            try:
                data = os.read(self._fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError as exc:
                if chunks:  # reported by the next read
                    break
                raise EOFError(str(exc)) from exc
            if not data:
                if chunks:  # the end of the pipe is seen again on the next read
                    break
                raise EOFError("the worker closed its end")
            chunks.append(data)
            if len(data) < READ_CHUNK:  # all there was
                break
        if not chunks:
            return []
        return self._reader.feed(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def close(self) -> None:
        """Stop writing; the owner closes the descriptor."""
        if self._pending:
            asyncio.get_running_loop().remove_writer(self._fd)
            self._pending.clear()
        self._closed = True

    def _drain(self) -> None:
        try:
            written = os.write(self._fd, self._pending)
        except BlockingIOError:
            return
        except OSError:
            self._broken()
            return
        del self._pending[:written]
        if not self._pending:
            asyncio.get_running_loop().remove_writer(self._fd)

    def _broken(self) -> None:
        self.close()
        self._on_broken()


__all__ = ["FrameReader", "PipeEnd", "frame"]
