"""A cell's gateway processes: each a `Child` spawned on its own listening socket of the
cell's port (the kernel spreads connections over them), up once spawned, restarted with
the pool's backoff when it dies, stopped on the way out."""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from api.cell.child import Child, Keeping
from api.config import Settings
from api.gateway import Order, connections_file, gateway_main
from api.http import ConnectionTally
from batcher.shared import Backoff

log = logging.getLogger("batchgate.cell")

STOP_GRACE_S = 30.0

GatewayTarget = Callable[..., None]
"""What a gateway process runs: `(settings, link, sock, slot, lifeline)`."""


class Gateways:
    """The gateway processes, and the count of connections they share."""

    def __init__(self, settings: Settings, link: str, socks: Sequence[socket.socket],
                 backoff: Backoff | None = None, target: GatewayTarget = gateway_main,
                 changed: Callable[[], None] | None = None,
                 metrics: Path | None = None) -> None:
        """`target` is what each process runs (a test's own, importable under spawn);
        `changed` is called when a gateway starts, dies or stops; `metrics`: the cell's
        metrics folder. `socks`: one listening socket per gateway, kept for its restarts
        (connections the kernel queued on it meanwhile wait for the next process)."""
        assert len(socks) == settings.gateways, "one listening socket per gateway"
        self._link, self._socks = link, list(socks)
        keeping = Keeping(backoff or Backoff(), STOP_GRACE_S)  # the worker pool's backoff
        self.children = [
            Child(f"batchgate-gateway-{slot}", target, (settings, link, sock, slot), keeping,
                  changed=changed, exited=functools.partial(self._exited, slot),
                  metrics=metrics)
            for slot, sock in enumerate(self._socks)]
        self._stopping = False
        self._tally: ConnectionTally | None = None

    async def start(self) -> None:
        """Spawn every gateway, with the count of connections they share."""
        self._tally = ConnectionTally.create(connections_file(self._link), len(self.children))
        for child in self.children:
            await child.start()

    def reload_keys(self) -> None:
        """SIGHUP: authentication happens in the gateways; each re-reads the keys file."""
        for child in self.children:
            if child.up:
                child.tell(Order.RELOAD)

    def info(self) -> list[dict[str, Any]]:
        return [{"slot": slot, "pid": child.info()["pid"], "state": child.state.value,
                 "restarts": child.restarts} for slot, child in enumerate(self.children)]

    def _exited(self, slot: int) -> None:
        if not self._stopping and self._tally is not None:  # its connections closed with it
            self._tally.forget(slot)

    async def stop(self) -> None:
        """Ask every gateway to stop (uvicorn finishes what it holds), wait, kill stragglers.

        No gateway starts again, so this process's copies of the listening sockets close
        first: once the gateways close theirs the port refuses new connections, where it
        would have queued them for nobody and reset them all when this process exits."""
        self._stopping = True
        for sock in self._socks:
            sock.close()
        async with anyio.create_task_group() as tg:
            for child in self.children:
                tg.start_soon(child.stop)
        if self._tally is not None:
            self._tally.close()
            self._tally = None


__all__ = ["STOP_GRACE_S", "GatewayTarget", "Gateways"]
