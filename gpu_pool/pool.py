"""The supervisor: one spawned worker process per slot, watched without blocking the loop.

Each worker's pipe is a stream transport of the event loop (`gpu_pool.pipe`) and its
process sentinel is registered with the loop's reader callbacks, so an answer and a death
are both events: a death is seen the moment the pipe reaches EOF or the kernel reaps the
process (SIGKILL and OOM kills included), not at the next poll. A dead
slot is restarted with exponential backoff, so a model that crashes at start-up cannot
spin the CPU.

With a memory bound (`--worker-max-rss-mb`), a worker found over it as it answers a batch
is replaced at once, between batches: it is told to stop (it holds nothing), and once it
has exited, freeing its memory, its slot starts another process under the same worker id
(`Slots.replace`). A batch the core sends meanwhile is held, and is the new process's first;
the hang watchdog's `kill` spares the new process while it loads (that batch has not started).

Each slot holds one model version (`PoolSettings.loads`). A switch (`switch`, the core's
decision) retires an idle worker the same way, told to stop and killed past a grace, and
once it has exited its slot starts a process loading the other version under a new worker
id (`Slots.switch`): restarting the process is what frees all the memory the old version
held.

In a cell (`PoolSettings.attach`) the workers outlive the core (`gpu_pool.lasting`): the next
core's pool finds each slot's live worker and attaches to it instead of starting one, its
model loaded, whichever version it holds if the catalogue names it (`gpu_pool.attach`), and
keeps what it ran for keyed requests of the dead core (`gpu_pool.salvage`); one of a slot
beyond the first `workers`, or holding a version not named, is ended.

The core scales the pool (`gpu_pool.slot_pool`): a slot added is pinned to the lowest
device no other slot holds (the core never asks for more workers than devices), and on the
CPU the threads are split among the slots there are as it starts. A retired worker is let
go as for a switch and its slot removed once it has exited; a start taken back is killed
and its slot removed once it has exited. Neither is reported dead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import anyio
from anyio.abc import TaskStatus

from gpu_pool.attach import AttachedProcess, Found, attachable, leave
from gpu_pool.lasting import Stay
from gpu_pool.launching import ForkedProcess, Launcher
from gpu_pool.load import Load
from gpu_pool.memory import MIB, resident_bytes
from gpu_pool.models import parse_spec
from gpu_pool.parking import ParkedWorker, ParkingLot, Place, Process, collect, unwatch
from gpu_pool.pipe import WorkerPipe, open_pipe, open_socket
from gpu_pool.protocol import (
    Attached,
    Err,
    Ok,
    Ready,
    Run,
    Salvaged,
    StartKind,
    Stop,
    Wake,
    WorkerId,
)
from gpu_pool.salvage import Salvage
from gpu_pool.seam import PoolEvents, Unstarted
from gpu_pool.settings import PoolSettings
from gpu_pool.slot_pool import SlotPool
from gpu_pool.slots import Slot, Slots, SlotState
from gpu_pool.worker import WorkerConfig, worker_main

log = logging.getLogger("batchgate.pool")
STOP_GRACE_S = 10.0  # for a replaced (or switched) worker to exit once told to stop


@dataclass(slots=True)
class _Slot(Slot):
    process: Process | None = None
    pipe: WorkerPipe | None = None  # owns the parent's end of the worker's pipe
    ready: anyio.Event = field(default_factory=anyio.Event)
    exited: anyio.Event = field(default_factory=anyio.Event)
    retired: Process | None = None  # replaced or switched, told to stop, not yet exited
    found: Found | None = None  # an earlier core's live worker, attached at the first start
    gpu: int | None = None  # the CUDA device its workers are pinned to; None on the CPU
    launching: bool = False  # `_start` is spawning its process, not yet watched
    parking: ParkedWorker | None = None  # its incarnation let go by parking, device not yet free
    loaded: Load | None = None  # what its incarnation holds (a switch changes `load` first)


class WorkerPool(SlotPool[_Slot]):
    """The process pool: the first implementation of `gpu_pool.seam.Pool`."""

    def __init__(self, settings: PoolSettings, salvage: Salvage | None = None) -> None:
        self._settings = settings
        # What attached workers ran for a dead core's keyed requests.
        self.salvage = salvage if salvage is not None else Salvage()
        self._memory = settings.memory
        self._events: PoolEvents = Unstarted()
        self._ctx = multiprocessing.get_context("spawn")
        self._launcher = None if not settings.launcher else Launcher(
            tuple(dict.fromkeys(x.spec for x in (*settings.slot_loads(), *settings.claimable)
                                if x.preload or (not x.spawn and parse_spec(x.spec)[0]))),
            settings.backoff, settings.ready_timeout)
        self._lot = ParkingLot(settings.parked_max, settings.parked_ram_mb, self._spared,
                               self._parked_changed)
        loads = settings.slot_loads()
        gpus = settings.gpus
        super().__init__(Slots(
            [_Slot(i, load=loads[i], gpu=i % gpus if gpus else None)
             for i in range(settings.workers)],
            first=SlotState.STARTING, backoff=settings.backoff))

    # -- lifecycle -------------------------------------------------------------------------
    async def run(
        self, events: PoolEvents, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start every slot, then restart dead ones until cancelled; stops workers on exit."""
        self._events = events
        if self._settings.attach is not None:  # an earlier core's workers, still live
            found = attachable(self._settings.attach, [s.index for s in self._slots])
            for slot in self._slots:
                slot.found = found.get(slot.index)
        try:
            async with anyio.create_task_group() as tasks:
                if self._launcher is not None:
                    tasks.start_soon(self._launcher.run)
                try:
                    await self._slots.keep_started(self._start, task_status=task_status)
                finally:  # no restart asked of it once gone, while the launcher's task ends
                    self._slots.stop()
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop()

    async def wait_ready(self, count: int, within: float) -> int:
        """Wait until `count` workers are ready, or until each has either come up or died
        at least once with one ready (one that crashes while loading holds no one back), or
        `within` seconds; return how many are ready."""
        with anyio.move_on_after(within):
            while not self._slots.settled(count):
                await self._slots.changed().wait()
        return self.ready_count()

    async def stop(self, grace: float = 10.0) -> None:
        """Ask every worker to exit, wait up to `grace`, then kill the stragglers."""
        self._slots.stop()
        parked = self._lot.stop()
        for slot in self._slots:
            if slot.pipe is not None and slot.state.up:
                slot.pipe.send(Stop())
            elif slot.process is not None and slot.process.is_alive():
                slot.process.kill()  # still loading: nothing to finish
            if slot.retired is not None:  # replaced, told to stop, holds nothing
                slot.retired.kill()
                slot.retired.join(timeout=5)
                slot.retired = None
        live = [s for s in self._slots if s.process is not None and s.process.pid is not None]
        with anyio.move_on_after(grace):
            for slot in live:
                await slot.exited.wait()
        for one in parked:
            if one.process.is_alive():
                one.process.kill()
            one.process.join(timeout=5)
            collect(one)
        for slot in live:
            if slot.process is not None and slot.process.is_alive():
                slot.process.kill()
            if slot.process is not None:
                slot.process.join(timeout=5)
                self._detach(slot)
            slot.state = SlotState.STOPPED
        if self._launcher is not None:  # last: it reaps the workers it forked
            await self._launcher.stop()

    # -- commands ----------------------------------------------------------------------------
    def send(self, worker: WorkerId, run: Run) -> None:
        """Hand a batch to a ready worker (one being replaced runs it once its new process
        is up). One that is gone was (or is now) reported dead."""
        slot = self._slots.find(worker)
        if slot is not None and slot.replacing and slot.held is None:
            slot.held = run
            return
        if slot is None or slot.pipe is None or slot.state is not SlotState.READY:
            return
        slot.state = SlotState.BUSY
        slot.pipe.send(run)  # a broken pipe reports the death (`_lost`)

    def kill(self, worker: WorkerId) -> None:
        """SIGKILL a worker (hung batch); its death arrives through the sentinel. Not one
        being replaced: its batch has not started, it waits for the new process to load
        (a load that never ends is killed at the ready timeout: a death like any other)."""
        slot = self._slots.find(worker)
        if slot is not None and slot.replacing:
            log.warning("worker %s is being replaced: its batch has not started, it runs "
                        "once the new process is up; nothing to kill", worker)
        elif slot is not None and slot.process is not None and slot.process.is_alive():
            log.warning("killing worker %s (pid %s)", worker, slot.process.pid)
            slot.process.kill()

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process and s.process.pid]

    @property
    def launcher(self) -> Launcher | None:
        return self._launcher

    def parked(self) -> list[tuple[Load, int, int | None]]:
        """What is parked, oldest first: its load, its pid and the bytes it holds."""
        return [(p.load, p.process.pid or 0, p.rss) for p in self._lot.held()]

    def start_kind(self, load: Load) -> StartKind:
        """How a start of `load` would come up now: woken when a worker holding it is
        parked, forked while the launcher is up, else spawned."""
        if self._lot.holds(load):
            return StartKind.WAKE
        launcher = self._launcher
        return StartKind.FORK if launcher is not None and launcher.up is not None and \
            not load.spawn else StartKind.SPAWN

    # -- internals ---------------------------------------------------------------------------
    async def _start(self, slot: _Slot) -> None:
        await self._reap(slot)  # a replaced or switched process exits (its memory freed) first
        if self._slots.stopping:
            return
        if slot.leaving:  # retired (its process now gone, or parked) or taken back
            self._lot.bound()
            self._finish_leaving(slot)
            return
        # The core never saw a replaced worker go: it keeps its id.
        worker = slot.worker if slot.replacing else self._slots.begin(slot)
        found, slot.found = slot.found, None
        slot.launching, slot.loaded = True, slot.load
        try:
            process = None if found is None else await self._attach(slot, worker, found)
            if process is None:
                process = self._wake(slot, worker)
            self._lot.bound()  # after the wake: a switch back never gives up its own
            if process is None:
                process = await self._launch(slot, worker, self._config(slot))
        finally:
            slot.launching = False
        if process is None:  # could not spawn: retried (`_spawn_failed`), unless taken back
            self._finish_leaving(slot)
            return
        if slot.leaving:  # taken back while it was spawned: its exit removes the slot
            process.kill()
        ready = slot.ready
        with anyio.move_on_after(self._settings.ready_timeout):
            await ready.wait()
        if not ready.is_set() and slot.worker == worker and slot.process is process:
            log.error("worker %s gave no READY in %.0fs; killing it", worker,
                      self._settings.ready_timeout)
            process.kill()

    def _config(self, slot: _Slot) -> WorkerConfig:
        load = slot.load
        assert load is not None  # every slot of this pool is given one
        staying = sum(not s.leaving for s in self._slots)
        return WorkerConfig(
            model=load.spec, gpu=slot.gpu,
            threads=max(1, (os.cpu_count() or 1) // max(1, staying)),
            latency_floor=self._settings.floor(load), version=load.version,
            otlp_endpoint=self._settings.otlp_endpoint,
        )

    async def _attach(self, slot: _Slot, worker: WorkerId, found: Found) -> Process | None:
        """Connect to an earlier core's live worker and watch it; None when it is gone
        (the slot then starts one)."""
        try:
            process = AttachedProcess(found.pid)
        except OSError:
            leave(found)
            return None
        slot.ready, slot.exited = anyio.Event(), anyio.Event()
        try:
            with anyio.CancelScope(shield=True):  # as in `_launch`
                pipe = await open_socket(str(found.path),
                                         functools.partial(self._handle, slot, worker),
                                         functools.partial(self._lost, slot, worker))
        except OSError as exc:
            log.warning("could not attach to worker pid %d (%s); starting another",
                        found.pid, exc)
            process.kill()
            process.close()
            leave(found)
            return None
        slot.process, slot.pipe, slot.pid = process, pipe, found.pid
        asyncio.get_running_loop().add_reader(process.sentinel, self._on_exit, slot, worker)
        return process

    async def _launch(
        self, slot: _Slot, worker: WorkerId, config: WorkerConfig
    ) -> Process | None:
        """Fork the slot's process from the launcher, else spawn it, and watch its pipe and
        sentinel; None if it could not be started."""
        try:
            parent, child = self._ctx.Pipe()
        except OSError as exc:
            self._spawn_failed(slot, exc)
            return None
        attach = self._settings.attach
        stay = None if attach is None else Stay(attach, slot.index, keeper=os.getppid())
        slot.ready, slot.exited = anyio.Event(), anyio.Event()
        process: BaseProcess | ForkedProcess | None = await self._fork(slot, child, config,
                                                                       stay)
        if process is None:
            process = self._ctx.Process(
                target=worker_main, args=(child, config, stay),
                name=f"batchgate-worker-{slot.index}", daemon=True,
            )
            slot.process, slot.how = process, StartKind.SPAWN
            try:
                await anyio.to_thread.run_sync(process.start)
            except OSError as exc:
                parent.close()
                child.close()
                slot.process = None
                self._spawn_failed(slot, exc)
                return None
        child.close()
        slot.pid = process.pid
        # Shielded (one loop turn): cancelled in between, a live worker with no sentinel
        # watched would hold `stop` for its whole grace.
        try:
            with anyio.CancelScope(shield=True):
                slot.pipe = await open_pipe(parent,
                                            functools.partial(self._handle, slot, worker),
                                            functools.partial(self._lost, slot, worker))
        except OSError as exc:
            log.error("could not watch worker %s's pipe (%s); killing it", worker, exc)
            process.kill()  # its exit, through the sentinel, is a death like any other
        asyncio.get_running_loop().add_reader(process.sentinel, self._on_exit, slot, worker)
        return process

    async def _fork(self, slot: _Slot, child: Connection, config: WorkerConfig,
                    stay: Stay | None) -> ForkedProcess | None:
        """The slot's process forked by the launcher; None (spawn it) when there is none
        up, the version opts out, or the launcher failed. The pool's first starts wait for
        the launcher's first preload, and are measured as spawns: they paid as much."""
        launcher, load = self._launcher, slot.load
        if launcher is None or load is None or load.spawn:
            return None
        waited = launcher.up is None  # its preload: what a spawn would have paid
        await launcher.settled(self._settings.ready_timeout)
        process = await launcher.fork(child, config, stay)
        if process is not None:
            slot.process, slot.how = process, StartKind.SPAWN if waited else StartKind.FORK
        return process

    def _wake(self, slot: _Slot, worker: WorkerId) -> Process | None:
        """Wake the worker parked holding the slot's load on its device, as the slot's
        incarnation `worker`; None when none is parked (or ready to be woken)."""
        assert slot.load is not None  # every slot of this pool is given one
        parked = self._lot.take(slot.load, slot.gpu)
        if parked is None:
            return None
        process = parked.process
        loop = asyncio.get_running_loop()
        slot.ready, slot.exited = anyio.Event(), anyio.Event()
        slot.process, slot.pipe, slot.pid, slot.how = process, parked.pipe, process.pid, \
            StartKind.WAKE
        parked.pipe.rebind(functools.partial(self._handle, slot, worker),
                           functools.partial(self._lost, slot, worker))
        loop.add_reader(process.sentinel, self._on_exit, slot, worker)
        parked.pipe.send(Wake(self._config(slot).threads))
        log.info("worker %s wakes in slot %d (pid %s, parked %.1fs)", worker, slot.index,
                 process.pid, time.monotonic() - parked.since)
        return process

    def _spawn_failed(self, slot: _Slot, exc: OSError) -> None:
        """Out of descriptors, processes or memory: the slot is retried like a crash, with
        its backoff, for as long as it takes (a failure here once tore the pool down and
        left a server that answered 503 forever). A worker being replaced is one the core
        holds up: its death is reported. One taken back is not retried."""
        if slot.leaving:
            return
        if slot.replacing:
            self._lost(slot, slot.worker)
        else:
            slot.failures += 1
            slot.state = SlotState.DEAD
        self._slots.forget(slot.worker)
        log.error("could not start a worker in slot %d (%s); retrying in %.1fs",
                  slot.index, exc, self._slots.backoff.delay(slot.failures))
        self._slots.signal_change()
        self._slots.restart(slot)

    def _handle(self, slot: _Slot, worker: WorkerId, messages: list[object]) -> None:
        for msg in messages:
            if slot.worker == worker and not slot.leaving:  # a start taken back: nothing
                self._handle_one(slot, worker, msg)

    def _handle_one(self, slot: _Slot, worker: WorkerId, msg: object) -> None:
        if isinstance(msg, Ready) and slot.switched_out == worker:
            slot.ready.set()
            self._let_go(slot)  # it loaded the old version, switched away meanwhile
            self._slots.take_back(slot, worker)
        elif isinstance(msg, Attached):
            self._attached(slot, worker, msg)
        elif isinstance(msg, Ready):
            self._up(slot, worker, msg, "ready")
        elif isinstance(msg, Ok | Err):
            self._slots.mark_answered(slot)
            if self._memory.max_rss_mb is not None:
                self._check_memory(slot, worker)
            self._events.worker_reply(worker, msg)
        elif isinstance(msg, Salvaged):
            self.salvage.landed(worker, msg)

    def _attached(self, slot: _Slot, worker: WorkerId, msg: Attached) -> None:
        """An earlier core's worker said what it holds: up, if the catalogue names it."""
        held = Load(msg.version, msg.spec, msg.latency_floor)
        named = {(x.version, x.spec, self._settings.floor(x))
                 for x in (*self._settings.slot_loads(), *self._settings.claimable)}
        if (held.version, held.spec, msg.latency_floor) not in named:
            log.warning("worker pid %d (slot %d) holds %s, which the catalogue does not "
                        "name: ending it", msg.ready.pid, slot.index, held.version)
            if slot.process is not None:
                slot.process.kill()  # its exit is a death while loading: the slot starts
            return
        if slot.load is None or held.version != slot.load.version:
            self._slots.holds(slot, held)
        slot.loaded = slot.load
        slot.how = StartKind.ATTACH
        self.salvage.attached(worker, held.version, msg.salvaged)
        self._up(slot, worker, msg.ready, "attached, loaded by an earlier core")

    def _up(self, slot: _Slot, worker: WorkerId, msg: Ready, how: str) -> None:
        started = self._slots.mark_ready(slot, msg.device)
        slot.ready.set()
        log.info("worker %s %s (slot %d, pid %d, %s)", worker, how, slot.index, msg.pid,
                 msg.device)
        if self._memory.max_rss_mb is not None and \
                self._memory.exceeded(resident_bytes(msg.pid)):
            log.warning("worker %s holds more than --worker-max-rss-mb %d as it comes up:"
                        " it will be replaced after every batch", worker,
                        self._memory.max_rss_mb)
        if started is not None:
            self._events.worker_ready(worker, started, slot.version, slot.how)
        elif slot.held is not None and slot.pipe is not None:  # the core's, meanwhile
            run, slot.held = slot.held, None
            slot.state = SlotState.BUSY
            slot.pipe.send(run)

    def _check_memory(self, slot: _Slot, worker: WorkerId) -> None:
        """Replace an idle worker over the memory bound (before its answer is passed on:
        the core's next batch for it then waits for the new process)."""
        if slot.pid is None or slot.pipe is None or slot.process is None:
            return
        rss = resident_bytes(slot.pid)
        if rss is None or not self._memory.exceeded(rss):
            return
        log.warning("worker %s (slot %d, pid %d) holds %d MiB, over --worker-max-rss-mb %d: "
                    "replacing it between batches", worker, slot.index, slot.pid, rss // MIB,
                    self._memory.max_rss_mb)
        self._let_go(slot, park=False)  # parked, it would hold what it was replaced for
        self._slots.replace(slot)

    def _let_go(self, slot: _Slot, park: bool = True) -> None:
        """Tell the slot's idle process to stop (or to park, when `park` and parking is on),
        watching it no more: no death to report. The slot's next start waits for it to exit,
        or to free its device (`_reap`)."""
        if slot.process is None or slot.pipe is None:
            return
        asyncio.get_running_loop().remove_reader(slot.process.sentinel)
        if park and self._parks(slot):
            self._park(slot)
            return
        slot.pipe.finish(Stop())  # it exits once it reads this
        slot.retired, slot.process, slot.pipe = slot.process, None, None

    # -- parking -------------------------------------------------------------------------------
    def _parks(self, slot: _Slot) -> bool:
        """Whether the slot's idle incarnation, let go, parks rather than exits: parking is
        on and it is no cell's lasting worker (the next core could not tell a parked one
        from one that serves)."""
        return self._settings.parked_max > 0 and self._settings.attach is None and \
            slot.loaded is not None and not self._slots.stopping

    def _park(self, slot: _Slot) -> None:
        """Tell the slot's idle incarnation to park; the slot's next start waits until it
        said so (its device free), `_reap`."""
        assert slot.process is not None and slot.pipe is not None and slot.loaded is not None
        parked = self._lot.park(slot.loaded, slot.gpu, slot.process, slot.pipe)
        slot.parking, slot.process, slot.pipe = parked, None, None
        log.info("worker %s (slot %d, pid %s) parks holding %s", slot.worker, slot.index,
                 parked.process.pid, parked.load.version)

    def _spared(self) -> list[Place]:
        """What the slots about to start may wake: their predecessors still parking."""
        return [(s.load, s.gpu) for s in self._slots if s.parking is not None and s.load]

    async def _reap(self, slot: _Slot) -> None:
        """Wait until the replaced or switched process has exited, its memory freed,
        killing it past `STOP_GRACE_S`; or, parked, until it said its device is free."""
        parking = slot.parking
        if parking is not None:
            with anyio.move_on_after(STOP_GRACE_S):
                await parking.settled.wait()
            slot.parking = None
            if not parking.settled.is_set():
                log.warning("parked worker (pid %s) did not free its device; ending it",
                            parking.process.pid)
                self._lot.give_up(parking)
                parking.process.kill()
        process = slot.retired
        if process is None:
            return
        gone = anyio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(process.sentinel, gone.set)
        try:
            with anyio.move_on_after(STOP_GRACE_S):
                await gone.wait()
            if not gone.is_set():
                log.warning("replaced worker (pid %s) did not stop; killing it", process.pid)
                process.kill()
                with anyio.move_on_after(STOP_GRACE_S):
                    await gone.wait()
        finally:
            loop.remove_reader(process.sentinel)
        process.join(timeout=1)
        if isinstance(process, AttachedProcess):
            process.close()
        slot.retired = None

    def _lost(self, slot: _Slot, worker: WorkerId) -> None:
        """The worker is gone (EOF, broken pipe or exit): report it once. Not one the core
        switched away (its exit hands the slot over: `_on_exit`)."""
        if slot.switched_out == worker or not self._slots.mark_dead(slot, worker):
            return
        slot.held = None  # the core re-runs it, told of the death
        self.salvage.lost(worker)
        if slot.pipe is not None:
            slot.pipe.close()
        if slot.process is not None and slot.process.is_alive():
            slot.process.kill()
        if not self._slots.stopping:
            code = slot.process.exitcode if slot.process is not None else None
            log.warning("worker %s (slot %d) died (exit code %s)", worker, slot.index, code)
        self._events.worker_died(worker, slot.version, self._restart_of(slot))

    def _on_exit(self, slot: _Slot, worker: WorkerId) -> None:
        if slot.worker != worker:
            return
        if slot.leaving:  # a start taken back, killed: no death
            slot.ready.set()
            if slot.process is not None:
                slot.process.join(timeout=1)
            self._detach(slot)
            slot.exited.set()
            self._finish_leaving(slot)
            return
        if slot.switched_out == worker:  # died loading the version switched away from
            slot.ready.set()
            if slot.process is not None:
                slot.process.join(timeout=1)
            self._detach(slot)
            slot.exited.set()
            self._slots.take_back(slot, worker)
            return
        self._lost(slot, worker)
        assert slot.process is not None
        slot.process.join(timeout=1)
        self._detach(slot)
        slot.exited.set()
        if self._settings.restart:
            self._slots.restart(slot)

    # -- scaling (`gpu_pool.slot_pool`) -------------------------------------------------------
    def _restarts(self) -> bool:
        return self._settings.restart

    def _new_slot(self, index: int, load: Load) -> _Slot:
        return _Slot(index, load=load, gpu=self._free_gpu())

    def _free_gpu(self) -> int | None:
        """The lowest device no slot holds; else (a retired worker still exiting) the
        lowest no staying slot holds; else the least held."""
        if not self._settings.gpus:
            return None
        held = Counter(s.gpu for s in self._slots)
        staying = Counter(s.gpu for s in self._slots if not s.leaving)
        return min(range(self._settings.gpus), key=lambda d: (staying[d], held[d], d))

    def _abandon(self, slot: _Slot) -> None:
        """Kill what the leaving slot started (its exit removes the slot, `_on_exit`), or
        remove the slot now if nothing of it runs."""
        process = slot.process
        if not slot.launching and process is not None and process.pid is not None and \
                not slot.exited.is_set():
            process.kill()
        self._finish_leaving(slot)

    def _finish_leaving(self, slot: _Slot) -> None:
        """Remove the leaving slot once nothing of it runs: not being spawned, no process
        still to exit (its own, or one let go)."""
        if not slot.leaving or slot.launching or slot.retired is not None:
            return
        process = slot.process
        if process is not None and process.pid is not None and not slot.exited.is_set():
            return  # `_on_exit` comes back here
        self._detach(slot)
        self._slots.remove(slot)

    def _detach(self, slot: _Slot) -> None:
        if slot.process is not None:
            unwatch(slot.process)
            if isinstance(slot.process, AttachedProcess):  # its pidfd, watched no more
                slot.process.close()
        if slot.pipe is not None:
            slot.pipe.close()
            slot.pipe = None
        self._slots.forget(slot.worker)


__all__ = ["WorkerPool"]
