"""A cell's child process and its supervisor: what the child is given, the one channel
between them, and the child's end with the supervisor's.

Each child (the core, a gateway) is spawned with a `Lifeline` as its last argument: the
supervisor's pid, the child's end of their channel, and its incarnation (0 for the first
child in its place, one more at each restart). The channel is a duplex pipe of framed
messages (`batcher.shared.Framed`): the supervisor sends `Order`s and, to the core, the
`CellStatus` it shows on `/admin/workers`; the child reports `Report.UP` once it serves.
Nothing else reaches a child: no signal, no file, no variable set for it.

The supervisor also sends a BEAT every `BEAT_S`. A supervisor that stopped (SIGSTOP, a
debugger, a host that swaps it out) keeps its end open and says nothing: a child that
heard nothing for `SILENT_S` is not ready (`ChildEnd.silent`), for a core or gateway that
died meanwhile would stay dead.

The supervisor holds nothing a client needs, but it is the only one that restarts a dead
core or gateway and stops them all: a child it leaves behind (the supervisor SIGKILLed, or
by the OOM killer) would hold the listening port, or the GPUs, for nobody, and a server
started again could not bind. Linux sends a child the signal asked for here when its parent
dies (`PR_SET_PDEATHSIG`); elsewhere this does nothing.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from batcher.shared import Framed, die_with_parent, name_process, prctl

log = logging.getLogger("batchgate.lifeline")

BEAT_S = 0.5  # how often the supervisor says it is there
SILENT_S = 2.0  # a supervisor silent this long is stopped or stuck: /readyz 503


class Order(enum.Enum):
    """What the supervisor tells a child."""

    LEAVE = "leave"  # the core: /readyz 503 on every gateway, which go on serving
    STOP = "stop"  # finish what is held, then exit (the core: once the gateways have stopped)
    RELOAD = "reload"  # re-read the keys file (a gateway) or the models file (the core)
    BEAT = "beat"  # the supervisor is there (`ChildEnd` takes it; `heard` never sees it)


class Report(enum.Enum):
    """What a child tells its supervisor."""

    UP = "up"  # serving: the core once its workers are ready and its link listens


@dataclass(frozen=True, slots=True)
class CellStatus:
    """The supervisor's last word on the cell's processes, sent to the core at each change:
    what `/admin/workers` shows of them; and the files on disk it refused (`file`,
    `reason`: the cell serves the copies accepted before them), which `/admin/models` shows."""

    core: dict[str, Any] | None = None
    gateways: tuple[dict[str, Any], ...] = ()
    refused: tuple[dict[str, Any], ...] = ()

    def shown(self) -> dict[str, Any]:
        return {"gateways": list(self.gateways), "core": self.core}


@dataclass(frozen=True, slots=True)
class Lifeline:
    """What a cell's child is spawned with (it crosses to the child pickled, the channel's
    descriptor with it)."""

    supervisor: int  # its pid: the child ends with it
    channel: Connection  # the child's end; a plain blocking Connection until `listen`
    incarnation: int = 0  # 0, 1, 2, ...: the children that held this place before it

    def hold(self) -> None:
        """End (SIGKILL) with the supervisor."""
        die_with_parent(self.supervisor)

    async def listen(self, heard: Callable[[Order | CellStatus], None]) -> ChildEnd:
        """Take the channel over on the running loop: `heard` takes each message as it
        comes. OSError if its descriptor cannot be duplicated."""
        try:
            sock = socket.socket(fileno=os.dup(self.channel.fileno()))
        finally:
            self.channel.close()
        try:
            _, end = await asyncio.get_running_loop().connect_accepted_socket(
                lambda: ChildEnd(heard), sock=sock)
        except BaseException:
            sock.close()
            raise
        return end


class ChildEnd(Framed):
    """The child's end of its channel on the loop. Closed by the supervisor, it says so in
    the log: the child ends with the supervisor (`Lifeline.hold`) or is already stopping."""

    coalesce = False  # a plain Connection on the other end may read it (a test's child)

    def __init__(self, heard: Callable[[Order | CellStatus], None]) -> None:
        super().__init__()
        self._heard = heard
        self._loop = asyncio.get_running_loop()
        self._heard_at = self._loop.time()  # listening counts as hearing: it just spawned us
        self._silent = False

    def say(self, report: Report) -> None:
        self.send(report)

    def silent(self) -> bool:
        """Whether the supervisor said nothing for `SILENT_S` (stopped, or stuck)."""
        silent = self._loop.time() - self._heard_at > SILENT_S
        if silent != self._silent:
            self._silent = silent
            if silent:
                log.error("the supervisor has said nothing for %.0f s: not ready, since "
                          "nobody would restart a process of the cell that died", SILENT_S)
            else:
                log.warning("the supervisor is heard again")
        return silent

    def received(self, messages: list[Any]) -> None:
        self._heard_at = self._loop.time()
        for message in messages:
            if message is not Order.BEAT:
                self._heard(message)

    def connection_lost(self, exc: Exception | None) -> None:
        closing = self.transport is None or self.transport.is_closing()
        super().connection_lost(exc)
        if not closing:
            log.warning("the supervisor closed its channel")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


__all__ = ["BEAT_S", "SILENT_S", "CellStatus", "ChildEnd", "Lifeline", "Order", "Report",
           "die_with_parent", "name_process", "prctl"]
