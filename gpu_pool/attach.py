"""The next core's side of `gpu_pool.lasting`: find the live workers a dead core left in the
cell's workers folder, and watch each as the pool watches the processes it spawned.

A worker found is a child of the cell's supervisor (the core's own parent): anything else
in the folder (a socket left by a worker that died, a pid reused since) is removed and never
signalled. A found worker is not this process's child, so it is watched through a pidfd, which
becomes readable when it exits as a spawned process's sentinel does; its exit code is not
ours to read, and the supervisor reaps it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("batchgate.pool")


@dataclass(frozen=True, slots=True)
class Found:
    """A live worker an earlier core started for slot `slot`, listening at `path`."""

    slot: int
    pid: int
    path: Path


def attachable(folder: str, slots: Collection[int]) -> dict[int, Found]:
    """The live worker listening in `folder` (a child of this process's parent, the cell's
    supervisor) for each of `slots`; others are ended, what else is there removed."""
    found: dict[int, Found] = {}
    keeper = os.getppid()
    Path(folder).mkdir(parents=True, exist_ok=True)
    for one in listening(Path(folder)):
        if parent_of(one.pid) != keeper:
            with contextlib.suppress(OSError):
                one.path.unlink()
        elif one.slot in slots and one.slot not in found:
            found[one.slot] = one
        else:
            leave(one)
    if found:
        log.info("found %d live workers of an earlier core: attaching to them", len(found))
    return found


def listening(folder: Path) -> list[Found]:
    """What the sockets in `folder` say listens there (`gpu_pool.lasting.Stay.path` names
    them `<slot>-<pid>.sock`), slot by slot, live or not; a name of another shape is
    removed."""
    found = []
    for path in sorted(folder.glob("*.sock")):
        slot, _, pid = path.stem.partition("-")
        if slot.isdigit() and pid.isdigit():
            found.append(Found(int(slot), int(pid), path))
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def stat_of(pid: int) -> tuple[str, int] | None:
    """`pid`'s state letter ("Z": exited, not reaped) and parent; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and parens
    return fields[0], int(fields[1])


def parent_of(pid: int) -> int:
    """`pid`'s parent; -1 when it is gone (or a zombie: it holds nothing to attach to)."""
    stat = stat_of(pid)
    return -1 if stat is None or stat[0] == "Z" else stat[1]


class AttachedProcess:
    """A worker another core started, with the surface of `multiprocessing`'s process that
    the pool uses. ProcessLookupError when it is gone already."""

    exitcode: int | None = None  # not our child: its exit code is the supervisor's

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.pidfd_open(pid)

    @property
    def sentinel(self) -> int:
        """Readable once the process has exited."""
        return self._fd

    def is_alive(self) -> bool:
        return self._fd >= 0 and not select.select([self._fd], [], [], 0)[0]

    def join(self, timeout: float | None = None) -> None:
        if self._fd >= 0:
            select.select([self._fd], [], [], timeout)

    def kill(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    def close(self) -> None:
        """Give the pidfd back, once nothing watches it any more (then it reads as gone)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def leave(found: Found) -> None:
    """End a found worker the pool will not take (no slot for it, or a version it does
    not name), and remove its socket."""
    with contextlib.suppress(OSError):
        process = AttachedProcess(found.pid)
        process.kill()
        process.close()
    with contextlib.suppress(OSError):
        found.path.unlink()


__all__ = ["AttachedProcess", "Found", "attachable", "leave", "listening", "parent_of",
           "stat_of"]
