"""The parent's end of a worker's pipe, read and written without ever blocking the loop.

The worker keeps a plain, blocking `multiprocessing.Connection`; this end is the same
socket (a duplex `multiprocessing.Pipe()` is a socketpair) taken over by the event loop as
a stream transport speaking `batcher.Framed`'s frames, one message to a frame, as the
worker's `Connection` does. `Connection.send` and `recv` on a descriptor that the loop
watches fail with EAGAIN as soon as a message outgrows the socket buffer, and the pool took
that for the worker's death; here a long message is written as the pipe drains and read as
it arrives, in pieces.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from batcher.shared import Framed


class WorkerPipe(Framed):
    """A worker's pipe on the parent's side: `send` a message, `on_messages` takes what
    arrives. The worker's end closing (it exited), a broken pipe or a stream that cannot be
    read is reported once through `on_lost`, at once; the owner treats it as the worker's
    death."""

    coalesce = False  # the worker's `Connection.recv` takes one object per frame

    def __init__(self, on_messages: Callable[[list[Any]], None],
                 on_lost: Callable[[], None]) -> None:
        super().__init__()
        self._on_messages = on_messages
        self._on_lost: Callable[[], None] | None = on_lost

    def received(self, messages: list[Any]) -> None:
        self._on_messages(messages)

    def eof_received(self) -> bool:
        self._lost()  # now, not once the transport has closed
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._lost()

    def rebind(self, on_messages: Callable[[list[Any]], None],
               on_lost: Callable[[], None]) -> None:
        """From now on report to these: the same worker, another owner (parked, woken)."""
        self._on_messages, self._on_lost = on_messages, on_lost

    def close(self) -> None:
        """Drop what is unsent and close this end, reporting nothing: the owner knows."""
        self._on_lost = None
        if self.transport is not None:
            self.transport.abort()

    def finish(self, last: object) -> None:
        """Send `last`, then close this end once it is written, reporting nothing and
        reading nothing more: the owner let the worker go."""
        self._on_lost = None
        self.send(last)
        if self.transport is not None:
            self.transport.close()

    def _lost(self) -> None:
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost()


async def open_pipe(conn: Connection, on_messages: Callable[[list[Any]], None],
                    on_lost: Callable[[], None]) -> WorkerPipe:
    """Take `conn` (the parent's end of a duplex pipe) over as a `WorkerPipe` on the running
    loop. `conn` is closed on return, whatever happens: the pipe owns a duplicate of its
    descriptor, closed with it. OSError if the descriptor cannot be duplicated."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    finally:
        conn.close()
    try:
        _, pipe = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: WorkerPipe(on_messages, on_lost), sock=sock)
    except BaseException:
        sock.close()
        raise
    return pipe


async def open_socket(path: str, on_messages: Callable[[list[Any]], None],
                      on_lost: Callable[[], None]) -> WorkerPipe:
    """Connect to a live worker listening at `path` (`gpu_pool.lasting`), as a `WorkerPipe`;
    OSError when nothing listens there."""
    _, pipe = await asyncio.get_running_loop().create_unix_connection(
        lambda: WorkerPipe(on_messages, on_lost), path)
    return pipe


__all__ = ["WorkerPipe", "open_pipe", "open_socket"]
