"""The core process of a cell: the one door (priority, batching, admission, rate limits,
idempotency), the core's owner and the pool, serving every gateway's link.

Started, and started again when it dies, by the cell's supervisor (`api.cell.supervisor`),
which tells it what to do by signals: `LEAVE_SIGNAL` turns /readyz 503 on every gateway while
they go on serving, `DRAIN_SIGNAL` (once the gateways have stopped) finishes what is queued
and running and ends the process, `RELOAD_SIGNAL` re-reads the models file. SIGTERM and
SIGINT, which come to it with the whole process group, are the supervisor's alone. It reads
the supervisor's status file for what it shows of the cell (`/admin/workers`), and says it
is up on `ready` once its workers are and its link listens: a gateway that connects from
then on is served.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio

from api.cell.link import LinkServer
from api.config import Settings, load_keys
from api.door import build_door, supervised
from api.gateway import die_with_supervisor, name_process
from api.http import settle_and_time
from api.metrics import Metrics

log = logging.getLogger("batchgate.core")

CORE_NAME = "batchgate-core"  # its /proc/PID/comm
LEAVE_SIGNAL = signal.SIGUSR1
DRAIN_SIGNAL = signal.SIGUSR2
RELOAD_SIGNAL = signal.SIGHUP  # re-read --models: the supervisor forwards its own SIGHUP


def core_main(settings: Settings, gpus: int, link: str, status: str,
              ready: Connection) -> None:
    """Entry point of the core process."""
    die_with_supervisor()
    name_process(CORE_NAME)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s core %(name)s: %(message)s",
    )
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    uvloop_runner()(_serve(settings, gpus, link, Path(status), ready))


def uvloop_runner() -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def read_status(path: Path) -> dict[str, Any]:
    """The supervisor's last word on the cell's processes (empty before its first)."""
    try:
        status: dict[str, Any] = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return status


async def _serve(settings: Settings, gpus: int, link: str, status: Path,
                 ready: Connection) -> None:
    metrics = Metrics(multiprocess=True)
    keys = load_keys(settings.keys, settings.admin_key)
    service, door, view, models = build_door(
        settings, keys, metrics, gpus,
        cell=lambda: read_status(status))
    server = LinkServer(door, service.clock, view)
    leave, drain = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(LEAVE_SIGNAL, leave.set)

    def drain_now() -> None:  # a drain always follows a leave
        leave.set()
        drain.set()

    loop.add_signal_handler(DRAIN_SIGNAL, drain_now)
    loop.add_signal_handler(RELOAD_SIGNAL, models.reload)
    unwatch: Callable[[], None] | None = None
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, service.run, os._exit)
            await tg.start(server.serve, link)
            unwatch = settle_and_time(metrics)
            ready.send("ready")
            ready.close()
            log.info("serving the gateways' links (pid %d)", os.getpid())
            await leave.wait()  # the drain comes after it, never before
            service.leave()  # /readyz says 503 from every gateway while they still serve
            await drain.wait()
            log.info("draining")
            server.close()
            await service.drain()
            await door.aclose()
            tg.cancel_scope.cancel()
    finally:
        if unwatch is not None:
            unwatch()
    log.info("stopped")


__all__ = ["CORE_NAME", "DRAIN_SIGNAL", "LEAVE_SIGNAL", "RELOAD_SIGNAL", "core_main",
           "read_status", "uvloop_runner"]
