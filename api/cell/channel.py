"""The supervisor's end of a child's channel (`api.gateway.Lifeline` is the child's).

Read on the loop as frames arrive, and read to the end at once when the child is gone:
a report it wrote just before it died (UP, then a crash) is read before its death is
handled, whichever of the two the loop saw first. Written without ever blocking: a child
that stopped reading (a core stopped, or stuck in a long turn) leaves what it has not taken
here, and the supervisor goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection

from batcher.shared import READ_CHUNK, FrameReader, frame


class Channel:
    """`send` a message to the child; `heard` takes each message from it, in order."""

    def __init__(self, conn: Connection, heard: Callable[[object], None]) -> None:
        """Takes `conn` (the supervisor's end of a duplex pipe) over; it is closed here."""
        try:
            self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        finally:
            conn.close()
        self._sock.setblocking(False)
        self._heard = heard
        self._reader = FrameReader()
        self._unsent = bytearray()
        self._loop = asyncio.get_running_loop()
        self._open = True
        self._loop.add_reader(self._sock.fileno(), self._read)

    def send(self, message: object) -> None:
        """Queue `message`: written now as far as the socket takes it, the rest as it
        drains. Nothing once closed, or once the child's end is gone."""
        if not self._open:
            return
        waiting = bool(self._unsent)
        self._unsent += frame(message)
        if not waiting:
            self._write()

    def offer(self, message: object) -> None:
        """Send `message` only if nothing sent before it still waits: what a child that
        stopped reading would never take (a beat) piles up nowhere."""
        if not self._unsent:
            self.send(message)

    def drain(self) -> None:
        """The child is gone: read what it wrote and was not read yet, now."""
        while self._open and self._read():
            pass

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
        self._sock.close()
        self._unsent.clear()

    def _read(self) -> bool:
        """Read once; whether there may be more."""
        try:
            data = self._sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:  # the child's end closed: nothing more comes
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._sock.fileno())
            return False
        for message in self._reader.feed(data):
            self._heard(message)
        return True

    def _write(self) -> None:
        try:
            sent = self._sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the child's end closed: nobody reads it
            self._unsent.clear()
            sent = 0
        del self._unsent[:sent]
        fd = self._sock.fileno()
        if self._unsent:
            self._loop.add_writer(fd, self._write)
        else:
            self._loop.remove_writer(fd)


__all__ = ["Channel"]
