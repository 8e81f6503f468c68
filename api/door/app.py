"""The composition root of the core's side: `build_door` wires the service, the door and the
status views from the settings (a single process and a cell's core process alike), and
`build` makes the single process's app, whose lifespan owns the service's task group."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import anyio
from anyio.abc import TaskStatus
from starlette.applications import Starlette
from starlette.types import ASGIApp

from api.config import KeyRing, Settings, load_keys
from api.door.door import Door
from api.door.local import LocalCore, LocalRoute
from api.door.models import ModelsAdmin
from api.door.overrides import Overrides
from api.door.service import Service
from api.door.shared_limits import rate_step
from api.door.status import StatusView
from api.door.streams import StreamStart
from api.http import DirectRoute, Routes, http_app, on_sighup, settle_and_time
from api.kept import redis_client
from api.metrics import Metrics
from api.oip import infer_call, oip_routes, serving_grpc
from api.stream import StreamRoute
from batcher.tracing import Tracing
from gpu_pool import CellIdentity, Pool

log = logging.getLogger("batchgate.app")


class CoreParts(NamedTuple):
    service: Service
    door: Door
    status: StatusView
    models: ModelsAdmin


def build_door(settings: Settings, keys: KeyRing, metrics: Metrics, pool: Pool | None = None,
               cell: Callable[[], dict[str, Any]] | None = None,
               identity: CellIdentity | None = None, keep_changes: bool = False,
               tracing: Tracing | None = None) -> CoreParts:
    """The running core and what serves it: the one place its parts are wired. `cell`: what
    the cell's supervisor last said of its processes; `identity`: which cell and which of
    its cores this is (None: a process of its own); `keep_changes`: the admin's changes to
    the models are written beside the models file, for the cores that start after this one
    (a cell's core, whose file is the supervisor's kept copy; else they live as long as the
    process)."""
    overrides = Overrides.beside(settings.models if keep_changes else None)
    service = Service(settings, metrics, keys.tiers, pool=pool, identity=identity,
                      overrides=overrides, weights=keys.weights)
    metrics.watch(service.snapshot)
    catalogue = service.models.catalogue
    metrics.name_guards(m for m in catalogue.models if catalogue.is_guard(m))
    # With kept answers in Redis, the rate limits cells share there, on their connection.
    durable = None if service.kept is None else service.kept.durable
    rates = rate_step(redis_client(durable), keys.tiers, metrics, service.clock.now)
    door = Door(service.core, service.clock, rates, service.idempotency, service.pressure,
                metrics, service.salvage, tracing)
    models = ModelsAdmin(service.models, service.clock, settings.workers.min, settings.models,
                         service.core.change,
                         None if cell is None else lambda: list(cell().get("refused", [])),
                         most=settings.workers.max, overrides=service.overrides)
    status = StatusView(service, service.pool.ready_count, metrics, cell, models,
                        StreamStart(door))
    return CoreParts(service, door, status, models)


def create_app(settings: Settings, keys: KeyRing | None = None) -> ASGIApp:
    """Build the app; the workers start (and are waited for) in the lifespan."""
    return build(settings, keys).app


class Built(NamedTuple):
    app: ASGIApp
    service: Service  # the server tells it when it is leaving
    direct: DirectRoute | None  # for the HTTP protocol: the hot route without ASGI


def build(settings: Settings, keys: KeyRing | None = None, pool: Pool | None = None,
          identity: CellIdentity | None = None) -> Built:
    """The single process: the app, the service it serves, and the hot route's direct way.
    `identity`: the cell it is one of (`BATCHGATE_CELL_ID`; None: a cell of its own)."""
    metrics = Metrics()
    keys = keys or load_keys(settings.keys, settings.admin_key)
    tracing = Tracing.of(settings.otlp_endpoint, "server", settings.otlp_sample)
    service, door, status, models = build_door(settings, keys, metrics, pool,
                                               identity=identity, tracing=tracing)
    routes = Routes(LocalCore(door, status.table), settings, keys, metrics, tracing=tracing)
    routes.streamed = StreamRoute(routes)
    direct = LocalRoute(routes, door)
    direct.shapes = infer_call  # /v2's infer on the direct way too

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        def reload() -> None:  # SIGHUP: the keys file, and the models file if any
            routes.reload_keys()
            service.set_weights(routes.keys.weights)
            models.reload()

        reloading = on_sighup(reload)
        unwatch: Callable[[], None] | None = None
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(supervised, service.run, os._exit)
                await tg.start(door.rates.run)  # shared limits: a frame waits for Redis here
                unwatch = settle_and_time(metrics)
                async with serving_grpc(routes, settings):  # --grpc-port, beside HTTP
                    yield
                log.info("draining")
                await service.drain()
                tg.cancel_scope.cancel()
        finally:
            reloading()
            if unwatch is not None:
                unwatch()
            if tracing is not None:
                tracing.shutdown()
        log.info("stopped")

    return Built(http_app(routes, lifespan, oip_routes(routes)), service, direct)


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
    group cannot: it sits at `yield` while uvicorn serves, so a dead pool or owner would
    leave a server answering 503 forever with /healthz at 200. A non-zero exit lets whatever
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


__all__ = ["EXIT_CORE_FAILED", "Built", "CoreParts", "build", "build_door", "create_app",
           "supervised"]
