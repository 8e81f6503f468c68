"""One gateway process of a cell: uvicorn on the shared socket, jobs sent to the core.

Spawned by `api/cell.py`. It parses HTTP and JSON, authenticates and validates, and sends
each job over its link (`api/link.py`); the hot route's plain requests take the direct way
(`api/direct.py`), as in a single process. It holds no shared state. When the link closes the
core is gone, and the gateway exits at once: a gateway without its core can only refuse.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from api.settings import Settings

log = logging.getLogger("batchgate.gateway")


def gateway_main(settings: Settings, link: str, sock: socket.socket, slot: int) -> None:
    """Entry point of a gateway process."""
    import uvicorn

    from api.app import on_sighup, served, settle_heap
    from api.auth import load_keys
    from api.direct import RemoteRoute
    from api.http_guard import guarded_protocol
    from api.link import RemoteCore
    from api.metrics import Metrics
    from api.routes import Routes

    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s gateway-{slot} %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the core process owns shutdown
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the lifespan reloads keys on it
    metrics = Metrics()
    keys = load_keys(settings.keys, settings.admin_key)
    server: uvicorn.Server | None = None

    def core_lost() -> None:
        log.error("the link to the core closed; exiting")
        if server is not None:
            server.should_exit = server.force_exit = True

    core = RemoteCore(link, core_lost)

    routes = Routes(core, settings, keys, metrics, gateway=slot)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        unwatch = metrics.watch_gc()
        reloading = on_sighup(routes.reload_keys)  # the core process forwards its SIGHUP
        try:
            await core.connect()
            settle_heap()
            yield
        finally:
            reloading()
            unwatch()

    app, direct = served(routes, lifespan, settings, lambda: RemoteRoute(routes, core))
    config = uvicorn.Config(
        app, log_level=settings.log_level, access_log=False, lifespan="on",
        timeout_graceful_shutdown=30, proxy_headers=False,
        http=guarded_protocol(settings.connection_limits, direct),
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])


__all__ = ["gateway_main"]
