"""Slot bookkeeping shared by the process pool and the Ray pool.

A pool has slots, each holding one worker incarnation at a time under a
fresh `WorkerId`, so an answer from a dead incarnation is never taken for its successor's.
What both pools keep alike lives here: the states, finding a slot by worker, counting
crashes, when a dead slot starts again (`Backoff`), and waking `wait_ready`. How a worker
is started, watched and killed stays in each pool.

A worker over its memory bound (`gpu_pool.memory`) is replaced between batches, which is no
crash: its slot starts a new process (or actor) at once, under the same `WorkerId`, since
the core never saw the old one go (it was idle, its last answer delivered: nothing late can
come from it); a batch the core sends meanwhile waits for the new one.

A slot holds one model version (`Load`); a restart keeps it. The core switches an idle
worker to another version (`Slots.switch`): the slot's incarnation is retired, as for a
replacement, and once it has exited the slot starts the new version under a NEW id (the core
took the old one out itself and learns the new one's version from its ready event: never a
death). No crash, no failure for the backoff, no restart counted. Until the new incarnation
is up (or dies) the slot shows as "switching" (no state of its own: it is starting, or
pending, for a switch). A switch that finds the slot in a memory replacement (the core saw
that worker idle) hands the replacement over: its start begins the new version, or, if its
process already loads the old one, that one is let go as it comes up or dies
(`switched_out`, `take_back`).

Every start a slot carries out has an identity (`StartId`): the slot's first
(`Origin.FIRST`, its index), the core's (a switch, a slot added), or a restart of a worker
that died once up (`Origin.RESTART`, the dead one's id); one that dies loading is retried
under the same id. The slot keeps it until a worker is up for it, and the pool's events
carry it back with the version, so nothing else is remembered of past incarnations.

The core scales the pool while it serves. A slot added (`Slots.add`) takes an index never
used before and starts at once. A slot leaves for good when the core retires its idle
incarnation (`retire`: let go as for a switch) or takes back a start not yet up
(`cancel_start`): it is forgotten at once (never reported dead, no crash counted), shows as
"stopped", and is removed (`remove`, by the pool) once nothing it started still runs.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from collections.abc import Callable, Collection, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskStatus

from batcher import VersionKey
from batcher.shared import Backoff
from gpu_pool.load import DEFAULT_VERSION, Load
from gpu_pool.protocol import Origin, Run, StartId, StartKind, WorkerId
from gpu_pool.seam import WorkerInfo

SWITCHING = "switching"  # what a slot in a switch shows (`WorkerInfo.state`, `state_counts`)


class SlotState(enum.Enum):
    PENDING = "pending"  # created, waiting for a node with room (Ray actors only)
    STARTING = "starting"  # placed, loading its model
    READY = "ready"
    BUSY = "busy"
    DEAD = "dead"
    STOPPED = "stopped"

    @property
    def up(self) -> bool:
        """Loaded and alive: it counts as ready, idle or not."""
        return self in (SlotState.READY, SlotState.BUSY)


@dataclass(slots=True)
class Slot:
    """One place for a worker: its current incarnation and the slot's history. Each pool
    extends it with the handles it watches the incarnation through."""

    index: int
    worker: WorkerId = field(default=WorkerId(0))
    state: SlotState = SlotState.STARTING
    device: str = "-"
    pid: int | None = None
    node: str = "local"
    batches: int = 0
    restarts: int = 0
    failures: int = 0  # deaths in a row, for the backoff
    ready_at: float = 0.0  # when the incarnation came up, on the owner's clock
    counted: WorkerId | None = None  # the last incarnation whose death raised `failures`
    replacing: bool = False  # its worker is being replaced, not restarted (`Slots.replace`)
    held: Run | None = None  # sent while the worker is replaced: the new incarnation's first
    load: Load | None = None  # the version it holds or loads; a restart keeps it
    switching: bool = False  # switched by the core, the new incarnation not up yet
    switched_out: WorkerId | None = None  # retired by a switch while still being replaced
    leaving: bool = False  # retired or its start taken back: removed once nothing runs
    start: StartId | None = None  # the start under way until a worker is up for it
    how: StartKind = StartKind.SPAWN  # how its incarnation is coming up (or came up)

    @property
    def version(self) -> VersionKey:
        return self.load.version if self.load else DEFAULT_VERSION

    @property
    def shown(self) -> str:
        """The state `/admin/workers` and the gauges show."""
        loading = self.state in (SlotState.PENDING, SlotState.STARTING)
        return SWITCHING if self.switching and loading else self.state.value

    def info(self) -> WorkerInfo:
        return WorkerInfo(id=self.worker, slot=self.index, pid=self.pid, state=self.shown,
                          device=self.device, batches=self.batches, restarts=self.restarts,
                          node=self.node, version=self.version)


S = TypeVar("S", bound=Slot)


class Slots(Generic[S]):
    """A pool's slots and the bookkeeping around them. Called on the event loop only; the
    clock is read only to time how long an incarnation stayed up. Indexing (`slots[i]`)
    is by position, which is the slot's index until slots are added or removed."""

    def __init__(
        self, slots: Sequence[S], *, first: SlotState, backoff: Backoff,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`first`: the state every incarnation begins in (PENDING where it waits for room,
        STARTING where it starts at once); a pool that never waits shows no pending count."""
        self._slots = list(slots)
        self._next_index = max((s.index for s in self._slots), default=-1) + 1
        self._first = first
        self.backoff = backoff
        self._clock = clock
        self._ids = itertools.count(1)
        self._by_worker: dict[WorkerId, S] = {}
        self._stopping = False
        self._crashes = self._replacements = self._switches = 0
        self._changed: anyio.Event | None = None  # what `wait_ready` waits on, if anyone
        self._wake = anyio.Event()  # set when a slot's backoff is shortened, or it leaves
        self._running = False  # `keep_started` has started the first slots
        # (slot, at once): at once for a replacement, a switch, a new or a leaving slot, else
        # after the backoff. Unbounded in type only: a slot asks once per incarnation.
        self._restart_send, self._restart_recv = anyio.create_memory_object_stream[
            tuple[S, bool]](math.inf)
        for slot in self._slots:
            slot.state, slot.start = first, StartId(Origin.FIRST, slot.index)

    def __iter__(self) -> Iterator[S]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, index: int) -> S:
        return self._slots[index]

    def find(self, worker: WorkerId) -> S | None:
        """The slot holding incarnation `worker`, while the pool still knows it."""
        return self._by_worker.get(worker)

    # -- an incarnation's life ---------------------------------------------------------------
    def begin(self, slot: S) -> WorkerId:
        """Give `slot` a new incarnation, in the first state, under a fresh id; its id."""
        worker = WorkerId(next(self._ids))
        slot.worker, slot.state, slot.device, slot.pid = worker, self._first, "-", None
        slot.switched_out = None
        self._by_worker[worker] = slot
        return worker

    def holds(self, slot: S, load: Load) -> None:
        """The slot's incarnation turned out to hold `load` (an actor an earlier core left,
        perhaps switched): that is its version, and the slot's from now on."""
        slot.load = load

    def forget(self, worker: WorkerId) -> None:
        """Nothing sent to `worker` reaches it any more."""
        self._by_worker.pop(worker, None)

    def mark_ready(self, slot: S, device: str) -> StartId | None:
        """The incarnation loaded its model on `device`: idle, and its run starts now. The
        start it ends (None for a replacement: the core never saw its worker go)."""
        slot.state, slot.device, slot.ready_at = SlotState.READY, device, self._clock()
        replaced, slot.replacing, slot.switching = slot.replacing, False, False
        self.signal_change()
        if replaced:
            return None
        start, slot.start = slot.start, None
        return start if start is not None else StartId(Origin.RESTART, slot.worker)

    def mark_answered(self, slot: S) -> None:
        """The slot's batch came back: it is idle again."""
        slot.state = SlotState.READY
        slot.batches += 1

    def mark_dead(self, slot: S, worker: WorkerId) -> bool:
        """Record that incarnation `worker` of `slot` is gone: a crash unless the pool is
        stopping, a failure for the backoff unless it ran stably. False, and nothing
        recorded, if it is not the slot's incarnation or was already recorded."""
        if slot.worker != worker or slot.state in (SlotState.DEAD, SlotState.STOPPED):
            return False
        up_for = self._clock() - slot.ready_at if slot.state.up else 0.0
        if slot.start is None:  # it was up (or being replaced): its slot starts anew
            slot.start = StartId(Origin.RESTART, worker)
        slot.state, slot.replacing, slot.switching = SlotState.DEAD, False, False
        if not self._stopping:
            self._crashes += 1
        failures = self.backoff.after_exit(slot.failures, up_for)
        slot.counted = worker if failures > slot.failures else None
        slot.failures = failures
        self.signal_change()
        return True

    def forgive(self, worker: WorkerId) -> None:
        """Take back the failure the death of incarnation `worker` counted, if it was the
        slot's last: its input was convicted, the slot did nothing wrong. A restart
        waiting out the backoff is woken to wait only what is left of the shorter one."""
        for slot in self._slots:
            if slot.counted == worker and slot.failures > 0:
                slot.failures -= 1
                slot.counted = None
                self._wake_waiting()

    def _wake_waiting(self) -> None:
        """Wake every start waiting out a backoff to look again (`_start_after`)."""
        self._wake.set()
        self._wake = anyio.Event()

    # -- restarts ----------------------------------------------------------------------------
    def restart(self, slot: S) -> None:
        """Count a restart of `slot` and have `keep_started` start it after its backoff;
        nothing once stopping."""
        if self._stopping or slot.leaving:
            return
        slot.restarts += 1
        self._restart_send.send_nowait((slot, False))

    def replace(self, slot: S) -> None:
        """Have `keep_started` start `slot` again at once, its worker kept: the pool has
        retired an idle incarnation that grew too big. No crash, no failure for the
        backoff, no restart counted; the slot is starting until the new one is up (or
        dies: then it is a death like any other). Nothing once stopping."""
        if self._stopping:
            return
        slot.state, slot.replacing = self._first, True
        self._replacements += 1
        self.signal_change()
        self._restart_send.send_nowait((slot, True))

    def switch(self, slot: S, worker: WorkerId, load: Load, start: StartId) -> bool:
        """The core retires idle incarnation `worker` of `slot` for `load`; whether the
        switch is on (False: `worker` is not the slot's live, idle incarnation, or the pool
        is stopping; nothing changed). On: `worker` is forgotten and the slot holds `load`.
        A ready slot is started again at once (the pool lets its incarnation go first, in
        the same turn); a slot being replaced is not (its start is under way: see the
        module's doc). No crash, no failure for the backoff, no restart counted."""
        if self._stopping or slot.worker != worker or slot.held is not None:
            return False
        if slot.state is not SlotState.READY and not slot.replacing:
            return False
        self.forget(worker)
        slot.load, slot.switching, slot.start = load, True, start
        self._switches += 1
        if slot.state is SlotState.READY:
            slot.state = self._first
            self._restart_send.send_nowait((slot, True))
        else:
            slot.replacing, slot.switched_out = False, worker
        self.signal_change()
        return True

    def take_back(self, slot: S, worker: WorkerId) -> bool:
        """Incarnation `worker`, switched away while being replaced, came up or died: the
        pool has let it go, and the slot starts its new version at once. False, and
        nothing done, if `worker` is not such an incarnation (or was already taken back)."""
        if slot.switched_out != worker or self._stopping:
            return False
        slot.switched_out, slot.state = None, self._first
        self._restart_send.send_nowait((slot, True))
        return True

    async def keep_started(
        self, start: Callable[[S], Coroutine[Any, Any, None]], *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call `start` for every slot at once, then again for each slot handed to
        `restart`, after its backoff (a leaving slot's at once: `start` lets it go); never
        once stopping. Runs until cancelled, with every `start` in flight; once over, the
        slots are stopping (a death reported after it, as a pool torn down without `stop`
        sees, is no restart to hand over)."""
        try:
            async with anyio.create_task_group() as tg, self._restart_recv:
                self._running = True  # a slot added from now on is handed over by `add`
                for slot in list(self._slots):
                    tg.start_soon(self._start_after, start, slot, 0.0)
                task_status.started()
                async for slot, at_once in self._restart_recv:
                    delay = 0.0 if at_once else self.backoff.delay(slot.failures)
                    tg.start_soon(self._start_after, start, slot, delay)
        finally:
            self._stopping = True

    async def _start_after(
        self, start: Callable[[S], Coroutine[Any, Any, None]], slot: S, delay: float
    ) -> None:
        began = anyio.current_time()
        while (left := delay - (anyio.current_time() - began)) > 0 and not slot.leaving:
            with anyio.move_on_after(left):
                await self._wake.wait()
            if not slot.replacing:  # forgiven meanwhile: wait the shorter backoff
                delay = min(delay, self.backoff.delay(slot.failures))
        if not self._stopping:
            await start(slot)

    def stop(self) -> None:
        """From now on a death is no crash and no slot restarts."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- slots added and removed -------------------------------------------------------------
    def add(self, make: Callable[[int], S], start: StartId) -> S | None:
        """A new slot for `start`, `make(index)` under an index never used before, in the
        first state; `keep_started` starts it at once. None, and nothing added, once
        stopping."""
        if self._stopping:
            return None
        slot = make(self._next_index)
        self._next_index += 1
        slot.state, slot.start = self._first, start
        self._slots.append(slot)
        if self._running:  # else `keep_started` starts it with the first ones
            self._restart_send.send_nowait((slot, True))
        self.signal_change()
        return slot

    def retire(self, slot: S, worker: WorkerId) -> bool:
        """The core retires idle incarnation `worker` of `slot` for good; whether it leaves
        (False: `worker` is not the slot's live, idle incarnation, or the pool is stopping;
        nothing changed). A ready slot is started at once (the pool lets its incarnation go
        first, in the same turn): its start waits for it to exit and removes the slot. One
        being replaced is the pool's to end (`SlotPool._abandon`)."""
        if self._stopping or slot.leaving or slot.worker != worker or slot.held is not None:
            return False
        idle = slot.state is SlotState.READY
        if not idle and not slot.replacing:
            return False
        self._leave(slot)
        if idle:
            self._restart_send.send_nowait((slot, True))
        return True

    def cancel_start(self, start: StartId, skip: Collection[WorkerId] = ()) -> S | None:
        """The slot carrying out `start` while no worker is up for it (pending, starting,
        or dead and waiting out its backoff), now leaving; None if there is none or the
        pool is stopping. Not a slot in a switch or a replacement (the core holds that
        worker), nor one whose incarnation is in `skip` (its death not reported yet)."""
        slot = next((s for s in self._slots if s.start == start), None)
        if (self._stopping or slot is None
                or slot.state not in (SlotState.PENDING, SlotState.STARTING, SlotState.DEAD)
                or slot.leaving or slot.switching or slot.replacing
                or slot.switched_out is not None or slot.worker in skip):
            return None
        self._leave(slot)
        return slot

    def _leave(self, slot: S) -> None:
        self.forget(slot.worker)
        slot.leaving, slot.replacing, slot.state = True, False, SlotState.STOPPED
        self._wake_waiting()  # a restart waiting out its backoff goes at once
        self.signal_change()

    def remove(self, slot: S) -> None:
        """The leaving `slot` is gone: nothing it started runs any more. Idempotent."""
        if any(s is slot for s in self._slots):
            self._slots = [s for s in self._slots if s is not slot]
            self.signal_change()

    # -- waiting for start-up ----------------------------------------------------------------
    def settled(self, count: int, stuck: Collection[SlotState] = ()) -> bool:
        """Whether `wait_ready(count)` is done: `count` slots are up, or one is and each of
        the first `count` has come up, died or restarted once (one that crashes while
        loading holds no one back), or is in a `stuck` state, waiting for what will not
        come (room in a full cluster)."""
        ready = self.ready_count()
        if ready >= count:
            return True
        staying = [s for s in self._slots if not s.leaving]
        return ready > 0 and all(
            s.state in (SlotState.READY, SlotState.BUSY, SlotState.DEAD) or s.restarts > 0
            or s.state in stuck
            for s in staying[:count]
        )

    def changed(self) -> anyio.Event:
        """An event set at the next change of any slot's readiness."""
        if self._changed is None or self._changed.is_set():
            self._changed = anyio.Event()
        return self._changed

    def signal_change(self) -> None:
        """Wake `wait_ready`: a worker came up, went down, or found room."""
        if self._changed is not None:
            self._changed.set()

    # -- what the pool reports ---------------------------------------------------------------
    def ready_count(self) -> int:
        return sum(s.state.up for s in self._slots)

    def workers(self) -> list[WorkerInfo]:
        return [slot.info() for slot in self._slots]

    def state_counts(self) -> dict[str, int]:
        counts = {state.value: 0 for state in SlotState
                  if state is not SlotState.PENDING or self._first is SlotState.PENDING}
        counts[SWITCHING] = 0
        for slot in self._slots:
            counts[slot.shown] += 1
        return counts

    @property
    def crashes(self) -> int:
        return self._crashes

    @property
    def replacements(self) -> int:
        """Workers replaced between batches for their memory (`replace`)."""
        return self._replacements

    @property
    def switches(self) -> int:
        """Workers switched to another version by the core (`switch`)."""
        return self._switches


__all__ = ["SWITCHING", "Slot", "SlotState", "Slots"]
