"""Backpressure: a connection whose client leaves its answers unread is not read again.

uvicorn pauses reading for reasons of its own (a pipelined request waits for the one before
it, a body runs ahead of its handler) and makes the ASGI way's `send` wait while the
transport's write buffer is over its mark, but it reads the next request as soon as an
answer is complete, whatever the buffer holds; the direct way (`api.http.direct`) writes
whole answers and never waits. So a client that sent requests and read nothing had every
answer kept in the process: a hundred 1 MB requests, a hundred megabytes.

Here a connection holds at most `WRITE_HIGH_WATER` unsent bytes before it stops being read,
whatever uvicorn asks, until the client has taken them; and the unsent bytes must be taken
within `unread_timeout` (the body timeout: a client gets as long to take an answer as to send
a body), or the connection is aborted, what it left unread discarded. A plain close would
wait for the client to read it first, for ever.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.flow_control import FlowControl

log = logging.getLogger("batchgate.http")

WRITE_HIGH_WATER = 0
"""Unsent bytes a connection may hold in the process before it is no longer read: none.
What a client has not read yet waits in the kernel's socket buffers; what they do not take
waits here, and so does the client's next request. With a mark above zero, a client that
stops sending and reading below it would hold its connection for ever: nothing is paused,
so no timer runs, and uvicorn's close waits for a buffer that never drains."""


class Backpressure(FlowControl):
    """uvicorn's flow control for one connection (it stands in `protocol.flow`), with
    reading held while the transport has unsent bytes, and a deadline for taking them."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 unread_timeout: float) -> None:
        super().__init__(transport)
        self._held = False  # uvicorn's own reasons to pause reading
        self._loop = loop
        self._unread_timeout = unread_timeout
        self._deadline: asyncio.TimerHandle | None = None
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    # uvicorn's calls: its reasons, and the transport's, each hold reading on their own.
    def pause_reading(self) -> None:
        self._held = True
        self._apply()

    def resume_reading(self) -> None:
        self._held = False
        self._apply()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._deadline is None:
            self._deadline = self._loop.call_later(self._unread_timeout, self._unread)
        self._apply()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stop()
        self._apply()

    def stop(self) -> None:
        """The client took what it was sent, or the connection is gone."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _apply(self) -> None:
        paused = self._held or self.write_paused
        if paused is not self.read_paused:
            self.read_paused = paused
            if paused:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def _unread(self) -> None:
        self._deadline = None
        transport = self._transport
        log.info("closed a connection that left %d bytes unread for %g s",
                 transport.get_write_buffer_size(), self._unread_timeout)
        transport.abort()


__all__ = ["WRITE_HIGH_WATER", "Backpressure"]
