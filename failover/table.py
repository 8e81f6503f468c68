"""The request-to-batch table: which items ride in which batch on which worker.

Plain synchronous code. Every event (a batch assigned, an answer, an error, a death, a
hang) changes state here and *returns* what to do: items to answer, items to re-queue,
groups to re-run. The async dispatcher carries the actions out. Because nothing here
awaits, a hypothesis state machine can drive every interleaving.

Fencing: an answer counts only if its batch id is in flight on the worker that sends it.
Batch ids are never reused and a worker's id changes with each restart, so an answer from
a worker already declared dead finds nothing and is discarded.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from batcher import Item
from failover.errors import ContractViolation, ModelError, QueryOfDeath, WorkerCrashed
from gpu_pool import BatchId, WorkerId

Result = tuple[Item, str | BaseException]


@dataclass(slots=True)
class _Lineage:
    """Shared by every group bisected out of one failed batch: bounds the extra runs."""

    budget: int


@dataclass(slots=True)
class InFlight:
    batch_id: BatchId
    worker: WorkerId
    items: list[Item]
    started: float
    hang_deadline: float
    lineage: _Lineage | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send `texts` as batch `batch_id` to `worker`."""

    batch_id: BatchId
    worker: WorkerId
    texts: tuple[str, ...]


@dataclass(slots=True)
class Actions:
    """What the dispatcher must do after an event."""

    deliver: list[Result] = field(default_factory=list)
    retry: list[Item] = field(default_factory=list)
    freed: bool = False  # a worker became idle
    discarded: bool = False  # the event was stale (fencing) and changed nothing


@dataclass(frozen=True, slots=True)
class TableStatistics:
    idle: int
    busy: int
    in_flight_batches: int
    in_flight_items: int
    pending_groups: int
    crashes: int
    reroutes: int
    rerouted_items: int
    discarded: int
    bisect_runs: int
    model_errors: int


