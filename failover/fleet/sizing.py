"""The pool's size carried out over the versions' cores: the scaling rule asked in the
owner's turn, the starts it asks for recorded in the ledger and handed to the owner, the
worker it retires taken out of its core, and each version's core told when its workers on
their way are expected up, so that admission counts them (the door stays honest while
capacity comes); a version whose loads keep failing has none coming.
"""

from __future__ import annotations

from batcher import VersionKey
from failover import CoreActions, DispatchCore
from failover.fleet.capacity import Capacity, CapacityGauges
from failover.fleet.failing import Failing
from failover.fleet.ledger import Kind
from failover.fleet.placing import Placing
from failover.fleet.residency import Residency


class Sizing:
    def __init__(self, capacity: Capacity | None, residency: Residency, placing: Placing,
                 cores: dict[VersionKey, DispatchCore], failing: Failing) -> None:
        """`capacity`: None for a pool whose size never changes and whose restarts nobody
        waits for (tests); `cores`: the composite's, by version, and `failing` (both read
        only)."""
        self._capacity = capacity
        self._failing = failing
        # A fixed pool's rule never scales: it meters no arrivals (the hot path).
        self.metered = capacity if capacity is not None and capacity.scales else None
        self._residency = residency
        self._placing = placing
        self._cores = cores

    def arrived(self, items: int, now: float, paid: bool) -> None:
        """Offered at the door, admitted or not: refused demand is demand."""
        if self.metered is not None:
            self.metered.arrived(items, now, paid)

    def due(self) -> float:
        """When the rule is asked next (inf: never)."""
        return self.metered.due(self._residency.ledger) if self.metered is not None else \
            float("inf")

    def step(self, now: float, running: int, out: CoreActions) -> None:
        """Ask the rule (`running` workers up); record the starts it asks for and take the
        worker it retires out of its core, into `out`."""
        assert self._capacity is not None
        residency, ledger = self._residency, self._residency.ledger
        running += ledger.switches()  # a switch keeps its worker
        decided = self._capacity.step(now, running, self._placing.views(now),
                                      self._placing.idle(), residency.load_s, ledger)
        for version in decided.grow:
            out.grow.append((version, ledger.ask(Kind.ADD, version, now,
                                                 residency.load_s(version))))
        if decided.take_back is not None and ledger.cancel(decided.take_back) is not None:
            out.cancel_start.append(decided.take_back)
        worker = decided.retire
        if worker is not None:
            held = residency.version_of(worker)
            if held is not None and self._cores[held].worker_left(worker):
                residency.left(worker, retired=True)
                out.retire.append(worker)
        self.tell_coming(now)

    def tell_coming(self, now: float) -> None:
        """Tell each version's core when its workers on their way are expected up."""
        if self._capacity is None:
            return
        residency, failing = self._residency, self._failing
        for version, core in self._cores.items():  # loads that keep failing bring nothing
            core.workers_coming(() if failing.failing(version, now) else
                                residency.ledger.joining(version, now, residency.load_s(version)))

    def gauges(self, now: float, running: int) -> CapacityGauges | None:
        """The pool's size as the rule sees it (None: no rule)."""
        return None if self._capacity is None else \
            self._capacity.gauges(now, running, self._residency.ledger)


__all__ = ["Sizing"]
