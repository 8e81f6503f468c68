"""How many connections the server holds, counted where `--max-connections` applies: in the
one process, or across all of a cell's gateways.

A cell's gateways accept from one shared listening socket, and the kernel hands connections
to whichever gateway asks first, unevenly: counted per gateway, the limit would hold K times
over, or refuse at one gateway while another holds none. So a cell counts in a
`ConnectionTally`: a small file in the cell's scratch folder, mapped by every gateway, one
slot per gateway that only its gateway changes, read and changed under a POSIX record lock.
The kernel drops that lock with a process that dies holding it; a dead gateway's
connections died with it too, and the core forgets its slot (`ConnectionTally.forget`)
before starting another in its place.
"""

from __future__ import annotations

import mmap
import os
import struct
from fcntl import LOCK_EX, LOCK_UN, lockf
from pathlib import Path
from typing import Protocol

_SLOT = struct.Struct("q")


class Connections(Protocol):
    """The count a connection takes a place in when it opens and leaves when it closes."""

    def enter(self) -> bool:
        """Take a place: False when the server holds as many connections as it takes."""

    def leave(self) -> None:
        """Give back a place `enter` took."""


class LocalConnections:
    """One process's count."""

    def __init__(self, limit: int) -> None:
        self._limit, self._held = limit, 0

    def enter(self) -> bool:
        if self._held >= self._limit:
            return False
        self._held += 1
        return True

    def leave(self) -> None:
        self._held -= 1

    def held(self) -> int:
        return self._held


class ConnectionTally:
    """A cell's count: the connections each gateway (slot) holds, shared by every process
    that opens the same file. `create` it once, before any gateway opens it."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, os.fstat(self._fd).st_size)
        self._slots = len(self._map) // _SLOT.size
        self._all = struct.Struct(f"{self._slots}q")

    @classmethod
    def create(cls, path: Path, slots: int) -> ConnectionTally:
        path.write_bytes(bytes(_SLOT.size * slots))
        return cls(path)

    def enter(self, slot: int, limit: int) -> bool:
        """Take a place for `slot` if the whole cell holds fewer than `limit`."""
        lockf(self._fd, LOCK_EX)  # two system calls; held for a microsecond
        try:
            if sum(self._all.unpack_from(self._map)) >= limit:
                return False
            self._add(slot, 1)
            return True
        finally:
            lockf(self._fd, LOCK_UN)

    def leave(self, slot: int) -> None:
        lockf(self._fd, LOCK_EX)
        try:
            self._add(slot, -1)
        finally:
            lockf(self._fd, LOCK_UN)

    def forget(self, slot: int) -> None:
        """A dead gateway's share: its connections closed with it."""
        lockf(self._fd, LOCK_EX)
        try:
            _SLOT.pack_into(self._map, slot * _SLOT.size, 0)
        finally:
            lockf(self._fd, LOCK_UN)

    def held(self) -> int:
        lockf(self._fd, LOCK_EX)
        try:
            return sum(self._all.unpack_from(self._map))
        finally:
            lockf(self._fd, LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def _add(self, slot: int, n: int) -> None:
        offset = slot * _SLOT.size
        (value,) = _SLOT.unpack_from(self._map, offset)
        _SLOT.pack_into(self._map, offset, value + n)


class CellConnections:
    """One gateway's view of its cell's `ConnectionTally`."""

    def __init__(self, tally: ConnectionTally, slot: int, limit: int) -> None:
        self._tally, self._slot, self._limit = tally, slot, limit

    def enter(self) -> bool:
        return self._tally.enter(self._slot, self._limit)

    def leave(self) -> None:
        self._tally.leave(self._slot)


__all__ = ["CellConnections", "ConnectionTally", "Connections", "LocalConnections"]
