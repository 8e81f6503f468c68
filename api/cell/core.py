"""The core process of a cell: the one door (priority, batching, admission, rate limits,
idempotency), the core's owner and the pool, serving every gateway's link.

Started, and started again when it dies, by the cell's supervisor (`api.cell.supervisor`),
which gives it the cell's id and its `Lifeline` (its incarnation, and its channel to the
supervisor) and tells it what to do over that channel: LEAVE turns /readyz 503 on every
gateway while they go on serving, STOP (once the gateways have stopped) finishes what is
queued and running and ends the process, RELOAD re-reads the models file; `CellStatus` is
what it shows of the cell's processes (`/admin/workers`) and of the files it refused
(`/admin/models`); a supervisor silent past its beats makes it say it is not ready
(`/readyz`: nobody would restart it if it died). SIGTERM, SIGINT and SIGHUP, which
come to it with the whole process group, are the supervisor's alone. It reports UP once its
workers are ready and its link listens: a gateway that connects from then on is served.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from api.cell.link import LinkServer
from api.config import Settings, load_keys
from api.door import build_door, supervised
from api.errors import KeysFileError
from api.gateway import CellStatus, ChildEnd, Lifeline, Order, Report, name_process
from api.http import StatusCall, settle_and_time
from api.metrics import Metrics
from batcher.tracing import Tracing
from gpu_pool import CellIdentity

log = logging.getLogger("batchgate.core")

CORE_NAME = "batchgate-core"  # its /proc/PID/comm
WORKERS = "workers"  # beside the link: where the cell's workers wait for the next core

CoreTarget = Callable[[Settings, str, str, Lifeline], None]
"""What a core process runs: `(settings, link, cell, lifeline)`."""


def core_main(settings: Settings, link: str, cell: str, lifeline: Lifeline) -> None:
    """Entry point of the core process: `cell` is the cell's id, the lifeline says which of
    its cores this is."""
    lifeline.hold()
    name_process(CORE_NAME)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s core %(name)s: %(message)s",
    )
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    identity = CellIdentity(cell, lifeline.incarnation, str(Path(link).parent / WORKERS))
    uvloop_runner()(_serve(settings, link, identity, lifeline))


def uvloop_runner() -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


async def _serve(settings: Settings, link: str, identity: CellIdentity,
                 lifeline: Lifeline) -> None:
    metrics = Metrics(multiprocess=True)
    keys = load_keys(settings.keys, settings.admin_key)
    cell = CellStatus()  # the supervisor's last word on the cell's processes
    tracing = Tracing.of(settings.otlp_endpoint, "core")
    service, door, view, models = build_door(
        settings, keys, metrics, identity=identity, keep_changes=True,  # for the next core
        cell=lambda: {**cell.shown(), "refused": list(cell.refused)},  # refused: /admin/models
        tracing=tracing)
    supervisor: ChildEnd | None = None  # its end of the lifeline, once listened to

    async def ready() -> dict[str, object]:  # not ready while nobody would restart the core
        body = await view.ready()
        if supervisor is not None and supervisor.silent():
            body = {**body, "ready": False, "supervisor": "silent"}
        return body

    server = LinkServer(door, service.clock, {**view.table, StatusCall.READY: ready})
    leave, drain = asyncio.Event(), asyncio.Event()

    def heard(message: Order | CellStatus) -> None:
        nonlocal cell
        if isinstance(message, CellStatus):
            cell = message
        elif message is Order.LEAVE:
            leave.set()
        elif message is Order.STOP:  # a drain always follows a leave
            leave.set()
            drain.set()
        elif message is Order.RELOAD:  # the supervisor accepted the files it kept
            models.reload()
            try:  # the gateways read the keys; the core, the accounts' weights
                service.set_weights(load_keys(settings.keys, settings.admin_key).weights)
            except KeysFileError as exc:
                log.error("weights not reloaded: %s", exc)

    supervisor = await lifeline.listen(heard)
    unwatch: Callable[[], None] | None = None
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, service.run, os._exit)
            await tg.start(server.serve, link)
            unwatch = settle_and_time(metrics)
            supervisor.say(Report.UP)
            log.info("serving the gateways' links (pid %d)", os.getpid())
            await leave.wait()  # the drain comes after it, never before
            service.leave()  # /readyz says 503 from every gateway while they still serve
            await drain.wait()
            log.info("draining")
            server.close()
            await service.drain()
            tg.cancel_scope.cancel()
    finally:
        supervisor.close()
        if unwatch is not None:
            unwatch()
        if tracing is not None:
            tracing.shutdown()
    log.info("stopped")


__all__ = ["CORE_NAME", "WORKERS", "CoreTarget", "core_main", "uvloop_runner"]
