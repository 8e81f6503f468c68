"""A cell's gateway processes: spawned on the shared listening socket, watched through their
sentinels, restarted with the pool's backoff when they die, stopped on the way out. Also
what the cell keeps on disk: the listening socket, and the scratch folder (link socket,
every process's metric files) that a killed core leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import multiprocessing
import os
import shutil
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import mark_process_dead

from api.config import Settings
from api.gateway import STOP_SIGNAL, connections_file, gateway_main
from api.http import ConnectionTally
from gpu_pool import Backoff

log = logging.getLogger("batchgate.cell")

STOP_GRACE_S = 30.0


class GatewayState(enum.Enum):
    STARTING = "starting"  # not spawned yet
    RUNNING = "running"
    RESTARTING = "restarting"  # dead, waiting out its backoff
    STOPPED = "stopped"


@dataclass(slots=True)
class _Gateway:
    slot: int
    process: BaseProcess | None = None
    restarts: int = 0
    failures: int = 0  # deaths in a row, for the backoff
    started_at: float = 0.0  # on the loop's clock
    state: GatewayState = GatewayState.STARTING


class Gateways:
    """Spawns the gateway processes, watches each one's sentinel, restarts the dead."""

    def __init__(self, settings: Settings, link: str, sock: socket.socket,
                 backoff: Backoff | None = None,
                 target: Callable[[Settings, str, socket.socket, int], None] = gateway_main,
                 ) -> None:
        """`target` is what each process runs (a test's own, importable under spawn)."""
        self._settings, self._link, self._sock = settings, link, sock
        self._backoff = backoff or Backoff()  # the worker pool's
        self._target = target
        self._ctx = multiprocessing.get_context("spawn")
        self._slots = [_Gateway(i) for i in range(settings.gateways)]
        self._stopping = False
        self._all_stopped = anyio.Event()
        self._tally: ConnectionTally | None = None

    def start(self) -> None:
        """Spawn every gateway, with the count of connections they share."""
        self._tally = ConnectionTally.create(connections_file(self._link), len(self._slots))
        for slot in self._slots:
            self._spawn(slot)

    def reload_keys(self) -> None:
        """SIGHUP: authentication happens in the gateways; each re-reads the keys file."""
        for slot in self._slots:
            if slot.state is GatewayState.RUNNING and slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid or 0, signal.SIGHUP)

    def info(self) -> list[dict[str, Any]]:
        return [
            {"slot": g.slot, "pid": g.process.pid if g.process else None,
             "state": g.state.value, "restarts": g.restarts}
            for g in self._slots
        ]

    def _spawn(self, slot: _Gateway) -> None:
        process = self._ctx.Process(
            target=self._target, args=(self._settings, self._link, self._sock, slot.slot),
            name=f"batchgate-gateway-{slot.slot}",
        )
        process.start()
        loop = asyncio.get_running_loop()
        slot.process, slot.state, slot.started_at = process, GatewayState.RUNNING, loop.time()
        loop.add_reader(process.sentinel, self._exited, slot, process)
        log.info("gateway %d started (pid %s)", slot.slot, process.pid)

    def _exited(self, slot: _Gateway, process: BaseProcess) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(process.sentinel)
        process.join(timeout=1)
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")  # set by multiprocess_metrics
        if folder and process.pid is not None:
            retire_metrics(process.pid, Path(folder))
        if self._stopping:
            slot.state = GatewayState.STOPPED
            if all(g.state is GatewayState.STOPPED for g in self._slots):
                self._all_stopped.set()
            return
        if self._tally is not None:  # its connections closed with it
            self._tally.forget(slot.slot)
        slot.failures = self._backoff.after_exit(slot.failures, loop.time() - slot.started_at)
        delay = self._backoff.delay(slot.failures)
        log.warning("gateway %d (pid %s) exited with %s; restarting in %.1f s", slot.slot,
                    process.pid, process.exitcode, delay)
        slot.state, slot.restarts = GatewayState.RESTARTING, slot.restarts + 1
        loop.call_later(delay, self._restart, slot)

    def _restart(self, slot: _Gateway) -> None:
        if not self._stopping:
            self._spawn(slot)

    async def stop(self) -> None:
        """Ask every gateway to stop (uvicorn finishes what it holds), wait, kill stragglers.

        No gateway starts again, so this process's copy of the listening socket closes
        first: once the gateways close theirs the port refuses new connections, where it
        would have queued them for nobody and reset them all when this process exits."""
        self._stopping = True
        self._sock.close()
        for slot in self._slots:
            if slot.state is not GatewayState.RUNNING:  # not started, or in its backoff
                slot.state = GatewayState.STOPPED
            elif slot.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid or 0, STOP_SIGNAL)
        if all(g.state is GatewayState.STOPPED for g in self._slots):
            self._all_stopped.set()
        with anyio.move_on_after(STOP_GRACE_S):
            await self._all_stopped.wait()  # each exit is seen through its sentinel
        for slot in self._slots:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
                slot.process.join(timeout=5)
            slot.state = GatewayState.STOPPED
        if self._tally is not None:
            self._tally.close()
            self._tally = None


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


RETIRED = "retired"  # stands for every dead process's pid in a metric file's name


def retire_metrics(pid: int, folder: Path) -> None:
    """Fold a dead process's metric files into the folder's retired totals.

    prometheus-client's `mark_process_dead` removes only the files of a dead process's live
    gauges: its counters' and histograms' files must keep counting in every scrape, so each
    restart would leave its files behind for good. Their values are added into one
    `<kind>_retired.db` per kind, which a scrape sums like any process's file. This runs on
    the core's loop, where the scrape runs too: none sees a value twice or misses one.
    """
    mark_process_dead(pid, str(folder))  # type: ignore[no-untyped-call]
    for kind in ("counter", "histogram", "summary"):
        dead = folder / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        retired = MmapedDict(str(folder / f"{kind}_{RETIRED}.db"))  # type: ignore[no-untyped-call]
        try:
            values = MmapedDict.read_all_values_from_file(str(dead))  # type: ignore[no-untyped-call]
            for key, value, timestamp, _ in values:
                total, _ = retired.read_value(key)  # type: ignore[no-untyped-call]
                retired.write_value(key, total + value, timestamp)  # type: ignore[no-untyped-call]
        finally:
            retired.close()  # type: ignore[no-untyped-call]
        dead.unlink()


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


__all__ = ["SCRATCH_PREFIX", "GatewayState", "Gateways", "bind", "multiprocess_metrics",
           "retire_metrics", "sweep_scratch"]
