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
from api.door.limits import RateLimiter
from api.door.local import LocalCore, LocalRoute, SharedLocalRoute
from api.door.models import ModelsAdmin
from api.door.service import Service
from api.door.shared_limits import shared_limits
from api.door.status import StatusView
from api.http import DirectRoute, Routes, http_app, on_sighup, settle_and_time
from api.metrics import Metrics
from gpu_pool import Pool

log = logging.getLogger("batchgate.app")

CLOSE_TIMEOUT_S = 1.0  # the shared limits' connections, closed on the way out


class CoreParts(NamedTuple):
    service: Service
    door: Door
    status: StatusView
    models: ModelsAdmin


def build_door(settings: Settings, keys: KeyRing, metrics: Metrics, gpus: int = 0,
               pool: Pool | None = None,
               cell: Callable[[], dict[str, Any]] | None = None) -> CoreParts:
    """The running core and what serves it: the one place its parts are wired."""
    service = Service(settings, metrics, keys.tiers, gpus=gpus, pool=pool)
    metrics.watch(service.snapshot)
    limiter = RateLimiter(keys.tiers)  # with shared limits: what decides while Redis is out
    shared = shared_limits(settings.state, keys.tiers, limiter, metrics, service.clock.now)
    door = Door(service.core, service.clock, limiter, service.idempotency, service.pressure,
                metrics, shared)
    models = ModelsAdmin(service.models, service.clock, settings.workers, settings.models,
                         service.core.poke)
    status = StatusView(service, service.pool.ready_count, metrics, cell, models)
    return CoreParts(service, door, status, models)


def create_app(settings: Settings, keys: KeyRing | None = None, gpus: int = 0) -> ASGIApp:
    """Build the app; the workers start (and are waited for) in the lifespan."""
    return build(settings, keys, gpus).app


class Built(NamedTuple):
    app: ASGIApp
    service: Service  # the server tells it when it is leaving
    direct: DirectRoute | None  # for the HTTP protocol: the hot route without ASGI


def build(settings: Settings, keys: KeyRing | None = None, gpus: int = 0,
          pool: Pool | None = None) -> Built:
    """The single process: the app, the service it serves, and the hot route's direct way."""
    metrics = Metrics()
    keys = keys or load_keys(settings.keys, settings.admin_key)
    service, door, status, models = build_door(settings, keys, metrics, gpus, pool)
    routes = Routes(LocalCore(door, status), settings, keys, metrics)
    # Shared limits: the direct way's checks wait for Redis in a task of the lifespan's.
    direct = LocalRoute(routes, door) if door.shared is None else SharedLocalRoute(routes, door)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        def reload() -> None:  # SIGHUP: the keys file, and the models file if any
            routes.reload_keys()
            models.reload()

        reloading = on_sighup(reload)
        unwatch: Callable[[], None] | None = None
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(supervised, service.run, os._exit)
                if isinstance(direct, SharedLocalRoute):
                    await tg.start(direct.serve)
                unwatch = settle_and_time(metrics)
                yield
                log.info("draining")
                await service.drain()
                tg.cancel_scope.cancel()
        finally:
            reloading()
            if unwatch is not None:
                unwatch()
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
                await door.aclose()
        log.info("stopped")

    return Built(http_app(routes, lifespan), service, direct)


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
