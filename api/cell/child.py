"""One child process of a cell, kept by the supervisor: the core and each gateway alike.

A child is spawned with its `Lifeline` (the supervisor's pid, its end of their channel, its
incarnation) as its last argument, watched through its sentinel and its channel, restarted
with backoff when it dies, and stopped with a grace then a kill:

```
STARTING --UP (or spawned, without a handshake)--> RUNNING --exit--> RESTARTING --backoff--+
   ^                                                                                        |
   +----------------------------------------------------------------------------------------+
any state --stop()--> STOPPED; a first child that dies before it is up --> STOPPED
```
"""

from __future__ import annotations

import asyncio
import enum
import logging
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio

from api.cell.channel import Channel
from api.cell.scratch import retire_metrics
from api.gateway import Lifeline, Order, Report
from batcher.shared import Backoff

log = logging.getLogger("batchgate.cell")


class ChildState(enum.StrEnum):
    STARTING = "starting"  # not spawned yet, or spawned and not up yet
    RUNNING = "running"
    RESTARTING = "restarting"  # dead, waiting out its backoff
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class Keeping:
    """How one kind of child is kept."""

    backoff: Backoff
    grace_s: float  # how long a child told to stop may finish what it holds: then killed
    handshake: bool = False  # up once it reports UP (the core); else once it is spawned
    at_once: int = 0  # deaths in a row restarted without waiting (the backoff after them)


class Child:
    """A child process kept alive: `target(*args, lifeline)` runs in it.

    `changed` is called whenever its state or its process changes; `exited` whenever its
    process exits (before any restart); `metrics`: the cell's metrics folder, where a dead
    process's files are folded into the retired totals."""

    def __init__(self, name: str, target: Callable[..., None], args: tuple[Any, ...],
                 keeping: Keeping, *, changed: Callable[[], None] | None = None,
                 exited: Callable[[], object] | None = None, metrics: Path | None = None
                 ) -> None:
        self.name, self._target, self._args, self._keeping = name, target, args, keeping
        self._changed, self._exited = changed or _nothing, exited or _nothing
        self._metrics = metrics
        self._ctx = multiprocessing.get_context("spawn")
        self.process: BaseProcess | None = None
        self.state = ChildState.STARTING
        self.incarnation = -1
        self.restarts = 0
        self.failures = 0  # deaths in a row, for the backoff
        self.up = False
        self._started_at = 0.0  # on the loop's clock
        self._channel: Channel | None = None
        self._restart: asyncio.TimerHandle | None = None
        self._leaving = self._stopping = False
        self._came_up = asyncio.Event()  # the current process is up
        self._gone = asyncio.Event()  # the current process exited

    def info(self) -> dict[str, Any]:
        pid = self.process.pid if self.process is not None else None
        return {"pid": pid, "state": self.state.value, "restarts": self.restarts,
                "incarnation": self.incarnation}

    async def start(self) -> bool:
        """Spawn the first process; whether it came up (False: it died first). Without a
        handshake it is up once spawned."""
        self._spawn()
        up, gone = (asyncio.ensure_future(e.wait()) for e in (self._came_up, self._gone))
        await asyncio.wait([up, gone], return_when=asyncio.FIRST_COMPLETED)
        came_up = up.done()  # not `up`: one that came up and died at once may be
        for waiting in (up, gone):  # restarting already, its successor not yet up
            waiting.cancel()
        return came_up

    def tell(self, message: object) -> None:
        """Send `message` to the current process (none while it is restarting)."""
        if self._channel is not None:
            self._channel.send(message)

    def beat(self) -> None:
        """Tell the current process its supervisor is there (`Order.BEAT`); dropped while
        it has not read what came before."""
        if self._channel is not None:
            self._channel.offer(Order.BEAT)

    def leave(self) -> None:
        """Tell the child it is leaving, and every later process once it is up."""
        self._leaving = True
        if self.up:
            self.tell(Order.LEAVE)

    async def stop(self) -> None:
        """Stop for good. A process that is up is told STOP and given the grace to finish
        what it holds, then killed; one not up yet holds nothing and is killed at once."""
        self._stopping = True
        if self._restart is not None:
            self._restart.cancel()
        process = self.process
        if process is None or self._gone.is_set():
            self._set(ChildState.STOPPED)
            return
        if self.up:
            self.tell(Order.STOP)
        else:
            process.kill()
        with anyio.move_on_after(self._keeping.grace_s):
            await self._gone.wait()
        if not self._gone.is_set():
            log.error("%s did not stop within %.0f s; killing it", self.name,
                      self._keeping.grace_s)
            process.kill()
            await self._gone.wait()

    def _spawn(self) -> None:
        self.incarnation += 1
        parent, child = self._ctx.Pipe()
        lifeline = Lifeline(os.getpid(), child, self.incarnation)
        process = self._ctx.Process(target=self._target, args=(*self._args, lifeline),
                                    name=self.name)
        process.start()
        child.close()
        loop = asyncio.get_running_loop()
        channel = self._channel = Channel(parent, self._heard)
        self.process, self._started_at = process, loop.time()
        self._came_up.clear()
        self._gone.clear()
        self.up = False
        loop.add_reader(process.sentinel, self._ended, process, channel)
        log.info("%s started (pid %s, incarnation %d)", self.name, process.pid,
                 self.incarnation)
        if self._keeping.handshake:
            self._set(ChildState.STARTING)
        else:
            self._now_up()

    def _heard(self, message: object) -> None:
        if message is Report.UP and not self.up:
            self._now_up()

    def _now_up(self) -> None:
        self.up = True
        self._came_up.set()
        if self._leaving:  # came up after the leave began
            self.tell(Order.LEAVE)
        self._set(ChildState.RUNNING)

    def _ended(self, process: BaseProcess, channel: Channel) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        channel.drain()  # what it said before it died counts (UP, then a crash)
        channel.close()
        self._channel = None
        process.join(timeout=1)
        self._exited()
        if self._metrics is not None and process.pid is not None:
            retire_metrics(process.pid, self._metrics)
        self._gone.set()
        if self._stopping or (not self.up and self.incarnation == 0):
            self._set(ChildState.STOPPED)  # stopped, or the first never came up: no restart
            return
        keeping = self._keeping
        self.failures = keeping.backoff.after_exit(self.failures, loop.time() - self._started_at)
        delay = 0.0 if self.failures <= keeping.at_once else keeping.backoff.delay(self.failures)
        log.error("%s (pid %s) exited with %s; starting another in %.1f s", self.name,
                  process.pid, process.exitcode, delay)
        self.up = False
        self.restarts += 1
        self._restart = loop.call_later(delay, self._again)
        self._set(ChildState.RESTARTING)

    def _again(self) -> None:
        self._restart = None
        if not self._stopping:
            self._spawn()

    def _set(self, state: ChildState) -> None:
        self.state = state
        self._changed()


def _nothing() -> None:
    pass


__all__ = ["Child", "ChildState", "Keeping"]
