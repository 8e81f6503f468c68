"""The Starlette application factory; its lifespan owns the service's task group."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import NamedTuple

import anyio
from anyio.abc import TaskStatus
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from api.access_log import with_access_log
from api.auth import KeyRing, load_keys
from api.direct import DirectRoute, LocalRoute
from api.door import Door
from api.errors import error_response, to_api_error
from api.fastpath import with_fast_path
from api.metrics import Metrics
from api.openapi import openapi_routes
from api.routes import Routes
from api.service import Service
from api.settings import Settings
from batcher import BatchgateError

log = logging.getLogger("batchgate.app")


def create_app(settings: Settings, keys: KeyRing | None = None, gpus: int = 0) -> ASGIApp:
    """Build the app; the workers start (and are waited for) in the lifespan."""
    return build(settings, keys, gpus).app


class Built(NamedTuple):
    app: ASGIApp
    service: Service  # the server tells it when it is leaving
    direct: DirectRoute | None  # for the HTTP protocol: the hot route without ASGI


def build(settings: Settings, keys: KeyRing | None = None, gpus: int = 0) -> Built:
    """The app, the service it serves, and the hot route's direct way (none while the
    access log, an ASGI middleware, is on)."""
    metrics = Metrics()
    keys = keys or load_keys(settings.keys, settings.admin_key)
    service = Service(settings, metrics, keys.tiers, gpus=gpus)
    door = Door(service, metrics)
    routes = Routes(door, settings, keys, metrics)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        unwatch = metrics.watch_gc()
        reloading = on_sighup(routes.reload_keys)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(supervised, service.run, os._exit)
                settle_heap()
                yield
                log.info("draining")
                await service.drain()
                tg.cancel_scope.cancel()
        finally:
            reloading()
            unwatch()
        log.info("stopped")

    app, direct = served(routes, lifespan, settings, lambda: LocalRoute(routes, door))
    return Built(app, service, direct)


Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def http_app(routes: Routes, lifespan: Lifespan) -> ASGIApp:
    """The HTTP surface over `routes`, the same in a single process and in a gateway."""
    app = Starlette(
        routes=[
            Route("/v1/batchstring", routes.batchstring, methods=["POST"]),
            Route("/healthz", routes.healthz, methods=["GET"]),
            Route("/readyz", routes.readyz, methods=["GET"]),
            Route("/metrics", routes.metrics_text, methods=["GET"]),
            Route("/admin/workers", routes.admin_workers, methods=["GET"]),
            *openapi_routes(routes.limits),
        ],
        exception_handlers={HTTPException: _http_error, BatchgateError: _refused,
                            Exception: _internal_error},
        lifespan=lifespan,
    )
    return with_fast_path(app, routes.batchstring)


def served(routes: Routes, lifespan: Lifespan, settings: Settings,
           direct: Callable[[], DirectRoute]) -> tuple[ASGIApp, DirectRoute | None]:
    """The ASGI app and the hot route's direct way beside it, in a single process or a
    gateway. No direct way while the access log, an ASGI wrapper, is on."""
    app = http_app(routes, lifespan)
    if settings.access_log == "json":
        return with_access_log(app, lambda: routes.keys), None
    return app, direct()


def on_sighup(reload: Callable[[], None]) -> Callable[[], object]:
    """Run `reload` on SIGHUP (keys files are re-read without a restart; SIGHUP's default
    would end the process). Returns the undo."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload)
    return lambda: loop.remove_signal_handler(signal.SIGHUP)


EXIT_CORE_FAILED = 70  # EX_SOFTWARE: the dispatch core stopped on an error


class _Watched:
    """A task status that remembers whether the task reported itself started."""

    def __init__(self, outer: TaskStatus[None]) -> None:
        self.outer, self.up = outer, False

    def started(self, value: None = None) -> None:
        self.up = True
        self.outer.started(value)


async def supervised(
    run: Callable[..., Awaitable[None]], die: Callable[[int], object],
    *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service; once it is up, its failure ends the process. The lifespan's task
    group cannot: it sits at `yield` while uvicorn serves, so a dead pool or owner once
    left a server answering 503 forever with /healthz at 200. A non-zero exit lets whatever
    supervises the server restart it. A failure while starting still raises (uvicorn then
    reports the lifespan's failure and exits)."""
    watched = _Watched(task_status)
    try:
        await run(task_status=watched)
    except Exception:
        if not watched.up:
            raise
        log.critical("the dispatch core stopped on an error; exiting with status %d so that "
                     "a supervisor restarts the server", EXIT_CORE_FAILED, exc_info=True)
        die(EXIT_CORE_FAILED)


GC_THRESHOLDS = (2_500, 100, 10)
"""The collector's thresholds once serving. Request handling makes no cyclic garbage
(checked with `gc.DEBUG_SAVEALL` under load) and closed connections are freed as they close,
so a collection only walks live state, at 0.3-0.4 us an object on these cores: the
connections that opened since the last one (about 20 objects each) and the requests in flight
(about 15 each on the direct way, `api.direct`). Young: the default (700 net allocations)
fired ~20 times a second at 800 RPS, because answers are freed in bursts of a whole batch
(decrements lost at the counter's floor) while arrivals allocate smoothly; 2,500 leaves
collections to real growth, and splits the growth of a load's arrival (its ~170 connections
and 160 requests at 800 RPS) into two collections of 0.6-0.8 ms where 5,000 made one of
1.4-2.1 ms (three runs each). Older: a collection of generation 1 walks everything that
survived a young one, the open connections and the requests in flight, 3-5 ms under load;
at 100 young collections apiece it comes every few minutes. Full collections (of what is not
frozen) as before, every 1,000 young ones."""


def settle_heap() -> None:
    """Start-up is over: move every object alive now (modules, app, settings) out of the
    collector's reach, so that a collection walks only what requests allocate. Nothing here
    is garbage anyway; freezing it costs no memory."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail), exc.headers)


async def _refused(request: Request, exc: Exception) -> Response:
    """An error of batchgate's own outside the hot route, as a gateway's call to a core that
    stopped answering: its status and code, as on the hot route."""
    err = to_api_error(exc)
    return error_response(err.status, err.code, err.message, err.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal", "internal error")


__all__ = ["Built", "build", "create_app", "http_app", "served", "settle_heap"]
