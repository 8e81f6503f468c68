"""A cell's gateway processes: spawned on the shared listening socket, watched through their
sentinels, restarted with the pool's backoff when they die, stopped on the way out."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio

from api.cell.scratch import retire_metrics
from api.config import Settings
from api.gateway import STOP_SIGNAL, connections_file, gateway_main
from api.http import ConnectionTally
from batcher.shared import Backoff

log = logging.getLogger("batchgate.cell")

STOP_GRACE_S = 30.0


class GatewayState(enum.Enum):
    STARTING = "starting"  # not spawned yet
    RUNNING = "running"
    RESTARTING = "restarting"  # dead, waiting out its backoff
    STOPPED = "stopped"


@dataclass(slots=True)
class _Gateway:
    slot: int
    process: BaseProcess | None = None
    restarts: int = 0
    failures: int = 0  # deaths in a row, for the backoff
    started_at: float = 0.0  # on the loop's clock
    state: GatewayState = GatewayState.STARTING


class Gateways:
    """Spawns the gateway processes, watches each one's sentinel, restarts the dead."""

    def __init__(self, settings: Settings, link: str, sock: socket.socket,
                 backoff: Backoff | None = None,
                 target: Callable[[Settings, str, socket.socket, int], None] = gateway_main,
                 changed: Callable[[], None] | None = None) -> None:
        """`target` is what each process runs (a test's own, importable under spawn);
        `changed` is called when a gateway starts, dies or stops."""
        self._settings, self._link, self._sock = settings, link, sock
        self._changed = changed or _nothing
        self._backoff = backoff or Backoff()  # the worker pool's
        self._target = target
        self._ctx = multiprocessing.get_context("spawn")
        self._slots = [_Gateway(i) for i in range(settings.gateways)]
        self._stopping = False
        self._all_stopped = anyio.Event()
        self._tally: ConnectionTally | None = None

    def start(self) -> None:
        """Spawn every gateway, with the count of connections they share."""
        self._tally = ConnectionTally.create(connections_file(self._link), len(self._slots))
        for slot in self._slots:
            self._spawn(slot)

    def reload_keys(self) -> None:
        """SIGHUP: authentication happens in the gateways; each re-reads the keys file."""
        for slot in self._slots:
            if slot.state is GatewayState.RUNNING and slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid or 0, signal.SIGHUP)

    def info(self) -> list[dict[str, Any]]:
        return [
            {"slot": g.slot, "pid": g.process.pid if g.process else None,
             "state": g.state.value, "restarts": g.restarts}
            for g in self._slots
        ]

    def _spawn(self, slot: _Gateway) -> None:
        process = self._ctx.Process(
            target=self._target, args=(self._settings, self._link, self._sock, slot.slot),
            name=f"batchgate-gateway-{slot.slot}",
        )
        process.start()
        loop = asyncio.get_running_loop()
        slot.process, slot.state, slot.started_at = process, GatewayState.RUNNING, loop.time()
        loop.add_reader(process.sentinel, self._exited, slot, process)
        log.info("gateway %d started (pid %s)", slot.slot, process.pid)
        self._changed()

    def _exited(self, slot: _Gateway, process: BaseProcess) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        process.join(timeout=1)
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")  # set by multiprocess_metrics
        if folder and process.pid is not None:
            retire_metrics(process.pid, Path(folder))
        if self._stopping:
            slot.state = GatewayState.STOPPED
            if all(g.state is GatewayState.STOPPED for g in self._slots):
                self._all_stopped.set()
            self._changed()
            return
        if self._tally is not None:  # its connections closed with it
            self._tally.forget(slot.slot)
        slot.failures = self._backoff.after_exit(slot.failures, loop.time() - slot.started_at)
        delay = self._backoff.delay(slot.failures)
        log.warning("gateway %d (pid %s) exited with %s; restarting in %.1f s", slot.slot,
                    process.pid, process.exitcode, delay)
        slot.state, slot.restarts = GatewayState.RESTARTING, slot.restarts + 1
        loop.call_later(delay, self._restart, slot)
        self._changed()

    def _restart(self, slot: _Gateway) -> None:
        if not self._stopping:
            self._spawn(slot)

    async def stop(self) -> None:
        """Ask every gateway to stop (uvicorn finishes what it holds), wait, kill stragglers.

        No gateway starts again, so this process's copy of the listening socket closes
        first: once the gateways close theirs the port refuses new connections, where it
        would have queued them for nobody and reset them all when this process exits."""
        self._stopping = True
        self._sock.close()
        for slot in self._slots:
            if slot.state is not GatewayState.RUNNING:  # not started, or in its backoff
                slot.state = GatewayState.STOPPED
            elif slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid or 0, STOP_SIGNAL)
        if all(g.state is GatewayState.STOPPED for g in self._slots):
            self._all_stopped.set()
        with anyio.move_on_after(STOP_GRACE_S):
            await self._all_stopped.wait()  # each exit is seen through its sentinel
        for slot in self._slots:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
                slot.process.join(timeout=5)
            slot.state = GatewayState.STOPPED
        if self._tally is not None:
            self._tally.close()
            self._tally = None


def _nothing() -> None:
    pass


__all__ = ["STOP_GRACE_S", "GatewayState", "Gateways"]
