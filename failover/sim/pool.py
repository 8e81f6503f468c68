"""A pool of contract workers in virtual time: the `gpu_pool.Pool` seam, kept exactly.

Each worker holds one version (`Load`); a batch of 1..`MAX_BATCH` inputs takes the version's
fixed latency (`Load.floor`), whatever its size, one batch at a time, and answers each input
with itself; a start (the pool's first slots, a slot added, a switch, a restart) takes the
version's load time. Every start carries its `StartId` as the seam says: a first slot's is
`StartId(Origin.FIRST, index)`, a dead worker's restart `StartId(Origin.RESTART, its id)`,
and a start whose worker dies loading is retried under the same id after the backoff.

Deaths are injected (`Death`: a slot's incarnation dies at a time, up or loading) or asked
(`kill`). The pool keeps its own events in one heap and one task (`run`) fires them in
time order, so it costs a wake-up per distinct event time, not a task per worker.

A test directs it further (`DirectedPool`, in `failover.sim.directed`): holding what the
workers finish (answers, loads) until it lets them go, ending one now, a death now, heard
now or later. A send the contract forbids raises: to a busy or loading worker, of no input
or too many, to an incarnation the core itself switched away or retired, or to one that
never was.

Start kinds (`StartTimes`), as the process pool makes them (`gpu_pool.StartKind`): with
none given, every start is a spawn of the version's load time. Given, a worker let go idle
(switched away, retired) parks holding its load, up to `parked_max` (the oldest given up
first), holding no GPU: parking is what makes a load come back cheap. A start then wakes a
parked worker of its load (`wake_s`), else forks from the launcher (`fork_s`, when there is
one), else spawns; the first slots spawn (they pay the launcher's preload). A switch takes
the parked worker it wakes before the one it lets go parks, so that a full parked set never
gives up the very worker `start_kind` said the switch would wake. `start_kind` answers what
the next start of a load would be, so the core expects the right time.

What it measures (`figures`): GPU-seconds (slots held, starting, up or waiting out a
backoff, integrated over a window; parked workers hold none), the most held at once,
starts added and stopped, switches, crashes, batches and items run, seconds spent loading
for switches, and how many starts came up each way (spawned, forked, woken).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from batcher import MAX_BATCH, VersionKey
from batcher.shared import Backoff
from failover.sim.loop import EPSILON_S
from failover.sim.meter import Counts, Figures, Held
from gpu_pool import (
    Err,
    Load,
    Ok,
    Origin,
    PoolEvents,
    Run,
    StartId,
    StartKind,
    WorkerId,
    WorkerInfo,
)


@dataclass(frozen=True, slots=True)
class StartTimes:
    """How long each kind of start takes, and how many workers may park (what a host with a
    launcher and parking pays, against a spawn of the version's load time each start).

    `fork_s`: a start forked from the launcher (None: no launcher, a start that wakes
    nothing spawns); `wake_s`: a parked worker of the load woken (its weights back on the
    GPU); `parked_max`: workers parked at most (0: none park)."""

    fork_s: float | None = None
    wake_s: float | None = None
    parked_max: int = 0

    def __post_init__(self) -> None:
        if self.parked_max < 0 or any(t is not None and not 0 <= t < math.inf
                                      for t in (self.fork_s, self.wake_s)):
            raise ValueError("start times must be >= 0 and parked_max >= 0")
        if self.parked_max > 0 and self.wake_s is None:
            raise ValueError("parked workers need a wake time (wake_s)")


@dataclass(frozen=True, slots=True)
class Death:
    """At `at` seconds, the incarnation of slot `slot` (its index) dies, up or loading."""

    at: float
    slot: int


class SlotState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    DEAD = "dead"  # waiting out its backoff before it starts again


class _Do(enum.IntEnum):  # what a heap entry does; ties at one time go in the order pushed
    UP = 0
    DONE = 1
    DIE = 2
    BEGIN = 3
    INJECT = 4


_FINISHES = (_Do.UP, _Do.DONE)  # what the workers finish: held while the pool holds
_OWN = (_Do.UP, _Do.DONE, _Do.BEGIN)  # a slot's one pending step: fenced by `Slot.due`

Entry = tuple[float, int, _Do, int, int]  # (t, seq, do, slot, worker)


def echo(load: Load, run: Run) -> Ok:
    """A contract worker's answer: each input, in its version's fixed latency."""
    return Ok(run.batch_id, run.inputs, load.floor(None))


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as a test reads it. `state`: starting, ready, busy or dead (waiting out its
    backoff, or, not `heard`, gone without the pool having noticed); `since`: when it came
    up (ready, busy) or its load began; `start`: the start it carries out, if any."""

    index: int
    worker: WorkerId
    version: VersionKey
    state: str
    since: float
    start: StartId | None
    switching: bool
    heard: bool


@dataclass(slots=True)
class Slot:
    index: int
    load: Load
    start: StartId | None
    worker: WorkerId = field(default=WorkerId(0))
    state: SlotState = SlotState.STARTING
    ready_at: float = 0.0
    began: float = 0.0  # when its start began loading
    failures: int = 0
    batch: Run | None = None
    switching: bool = False
    how: StartKind = StartKind.SPAWN  # how its incarnation comes (came) up
    due: int = -1  # the entry of its pending step (load, answer, restart): others are stale
    heard: bool = True  # dead: the pool noticed (its death reported)

    def info(self) -> WorkerInfo:
        return WorkerInfo(id=self.worker, slot=self.index, pid=None, state=self.state.value,
                          device="sim", batches=0, restarts=0, node="sim",
                          version=self.load.version)


@dataclass
class ContractPool:
    """Implements `gpu_pool.Pool` over contract workers in virtual time.

    `first`: the load of each first slot; `load_s`: a version's load time (a spawn's);
    `deaths`: when which slot dies; `metered`: the window GPU-seconds are counted over;
    `answer`: what a worker answers for a batch; `kinds`: the times of a fork and a wake
    and how many park (None: every start a spawn, nothing parks)."""

    first: Sequence[Load]
    load_s: Callable[[VersionKey], float]
    backoff: Backoff = field(default_factory=Backoff)
    deaths: Sequence[Death] = ()
    metered: tuple[float, float] = (0.0, math.inf)
    answer: Callable[[Load, Run], Ok | Err] = echo
    kinds: StartTimes | None = None

    def __post_init__(self) -> None:
        self._slots: dict[int, Slot] = {}
        self._of: dict[WorkerId, Slot] = {}
        self._ids = itertools.count(1)
        self._indexes = itertools.count()  # slot indexes: the first slots', then added
        self._heap: list[Entry] = []
        self._held_entries: list[Entry] = []  # finishes come due while holding
        self.holding = False  # the workers' finishes wait for `let_go` (a test's)
        self._unheard: list[tuple[int, WorkerId, bool, float]] = []  # slot, worker, up, up_for
        self._ended: dict[WorkerId, str] = {}  # incarnations the core ended: why
        self._last = WorkerId(0)  # the newest incarnation's id
        self._seq = itertools.count()
        self._events: PoolEvents | None = None
        self._wake = anyio.Event()
        self._until = math.inf  # when the task next wakes unless woken
        self._changed = anyio.Event()
        self._held = Held(*self.metered)
        self.counts = Counts()
        self._parked: list[Load] = []  # the loads of the workers parked, oldest first
        self._launched = False  # the first slots began: the launcher is up from here on

    # -- the task ------------------------------------------------------------------------
    async def run(self, events: PoolEvents, *, task_status: TaskStatus[None]) -> None:
        self._events = events
        now = anyio.current_time()
        self._indexes = itertools.count(len(self.first))
        for index, load in enumerate(self.first):
            self._new_slot(index, load, StartId(Origin.FIRST, index), now)
        self._launched = True
        for death in self.deaths:
            self._push(death.at, _Do.INJECT, death.slot, 0)
        task_status.started()
        while True:
            now = anyio.current_time()
            heap = self._heap
            while heap and heap[0][0] <= now + EPSILON_S:
                entry = heapq.heappop(heap)
                if self.holding and entry[2] in _FINISHES:
                    self._held_entries.append(entry)
                    continue
                self.counts.fired += 1
                self._fire(entry, now)
            self._until = heap[0][0] if heap else math.inf
            self._wake = anyio.Event()
            with anyio.CancelScope(deadline=self._until):
                await self._wake.wait()

    def _push(self, at: float, do: _Do, index: int, worker: int) -> int:
        seq = next(self._seq)
        heapq.heappush(self._heap, (at, seq, do, index, worker))
        if at < self._until:
            self._until = at
            self._wake.set()
        return seq

    def _fire(self, entry: Entry, now: float) -> None:
        _, seq, do, index, number = entry
        worker = WorkerId(number)
        slot = self._slots.get(index)
        if slot is None or (do in _OWN and seq != slot.due):
            return
        if do is _Do.INJECT:
            if slot.state is not SlotState.DEAD:
                self._die(slot, now)
        elif do is _Do.BEGIN:
            if slot.state is SlotState.DEAD:
                self._begin(slot, now)
        elif slot.worker != worker:  # fenced: an event of an incarnation gone
            return
        elif do is _Do.UP and slot.state is SlotState.STARTING:
            self._up(slot, now)
        elif do is _Do.DONE and slot.state is SlotState.BUSY:
            self._done(slot, None)
        elif do is _Do.DIE and slot.state is not SlotState.DEAD:
            self._die(slot, now)

    def _done(self, slot: Slot, reply: Ok | Err | None) -> None:
        run, worker = slot.batch, slot.worker
        assert run is not None
        slot.batch, slot.state, slot.due = None, SlotState.READY, -1
        self._tell().worker_reply(worker, self.answer(slot.load, run) if reply is None
                                  else reply)

    def _tell(self) -> PoolEvents:
        assert self._events is not None, "a worker event before the pool ran"
        return self._events

    # -- an incarnation's life -------------------------------------------------------------
    def _new_slot(self, index: int, load: Load, start: StartId, now: float) -> None:
        slot = Slot(index, load, start)
        self._slots[index] = slot
        self._held.change(now, len(self._slots))
        self._begin(slot, now)

    def _begin(self, slot: Slot, now: float) -> None:
        """A new incarnation loads the slot's version for its start: woken (the parked
        worker taken), forked or spawned, as `start_kind` says, in that kind's time."""
        how = slot.how = self.start_kind(slot.load)
        kinds = self.kinds
        if how is StartKind.WAKE:
            assert kinds is not None and kinds.wake_s is not None
            self._parked.remove(slot.load)
            self.counts.wakes += 1
            took = kinds.wake_s
        elif how is StartKind.FORK:
            assert kinds is not None and kinds.fork_s is not None
            self.counts.forks += 1
            took = kinds.fork_s
        else:
            self.counts.spawns += 1
            took = self.load_s(slot.load.version)
        slot.worker = self._last = WorkerId(next(self._ids))
        slot.state, slot.began = SlotState.STARTING, now
        self._of[slot.worker] = slot
        slot.due = self._push(now + took, _Do.UP, slot.index, slot.worker)

    def _park(self, load: Load) -> None:
        """An idle worker let go parks holding `load` (no GPU held), the oldest parked
        given up past `parked_max`; with no parking it simply exits."""
        most = 0 if self.kinds is None else self.kinds.parked_max
        if most > 0:
            self._parked.append(load)
            del self._parked[:-most]

    def _up(self, slot: Slot, now: float) -> None:
        start, slot.start, slot.due = slot.start, None, -1
        assert start is not None
        if slot.switching:
            self.counts.switch_s += now - slot.began
        slot.state, slot.ready_at, slot.switching = SlotState.READY, now, False
        self._changed.set()
        self._tell().worker_ready(slot.worker, start, slot.load.version, slot.how)

    def _die(self, slot: Slot, now: float, heard: bool = True) -> None:
        """The slot's incarnation is gone. Heard, it is reported with the start its slot
        carries out and the slot starts again after its backoff; not heard, both wait until
        the pool notices (`hear`)."""
        worker, up = slot.worker, slot.state in (SlotState.READY, SlotState.BUSY)
        self._of.pop(worker, None)
        slot.batch, slot.due = None, -1
        slot.state, slot.switching, slot.heard = SlotState.DEAD, False, heard
        self.counts.crashes += 1
        up_for = now - slot.ready_at if up else 0.0
        if heard:
            self._report(slot, worker, up, up_for, now)
        else:
            self._unheard.append((slot.index, worker, up, up_for))

    def _report(self, slot: Slot, worker: WorkerId, up: bool, up_for: float,
                now: float) -> None:
        slot.failures = self.backoff.after_exit(slot.failures, up_for)
        if up:
            slot.start = StartId(Origin.RESTART, worker)
        slot.heard = True
        slot.due = self._push(now + self.backoff.delay(slot.failures), _Do.BEGIN, slot.index, 0)
        self._tell().worker_died(worker, slot.load.version, slot.start)

    def _leave(self, slot: Slot, now: float) -> None:
        self._of.pop(slot.worker, None)
        del self._slots[slot.index]
        self._held.change(now, len(self._slots))
        self.counts.stopped += 1

    # -- the seam: what the core's owner asks --------------------------------------------------
    async def wait_ready(self, count: int, within: float) -> int:
        with anyio.move_on_after(within):
            while self.ready_count() < count:
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.ready_count()

    def send(self, worker: WorkerId, run: Run) -> None:
        slot = self._of.get(worker)
        if slot is None:  # gone: its death is (or was) reported, unless the core ended it
            why = self._ended.get(worker) or (None if 0 < worker <= self._last
                                              else "never started")
            if why is not None:
                raise RuntimeError(f"the contract is broken: a batch sent to worker "
                                   f"{worker}, {why}")
            return
        if slot.state is not SlotState.READY or not 1 <= len(run.inputs) <= MAX_BATCH:
            raise RuntimeError(f"the contract is broken: {len(run.inputs)} inputs sent to "
                               f"worker {worker}, {slot.state.value}")
        slot.state, slot.batch = SlotState.BUSY, run
        self.counts.batches += 1
        self.counts.items += len(run.inputs)
        slot.due = self._push(anyio.current_time() + slot.load.floor(None), _Do.DONE,
                              slot.index, worker)

    def kill(self, worker: WorkerId) -> None:
        slot = self._of.get(worker)
        if slot is not None:
            self._push(anyio.current_time(), _Do.DIE, slot.index, worker)

    def forgive(self, worker: WorkerId) -> None:
        """A forgiven death costs its slot no backoff here either: nothing to undo, as the
        pool's backoff only delays a restart already under way."""

    def switch(self, worker: WorkerId, load: Load, start: StartId) -> None:
        slot = self._of.get(worker)
        if slot is None or slot.state is not SlotState.READY:
            return
        del self._of[worker]
        self._ended[worker] = "switched away"
        away, slot.load, slot.start, slot.switching = slot.load, load, start, True
        self.counts.switches += 1
        self._begin(slot, anyio.current_time())  # woken if parked: before `away` parks,
        self._park(away)  # so that a full parked set does not give up the one it wakes

    def add(self, load: Load, start: StartId) -> None:
        self.counts.started += 1
        self._new_slot(next(self._indexes), load, start, anyio.current_time())

    def retire(self, worker: WorkerId) -> None:
        slot = self._of.get(worker)
        if slot is not None and slot.state is SlotState.READY:
            self._ended[worker] = "retired"
            self._park(slot.load)
            self._leave(slot, anyio.current_time())

    def cancel_start(self, start: StartId) -> bool:
        slot = next((s for s in self._slots.values() if s.start == start), None)
        if slot is None or slot.switching or slot.state not in (SlotState.STARTING, SlotState.DEAD):
            return False
        self._leave(slot, anyio.current_time())
        return True

    # -- reading -----------------------------------------------------------------------------
    def start_kind(self, load: Load) -> StartKind:
        """How the next start of `load` comes up: woken when a worker holding it is parked,
        forked once the first slots began (the launcher up) if there is a launcher and the
        load may fork, else spawned."""
        kinds = self.kinds
        if kinds is None:
            return StartKind.SPAWN
        if load in self._parked:
            return StartKind.WAKE
        if kinds.fork_s is not None and self._launched and not load.spawn:
            return StartKind.FORK
        return StartKind.SPAWN

    def parked(self) -> list[Load]:
        """The loads of the workers parked now, oldest first."""
        return list(self._parked)

    def ready_count(self) -> int:
        return sum(s.state in (SlotState.READY, SlotState.BUSY) for s in self._slots.values())

    def workers(self) -> list[WorkerInfo]:
        return [slot.info() for slot in self._slots.values()]

    def state_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for slot in self._slots.values():
            out[slot.state.value] = out.get(slot.state.value, 0) + 1
        return out

    @property
    def crashes(self) -> int:
        return self.counts.crashes

    def figures(self, now: float) -> Figures:
        c = self.counts
        return Figures(self._held.seconds(now), self._held.peak, c.started, c.stopped,
                       c.switches, c.crashes, c.batches, c.items, c.switch_s, c.spawns,
                       c.forks, c.wakes)

    def in_flight(self) -> int:
        """Items in the batches running now."""
        return sum(len(s.batch.inputs) for s in self._slots.values() if s.batch is not None)

    def slots(self) -> int:
        """Slots held now (starting, up, or waiting out a backoff)."""
        return len(self._slots)

    def view(self) -> list[SlotView]:
        """Each slot held now, in the order its index was given."""
        return [self._view(slot) for slot in self._slots.values()]

    def slot(self, index: int) -> SlotView | None:
        """Slot `index` now (None: it left)."""
        slot = self._slots.get(index)
        return None if slot is None else self._view(slot)

    @staticmethod
    def _view(slot: Slot) -> SlotView:
        up = slot.state in (SlotState.READY, SlotState.BUSY)
        return SlotView(slot.index, slot.worker, slot.load.version, slot.state.value,
                        slot.ready_at if up else slot.began, slot.start, slot.switching,
                        slot.heard)

    def running(self, worker: WorkerId) -> Run | None:
        """The batch incarnation `worker` runs now."""
        slot = self._of.get(worker)
        return None if slot is None else slot.batch


__all__ = ["ContractPool", "Death", "SlotView", "StartTimes", "echo"]
