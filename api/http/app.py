"""The HTTP surface as an ASGI app, and the uvicorn server that runs it: the same in a single
process and in a gateway, built in one place."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from api.config import Settings
from api.errors import error_response, to_api_error
from api.http.access_log import with_access_log
from api.http.connections import Connections
from api.http.direct import DirectRoute
from api.http.fastpath import with_fast_path
from api.http.openapi import openapi_routes
from api.http.protocol import ConnectionLimits, guarded_protocol
from api.http.routes import Routes
from api.metrics import Metrics
from batcher import BatchgateError

log = logging.getLogger("batchgate.http")

Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]


def http_app(routes: Routes, lifespan: Lifespan, extra: Sequence[BaseRoute] = ()) -> ASGIApp:
    """The HTTP surface over `routes`, the same in a single process and in a gateway;
    `extra`: routes mounted beside it (the Open Inference Protocol's `/v2`), in the OpenAPI
    document where they bring their part (`DocumentedRoute`)."""
    app = Starlette(
        routes=[
            # First: the router tries each in turn, and `/v1/batchstring` is mostly served
            # before it (`with_fast_path`), where the extra routes' infer is the busy one.
            *extra,
            Route("/v1/batchstring", routes.batchstring, methods=["POST"]),
            Route("/healthz", routes.healthz, methods=["GET"]),
            Route("/readyz", routes.readyz, methods=["GET"]),
            Route("/metrics", routes.metrics_text, methods=["GET"]),
            Route("/admin/workers", routes.admin_workers, methods=["GET"]),
            Route("/admin/models", routes.admin_models, methods=["GET"]),
            Route("/admin/models/{name}", routes.admin_models, methods=["PUT"]),
            Route("/admin/models/{name}/versions/{version}", routes.admin_models,
                  methods=["DELETE"]),
            Route("/admin/models/{name}/overrides", routes.admin_models, methods=["DELETE"]),
            *openapi_routes(routes.limits, extra),
        ],
        exception_handlers={HTTPException: _http_error, BatchgateError: _refused,
                            Exception: _internal_error},
        lifespan=lifespan,
    )
    # A path with a slash too many is a 404 like any other: Starlette's redirect would be
    # no JSON, and its Location is built from the request's own Host header.
    app.router.redirect_slashes = False
    logged: ASGIApp = app
    if routes.access_log is not None:  # the hot route hands its own records
        logged = with_access_log(app, routes.access_log, lambda: routes.keys)
    return with_fast_path(logged, routes.batchstring)


def server_config(app: ASGIApp, settings: Settings, direct: DirectRoute | None,
                  connections: Connections | None = None) -> uvicorn.Config:
    """uvicorn's configuration for `app` on `settings`' address (a cell's gateway passes
    the shared socket to `Server.run(sockets=...)` instead, and its cell's `connections`)."""
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level,
        access_log=False, lifespan="on", timeout_graceful_shutdown=30, proxy_headers=False,
        http=guarded_protocol(ConnectionLimits.of(settings), direct, connections),
    )


def on_sighup(reload: Callable[[], None]) -> Callable[[], object]:
    """Run `reload` on SIGHUP (keys files are re-read without a restart; SIGHUP's default
    would end the process). Returns the undo."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload)
    return lambda: loop.remove_signal_handler(signal.SIGHUP)


GC_THRESHOLDS = (2_500, 100, 10)
"""The collector's thresholds once serving. Request handling makes no cyclic garbage, so a
collection only walks live state: the connections opened since the last one and the
requests in flight. Young: the default fires many times a second under load, because
answers are freed in bursts of a whole batch while arrivals allocate smoothly; a higher
threshold leaves collections to real growth, split into pauses short enough to stay under
the 2 ms the benchmarks hold them to. Older generations walk every open connection, so they
wait for many young collections. The figures behind these numbers are in
docs/benchmarks.md."""


def settle_heap() -> None:
    """Start-up is over: move every object alive now (modules, app, settings) out of the
    collector's reach, so that a collection walks only what requests allocate. Nothing here
    is garbage anyway; freezing it costs no memory."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def settle_and_time(metrics: Metrics) -> Callable[[], None]:
    """`settle_heap`, then time every later collection (returns the undo): start-up's own
    collection is no pause under load, and left in the histogram it read as its P99."""
    settle_heap()
    return metrics.watch_gc()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "invalid_request" if exc.status_code < 500 else "internal")
    return error_response(code, str(exc.detail), exc.headers)


async def _refused(request: Request, exc: Exception) -> Response:
    """An error of batchgate's own outside the hot route, as a gateway's call to a core that
    stopped answering: its status and code, as on the hot route."""
    err = to_api_error(exc)
    return error_response(err.code, err.message, err.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return error_response("internal", "internal error")


__all__ = ["GC_THRESHOLDS", "Lifespan", "http_app", "on_sighup", "server_config",
           "settle_and_time", "settle_heap"]
