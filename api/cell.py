"""`batchgate serve --gateways K`: K HTTP gateway processes in front of one core process.

```
             +-- gateway 1 (uvicorn: HTTP, JSON, keys) --+
clients ---> +-- gateway 2                                +==link==> core process: Door,
 (one port)  +-- gateway K                                +          core owner, pool
```

The core process (this one) binds the listening socket and hands it to K spawned gateways
(as uvicorn's own multiprocess supervisor does); each gateway runs uvicorn on it and sends
its jobs over its link (`api/link.py`). The core keeps priority, batching, admission, rate
limits and idempotency global. It supervises the gateways: one that dies is restarted (its
queued items were withdrawn when its link closed); if the core dies, each gateway sees its
link close and exits at once. SIGTERM first turns /readyz 503 on every gateway while they
go on serving for `--drain-delay-s` (a second signal cuts it short), then stops the gateways
(uvicorn finishes what they hold, which the core still serves), then drains the core and its
workers.

Metrics: every process writes its counters and histograms through prometheus-client's
multiprocess mode into one folder; the core renders them together with its own gauges, and
a gateway's `/metrics` asks the core, so one scrape shows the whole server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio

from api.settings import Settings

log = logging.getLogger("batchgate.cell")

RESTART_DELAY_S = 0.5
STOP_GRACE_S = 30.0


@dataclass(slots=True)
class _Gateway:
    slot: int
    process: BaseProcess | None = None
    restarts: int = 0
    state: str = "starting"


class Gateways:
    """Spawns the gateway processes, watches each one's sentinel, restarts the dead."""

    def __init__(self, settings: Settings, link: str, sock: socket.socket) -> None:
        self._settings, self._link, self._sock = settings, link, sock
        self._ctx = multiprocessing.get_context("spawn")
        self._slots = [_Gateway(i) for i in range(settings.gateways)]
        self._stopping = False
        self._all_stopped = anyio.Event()

    def start(self) -> None:
        for slot in self._slots:
            self._spawn(slot)

    def reload_keys(self) -> None:
        """SIGHUP: authentication happens in the gateways; each re-reads the keys file."""
        for slot in self._slots:
            if slot.state == "running" and slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid or 0, signal.SIGHUP)

    def info(self) -> list[dict[str, Any]]:
        return [
            {"slot": g.slot, "pid": g.process.pid if g.process else None, "state": g.state,
             "restarts": g.restarts}
            for g in self._slots
        ]

    def _spawn(self, slot: _Gateway) -> None:
        from api.gateway import gateway_main

        process = self._ctx.Process(
            target=gateway_main, args=(self._settings, self._link, self._sock, slot.slot),
            name=f"batchgate-gateway-{slot.slot}",
        )
        process.start()
        slot.process, slot.state = process, "running"
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, slot, process)
        log.info("gateway %d started (pid %s)", slot.slot, process.pid)

    def _exited(self, slot: _Gateway, process: BaseProcess) -> None:
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join(timeout=1)
        if self._stopping:
            slot.state = "stopped"
            if all(g.state == "stopped" for g in self._slots):
                self._all_stopped.set()
            return
        log.warning("gateway %d (pid %s) exited with %s; restarting", slot.slot, process.pid,
                    process.exitcode)
        slot.state, slot.restarts = "restarting", slot.restarts + 1
        asyncio.get_running_loop().call_later(RESTART_DELAY_S, self._restart, slot)

    def _restart(self, slot: _Gateway) -> None:
        if not self._stopping:
            self._spawn(slot)

    async def stop(self) -> None:
        """SIGTERM every gateway (uvicorn finishes what it holds), wait, kill stragglers."""
        self._stopping = True
        for slot in self._slots:
            if slot.state != "running":  # not started, or waiting for its restart
                slot.state = "stopped"
            elif slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid or 0, signal.SIGTERM)
        if all(g.state == "stopped" for g in self._slots):
            self._all_stopped.set()
        with anyio.move_on_after(STOP_GRACE_S):
            await self._all_stopped.wait()  # each exit is seen through its sentinel
        for slot in self._slots:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
                slot.process.join(timeout=5)
            slot.state = "stopped"


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every gateway shares."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def multiprocess_metrics(folder: Path) -> None:
    """Every process of the cell writes its metrics into `folder` (inherited by spawned
    children through the environment; this process switches its value class now)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


SCRATCH_PREFIX = "batchgate-cell-"


def sweep_scratch(root: Path) -> list[Path]:
    """Remove what cores killed outright left in `root`; returns the folders removed.

    A cell's scratch folder (its link socket, every process's metric files) is named for its
    core's pid. A core killed by SIGKILL or the OOM killer never reaches its own clean-up, and
    a server restarted after each crash would leave one folder per crash. A folder goes once
    its core's pid is gone and nothing listens on its link (the second check spares a live
    cell whose /tmp is shared across pid namespaces).
    """
    removed: list[Path] = []
    for folder in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name.removeprefix(SCRATCH_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and not _listening(folder / "link.sock"):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


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
    from api.app import settle_heap, supervised
    from api.auth import load_keys
    from api.door import Door
    from api.link import LinkServer
    from api.metrics import Metrics
    from api.service import Service

    metrics = Metrics(multiprocess=True)
    keys = load_keys(settings.keys, settings.admin_key)
    service = Service(settings, metrics, keys.tiers, gpus=gpus)
    gateways = Gateways(settings, link, sock)
    door = Door(service, metrics, gateways=gateways.info)
    server = LinkServer(door)
    stop, hurry = asyncio.Event(), asyncio.Event()  # the first signal, and a second one

    def signalled() -> None:
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    loop.add_signal_handler(signal.SIGHUP, gateways.reload_keys)
    unwatch = metrics.watch_gc()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, service.run, os._exit)
            await server.start(link)
            settle_heap()
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
        unwatch()
        sock.close()
    log.info("stopped")


__all__ = ["SCRATCH_PREFIX", "Gateways", "bind", "multiprocess_metrics", "serve_cell",
           "sweep_scratch"]
