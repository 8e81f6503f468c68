"""One gateway process of a cell: uvicorn on the shared socket, jobs sent to the core.

Spawned by the cell's supervisor (`api.cell`). It parses HTTP and JSON, authenticates and
validates, and sends each job over its link (`api.gateway.remote`); the hot route's plain
requests take the direct way, as in a single process. It holds no shared state and loads none
of the core's packages. When the link closes the core process died: the gateway keeps its
clients and their jobs, says it is not ready, and sends the jobs again to the core the
supervisor starts in its place. It ends with its supervisor (`die_with_parent`).
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from api.config import Settings, load_keys
from api.gateway.lifeline import die_with_supervisor, name_process
from api.gateway.remote import RemoteCore, RemoteRoute
from api.http import (
    CellConnections,
    ConnectionTally,
    Routes,
    http_app,
    on_sighup,
    server_config,
    settle_and_time,
)
from api.metrics import Metrics

log = logging.getLogger("batchgate.gateway")


def gateway_main(settings: Settings, link: str, sock: socket.socket, slot: int) -> None:
    """Entry point of a gateway process."""
    die_with_supervisor()
    name_process(f"batchgate-gw-{slot}")
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s gateway-{slot} %(name)s: %(message)s",
    )
    # The core process owns shutdown: SIGTERM and SIGINT also come to the whole process
    # group (systemd's control-group kill, Ctrl-C), and the core asks with STOP_SIGNAL.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the lifespan reloads keys on it
    metrics = Metrics()
    keys = load_keys(settings.keys, settings.admin_key)

    def core_lost() -> None:
        log.error("the link to the core closed; holding %d jobs for the next core",
                  len(core.jobs))

    core = RemoteCore(link, core_lost, resubmitted=metrics.resubmitted.inc)
    routes = Routes(core, settings, keys, metrics, gateway=slot)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        reloading = on_sighup(routes.reload_keys)  # the core process forwards its SIGHUP
        unwatch: Callable[[], None] | None = None
        try:
            try:
                await core.connect()
            except OSError:  # started while the cell restarts its core
                core.connect_later()
            unwatch = settle_and_time(metrics)
            yield
        finally:
            core.close()
            reloading()
            if unwatch is not None:
                unwatch()

    app, direct = http_app(routes, lifespan), RemoteRoute(routes, core)
    connections = CellConnections(ConnectionTally(connections_file(link)), slot,
                                  settings.max_connections)
    server = GatewayServer(server_config(app, settings, direct, connections))
    # Until now STOP_SIGNAL's default ended a gateway that had no client yet.
    signal.signal(STOP_SIGNAL, server.handle_exit)
    server.run(sockets=[sock])


def connections_file(link: str) -> Path:
    """Where the core keeps the cell's count of connections: beside the link."""
    return Path(link).with_name("connections")


STOP_SIGNAL = signal.SIGUSR1  # from the supervisor: finish what this gateway holds, then exit


class GatewayServer(uvicorn.Server):
    """uvicorn's server, stopped by the supervisor alone. SIGTERM and SIGINT reach a gateway with
    its whole process group while the core still serves the gateway's clients: a gateway
    that stopped at once would be restarted during the drain, and the connections queued on
    the shared socket reset when the core closes it."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == STOP_SIGNAL:  # not re-raised at exit as uvicorn does with its own
            self.should_exit = True


__all__ = ["STOP_SIGNAL", "GatewayServer", "connections_file", "gateway_main"]