class InFlightTable:
    def __init__(self, *, max_attempts: int = 12, bisect_budget: int = 16) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._max_attempts = max_attempts
        self._bisect_budget = bisect_budget
        self._ids = itertools.count(1)
        self._idle: dict[WorkerId, None] = {}  # insertion-ordered set
        self._busy: dict[WorkerId, BatchId] = {}
        self._batches: dict[BatchId, InFlight] = {}
        self._groups: deque[tuple[list[Item], _Lineage]] = deque()
        self._crashes = self._reroutes = self._rerouted_items = 0
        self._discarded = self._bisect_runs = self._model_errors = 0

    # -- workers -------------------------------------------------------------------------
    def worker_up(self, worker: WorkerId) -> None:
        """A worker finished loading and is idle."""
        if worker in self._busy or worker in self._idle:
            raise ValueError(f"worker {worker} is already up")
        self._idle[worker] = None

    def idle_count(self) -> int:
        """Idle workers not already claimed by a bisected group waiting to run."""
        return max(0, len(self._idle) - len(self._groups))

    def ready_count(self) -> int:
        return len(self._idle) + len(self._busy)

    def quiet(self) -> bool:
        """No batch in flight and no bisected group waiting: safe to stop the workers."""
        return not self._batches and not self._groups

    # -- dispatch ------------------------------------------------------------------------
    def assign(self, items: list[Item], now: float, hang_timeout: float) -> Dispatch:
        """Record a new batch on an idle worker; the caller sends it."""
        return self._assign(items, now, hang_timeout, None)

    def next_group(self, now: float, hang_timeout: float) -> Dispatch | None:
        """A bisected group waiting for a worker, assigned to an idle one, if both exist."""
        if not self._groups or not self._idle:
            return None
        items, lineage = self._groups.popleft()
        return self._assign(items, now, hang_timeout, lineage)

    def _assign(
        self, items: list[Item], now: float, hang_timeout: float, lineage: _Lineage | None
    ) -> Dispatch:
        if not items:
            raise ValueError("a batch holds at least one item")
        worker, _ = self._idle.popitem()
        batch_id = BatchId(next(self._ids))
        self._busy[worker] = batch_id
        self._batches[batch_id] = InFlight(
            batch_id, worker, items, now, now + hang_timeout, lineage
        )
        return Dispatch(batch_id, worker, tuple(i.text for i in items))

    # -- answers -------------------------------------------------------------------------
    def on_ok(self, worker: WorkerId, batch_id: BatchId, outputs: tuple[str, ...]) -> Actions:
        batch = self._take(worker, batch_id)
        if batch is None:
            return Actions(discarded=True)
        if len(outputs) != len(batch.items) or not all(type(o) is str for o in outputs):
            detail = f"{len(outputs)} outputs for {len(batch.items)} inputs"
            return self._failed(batch, ContractViolation("ContractViolation", detail))
        return Actions(deliver=list(zip(batch.items, outputs, strict=True)), freed=True)

    def on_error(self, worker: WorkerId, batch_id: BatchId, error: ModelError) -> Actions:
        """The model raised on the batch; the worker lives. Bisect to isolate the culprits."""
        batch = self._take(worker, batch_id)
        if batch is None:
            return Actions(discarded=True)
        return self._failed(batch, error)

    def _failed(self, batch: InFlight, error: ModelError) -> Actions:
        """Fail only the items that fail alone. Halve while the lineage's budget lasts (one
        poison input among 100 costs ~14 runs); past it, run what is left one by one, so
        that many poison inputs cost at most one run per input and never an innocent's
        answer."""
        items = [i for i in batch.items if not i.cancelled]
        if len(items) <= 1:
            self._model_errors += len(items)
            return Actions(deliver=[(i, error) for i in items], freed=True)
        self._split(items, batch.lineage or _Lineage(self._bisect_budget))
        return Actions(freed=True)

    def _split(self, items: list[Item], lineage: _Lineage) -> None:
        """Queue `items` again as two halves (one by one once the budget is spent)."""
        if len(items) == 1:
            groups = [items]
        elif lineage.budget >= 2:
            lineage.budget -= 2
            half = len(items) // 2
            groups = [items[:half], items[half:]]
        else:
            groups = [[item] for item in items]
        self._bisect_runs += len(groups)
        self._groups.extend((group, lineage) for group in groups)

    def _take(self, worker: WorkerId, batch_id: BatchId) -> InFlight | None:
        """Close a batch if (worker, batch_id) is the live dispatch; None if stale."""
        if self._busy.get(worker) != batch_id:
            self._discarded += 1
            return None
        del self._busy[worker]
        self._idle[worker] = None
        return self._batches.pop(batch_id)

    # -- faults --------------------------------------------------------------------------
    def on_worker_died(self, worker: WorkerId) -> Actions:
        """Forget the worker; its batch's items go back to the retry lane or fail."""
        self._idle.pop(worker, None)
        batch_id = self._busy.pop(worker, None)
        if batch_id is None:
            return Actions()
        self._crashes += 1
        batch = self._batches.pop(batch_id)
        actions = Actions()
        items = [i for i in batch.items if not i.cancelled]
        suspects: list[Item] = []
        for item in items:
            item.attempts += 1
            if item.attempts >= self._max_attempts:
                crashed = WorkerCrashed(f"the item's worker died {item.attempts} times")
                actions.deliver.append((item, crashed))
            elif item.attempts >= 2 and len(items) == 1:
                killer = QueryOfDeath("run alone, this input killed its worker")
                actions.deliver.append((item, killer))
            elif item.attempts >= 2:
                suspects.append(item)
            else:
                actions.retry.append(item)
        if suspects:
            # Died twice: the batch may hold a query of death. Halve it (then halve again)
            # until the input that kills a worker runs alone; the rest are answered.
            self._split(suspects, batch.lineage or _Lineage(self._bisect_budget))
        if actions.retry:
            self._reroutes += 1
            self._rerouted_items += len(actions.retry)
        return actions

    def hung(self, now: float) -> list[WorkerId]:
        """Workers whose batch has run past its hang deadline, each reported once: the
        caller kills them, and their death re-routes the batch."""
        late = [b for b in self._batches.values() if b.hang_deadline <= now]
        for batch in late:
            batch.hang_deadline = math.inf
        return [b.worker for b in late]

    def next_hang_deadline(self) -> float:
        return min((b.hang_deadline for b in self._batches.values()), default=math.inf)

    def abandon(self) -> list[Item]:
        """Shutdown: every item in flight or in a bisected group, which will never be
        answered now; the table forgets them."""
        items = [i for group, _ in self._groups for i in group]
        items += [i for batch in self._batches.values() for i in batch.items]
        self._groups.clear()
        self._batches.clear()
        self._busy.clear()
        return items

    def statistics(self) -> TableStatistics:
        return TableStatistics(
            idle=len(self._idle),
            busy=len(self._busy),
            in_flight_batches=len(self._batches),
            in_flight_items=sum(len(b.items) for b in self._batches.values()),
            pending_groups=len(self._groups),
            crashes=self._crashes,
            reroutes=self._reroutes,
            rerouted_items=self._rerouted_items,
            discarded=self._discarded,
            bisect_runs=self._bisect_runs,
            model_errors=self._model_errors,
        )


__all__ = ["Actions", "Dispatch", "InFlight", "InFlightTable", "TableStatistics"]
