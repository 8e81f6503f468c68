"""`batchgate serve --gateways K`: a supervisor, one core process and K gateway processes.

```
                          supervisor (this process: starts, restarts, stops; holds nothing)
                         /                     \\
             +-- gateway 1 (uvicorn: HTTP, JSON, keys) --+
clients ---> +-- gateway 2                                +==link==> core process: Door,
 (one port)  +-- gateway K                                +          core owner, pool
```

The supervisor binds the listening socket and hands it to K spawned gateways (as uvicorn's
own multiprocess supervisor does); each gateway runs uvicorn on it and sends its jobs over
its link to the core process (`api.cell.core`), which keeps priority, batching, admission,
rate limits and idempotency global. The supervisor only supervises: a gateway that dies is
restarted (its queued items were withdrawn when its link closed), and so is the core. While
the core is gone the gateways hold their clients and jobs, and send the jobs again to the
next core (`api.gateway.RemoteCore`); the dead core's workers that still run (a hung batch)
are ended here, the supervisor being the subreaper of its descendants. The core's restarts
are counted in `/admin/workers`, and each core process learns the cell's id and its own
incarnation (`gpu_pool.CELL_ID_ENV`, `gpu_pool.INCARNATION_ENV`), which the shared state
and the Ray pool use to tell a dead predecessor's claims and actors from another cell's.

SIGTERM first turns /readyz 503 on every gateway while they go on serving for
`--drain-delay-s` (a second signal cuts it short), then stops the gateways (uvicorn finishes
what they hold, which the core still serves), then drains the core and its workers. The drain
is the supervisor's alone: the core, the gateways and the workers ignore SIGTERM and SIGINT,
which come to them too when the whole process group is signalled (systemd's default
`KillMode=control-group`, Ctrl-C in a terminal). Every child ends with the supervisor
(`api.gateway.lifeline`).

`--max-connections` holds for the whole cell: the gateways count their connections together
(`api.http.ConnectionTally`), and the supervisor forgets a dead gateway's share.

Metrics: every process writes its counters and histograms through prometheus-client's
multiprocess mode into one folder; the core renders them together with its own gauges, and
a gateway's `/metrics` asks the core, so one scrape shows the whole server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio

from api.cell.core import DRAIN_SIGNAL, LEAVE_SIGNAL, RELOAD_SIGNAL, core_main, uvloop_runner
from api.cell.gateways import Gateways
from api.cell.scratch import (
    SCRATCH_PREFIX,
    bind,
    multiprocess_metrics,
    retire_metrics,
    sweep_scratch,
)
from api.config import Settings
from api.gateway import SUPERVISOR_PID, prctl
from batcher.shared import Backoff
from gpu_pool import CELL_ID_ENV, INCARNATION_ENV

log = logging.getLogger("batchgate.cell")

CORE_DRAIN_GRACE_S = 120.0  # past the core's own drain bound: then it is killed
CORE_BACKOFF = Backoff(first=0.5, cap=30.0, stable_after=5.0)
"""A core that served a few seconds died of something other than its start: the next one
starts at once. Only a core that dies again and again soon after starting waits, longer
each time (a crash loop must not spin the host's CPU)."""
PR_SET_CHILD_SUBREAPER = 36

CoreTarget = Callable[[Settings, int, str, str, Connection], None]


def serve_cell(settings: Settings, gpus: int) -> int:
    """Run the cell: the core and `settings.gateways` gateways; block until done."""
    root = Path(tempfile.gettempdir())
    for folder in sweep_scratch(root):
        log.info("removed %s, left by a cell that was killed", folder)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
    try:
        multiprocess_metrics(scratch / "metrics")
        os.environ[SUPERVISOR_PID] = str(os.getpid())
        os.environ.setdefault(CELL_ID_ENV, secrets.token_hex(8))
        sock = bind(settings.host, settings.port)
        code: int = uvloop_runner()(_supervise(settings, gpus, sock, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return code


class CoreProcess:
    """The core process: started, watched through its sentinel, restarted with the pool's
    backoff when it dies, drained on the way out."""

    def __init__(self, settings: Settings, gpus: int, link: str, status: Path,
                 changed: Callable[[], None], backoff: Backoff | None = None,
                 target: CoreTarget = core_main) -> None:
        self._args = (settings, gpus, link, str(status))
        self._changed, self._target = changed, target
        self._backoff = backoff or CORE_BACKOFF
        self._ctx = multiprocessing.get_context("spawn")
        self.process: BaseProcess | None = None
        self.incarnation = -1
        self.restarts = 0
        self.state = "starting"
        self._failures = 0
        self._started_at = 0.0
        self._leaving = self._stopping = False
        self._up = asyncio.Event()  # the current core said it is ready
        self._gone = asyncio.Event()  # the current core exited

    def info(self) -> dict[str, Any]:
        pid = self.process.pid if self.process is not None else None
        return {"pid": pid, "state": self.state, "restarts": self.restarts,
                "incarnation": self.incarnation}

    async def start(self) -> bool:
        """Start the first core; whether it came up (False: it died first)."""
        self._spawn()
        up, gone = asyncio.ensure_future(self._up.wait()), asyncio.ensure_future(
            self._gone.wait())
        await asyncio.wait([up, gone], return_when=asyncio.FIRST_COMPLETED)
        came_up = up.done()  # not `_up`: a core that came up and died at once may be
        for waiting in (up, gone):  # restarting already, its successor not yet up
            waiting.cancel()
        return came_up

    def _spawn(self) -> None:
        self.incarnation += 1
        os.environ[INCARNATION_ENV] = str(self.incarnation)  # read by the child at start
        reader, writer = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(target=self._target, args=(*self._args, writer),
                                    name="batchgate-core")
        process.start()
        writer.close()
        loop = asyncio.get_running_loop()
        self.process, self.state, self._started_at = process, "starting", loop.time()
        self._up.clear()
        self._gone.clear()
        loop.add_reader(reader.fileno(), self._said, reader)
        loop.add_reader(process.sentinel, self._exited, process, reader)
        log.info("core started (pid %s, incarnation %d)", process.pid, self.incarnation)
        self._changed()

    def _said(self, reader: Connection) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(reader.fileno())
        try:
            reader.recv()
        except (EOFError, OSError):  # died before it was up: its sentinel says so
            return
        finally:
            reader.close()
        self.state = "running"
        self._up.set()
        if self._leaving and self.process is not None:  # came up after the leave began
            _signal(self.process, LEAVE_SIGNAL)
        self._changed()

    def _exited(self, process: BaseProcess, reader: Connection) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(reader.fileno())
        if not self._up.is_set() and not reader.closed and reader.poll():
            self._said(reader)  # it said it was up, then died before that was read
        if not reader.closed:
            reader.close()
        process.join(timeout=1)
        end_orphans()
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if folder and process.pid is not None:
            retire_metrics(process.pid, Path(folder))
        self._gone.set()
        if self._stopping or (not self._up.is_set() and self.incarnation == 0):
            self.state = "stopped"  # stopped, or the first never came up: no restart
            self._changed()
            return
        self._failures = self._backoff.after_exit(self._failures,
                                                  loop.time() - self._started_at)
        delay = self._backoff.delay(self._failures) if self._failures > 1 else 0.0
        log.error("the core (pid %s) exited with %s; starting another in %.1f s",
                  process.pid, process.exitcode, delay)
        self.state, self.restarts = "restarting", self.restarts + 1
        loop.call_later(delay, self._restart)
        self._changed()

    def _restart(self) -> None:
        if not self._stopping:
            self._spawn()

    def reload_models(self) -> None:
        """SIGHUP: the core re-reads `--models` (the catalogue lives in the core alone)."""
        if self.process is not None and self._up.is_set() and not self._gone.is_set():
            _signal(self.process, RELOAD_SIGNAL)

    def leave(self) -> None:
        """/readyz 503 everywhere while the gateways still serve (a core that comes up
        later is told at once)."""
        self._leaving = True
        if self.process is not None and self._up.is_set():
            _signal(self.process, LEAVE_SIGNAL)

    async def stop(self) -> None:
        """Drain the core (the gateways have stopped): it finishes what it holds and exits.
        One not up yet holds nothing: it is ended at once."""
        self._stopping = True
        process = self.process
        if process is None or self._gone.is_set():
            return
        _signal(process, DRAIN_SIGNAL if self._up.is_set() else signal.SIGKILL)
        with anyio.move_on_after(CORE_DRAIN_GRACE_S):
            await self._gone.wait()
        if process.is_alive():
            log.error("the core did not drain within %.0f s; killing it", CORE_DRAIN_GRACE_S)
            process.kill()
            await self._gone.wait()


def _signal(process: BaseProcess, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid or 0, sig)


def become_subreaper() -> None:
    """Descendants whose parent dies (a dead core's workers) become this process's children,
    so that `end_orphans` can end them (Linux; elsewhere nothing)."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def end_orphans() -> list[int]:
    """End and reap every child of this process it did not start: what a dead core left (a
    worker stuck in a batch would otherwise hold its GPU for good). Called once the core is
    reaped, when the kernel has handed its orphans here. The pids ended."""
    own = {p.pid for p in multiprocessing.active_children()}
    own.add(getattr(resource_tracker._resource_tracker, "_pid", None))
    me, ended = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid in own or _parent(entry) != me:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        ended.append(pid)
    if ended:
        log.warning("ended %d processes the dead core left: %s", len(ended), ended)
    return ended


def _parent(proc: Path) -> int:
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parens


def _write_status(path: Path, status: dict[str, Any]) -> None:
    """Atomically: the core reads it at any time."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps(status))
    part.replace(path)


async def _supervise(settings: Settings, gpus: int, sock: socket.socket, scratch: Path) -> int:
    become_subreaper()
    link, status = str(scratch / "link.sock"), scratch / "cell.json"
    parts: list[Any] = []

    def changed() -> None:
        if len(parts) == 2:
            _write_status(status, {"core": parts[0].info(), "gateways": parts[1].info()})

    core = CoreProcess(settings, gpus, link, status, changed)
    gateways = Gateways(settings, link, sock, changed=changed)
    parts += [core, gateways]
    stop, hurry = asyncio.Event(), asyncio.Event()  # the first signal, and a second one

    def signalled() -> None:
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    def reload() -> None:  # the gateways re-read the keys, the core the models
        gateways.reload_keys()
        core.reload_models()

    loop.add_signal_handler(signal.SIGHUP, reload)
    try:
        if not await core.start():
            log.critical("the core process exited before it was ready")
            return 1
        gateways.start()
        log.info("serving on %s:%d with %d gateways", settings.host, settings.port,
                 settings.gateways)
        await stop.wait()
        core.leave()
        log.info("leaving: serving %.1fs more before draining", settings.drain_delay_s)
        with anyio.move_on_after(settings.drain_delay_s):
            await hurry.wait()
        log.info("draining")
        await gateways.stop()
        await core.stop()
    finally:
        sock.close()
    log.info("stopped")
    return 0


__all__ = ["CoreProcess", "end_orphans", "serve_cell"]
