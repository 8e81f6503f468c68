"""`batchgate serve --gateways K`: K HTTP gateway processes in front of one core process.

```
             +-- gateway 1 (uvicorn: HTTP, JSON, keys) --+
clients ---> +-- gateway 2                                +==link==> core process: Door,
 (one port)  +-- gateway K                                +          core owner, pool
```

The core process (this one) binds the listening socket and hands it to K spawned gateways
(as uvicorn's own multiprocess supervisor does); each gateway runs uvicorn on it and sends
its jobs over its link (`api.gateway`), served here by `api.cell.link`. The core keeps
priority, batching, admission, rate limits and idempotency global. It supervises the
gateways: one that dies is restarted (its queued items were withdrawn when its link closed);
if the core dies, each gateway sees its link close and exits at once. SIGTERM first turns
/readyz 503 on every gateway while they go on serving for `--drain-delay-s` (a second signal
cuts it short), then stops the gateways (uvicorn finishes what they hold, which the core
still serves), then drains the core and its workers. The drain is the core's alone: gateways
and workers ignore SIGTERM and SIGINT, which come to them too when the whole process group
is signalled (systemd's default `KillMode=control-group`, Ctrl-C in a terminal).

`--max-connections` holds for the whole cell: the gateways count their connections together
(`api.http.ConnectionTally`), and the supervisor forgets a dead gateway's share.

Metrics: every process writes its counters and histograms through prometheus-client's
multiprocess mode into one folder; the core renders them together with its own gauges, and
a gateway's `/metrics` asks the core, so one scrape shows the whole server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from api.cell.link import LinkServer
from api.cell.supervisor import (
    SCRATCH_PREFIX,
    Gateways,
    bind,
    multiprocess_metrics,
    sweep_scratch,
)
from api.config import Settings, load_keys
from api.door import build_door, supervised
from api.http import settle_and_time
from api.metrics import Metrics

log = logging.getLogger("batchgate.cell")


def serve_cell(settings: Settings, gpus: int) -> int:
    """Run the core here and `settings.gateways` gateways in front of it; block until done."""
    root = Path(tempfile.gettempdir())
    for folder in sweep_scratch(root):
        log.info("removed %s, left by a core that was killed", folder)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
    try:
        multiprocess_metrics(scratch / "metrics")
        sock = bind(settings.host, settings.port)
        runner = _uvloop_runner()
        runner(_core_main(settings, gpus, sock, str(scratch / "link.sock")))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _uvloop_runner() -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


async def _core_main(settings: Settings, gpus: int, sock: socket.socket, link: str) -> None:
    metrics = Metrics(multiprocess=True)
    keys = load_keys(settings.keys, settings.admin_key)
    gateways = Gateways(settings, link, sock)
    service, door, status = build_door(settings, keys, metrics, gpus,
                                       gateways=gateways.info)
    server = LinkServer(door, service.clock, status)
    stop, hurry = asyncio.Event(), asyncio.Event()  # the first signal, and a second one

    def signalled() -> None:
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    loop.add_signal_handler(signal.SIGHUP, gateways.reload_keys)
    unwatch: Callable[[], None] | None = None
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, service.run, os._exit)
            await tg.start(server.serve, link)
            unwatch = settle_and_time(metrics)
            gateways.start()
            log.info("serving on %s:%d with %d gateways", settings.host, settings.port,
                     settings.gateways)
            await stop.wait()
            service.leave()  # /readyz says 503 from every gateway while they still serve
            log.info("leaving: serving %.1fs more before draining", settings.drain_delay_s)
            with anyio.move_on_after(settings.drain_delay_s):
                await hurry.wait()
            log.info("draining")
            await gateways.stop()
            server.close()
            await service.drain()
            tg.cancel_scope.cancel()
    finally:
        if unwatch is not None:
            unwatch()
        sock.close()
    log.info("stopped")


__all__ = ["serve_cell"]
