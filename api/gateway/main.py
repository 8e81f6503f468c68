"""One gateway process of a cell: uvicorn on the shared socket, jobs sent to the core.

Spawned by the cell's supervisor (`api.cell`). It parses HTTP and JSON, authenticates and
validates, and sends each job over its link (`api.gateway.remote`); the hot route's plain
requests take the direct way, as in a single process. It holds no shared state and loads none
of the core's packages. When the link closes the core process died: the gateway keeps its
clients and their jobs, says it is not ready, and sends the jobs again to the core the
supervisor starts in its place. It hears its supervisor over its lifeline
(`api.gateway.lifeline`: STOP, RELOAD, its beats) and ends with it; while the supervisor
is silent it says it is not ready.
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
from api.gateway.lifeline import CellStatus, ChildEnd, Lifeline, Order, name_process
from api.gateway.remote import RemoteCore, RemoteRoute
from api.http import (
    CellConnections,
    ConnectionTally,
    Routes,
    http_app,
    server_config,
    settle_and_time,
)
from api.metrics import Metrics
from api.oip import infer_call, oip_routes, serving_grpc
from api.stream import StreamRoute
from batcher.tracing import Tracing

log = logging.getLogger("batchgate.gateway")


def gateway_main(settings: Settings, link: str, sock: socket.socket, slot: int,
                 lifeline: Lifeline) -> None:
    """Entry point of a gateway process."""
    lifeline.hold()
    name_process(f"batchgate-gw-{slot}")
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s gateway-{slot} %(name)s: %(message)s",
    )
    # The supervisor owns shutdown and reloads, and asks over the lifeline: SIGTERM, SIGINT
    # and SIGHUP also come to the whole process group (systemd's control-group kill, Ctrl-C,
    # a terminal's hang-up).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    metrics = Metrics()
    keys = load_keys(settings.keys, settings.admin_key)

    stopping = False  # the supervisor said STOP: the core closes the link as the cell stops

    def core_lost() -> None:
        if stopping and not core.jobs:
            log.info("the link to the core closed as the cell stops")
            return
        log.error("the link to the core closed; holding %d jobs for the next core",
                  len(core.jobs))

    supervisor: ChildEnd | None = None  # its end of the lifeline, once this loop runs

    def kept() -> bool:  # the supervisor is heard: a dead core would be restarted
        return supervisor is None or not supervisor.silent()

    core = RemoteCore(link, core_lost, resubmitted=metrics.resubmitted.inc, kept=kept)
    tracing = Tracing.of(settings.otlp_endpoint, "gateway", settings.otlp_sample)
    routes = Routes(core, settings, keys, metrics, gateway=slot, tracing=tracing)
    routes.streamed = StreamRoute(routes)

    def heard(message: Order | CellStatus) -> None:
        nonlocal stopping
        if message is Order.STOP:  # finish what this gateway holds, then exit
            stopping = True
            server.stop()
        elif message is Order.RELOAD:
            routes.reload_keys()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal supervisor
        supervisor = await lifeline.listen(heard)
        unwatch: Callable[[], None] | None = None
        try:
            try:
                await core.connect()
            except OSError:  # started while the cell restarts its core
                core.connect_later()
            unwatch = settle_and_time(metrics)
            async with serving_grpc(routes, settings, reuse_port=True):  # one port, K gateways
                yield
        finally:
            core.close()
            supervisor.close()
            if unwatch is not None:
                unwatch()
            if tracing is not None:
                tracing.shutdown()

    app, direct = http_app(routes, lifespan, oip_routes(routes)), RemoteRoute(routes, core)
    direct.shapes = infer_call  # /v2's infer on the direct way too
    connections = CellConnections(ConnectionTally(connections_file(link)), slot,
                                  settings.max_connections)
    server = GatewayServer(server_config(app, settings, direct, connections))
    server.run(sockets=[sock])


def connections_file(link: str) -> Path:
    """Where the core keeps the cell's count of connections: beside the link."""
    return Path(link).with_name("connections")


class GatewayServer(uvicorn.Server):
    """uvicorn's server, stopped by the supervisor alone (`stop`). SIGTERM and SIGINT reach a
    gateway with its whole process group while the core still serves the gateway's clients:
    a gateway that stopped at once would be restarted during the drain, and the connections
    queued on the shared socket reset when the core closes it. None is raised again at exit,
    as uvicorn does with its own."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        pass

    def stop(self) -> None:
        """The supervisor's STOP: finish what this gateway holds, then exit."""
        self.should_exit = True


__all__ = ["GatewayServer", "connections_file", "gateway_main"]
