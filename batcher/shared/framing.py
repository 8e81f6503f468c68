"""Framed messages over a byte stream: the one transport of a cell's link (gateway and core)
and of a worker's pipe (the pool's end).

A frame is multiprocessing.connection's: a `!i` length (or -1, then a `!Q` length, for
2 GiB and more) and a pickle. So the pool's end speaks to a worker's plain, blocking
`multiprocessing.Connection` without either knowing of the other. Both peers are processes
of the same server, started from the same code: pickle is safe here, and the fastest codec
for small tuples.

`Framed` is the asyncio protocol both ends use. The link coalesces: what is sent during one
loop turn leaves as one frame holding the list of messages, so a batch's 100 answers are
one write, not 100. A worker's pipe does not (`coalesce = False`): its `Connection.recv`
takes one object per frame, and the pool sends once per batch anyway. Either way the
transport buffers what the peer cannot take yet, so a long message never blocks the loop,
and bytes are read straight into the reader's buffer (`asyncio.BufferedProtocol`).
"""

from __future__ import annotations

import asyncio
import math
import pickle
import struct
from typing import Any, cast

from batcher import RateMeter

_SIZE = struct.Struct("!i")
_LONG_SIZE = struct.Struct("!Q")  # after a size of -1
_LONG = 0x7FFFFFFF  # the longest payload a `!i` size holds
READ_CHUNK = 1 << 16
"""The room a reader keeps for the next read. A frame longer than that gets a buffer of its
own length, so it is read in place in as few reads as the socket allows; the buffer goes
back to this size afterwards, so a connection holds no more than this between long frames."""


def frame(message: object) -> bytes:
    """`message` as one frame: what `Connection.recv` on the other end expects."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > _LONG:
        return _SIZE.pack(-1) + _LONG_SIZE.pack(len(payload)) + payload
    return _SIZE.pack(len(payload)) + payload


class FrameReader:
    """Bytes in, whole frames' objects out, in order. A stream reads into `get_buffer()` and
    reports how much came with `filled(n)`; `feed(data)` does both for bytes in hand."""

    def __init__(self) -> None:
        self._buffer = bytearray(READ_CHUNK)
        self._end = 0  # bytes held, from the start of the buffer: a partial frame at most
        self._need = 0  # the partial frame's whole length, once its header is in

    def get_buffer(self) -> memoryview:
        """Where the next bytes go: the buffer's free tail, with room for the whole partial
        frame at least; what is written there counts once `filled` says how much."""
        want = max(self._need, READ_CHUNK)
        size = len(self._buffer)
        if size < want or (size > READ_CHUNK and want == READ_CHUNK):  # grow, or shrink back
            buffer = bytearray(want)
            buffer[:self._end] = self._buffer[:self._end]
            self._buffer = buffer
        return memoryview(self._buffer)[self._end:]

    def filled(self, nbytes: int) -> list[object]:
        """`nbytes` more were written into the last `get_buffer()`: the frames they ended."""
        end = self._end = self._end + nbytes
        if end < self._need:  # a long frame still coming
            return []
        buffer, start, need, objects = self._buffer, 0, 0, []
        with memoryview(buffer) as view:
            while end - start >= _SIZE.size:
                (size,) = _SIZE.unpack_from(buffer, start)
                body = start + _SIZE.size
                if size == -1:
                    if end - body < _LONG_SIZE.size:
                        break
                    (size,) = _LONG_SIZE.unpack_from(buffer, body)
                    body += _LONG_SIZE.size
                if end < body + size:
                    need = body + size - start
                    break
                objects.append(pickle.loads(view[body:body + size]))
                start = body + size
        self._need = need
        if start:
            # The same length either side: moved in place, never resized, which a buffer
            # still exported to the transport refuses.
            buffer[:end - start] = buffer[start:end]
            self._end = end - start
        return objects

    def feed(self, data: bytes) -> list[object]:
        """`data` as if read from the stream: the frames it ended."""
        objects: list[object] = []
        data_view = memoryview(data)
        while data_view:
            with self.get_buffer() as room:
                n = min(len(room), len(data_view))
                room[:n] = data_view[:n]
            objects += self.filled(n)
            data_view = data_view[n:]
        return objects


class Framed(asyncio.BufferedProtocol):
    """Frames in, `received(messages)` out; `send`/`send_all` out.

    With `coalesce` (the link), what is sent during one loop turn leaves as one frame
    holding the list of messages, and, while more than `busy_rate` messages a second are
    sent, no sooner than `spacing` after the previous frame; `received` is called once per
    frame with its list. Without (a worker's pipe), each message is a frame of its own,
    written at once, and `received` gets the messages of every frame that one read ended.

    A message sent with no open transport is dropped: the connection is gone, and whoever
    watches it learns that from `connection_lost`."""

    coalesce = True
    spacing = 0.0
    busy_rate = 0.0

    def __init__(self) -> None:
        self._reader = FrameReader()
        self._outbox: list[Any] = []
        self._last_flush = -math.inf
        self._sent = RateMeter()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass).
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    # -- out ---------------------------------------------------------------------------------
    def send(self, message: Any) -> None:
        if self.coalesce:
            self.send_all([message])
        else:
            self._write(frame(message))

    def send_all(self, messages: list[Any]) -> None:
        """Send `messages` in order: in this turn's frame (or the next spaced one) when
        coalescing, else each as its own frame now."""
        if not self.coalesce:
            self._write(b"".join(frame(message) for message in messages))
            return
        if not self._outbox:
            loop = asyncio.get_running_loop()
            wait = -1.0
            if self.spacing:
                now = loop.time()
                self._sent.add(len(messages), now)
                if self._sent.rate(now) > self.busy_rate:
                    wait = self._last_flush + self.spacing - now
            if wait > 0:
                loop.call_later(wait, self._flush)
            else:
                loop.call_soon(self._flush)
        elif self.spacing:
            self._sent.add(len(messages), asyncio.get_running_loop().time())
        self._outbox += messages

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if self.spacing:
            self._last_flush = asyncio.get_running_loop().time()
        self._write(frame(messages))

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    # -- in ----------------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        frames = self._reader.filled(nbytes)
        if not frames:
            return
        if not self.coalesce:
            self.received(frames)
            return
        for messages in frames:
            self.received(cast(list[Any], messages))

    def received(self, messages: list[Any]) -> None:
        """Messages that arrived, in the order they were sent."""
        raise NotImplementedError


__all__ = ["READ_CHUNK", "FrameReader", "Framed", "frame"]
