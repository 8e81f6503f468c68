"""A cell's worker that outlives its core: the next core attaches to it, its model loaded.

A worker of a single process ends with it (EOF on its pipe). In a cell, a core that dies
would otherwise take every worker with it, and its successor would load every model again
(seconds on a CPU, minutes for a large model on a GPU) and run again the keyed batches that
were running. So once loaded, a cell's worker also listens on a Unix socket in the cell's
workers folder, named `<slot>-<pid>.sock`; when its core's pipe breaks it finishes the
batch it holds and waits there for the next core, which connects (`gpu_pool.attach`).

To a core that connects, a thread of its own says at once `Attached`: what the worker holds,
and the keyed batches it ran last (`KEPT_BATCHES`) with their answers, the running one
included (its answer follows as `Salvaged` once it lands). The dead core's gateways send
their jobs again, and the next core answers those inputs from the salvage
(`gpu_pool.salvage`) instead of running the model again. The answer to a batch whose core
died goes to the next core only that way, never as an `Ok` of a batch it did not send.

It waits for a core as long as the cell's supervisor (the `keeper`, its parent once the core
is gone) lives, and at most `wait_s`; the supervisor ends what a dead core left that is not
listening (a worker still loading), and every worker when the cell stops.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from batcher import VersionKey
from gpu_pool.protocol import Attached, Err, Ok, Ready, Run, Salvaged, Stop

KEPT_BATCHES = 4
"""The keyed batches a worker keeps the answers of: a core answers a batch's requests in the
turn its answer lands, but a keyed answer may wait on the state store a moment longer."""
POLL_S = 1.0  # how often a worker waiting for a core looks at whether its keeper lives

RunBatch = Callable[[Run], Ok | Err]
"""One batch on the loaded model (`gpu_pool.worker.run_batch`, bound to it)."""


@dataclass(frozen=True, slots=True)
class Stay:
    """How a cell's worker outlives its core: where it listens, its slot, the supervisor
    whose life bounds its wait, and the longest wait for a core."""

    folder: str
    slot: int
    keeper: int
    wait_s: float = 600.0

    def path(self, pid: int) -> Path:
        return Path(self.folder) / f"{self.slot}-{pid}.sock"


class Lasting:
    """The worker's side: serve one core after another until told to stop."""

    def __init__(self, stay: Stay, ready: Ready, version: VersionKey, spec: str,
                 floor: float) -> None:
        self._stay = stay
        self._hello = (ready, version, spec, floor)
        self._lock = threading.Lock()
        self._running: Run | None = None
        self._told: list[Connection] = []  # cores told that `_running` runs
        self._kept: deque[Salvaged] = deque(maxlen=KEPT_BATCHES)
        self._incoming: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        self._path = stay.path(ready.pid)
        self._listener = self._listen()

    def serve(self, conn: Connection | None, run: RunBatch) -> None:
        """Run batches for `conn`, then for each next core, until `Stop` or no core comes."""
        while True:
            conn = self._newest(conn)
            if conn is None:
                return
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # its core is gone
                conn.close()
                conn = None
                continue
            if isinstance(msg, Stop):
                self.close()
                return
            if isinstance(msg, Run):
                conn = self._run(conn, msg, run)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._path.unlink()
        self._listener.close()

    def _run(self, conn: Connection, msg: Run, run: RunBatch) -> Connection | None:
        with self._lock:
            self._running = msg
        outcome = run(msg)
        with self._lock:
            self._running, told, self._told = None, self._told, []
            if msg.tags is not None and isinstance(outcome, Ok):
                self._kept.append(Salvaged(msg.tags, msg.inputs, outcome.outputs))
        if told:  # its core died meanwhile: the next one hears of it as salvage
            landed = Salvaged(msg.tags or (), msg.inputs,
                              outcome.outputs if isinstance(outcome, Ok) else None)
            for core in told:
                with contextlib.suppress(OSError):
                    core.send(landed)
            conn.close()
            return None
        try:
            conn.send(outcome)
        except OSError:  # its core died as it ran
            conn.close()
            return None
        return conn

    def _newest(self, conn: Connection | None) -> Connection | None:
        """The newest core's connection: `conn` unless another core connected since, or
        the next one to connect while the keeper lives (None: stop waiting)."""
        while True:
            try:
                newer = self._incoming.get_nowait()
            except queue.Empty:
                break
            if conn is not None:
                conn.close()
            conn = newer
        waited = 0.0
        while conn is None:
            # Once its core is gone the keeper is its parent (a subreaper); a moment after
            # the pipe broke, the kernel may not have handed it over yet.
            orphaned = waited > 0 and os.getppid() != self._stay.keeper
            if orphaned or waited >= self._stay.wait_s:
                self.close()
                return None
            try:
                conn = self._incoming.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
        return conn

    def _listen(self) -> socket.socket:
        path = self._path
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(4)
        threading.Thread(target=self._accept, args=(listener,), name="attach",
                         daemon=True).start()
        return listener

    def _accept(self, listener: socket.socket) -> None:
        ready, version, spec, floor = self._hello
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:  # closed: the worker is leaving
                return
            conn = Connection(sock.detach())
            with self._lock:
                salvaged = list(self._kept)
                running = self._running
                if running is not None and running.tags is not None:
                    salvaged.append(Salvaged(running.tags, running.inputs, None, running=True))
                    self._told.append(conn)
                try:
                    conn.send(Attached(ready, version, spec, floor, tuple(salvaged)))
                except OSError:
                    conn.close()
                    continue
            self._incoming.put(conn)


__all__ = ["KEPT_BATCHES", "Lasting", "Stay"]
