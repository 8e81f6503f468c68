"""The ledger of starts: every worker on its way, once, from the moment it is asked for
until a worker is up for it or it is taken back.

A start has an identity (`StartId`) made where it is created: by the core when it asks for
a worker (a worker added, a switch of an idle worker to another version), by the pool when
it starts a slot on its own (its first workers, a dead worker's restart). The pool's events
carry it back (`worker_ready` ends it, `worker_died` retries it or begins a restart), so no
event is matched to a start by guessing. Placement reads what is loading per version, the
scaling rule the starts that add a worker (a switch keeps its worker), admission each
version's ETAs; nobody else keeps a copy.

A start that fails (its worker dies while loading) stays in the ledger under its id, its ETA
moved out by the pool's backoff. The time a version takes to load is measured here, from
the starts that end (a restart's holds its backoff, so it is not measured), apart for each
way a worker comes up (`StartKind`: spawned, forked from the launcher, woken from parked):
a start is expected to take the time of the kind the pool would use for it.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, replace
from typing import TypeVar

from batcher import VersionKey
from batcher.shared import Backoff
from gpu_pool import Origin, StartId, StartKind, WorkerId

MEASURE_WEIGHT = 0.3  # of the newest load in a version's measured load time
LATE_SHARE = 0.25  # of a start-up: when a start past its ETA is expected from now
# The kinds of start each kind is never slower than.
_SLOWER = {StartKind.WAKE: (StartKind.FORK, StartKind.SPAWN), StartKind.FORK: (StartKind.SPAWN,)}
K = TypeVar("K")


class Kind(enum.Enum):
    """Why a slot loads a version."""

    FIRST = "first"  # a worker the pool starts with
    ADD = "add"  # a worker the scaling rule adds
    SWITCH = "switch"  # an idle worker switched to another version: it keeps its place
    RESTART = "restart"  # a dead worker's slot starting again

    @property
    def measured(self) -> bool:
        """Whether its load time is a version's load time (a restart's holds its backoff)."""
        return self is not Kind.RESTART


@dataclass(frozen=True, slots=True)
class Start:
    id: StartId
    version: VersionKey
    kind: Kind
    since: float  # when it was asked for
    eta: float  # when a worker is expected up for it
    failures: int = 0  # attempts that died loading
    worker: WorkerId | None = None  # a switch: the idle worker it takes
    held: VersionKey | None = None  # a switch: the version that worker held

    @property
    def adds_worker(self) -> bool:
        """Whether the pool grows by it when it comes up (a switch keeps its worker)."""
        return self.kind is not Kind.SWITCH


class Ledger:
    """The one table of starts. Synchronous, clocked by its caller."""

    def __init__(self, backoff: Backoff | None = None) -> None:
        """`backoff`: the pool's, which a start that dies loading waits out."""
        self._backoff = backoff or Backoff()
        self._starts: dict[StartId, Start] = {}  # in the order asked for
        self._numbers = itertools.count(1)
        # Seconds a start of each version takes, by how it came up; and of any version.
        self.measured: dict[tuple[VersionKey, StartKind], float] = {}
        self._of_kind: dict[StartKind, float] = {}

    # -- what begins a start ---------------------------------------------------------------
    def ask(self, kind: Kind, version: VersionKey, now: float, load_s: float,
            worker: WorkerId | None = None, held: VersionKey | None = None) -> StartId:
        """A start the core asks for (`Kind.ADD`, `Kind.SWITCH`): its new id."""
        start = StartId(Origin.CORE, next(self._numbers))
        self._starts[start] = Start(start, version, kind, now, now + load_s, 0, worker, held)
        return start

    def first(self, slot: int, version: VersionKey, now: float, load_s: float) -> StartId:
        """The start the pool makes of its slot `slot` when it starts."""
        start = StartId(Origin.FIRST, slot)
        self._starts[start] = Start(start, version, Kind.FIRST, now, now + load_s)
        return start

    def died(self, start: StartId, version: VersionKey, now: float, load_s: float) -> Start:
        """A worker died and its slot carries out `start`: the same start, failed once more
        (its worker died loading), or a new restart of a worker that was up."""
        known = self._starts.get(start)
        if known is None:
            known = Start(start, version, Kind.RESTART, now, now + load_s)
        else:
            failures = known.failures + 1
            known = replace(known, failures=failures,
                            eta=now + self._backoff.delay(failures) + load_s)
        self._starts[start] = known
        return known

    # -- what ends one ---------------------------------------------------------------------
    def up(self, start: StartId, now: float, how: StartKind = StartKind.SPAWN) -> Start | None:
        """A worker is up for `start`, come up `how` (None: a start not in the ledger,
        taken back)."""
        done = self._starts.pop(start, None)
        if done is not None and done.kind.measured and how is not StartKind.ATTACH:
            seconds = now - done.since
            _weigh(self.measured, (done.version, how), seconds)
            _weigh(self._of_kind, how, seconds)
        return done

    def measured_of(self, version: VersionKey) -> dict[StartKind, float]:
        """Seconds a start of `version` took, as measured, by kind."""
        return {k: s for (v, k), s in self.measured.items() if v == version}

    def time_of(self, version: VersionKey, how: StartKind) -> float | None:
        """Seconds a start of `version` is expected to take, come up `how`: as measured.
        Else a wake (moving weights back: about alike for any version) as measured of any
        version, but never longer than a slower kind of this version measured (a wake is no
        slower than a fork, a fork than a spawn); else that slower kind's time (a fork pays
        whatever its model loads after the fork, which only its own measure knows). None:
        nothing to go by (a spawn never measured)."""
        own = self.measured.get((version, how))
        if own is not None:
            return own
        bound = min((s for (v, k), s in self.measured.items()
                     if v == version and k in _SLOWER.get(how, ())), default=None)
        kind = self._of_kind.get(how) if how is StartKind.WAKE else None
        if kind is None:
            return bound
        return kind if bound is None else min(kind, bound)

    def cancel(self, start: StartId) -> Start | None:
        """`start` is taken back: the pool ends it."""
        return self._starts.pop(start, None)

    def switch_of(self, worker: WorkerId) -> Start | None:
        """The switch that takes `worker`, dropped: the worker died before the pool
        switched it, so the switch never happens (its slot restarts what it held)."""
        found = next((s for s in self._starts.values() if s.worker == worker), None)
        if found is not None:
            del self._starts[found.id]
        return found

    # -- reading ---------------------------------------------------------------------------
    def get(self, start: StartId) -> Start | None:
        return self._starts.get(start)

    def of(self, version: VersionKey) -> list[Start]:
        """The starts of `version`, oldest first."""
        return [s for s in self._starts.values() if s.version == version]

    def under_way(self, version: VersionKey) -> int:
        return sum(s.version == version for s in self._starts.values())

    def began(self, version: VersionKey) -> float:
        """When the earliest start of `version` under way was asked for (inf: none)."""
        return min((s.since for s in self._starts.values() if s.version == version),
                   default=math.inf)

    def switches(self) -> int:
        return sum(not s.adds_worker for s in self._starts.values())

    def adding(self) -> list[Start]:
        """The starts that grow the pool when they come up, oldest first: what the scaling
        rule counts as workers on their way."""
        return [s for s in self._starts.values() if s.adds_worker]

    def joining(self, version: VersionKey, now: float, load_s: float) -> tuple[float, ...]:
        """When each start of `version` that adds a worker is expected up, for admission,
        soonest first. A start past its ETA is late by an unknown amount: expected a share
        of a start-up from now, never as if up; overdue by more than a start-up (a Ray
        actor no node has room for) it no longer counts: nobody knows when it comes."""
        late = now + LATE_SHARE * load_s
        return tuple(sorted(s.eta if s.eta >= now else late for s in self._starts.values()
                            if s.version == version and s.adds_worker
                            and now <= s.eta + load_s))

    def next_eta(self, now: float) -> float:
        """Seconds until the next start that adds a worker is expected up (0: none)."""
        return max(0.0, min((s.eta for s in self.adding()), default=now) - now)

    def __len__(self) -> int:
        return len(self._starts)


def _weigh(into: dict[K, float], key: K, seconds: float) -> None:
    """Fold the newest measure into `into[key]`."""
    before = into.get(key)
    into[key] = seconds if before is None else (
        (1 - MEASURE_WEIGHT) * before + MEASURE_WEIGHT * seconds)


__all__ = ["LATE_SHARE", "MEASURE_WEIGHT", "Kind", "Ledger", "Start"]
