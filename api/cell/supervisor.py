"""`batchgate serve --gateways K`: a supervisor, one core process and K gateway processes.

```
                          supervisor (this process: starts, restarts, stops; holds nothing)
                         /                     \\
             +-- gateway 1 (uvicorn: HTTP, JSON, keys) --+
clients ---> +-- gateway 2                                +==link==> core process: Door,
 (one port)  +-- gateway K                                +          core owner, pool
```

The supervisor binds the port, one listening socket per gateway (`SO_REUSEPORT`: the kernel
spreads the connections), and hands each to its spawned gateway; each gateway runs uvicorn
on it and sends its jobs over its link to the core process (`api.cell.core`), which keeps
priority, batching, admission, rate limits and idempotency global. The supervisor only
supervises: a gateway that dies is restarted (its queued items were withdrawn when its link
closed), and so is the core. While the core is gone the gateways hold their clients and
jobs, and send the jobs again to the next core (`api.gateway.RemoteCore`). The dead core's
workers outlive it: the supervisor, subreaper of its descendants, is their parent from then
on, and the next core attaches to them where they listen (`WORKERS`, `gpu_pool.lasting`),
their models loaded; what else the dead core left (a worker still loading) is ended here,
and what the core ends later is reaped here. The core's restarts are counted in
`/admin/workers`, and each core process is given the cell's id and its own incarnation as
arguments (its `Lifeline`), which the shared state and the Ray pool use to tell a dead
predecessor's claims and actors from another cell's.

The core and every gateway are each a `Child` (`api.cell.child`): spawned with a lifeline,
watched, restarted with backoff, stopped with a grace then a kill. The supervisor speaks to
each over its lifeline's channel alone: LEAVE, STOP and RELOAD, a BEAT every `BEAT_S` (a
child that hears none for a while says /readyz 503: nobody would restart what dies), and to
the core the cell's processes as they change (`CellStatus`, which `/admin/workers` shows).

The models and keys files are read here alone, at start and on SIGHUP (`api.cell.accepted`):
the children read the copies last accepted, so a file broken on disk is refused once, here,
and a core or gateway that dies meanwhile starts again from the copy.

SIGTERM first turns /readyz 503 on every gateway while they go on serving for
`--drain-delay-s` (a second signal cuts it short), then stops the gateways (uvicorn finishes
what they hold, which the core still serves), then drains the core and its workers. The drain
is the supervisor's alone: the core, the gateways and the workers ignore SIGTERM and SIGINT,
which come to them too when the whole process group is signalled (systemd's default
`KillMode=control-group`, Ctrl-C in a terminal). Every child ends with the supervisor
(`api.gateway.Lifeline.hold`).

`--max-connections` holds for the whole cell: the gateways count their connections together
(`api.http.ConnectionTally`), and the supervisor forgets a dead gateway's share.

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
import secrets
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path

import anyio

from api.cell.accepted import ACCEPTED, Accepted
from api.cell.child import Child, Keeping
from api.cell.core import WORKERS, CoreTarget, core_main, uvloop_runner
from api.cell.gateways import Gateways
from api.cell.scratch import SCRATCH_PREFIX, bind, multiprocess_metrics, sweep_scratch
from api.config import Settings
from api.gateway import BEAT_S, CellStatus, Order, prctl
from batcher.shared import Backoff
from gpu_pool import listening, stat_of

log = logging.getLogger("batchgate.cell")

CORE_DRAIN_GRACE_S = 120.0  # past the core's own drain bound: then it is killed
CORE_KEEPING = Keeping(Backoff(first=0.5, cap=30.0, stable_after=5.0), CORE_DRAIN_GRACE_S,
                       handshake=True, at_once=1)
"""A core that served a few seconds died of something other than its start: the next one
starts at once. Only a core that dies again and again soon after starting waits, longer
each time (a crash loop must not spin the host's CPU). It is up once it says so: its
workers are ready and its link listens."""
PR_SET_CHILD_SUBREAPER = 36


def serve_cell(settings: Settings, cell: str | None = None) -> int:
    """Run the cell: the core and `settings.gateways` gateways; block until done. `cell`:
    the cell's id (`BATCHGATE_CELL_ID`; None: a random one)."""
    root = Path(tempfile.gettempdir())
    for folder in sweep_scratch(root):
        log.info("removed %s, left by a cell that was killed", folder)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
    try:
        multiprocess_metrics(scratch / "metrics")
        accepted = Accepted(settings, scratch / ACCEPTED)
        if not accepted.read():
            return 2  # said why; the edge checked the files a moment ago
        socks = bind(settings.host, settings.port, settings.gateways)
        code: int = uvloop_runner()(_supervise(accepted, cell or secrets.token_hex(8), socks,
                                               scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return code


def core_process(settings: Settings, link: str, cell: str,
                 changed: Callable[[], None] | None = None, target: CoreTarget = core_main,
                 metrics: Path | None = None, keeping: Keeping = CORE_KEEPING) -> Child:
    """The core process as a `Child`: `target(settings, link, cell, lifeline)` runs in it;
    what a dead core left is ended (`end_orphans`) before the next one starts, but the
    workers that wait for it beside the link (`WORKERS`)."""
    spare = Path(link).parent / WORKERS
    return Child("batchgate-core", target, (settings, link, cell), keeping, changed=changed,
                 exited=lambda: end_orphans(spare), metrics=metrics)


def become_subreaper() -> None:
    """Descendants whose parent dies (a dead core's workers) become this process's children,
    so that `end_orphans` can end them (Linux; elsewhere nothing)."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def end_orphans(spare: Path | None = None) -> list[int]:
    """End and reap every child of this process it did not start: what a dead core left (a
    worker still loading would otherwise hold its GPU for good), but the workers listening in
    `spare` for the next core (their socket names their pid). Called once the core is
    reaped, when the kernel has handed its orphans here, and as the cell stops. The pids
    ended."""
    waiting = set() if spare is None else {worker.pid for worker in listening(spare)}
    ended = []
    for pid, zombie in _orphans():
        if not zombie and pid in waiting:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        if not zombie:
            ended.append(pid)
    if ended:
        log.warning("ended %d processes the dead core left: %s", len(ended), ended)
    return ended


def reap_orphans() -> None:
    """Reap the orphans that have exited (an attached worker a later core ended)."""
    for pid, zombie in _orphans():
        if zombie:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _orphans() -> list[tuple[int, bool]]:
    """This process's children it did not start, each with whether it has exited."""
    own = {p.pid for p in multiprocessing.active_children()}
    own.add(getattr(resource_tracker._resource_tracker, "_pid", None))
    me, found = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        stat = None if pid in own else stat_of(pid)
        if stat is not None and stat[1] == me:
            found.append((pid, stat[0] == "Z"))
    return found


async def _supervise(accepted: Accepted, cell: str, socks: list[socket.socket],
                     scratch: Path) -> int:
    become_subreaper()
    link, metrics = str(scratch / "link.sock"), scratch / "metrics"
    settings = accepted.settings()  # the children read the kept copies of the files

    def changed() -> None:  # the core shows the cell's processes on /admin/workers
        core.tell(CellStatus(core.info(), tuple(gateways.info()),
                             tuple(r.shown() for r in accepted.refused)))

    core = core_process(settings, link, cell, changed, metrics=metrics)
    gateways = Gateways(settings, link, socks, changed=changed, metrics=metrics)
    stop, hurry = asyncio.Event(), asyncio.Event()  # the first signal, and a second one
    signals: list[int] = []

    def signalled(sig: int) -> None:
        signals.append(sig)
        (hurry if stop.is_set() else stop).set()

    def reload() -> None:  # the gateways re-read the keys, the core the models
        accepted.read()
        changed()  # /admin/models shows what is refused
        gateways.reload_keys()
        if core.up:
            core.tell(Order.RELOAD)

    beating: asyncio.TimerHandle | None = None

    def beat() -> None:  # the children hear that a supervisor keeps them
        nonlocal beating
        core.beat()
        for child in gateways.children:
            child.beat()
        reap_orphans()
        beating = loop.call_later(BEAT_S, beat)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled, sig)
    loop.add_signal_handler(signal.SIGHUP, reload)
    beat()
    try:
        if not await _started(core, stop):
            if signals:  # while the core loads: it holds nothing yet, and is stopped
                log.info("stopped before serving")
                return 128 + signals[0]
            log.critical("the core process exited before it was ready")
            return 1
        await gateways.start()
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
        if beating is not None:
            beating.cancel()
        for sock in socks:
            sock.close()
        end_orphans()  # workers still waiting for a core that will not come
    log.info("stopped")
    return 0


async def _started(core: Child, stop: asyncio.Event) -> bool:
    """Whether the core came up; a signal (`stop`) first stops it at once, not after
    its models have loaded."""
    starting, stopping = asyncio.ensure_future(core.start()), asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        return starting.result()
    starting.cancel()
    await core.stop()
    return False


__all__ = ["CORE_KEEPING", "become_subreaper", "core_process", "end_orphans", "serve_cell"]
