"""The supervisor: one spawned worker process per slot, watched without blocking the loop.

Each worker's pipe and process sentinel are registered with the event loop's reader
callbacks, so an answer and a death are both events: a death is seen the moment the
kernel reaps the process (SIGKILL and OOM kills included), not at the next poll. A dead
slot is restarted with exponential backoff, so a model that crashes at start-up cannot
spin the CPU.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import anyio
from anyio.abc import TaskStatus

from gpu_pool.pipe import PipeEnd
from gpu_pool.protocol import Err, Ok, Ready, Run, Stop, WorkerId
from gpu_pool.seam import PoolEvents, Unstarted, WorkerInfo
from gpu_pool.worker import WorkerConfig, worker_main

log = logging.getLogger("batchgate.pool")


class WorkerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    DEAD = "dead"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class PoolSettings:
    model: str
    workers: int
    latency_floor: float = 0.0
    gpus: int = 0  # CUDA devices present; workers are pinned round-robin
    ready_timeout: float = 300.0
    restart_backoff: float = 0.5
    restart_backoff_max: float = 30.0
    stable_after: float = 30.0  # a worker alive this long resets its slot's backoff
    restart: bool = True

    def restart_delay(self, failures: int) -> float:
        """Seconds before restarting a slot whose workers died `failures` times in a row:
        exponential, capped, so a model that crashes at load cannot spin the CPU."""
        return min(self.restart_backoff_max, self.restart_backoff * 2.0 ** max(0, failures - 1))

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.latency_floor < 0:
            raise ValueError("batch latency floor must be >= 0")


@dataclass(slots=True)
class _Slot:
    index: int
    worker: WorkerId = field(default=WorkerId(0))
    process: BaseProcess | None = None
    conn: Connection | None = None  # owns the descriptor; `pipe` does the I/O on it
    pipe: PipeEnd | None = None
    state: WorkerState = WorkerState.STARTING
    device: str = "-"
    batches: int = 0
    restarts: int = 0
    failures: int = 0
    ready_at: float = 0.0
    ready: anyio.Event = field(default_factory=anyio.Event)
    exited: anyio.Event = field(default_factory=anyio.Event)


class WorkerPool:
    """The process pool: the first implementation of `gpu_pool.seam.Pool`."""

    def __init__(self, settings: PoolSettings) -> None:
        self._settings = settings
        self._changed: anyio.Event | None = None  # what `wait_ready` waits on, if anyone
        self._events: PoolEvents = Unstarted()
        self._ctx = multiprocessing.get_context("spawn")
        self._ids = itertools.count(1)
        self._slots = [_Slot(i) for i in range(settings.workers)]
        self._by_worker: dict[WorkerId, _Slot] = {}
        self._stopping = False
        self._crashes = 0
        self._restart_send, self._restart_recv = anyio.create_memory_object_stream[int](
            settings.workers
        )

    # -- lifecycle -------------------------------------------------------------------------
    async def run(
        self, events: PoolEvents, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start every slot, then restart dead ones until cancelled; stops workers on exit."""
        self._events = events
        try:
            async with anyio.create_task_group() as tg:
                for slot in self._slots:
                    tg.start_soon(self._start, slot, 0.0)
                task_status.started()
                async with self._restart_recv:
                    async for index in self._restart_recv:
                        slot = self._slots[index]
                        delay = self._settings.restart_delay(slot.failures)
                        tg.start_soon(self._start, slot, delay)
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop()

    async def wait_ready(self, count: int, within: float) -> int:
        """Wait until `count` workers are ready, or until each has either come up or died
        at least once with one ready (one that crashes while loading holds no one back), or
        `within` seconds; return how many are ready."""

        def settled(slot: _Slot) -> bool:
            return slot.state in (WorkerState.READY, WorkerState.BUSY, WorkerState.DEAD) \
                or slot.restarts > 0

        with anyio.move_on_after(within):
            while self.ready_count() < count and not (
                self.ready_count() > 0 and all(settled(s) for s in self._slots[:count])
            ):
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.ready_count()

    async def stop(self, grace: float = 10.0) -> None:
        """Ask every worker to exit, wait up to `grace`, then kill the stragglers."""
        self._stopping = True
        for slot in self._slots:
            if slot.pipe is not None and slot.state in (WorkerState.READY, WorkerState.BUSY):
                slot.pipe.send(Stop())
            elif slot.process is not None and slot.process.is_alive():
                slot.process.kill()  # still loading: nothing to finish
        live = [s for s in self._slots if s.process is not None and s.process.pid is not None]
        with anyio.move_on_after(grace):
            for slot in live:
                await slot.exited.wait()
        for slot in live:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
            if slot.process is not None:
                slot.process.join(timeout=5)
                self._detach(slot)
            slot.state = WorkerState.STOPPED

    # -- commands ----------------------------------------------------------------------------
    def send(self, worker: WorkerId, run: Run) -> None:
        """Hand a batch to a ready worker. One that is gone was (or is now) reported dead."""
        slot = self._by_worker.get(worker)
        if slot is None or slot.pipe is None or slot.state is not WorkerState.READY:
            return
        slot.state = WorkerState.BUSY
        slot.pipe.send(run)  # a broken pipe reports the death

    def kill(self, worker: WorkerId) -> None:
        """SIGKILL a worker (hung batch); its death arrives through the sentinel."""
        slot = self._by_worker.get(worker)
        if slot is not None and slot.process is not None and slot.process.is_alive():
            log.warning("killing worker %s (pid %s)", worker, slot.process.pid)
            slot.process.kill()

    def ready_count(self) -> int:
        return sum(s.state in (WorkerState.READY, WorkerState.BUSY) for s in self._slots)

    def workers(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=s.worker,
                slot=s.index,
                pid=s.process.pid if s.process is not None else None,
                state=s.state.value,
                device=s.device,
                batches=s.batches,
                restarts=s.restarts,
            )
            for s in self._slots
        ]

    def state_counts(self) -> dict[str, int]:
        counts = {state.value: 0 for state in WorkerState}
        for slot in self._slots:
            counts[slot.state.value] += 1
        return counts

    @property
    def crashes(self) -> int:
        return self._crashes

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process and s.process.pid]

    # -- internals ---------------------------------------------------------------------------
    async def _start(self, slot: _Slot, delay: float) -> None:
        if delay > 0:
            await anyio.sleep(delay)
        if self._stopping:
            return
        worker = WorkerId(next(self._ids))
        config = WorkerConfig(
            model=self._settings.model,
            gpu=slot.index % self._settings.gpus if self._settings.gpus else None,
            threads=max(1, (os.cpu_count() or 1) // self._settings.workers),
            latency_floor=self._settings.latency_floor,
        )
        try:
            parent, child = self._ctx.Pipe()
        except OSError as exc:
            self._spawn_failed(slot, exc)
            return
        process = self._ctx.Process(
            target=worker_main, args=(child, config), name=f"batchgate-worker-{slot.index}",
            daemon=True,
        )
        slot.worker, slot.process, slot.conn = worker, process, parent
        slot.state, slot.device = WorkerState.STARTING, "-"
        slot.ready, slot.exited = anyio.Event(), anyio.Event()
        self._by_worker[worker] = slot
        try:
            await anyio.to_thread.run_sync(process.start)
        except OSError as exc:
            parent.close()
            child.close()
            slot.process = slot.conn = None
            del self._by_worker[worker]
            self._spawn_failed(slot, exc)
            return
        child.close()
        slot.pipe = PipeEnd(parent.fileno(), functools.partial(self._lost, slot, worker))
        loop = asyncio.get_running_loop()
        loop.add_reader(parent.fileno(), self._on_readable, slot, worker)
        loop.add_reader(process.sentinel, self._on_exit, slot, worker)
        with anyio.move_on_after(self._settings.ready_timeout):
            await slot.ready.wait()
        if slot.worker == worker and slot.state is WorkerState.STARTING:
            log.error("worker %s gave no READY in %.0fs; killing it", worker,
                      self._settings.ready_timeout)
            process.kill()

    def _spawn_failed(self, slot: _Slot, exc: OSError) -> None:
        """Out of descriptors, processes or memory: the slot is retried like a crash, with
        its backoff, for as long as it takes (a failure here once tore the pool down and
        left a server that answered 503 forever)."""
        slot.failures += 1
        slot.restarts += 1
        slot.state = WorkerState.DEAD
        delay = self._settings.restart_delay(slot.failures)
        log.error("could not start a worker in slot %d (%s); retrying in %.1fs",
                  slot.index, exc, delay)
        self._signal_change()
        if not self._stopping:
            self._restart_send.send_nowait(slot.index)

    def _on_readable(self, slot: _Slot, worker: WorkerId) -> None:
        pipe = slot.pipe
        if pipe is None or slot.worker != worker:
            return
        try:
            messages = pipe.read()
        except EOFError:
            self._lost(slot, worker)
            return
        for message in messages:
            self._handle(slot, worker, message)

    def _handle(self, slot: _Slot, worker: WorkerId, msg: object) -> None:
        if isinstance(msg, Ready):
            slot.state, slot.device = WorkerState.READY, msg.device
            slot.ready_at = time.monotonic()
            slot.ready.set()
            self._signal_change()
            log.info("worker %s ready (slot %d, pid %d, %s)", worker, slot.index, msg.pid,
                     msg.device)
            self._events.worker_ready(worker)
        elif isinstance(msg, Ok | Err):
            slot.state = WorkerState.READY
            slot.batches += 1
            self._events.worker_reply(worker, msg)

    def _lost(self, slot: _Slot, worker: WorkerId) -> None:
        """The worker is gone (EOF, broken pipe or exit): report it once."""
        if slot.worker != worker or slot.state in (WorkerState.DEAD, WorkerState.STOPPED):
            return
        was_up = slot.state in (WorkerState.READY, WorkerState.BUSY)
        slot.state = WorkerState.DEAD
        if slot.pipe is not None:
            slot.pipe.close()
        if slot.conn is not None:
            asyncio.get_running_loop().remove_reader(slot.conn.fileno())
        if slot.process is not None and slot.process.is_alive():
            slot.process.kill()
        if not self._stopping:
            self._crashes += 1
            code = slot.process.exitcode if slot.process is not None else None
            log.warning("worker %s (slot %d) died (exit code %s)", worker, slot.index, code)
        lived = time.monotonic() - slot.ready_at if was_up else 0.0
        slot.failures = 0 if lived >= self._settings.stable_after else slot.failures + 1
        self._signal_change()
        self._events.worker_died(worker)

    def _signal_change(self) -> None:
        """Wake `wait_ready`: a worker came up or went down."""
        if self._changed is not None:
            self._changed.set()

    def _on_exit(self, slot: _Slot, worker: WorkerId) -> None:
        if slot.worker != worker:
            return
        self._lost(slot, worker)
        assert slot.process is not None
        slot.process.join(timeout=1)
        self._detach(slot)
        slot.exited.set()
        if not self._stopping and self._settings.restart:
            slot.restarts += 1
            self._restart_send.send_nowait(slot.index)

    def _detach(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        if slot.process is not None:
            loop.remove_reader(slot.process.sentinel)
        if slot.pipe is not None:
            slot.pipe.close()
            slot.pipe = None
        if slot.conn is not None:
            loop.remove_reader(slot.conn.fileno())
            slot.conn.close()
            slot.conn = None
        self._by_worker.pop(slot.worker, None)


__all__ = ["PoolSettings", "WorkerPool", "WorkerState"]
