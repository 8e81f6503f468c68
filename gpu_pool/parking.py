"""The process pool's parked workers (`--parked-max`): a worker let go (retired, or switched
away) that keeps its process, its weights moved to host memory, so that a later start of its
version on its device wakes it in a moment instead of loading it from scratch.

The lot holds them oldest first and bounds them by count and by the host memory they hold
(`--parked-ram-mb`), giving up the oldest first, but never the one a slot about to start
may wake (`spared`). A parked worker holds no work: when it exits nothing is reported, it
is only collected. Each change to what is parked is told to the pool (`changed`), so that
whoever waits on it looks again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

import anyio

from gpu_pool.attach import AttachedProcess
from gpu_pool.load import Load
from gpu_pool.memory import MIB, resident_bytes
from gpu_pool.pipe import WorkerPipe
from gpu_pool.protocol import Park, Parked, Stop

log = logging.getLogger("batchgate.pool")

Process = BaseProcess | AttachedProcess
Place = tuple[Load, int | None]  # a version on a device (None: the CPU)


@dataclass(slots=True, eq=False)
class ParkedWorker:
    """A worker let go that keeps its process, its weights in host memory, until a start
    of its version on its device wakes it, or it is given up (the oldest first)."""

    load: Load
    gpu: int | None
    process: Process
    pipe: WorkerPipe
    since: float  # when it was parked, on the monotonic clock
    settled: anyio.Event = field(default_factory=anyio.Event)  # said `Parked`, or gone
    rss: int | None = None  # bytes resident once parked


class ParkingLot:
    def __init__(self, most: int, ram_mb: int | None, spared: Callable[[], list[Place]],
                 changed: Callable[[], None]) -> None:
        """`most`, `ram_mb`: the bounds; `spared()`: what slots about to start may wake."""
        self._most, self._ram_mb = most, ram_mb
        self._spared, self._changed = spared, changed
        self._parked: list[ParkedWorker] = []  # oldest first

    def held(self) -> list[ParkedWorker]:
        """What is parked, oldest first."""
        return list(self._parked)

    def holds(self, load: Load) -> bool:
        return any(p.load == load for p in self._parked)

    def park(self, load: Load, gpu: int | None, process: Process, pipe: WorkerPipe
             ) -> ParkedWorker:
        """Tell an idle worker, watched by its pool no more, to park; it is settled once
        it said so (its device free)."""
        parked = ParkedWorker(load, gpu, process, pipe, time.monotonic())
        pipe.rebind(functools.partial(self._says, parked), functools.partial(self._gone, parked))
        pipe.send(Park())
        asyncio.get_running_loop().add_reader(process.sentinel, self._gone, parked)
        self._parked.append(parked)
        self._changed()  # bound once the slot's next start took what it wakes
        return parked

    def take(self, load: Load, gpu: int | None) -> ParkedWorker | None:
        """The worker parked holding `load` on `gpu`, out of the lot and watched no more,
        to be woken; None when none is (or none said it parked yet)."""
        parked = next((p for p in self._parked if p.load == load and p.gpu == gpu
                       and p.settled.is_set()), None)
        if parked is not None:
            self._parked.remove(parked)
            self._changed()
            unwatch(parked.process)
        return parked

    def bound(self) -> None:
        """Give up the oldest parked workers past the count or the host-memory bound,
        sparing what a slot about to start may wake (its predecessor still parking)."""
        wanted = self._spared()
        spared = [p for p in self._parked if (p.load, p.gpu) in wanted]
        parked, budget = self._parked, self._ram_mb
        while len(parked) > len(spared) and (  # the spared leave it as they wake
                len(parked) - len(spared) > self._most or
                (budget is not None and sum(p.rss or 0 for p in parked) > budget * MIB)):
            oldest = next(p for p in parked if p not in spared)
            log.info("parked worker (pid %s, %s) given up: %d parked, %d MiB", oldest.process.pid,
                     oldest.load.version, len(parked), sum(p.rss or 0 for p in parked) // MIB)
            self.give_up(oldest)

    def give_up(self, parked: ParkedWorker) -> None:
        """Tell a parked worker to exit; its exit is only collected."""
        if parked in self._parked:
            self._parked.remove(parked)
            self._changed()
        unwatch(parked.process)
        parked.pipe.finish(Stop())
        asyncio.get_running_loop().add_reader(parked.process.sentinel, self._gone, parked)

    def stop(self) -> list[ParkedWorker]:
        """Give every parked worker up; they are the caller's to end (`collect`) once they
        had their grace."""
        parked = list(self._parked)
        for one in parked:
            self.give_up(one)
        return parked

    def _says(self, parked: ParkedWorker, messages: list[object]) -> None:
        if any(isinstance(m, Parked) for m in messages) and not parked.settled.is_set():
            parked.rss = resident_bytes(parked.process.pid) if parked.process.pid else None
            parked.settled.set()
            self.bound()
            self._changed()

    def _gone(self, parked: ParkedWorker) -> None:
        """A parked worker exited (killed, or its pipe broke): nothing to report, it held
        no work; it is not woken."""
        parked.settled.set()
        if parked in self._parked:
            self._parked.remove(parked)
            log.warning("parked worker (pid %s, %s) is gone", parked.process.pid,
                        parked.load.version)
        collect(parked)
        self._changed()


def collect(parked: ParkedWorker) -> None:
    """End what is left of a parked worker: its watch, its pipe, its process."""
    unwatch(parked.process)
    parked.pipe.close()
    if parked.process.is_alive():
        parked.process.kill()
    parked.process.join(timeout=1)
    if isinstance(parked.process, AttachedProcess):
        parked.process.close()


def unwatch(process: Process) -> None:
    """Stop watching `process`'s exit (nothing when its pidfd is closed already)."""
    if process.sentinel >= 0:
        asyncio.get_running_loop().remove_reader(process.sentinel)


__all__ = ["ParkedWorker", "ParkingLot", "Place", "Process", "collect", "unwatch"]
