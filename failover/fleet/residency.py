"""Which worker holds which version, and what is loading: the workers up (and since when),
the workers retired whose death the pool may still report, and the ledger of starts.

A worker belongs to the version it holds from the event that says it is up (which carries
its start and its version) until it leaves: switched to another version, retired, or dead.
A version's load time is the ledger's measurement for the kind of start the pool would use
now (`how`: spawn, fork or wake), else the catalogue's hint, else `DEFAULT_LOAD_S`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from batcher import VersionKey
from failover.fleet.ledger import Kind, Ledger, Start
from gpu_pool import StartId, StartKind, WorkerId

DEFAULT_LOAD_S = 30.0  # a version's load time before one is measured or hinted
RETIRED_KEPT = 1024  # workers retired whose death the pool may still report


class Residency:
    def __init__(self, ledger: Ledger, hint: Callable[[VersionKey], float | None],
                 how: Callable[[VersionKey], StartKind] | None = None) -> None:
        """`hint`: the catalogue's load time of a version (None: none given). `how`: the
        kind of start the pool would make of a version now (None: always a spawn)."""
        self.ledger = ledger
        self._hint = hint
        self._how = how or _spawned
        self._of: dict[WorkerId, VersionKey] = {}  # workers up, by the version they hold
        self._since: dict[WorkerId, float] = {}  # when each became resident
        self._retired: dict[WorkerId, VersionKey] = {}  # retired workers (newest last), by version

    # -- the pool's events -----------------------------------------------------------------
    def up(self, worker: WorkerId, start: StartId, version: VersionKey, now: float,
           how: StartKind = StartKind.SPAWN) -> Start | None:
        """`worker`, holding `version`, is up for `start`, come up `how`: the start it
        ended, if the ledger held it (a start taken back may still come up: it serves)."""
        self._of[worker], self._since[worker] = version, now
        return self.ledger.up(start, now, how)

    def died(self, worker: WorkerId, version: VersionKey, restart: StartId | None, now: float
             ) -> bool:
        """`worker` is gone, its slot carrying out `restart`: whether it was known (up,
        switched away or retired; else it died loading). A switch of it not yet carried
        out never happens; the slot restarts what it held."""
        self._since.pop(worker, None)
        serving = self._of.pop(worker, None)
        switched = self.ledger.switch_of(worker)
        retired = self._retired.pop(worker, None)
        held = serving or (switched.held if switched else None) or retired or version
        if restart is not None:
            self.ledger.died(restart, held, now, self.load_s(held))
        return serving is not None or switched is not None or retired is not None

    def left(self, worker: WorkerId, retired: bool) -> None:
        """`worker` left its version: switched away, or `retired` for good (until the pool
        has let it go, its death may still be reported)."""
        version = self._of.pop(worker)
        self._since.pop(worker, None)
        if retired:
            self._retired[worker] = version
            while len(self._retired) > RETIRED_KEPT:
                del self._retired[next(iter(self._retired))]

    def switch(self, worker: WorkerId, to: VersionKey, now: float) -> StartId:
        """Idle `worker` leaves its version for `to`: the switch's start."""
        held = self._of[worker]
        self.left(worker, retired=False)
        return self.ledger.ask(Kind.SWITCH, to, now, self.load_s(to), worker, held)

    # -- reading ---------------------------------------------------------------------------
    def version_of(self, worker: WorkerId) -> VersionKey | None:
        return self._of.get(worker)

    def since(self, worker: WorkerId) -> float:
        return self._since[worker]

    def workers(self) -> Iterator[tuple[WorkerId, VersionKey]]:
        return iter(list(self._of.items()))

    def loading(self, version: VersionKey) -> int:
        return self.ledger.under_way(version)

    def load_s(self, version: VersionKey) -> float:
        """Seconds a start of `version` is expected to take, made the way the pool would
        make it now."""
        measured = self.measured_s(version)
        if measured is not None:
            return measured
        hint = self._hint(version)
        return DEFAULT_LOAD_S if hint is None else hint

    def how(self, version: VersionKey) -> StartKind:
        """The kind of start the pool would make of `version` now."""
        return self._how(version)

    def measured_s(self, version: VersionKey) -> float | None:
        """`load_s` as measured (None: nothing of it measured yet)."""
        return self.ledger.time_of(version, self._how(version))


def _spawned(version: VersionKey) -> StartKind:
    return StartKind.SPAWN


__all__ = ["DEFAULT_LOAD_S", "RETIRED_KEPT", "Residency"]
