"""The owner task: the one task that feeds the dispatch core and carries out its actions.

The pool reports its events here (they are queued, never handled inside the pool's
callback); the front door admits and cancels items through here. Each turn hands every
queued event to the core with one reading of the clock, then performs the actions in the
core's order: batches out to workers first, then kills, then answers to waiters. Between
turns it sleeps until an event arrives or the core's next deadline passes. Nothing calls
back into the core, so no decision ever runs inside another: the front door writes the
answers a turn settled once its actions are carried out (`after_turns`), and placement looks
last.

A wake much later than asked for means the owner's own loop stood still (the process was
stopped, a long pause): the core is told, so that no batch is judged hung for time its
worker spent answering into a pipe nobody read, and those answers are read before the turn.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from batcher import Clock, FlushReason, Item, Tier, VersionKey
from failover.actions import CoreActions
from failover.core import CoreStatistics, Refusal
from failover.errors import ModelLoading
from gpu_pool import Err, Load, Ok, Pool, StartId, StartKind, WorkerId

STALL_S = 0.1
"""A wake this much later than the owner asked for (or than its last turn, if that ran
past the deadline) means its loop stood still."""
STALL_READS = 2
"""Loop passes the owner lets go by after a stall before its turn: the timer that woke it
may run before the loop reads the workers' pipes (uvloop runs due timers first), and one
pass reads them."""


class Core(Protocol):
    """What the owner feeds and reads: a synchronous state machine that takes events with
    the turn's clock reading and returns the actions to carry out. A `DispatchCore` serves
    one version; the fleet's composite (`failover.fleet.ModelCores`) one per version."""

    def admit(self, items: list[Item], deadline_in: float, now: float) -> bool: ...

    def admit_all(
        self, requests: Sequence[tuple[list[Item], float]], now: float
    ) -> tuple[list[Refusal | None], bool]: ...

    def resolve(self, model: str | None, sticky: str | None) -> VersionKey | None: ...

    def judge(self, version: VersionKey | None, tier: Tier, items: int, chars: int,
              deadline_in: float, now: float) -> int: ...

    def cancel(self, item: Item) -> bool: ...

    def drain(self) -> None: ...

    def worker_ready(self, worker: WorkerId, now: float, start: StartId | None = None,
                     version: VersionKey | None = None,
                     how: StartKind = StartKind.SPAWN) -> CoreActions: ...

    def reply(self, worker: WorkerId, reply: Ok | Err, now: float, at: float) -> CoreActions:
        ...

    def worker_died(self, worker: WorkerId, now: float, version: VersionKey | None = None,
                    restart: StartId | None = None) -> CoreActions: ...

    def poll(self, now: float) -> CoreActions: ...

    def place(self, now: float) -> CoreActions: ...

    def stalled(self, seconds: float) -> None: ...

    def next_deadline(self) -> float: ...

    def finished(self) -> bool: ...

    def abandon(self) -> CoreActions: ...

    def expected_wait(self, tier: Tier, now: float) -> float: ...

    def ready_count(self) -> int: ...

    @property
    def draining(self) -> bool: ...

    def statistics(self, now: float) -> CoreStatistics: ...


class CoreObserver(Protocol):
    """Told of every batch sent and answered (metrics); must be cheap and never raise."""

    def batch_sent(self, size: int, reason: FlushReason | None, idle_gap: float | None,
                   version: VersionKey | None = None) -> None:
        ...

    def batch_done(self, seconds: float, version: VersionKey | None = None) -> None: ...

    def load_done(self, version: VersionKey, seconds: float) -> None:
        """A worker loaded `version` in `seconds`, from the moment it was asked for."""

    def guard_verdict(self, guard: str, reason: str, count: int = 1) -> None:
        """`guard` answered an input: "allow", or its refusal's reason code."""

    def guard_failed(self, guard: str, mode: str, count: int = 1) -> None:
        """`guard` could not answer an input in time; `mode`: "closed" or "open"."""


