"""The Ray pool's parked actors (`--parked-max`, not in a cell): an actor let go by a switch
or a retire that keeps its process, its weights in host memory, so that a later start of its
version wakes it (`StartKind.WAKE`), as a parked process worker does (`gpu_pool.parking`).

The lot holds them oldest first and kills the oldest past the bound, but never one a slot
about to start may wake (`spared`); the pool also gives them up while the cluster has no
room for an actor it must start (a parked actor holds its room). One that dies, or fails to
park, is dropped: it held no work, no death is reported. Each change to what is parked is
told to the pool (`changed`). Ray's answers come on its own threads; the lot hears them on
the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import ray
from ray.exceptions import RayError

from gpu_pool.load import Load
from gpu_pool.ray_actor import Owner
from gpu_pool.ray_cluster import kill_actors
from gpu_pool.worker import WorkerConfig

log = logging.getLogger("batchgate.ray_pool")


@dataclass(slots=True, eq=False)
class ParkedActor:
    """An actor let go that keeps its process, its weights in host memory, until a start
    of its version wakes it, or it is given up (the oldest first)."""

    load: Load
    config: WorkerConfig  # what it holds: a start of the same wakes it
    actor: Any
    node: str
    pid: int | None
    sentinel: ray.ObjectRef[Any]  # its owner's call, pending while it lives: a woken one's
    since: float  # when it was parked, on the monotonic clock
    settled: anyio.Event = field(default_factory=anyio.Event)  # its park answered, or it died
    gone: bool = False  # dead, or its park failed: not to be woken


class ActorLot:
    def __init__(self, most: int, owner: Owner, spared: Callable[[], set[WorkerConfig]],
                 changed: Callable[[], None]) -> None:
        """`most`: the bound; `owner`: the pool's, which parks and wakes; `spared()`: the
        configs slots about to start may wake."""
        self._most, self._owner = most, owner
        self._spared, self._changed = spared, changed
        self._parked: list[ParkedActor] = []  # oldest first

    def __len__(self) -> int:
        return len(self._parked)

    def held(self) -> list[ParkedActor]:
        """What is parked, oldest first."""
        return list(self._parked)

    def holds(self, config: WorkerConfig) -> bool:
        return any(p.config == config and not p.gone for p in self._parked)

    def park(self, load: Load, config: WorkerConfig, actor: Any, node: str, pid: int | None,
             sentinel: ray.ObjectRef[Any]) -> ParkedActor | None:
        """Tell an idle actor, its slot's no more, to park and keep it; None when this
        process lost Ray itself (the actor is dropped)."""
        parked = ParkedActor(load, config, actor, node, pid, sentinel, time.monotonic())
        self._parked.append(parked)
        self._watch(parked, sentinel, self._gone)
        try:
            ref = actor.park.remote(self._owner)
        except RayError:  # this process lost Ray itself
            self._gone(parked, None)
            return None
        self._watch(parked, ref, self._says)
        self._changed()
        self.bound()
        return parked

    def take(self, config: WorkerConfig) -> ParkedActor | None:
        """The oldest actor parked holding `config`, out of the lot; None if none."""
        parked = next((p for p in self._parked if p.config == config and not p.gone), None)
        if parked is not None:
            self._parked.remove(parked)
            self._changed()
        return parked

    async def settled(self, parked: ParkedActor, within: float) -> ParkedActor | None:
        """`parked` once its park answered (a wake must not run before it: an actor's
        calls run in threads, in no set order); None, and it is killed, if it died, failed
        or took longer than `within` seconds."""
        with anyio.move_on_after(within):
            await parked.settled.wait()
        if parked.settled.is_set() and not parked.gone:
            return parked
        log.warning("parked actor (node %s, pid %s) could not be woken; starting another",
                    parked.node, parked.pid)
        kill_actors([parked.actor])
        return None

    def bound(self) -> None:
        """Kill the oldest parked actors past the bound, sparing what a slot about to start
        may wake (one let go for another version, its start not yet under way)."""
        wanted = self._spared()
        spared = [p for p in self._parked if p.config in wanted]
        while len(self._parked) - len(spared) > self._most:
            oldest = next(p for p in self._parked if p not in spared)
            self.give_up(oldest, f"{len(self._parked)} parked")

    def make_room(self, fit: int, held: int) -> None:
        """Give up the oldest parked actors while the cluster's room for `fit` actors holds
        no more beside them and the pool's `held` others."""
        while self._parked and held + len(self._parked) >= fit:
            self.give_up(self._parked[0], f"the cluster has room for {fit} workers")

    def give_up(self, parked: ParkedActor, why: str) -> None:
        """Kill a parked actor; its death (its sentinel failing) is only noted."""
        if parked in self._parked:
            self._parked.remove(parked)
            self._changed()
        log.info("parked actor (node %s, pid %s, %s) given up: %s", parked.node, parked.pid,
                 parked.load.version, why)
        kill_actors([parked.actor])

    def stop(self) -> list[Any]:
        """Forget every parked actor: theirs to kill, the caller's."""
        actors = [p.actor for p in self._parked]
        if self._parked:
            self._parked.clear()
            self._changed()
        return actors

    def _watch(
        self, parked: ParkedActor, ref: ray.ObjectRef[Any],
        then: Callable[[ParkedActor, concurrent.futures.Future[Any] | None], None],
    ) -> None:
        """Run `then` on the event loop once `ref`, a parked actor's call, is answered."""
        loop = asyncio.get_running_loop()

        def done(future: concurrent.futures.Future[Any]) -> None:  # in a Ray thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(then, parked, future)

        ref.future().add_done_callback(done)

    def _says(self, parked: ParkedActor, future: concurrent.futures.Future[Any] | None
              ) -> None:
        if future is None or future.exception() is not None:  # died, or refused to park
            self._gone(parked, future)
        elif not parked.settled.is_set():
            parked.settled.set()
            self._changed()

    def _gone(self, parked: ParkedActor, future: concurrent.futures.Future[Any] | None
              ) -> None:
        """A parked actor died (its sentinel call ended) or failed to park: nothing to
        report, it held no work; it is not woken. Nothing for one woken or given up."""
        parked.gone = True
        parked.settled.set()
        if parked in self._parked:
            self._parked.remove(parked)
            log.warning("parked actor (node %s, pid %s, %s) is gone", parked.node,
                        parked.pid, parked.load.version)
            kill_actors([parked.actor])  # one that failed to park holds its room still
            self._changed()


__all__ = ["ActorLot", "ParkedActor"]