class _Unobserved:
    def batch_sent(self, size: int, reason: FlushReason | None, idle_gap: float | None,
                   version: VersionKey | None = None) -> None:
        pass

    def batch_done(self, seconds: float, version: VersionKey | None = None) -> None:
        pass

    def load_done(self, version: VersionKey, seconds: float) -> None:
        pass

    def guard_verdict(self, guard: str, reason: str, count: int = 1) -> None:
        pass

    def guard_failed(self, guard: str, mode: str, count: int = 1) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Ready:
    worker: WorkerId
    start: StartId
    version: VersionKey
    how: StartKind


@dataclass(frozen=True, slots=True)
class _Reply:
    worker: WorkerId
    reply: Ok | Err
    at: float


@dataclass(frozen=True, slots=True)
class _Died:
    worker: WorkerId
    version: VersionKey
    restart: StartId | None


@dataclass(frozen=True, slots=True)
class _Change:
    """Something the core decides on changed outside it (the catalogue): applied in a
    turn, with that turn's clock reading."""

    apply: Callable[[float], None]


class CoreOwner:
    """Implements `gpu_pool.PoolEvents` for the pool it drives."""

    def __init__(
        self, core: Core, pool: Pool, clock: Clock,
        observer: CoreObserver | None = None,
        loads: Callable[[VersionKey], Load] | None = None,
    ) -> None:
        """`loads`: what a worker switched to a version loads (several versions only)."""
        self._core = core
        self._loads = loads
        self._pool = pool
        self._clock = clock
        self._observer: CoreObserver = observer or _Unobserved()
        self._inbox: deque[_Ready | _Reply | _Died | _Change] = deque()
        self._wake = anyio.Event()
        self._finished = anyio.Event()
        self._turned_at = -math.inf  # the clock at the start of the last turn
        self._turn_over: tuple[Callable[[], None], ...] = ()  # replaced, never changed

    # -- the pool's events: queued for the next turn ---------------------------------------
    def worker_ready(self, worker: WorkerId, start: StartId, version: VersionKey,
                     how: StartKind = StartKind.SPAWN) -> None:
        self._post(_Ready(worker, start, version, how))

    def worker_reply(self, worker: WorkerId, reply: Ok | Err) -> None:
        self._post(_Reply(worker, reply, self._clock.now()))

    def worker_died(self, worker: WorkerId, version: VersionKey, restart: StartId | None) -> None:
        self._post(_Died(worker, version, restart))

    def _post(self, event: _Ready | _Reply | _Died | _Change) -> None:
        self._inbox.append(event)
        self._wake.set()

    # -- the front door --------------------------------------------------------------------
    def admit(self, items: list[Item], deadline_in: float, now: float | None = None) -> None:
        """Queue a request's items or refuse them all (the core's errors propagate); `now`
        when the caller has just read the clock."""
        try:
            turn = self._core.admit(items, deadline_in, self._clock.now() if now is None else now)
        except ModelLoading:  # placement starts the load it waits for: take a turn
            self._wake.set()
            raise
        if turn:
            self._wake.set()

    def admit_all(
        self, requests: Sequence[tuple[list[Item], float]], now: float
    ) -> list[Refusal | None]:
        """Queue several requests (each refused or queued whole): each one's refusal."""
        refusals, turn = self._core.admit_all(requests, now)
        if turn:
            self._wake.set()
        return refusals

    def resolve(self, model: str | None, sticky: str | None) -> VersionKey | None:
        """The version a request naming `model` runs on (raises UnknownModel); "" for a
        core of one version."""
        return self._core.resolve(model, sticky)

    def judge(self, version: VersionKey | None, tier: Tier, items: int, chars: int,
              deadline_in: float) -> int:
        """Judge a streamed request before any of its inputs is queued (raises its
        refusal); the ready workers of its version."""
        return self._core.judge(version, tier, items, chars, deadline_in, self._clock.now())

    def cancel(self, item: Item) -> None:
        if self._core.cancel(item):
            self._wake.set()

    def change(self, apply: Callable[[float], None]) -> None:
        """Something the core decides on changed outside it (the admin API, SIGHUP):
        `apply(now)` changes the core in a turn taken at once, with that turn's clock, so
        what the caller reads next already has it."""
        self._post(_Change(apply))
        self._turn()
        self._wake.set()  # the loop asks the core again when it next needs waking

    def after_turns(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` at the end of every turn, once its batches are out and its items
        settled, before placement looks: a front door writes the answers a batch settled
        in the same pass of the loop, not the next. Returns what takes it off again."""
        self._turn_over += (callback,)

        def off() -> None:
            self._turn_over = tuple(c for c in self._turn_over if c is not callback)

        return off

    def drain(self) -> None:
        """Stop admitting; `run` returns once everything queued and in flight is answered."""
        self._core.drain()
        self._wake.set()

    def expected_wait(self, tier: Tier) -> float:
        return self._core.expected_wait(tier, self._clock.now())

    def ready_count(self) -> int:
        return self._core.ready_count()

    @property
    def draining(self) -> bool:
        return self._core.draining

    def statistics(self) -> CoreStatistics:
        return self._core.statistics(self._clock.now())

    # -- the task --------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Turn until the core has drained (or until cancelled)."""
        task_status.started()
        try:
            while True:
                self._turn()
                if self._core.finished():
                    return
                if self._inbox:  # posted while performing (a send found its worker gone)
                    continue
                self._wake = anyio.Event()
                deadline = self._core.next_deadline()
                if deadline == math.inf:
                    await self._wake.wait()
                elif deadline > self._clock.now():
                    with anyio.CancelScope(deadline=deadline):
                        await self._wake.wait()
                else:  # due already: turn again, but never starve the loop doing so
                    await anyio.lowlevel.checkpoint()
                late = self._clock.now() - max(deadline, self._turned_at)
                if late > STALL_S:
                    await self._stalled(late)
        finally:
            self._finished.set()

    async def _stalled(self, seconds: float) -> None:
        """The loop stood still for at least `seconds`: no batch's clock ran meanwhile, and
        what the workers answered meanwhile is read before any batch is judged."""
        self._core.stalled(seconds)
        for _ in range(STALL_READS):
            await anyio.lowlevel.checkpoint()

    async def wait_finished(self) -> None:
        await self._finished.wait()

    def abandon(self) -> None:
        """Shutdown: answer every item that will never run now."""
        self._perform(self._core.abandon())

    def _turn(self) -> None:
        now = self._turned_at = self._clock.now()
        core, actions = self._core, CoreActions()
        while self._inbox:
            event = self._inbox.popleft()
            if isinstance(event, _Reply):
                actions.extend(core.reply(event.worker, event.reply, now, event.at))
            elif isinstance(event, _Died):
                actions.extend(core.worker_died(event.worker, now, event.version,
                                                event.restart))
            elif isinstance(event, _Ready):
                actions.extend(core.worker_ready(event.worker, now, event.start,
                                                 event.version, event.how))
            else:
                event.apply(now)
        actions.extend(core.poll(now))
        self._perform(actions)
        for turn_over in self._turn_over:
            turn_over()
        self._perform(core.place(now))

    def _perform(self, actions: CoreActions) -> None:
        observer = self._observer
        for send in actions.send:
            self._pool.send(send.worker, send.run)
            observer.batch_sent(len(send.run.inputs), send.reason, send.idle_gap, send.version)
        for worker in actions.kill:
            self._pool.kill(worker)
        for worker in actions.forgive:
            self._pool.forgive(worker)
        for worker, version, start in actions.switch:
            assert self._loads is not None, "a switch needs the versions' loads"
            self._pool.switch(worker, self._loads(version), start)
        for start in actions.cancel_start:  # first: a slot taken back frees its device
            self._pool.cancel_start(start)
        for version, start in actions.grow:
            assert self._loads is not None, "a worker added needs the versions' loads"
            self._pool.add(self._loads(version), start)
        for worker in actions.retire:
            self._pool.retire(worker)
        for seconds, ran in actions.batch_seconds:
            observer.batch_done(seconds, ran)
        for version, seconds in actions.loaded:
            observer.load_done(version, seconds)
        if actions.guards:
            for guard, said, failed in actions.guards:
                if failed:
                    observer.guard_failed(guard, said)
                else:
                    observer.guard_verdict(guard, said)
        for item, result in actions.settle:
            item.sink.item_done(item, result)  # `Item.settle`, inlined: 100 a batch


__all__ = ["Core", "CoreObserver", "CoreOwner"]
