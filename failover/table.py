"""The request-to-batch table: which items ride in which batch on which worker.

Plain synchronous code. Every event (a batch assigned, an answer, an error, a death, a
hang) changes state here and *returns* what to do: items to answer, items to re-queue,
groups to re-run. The async dispatcher carries the actions out. Because nothing here
awaits, a hypothesis state machine can drive every interleaving.

Fencing: an answer counts only if its batch id is in flight on the worker that sends it.
Batch ids are never reused and a worker's id changes with each restart, so an answer from
a worker already declared dead finds nothing and is discarded.

Hedging: a batch running far past what batches have taken lately (`failover/hang.py`) is
re-run on another worker while the first keeps running. An item may then be in two
batches: the first answer settles it (`Item.done`), and a failure of one batch touches only
the items no other batch still carries (`Item.flights`).

Judging a failure: a failed run convicts only when every member it ran with is still this
table's to judge. A member withdrawn meanwhile (its client left, its deadline passed) may
have been the culprit, so the survivors run again together, a fresh isolation; an input is
a query of death only once it crashed a worker run alone.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from batcher import Item
from failover.errors import ContractViolation, ModelError, QueryOfDeath, WorkerCrashed
from failover.hang import BatchTimes
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
    hang_deadline: float  # its worker is killed past this
    hedge_deadline: float  # re-run elsewhere past this (inf: never)
    chars: int
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
    hedges: int


class InFlightTable:
    def __init__(
        self, *, max_attempts: int = 12, bisect_budget: int = 16, times: BatchTimes | None = None
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._max_attempts = max_attempts
        self._bisect_budget = bisect_budget
        self.times = times or BatchTimes()
        self._ids = itertools.count(1)
        self._idle: dict[WorkerId, None] = {}  # insertion-ordered set
        self._busy: dict[WorkerId, BatchId] = {}
        self._batches: dict[BatchId, InFlight] = {}
        # Bisected groups and hedges waiting for an idle worker; they go before new batches.
        # A waiting hedge counts as one of its items' flights: no one else re-runs them.
        self._groups: deque[tuple[list[Item], _Lineage | None]] = deque()
        self._crashes = self._reroutes = self._rerouted_items = 0
        self._discarded = self._bisect_runs = self._model_errors = self._hedges = 0

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
    def assign(self, items: list[Item], now: float) -> Dispatch:
        """Record a new batch on an idle worker; the caller sends it."""
        return self._assign(items, now, None, hedge=True)

    def next_group(self, now: float) -> Dispatch | None:
        """A bisected group or a hedge waiting for a worker, assigned to an idle one, if
        both exist. Items answered or given up on meanwhile are left out."""
        while self._groups and self._idle:
            group, lineage = self._groups.popleft()
            if lineage is None:  # a hedge: its waiting flight lands
                for item in group:
                    item.flights -= 1
            items = [i for i in group if not i.done and not i.cancelled]
            if items:
                return self._assign(items, now, lineage, hedge=False)
        return None

    def _assign(
        self, items: list[Item], now: float, lineage: _Lineage | None, *, hedge: bool
    ) -> Dispatch:
        """`hedge`: the batch may be re-run elsewhere if it stalls. Never a hedge itself, a
        bisected group, or items that already cost a worker: a query that hangs every
        worker it meets must not take two at a time."""
        if not items:
            raise ValueError("a batch holds at least one item")
        worker, _ = self._idle.popitem()
        batch_id = BatchId(next(self._ids))
        self._busy[worker] = batch_id
        texts = tuple(i.text for i in items)
        chars = sum(map(len, texts))
        for item in items:
            item.flights += 1
            hedge = hedge and item.attempts == 0
        times = self.times
        self._batches[batch_id] = InFlight(
            batch_id, worker, items, now, now + times.kill_after(chars),
            now + times.hedge_after(chars) if hedge else math.inf, chars, lineage,
        )
        return Dispatch(batch_id, worker, texts)

    # -- answers -------------------------------------------------------------------------
    def on_ok(
        self, worker: WorkerId, batch_id: BatchId, outputs: tuple[str, ...],
        seconds: float | None = None,
    ) -> Actions:
        """`seconds`: how long the model took, learned for the hang limits."""
        batch = self._take(worker, batch_id)
        if batch is None:
            return Actions(discarded=True)
        if len(outputs) != len(batch.items) or not all(type(o) is str for o in outputs):
            detail = f"{len(outputs)} outputs for {len(batch.items)} inputs"
            return self._failed(batch, ContractViolation("ContractViolation", detail))
        if seconds is not None:
            self.times.observe(seconds, batch.chars)
        deliver: list[Result] = []
        for item, output in zip(batch.items, outputs, strict=True):
            if not item.done:  # else its hedge (or the batch it hedged) answered first
                item.done = True
                deliver.append((item, output))
        return Actions(deliver=deliver)

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
        answer. A run that lost a member meanwhile proves nothing: its survivors run
        again, together."""
        items = self._orphans(batch)
        if items and len(items) < len(batch.items):
            self._rerun(items)
            return Actions()
        if len(items) <= 1:
            self._model_errors += len(items)
            return Actions(deliver=_settled([(i, error) for i in items]))
        self._split(items, batch.lineage or _Lineage(self._bisect_budget))
        return Actions()

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

    def _rerun(self, items: list[Item]) -> None:
        """Queue the survivors of a run that lost a member as one group, a fresh isolation.
        Each such re-run holds fewer items than the run before it: bounded."""
        self._bisect_runs += 1
        self._groups.append((items, _Lineage(self._bisect_budget)))

    def _take(self, worker: WorkerId, batch_id: BatchId) -> InFlight | None:
        """Close a batch if (worker, batch_id) is the live dispatch; None if stale."""
        if self._busy.get(worker) != batch_id:
            self._discarded += 1
            return None
        del self._busy[worker]
        self._idle[worker] = None
        return self._landed(self._batches.pop(batch_id))

    @staticmethod
    def _landed(batch: InFlight) -> InFlight:
        for item in batch.items:
            item.flights -= 1
        return batch

    @staticmethod
    def _orphans(batch: InFlight) -> list[Item]:
        """The items of a failed batch that are this table's to decide: not answered, not
        given up on, and carried by no other batch (a hedge still running decides)."""
        return [i for i in batch.items if not i.done and not i.cancelled and i.flights == 0]

    # -- faults --------------------------------------------------------------------------
    def on_worker_died(self, worker: WorkerId) -> Actions:
        """Forget the worker; its batch's items go back to the retry lane or fail."""
        self._idle.pop(worker, None)
        batch_id = self._busy.pop(worker, None)
        if batch_id is None:
            return Actions()
        self._crashes += 1
        batch = self._landed(self._batches.pop(batch_id))
        actions = Actions()
        items = self._orphans(batch)
        alone = len(batch.items) == 1  # only a crash alone convicts (and quarantines)
        suspects: list[Item] = []
        for item in items:
            item.attempts += 1
            if item.attempts >= self._max_attempts:
                crashed = WorkerCrashed(f"the item's worker died {item.attempts} times")
                actions.deliver.append((item, crashed))
            elif item.attempts >= 2 and alone:
                killer = QueryOfDeath("run alone, this input killed its worker")
                actions.deliver.append((item, killer))
            elif item.attempts >= 2:
                suspects.append(item)
            else:
                actions.retry.append(item)
        if suspects and len(items) < len(batch.items):
            self._rerun(suspects)  # a member left meanwhile: it may have been the killer
        elif suspects:
            # Died twice: the batch may hold a query of death. Halve it (then halve again)
            # until the input that kills a worker runs alone; the rest are answered.
            self._split(suspects, batch.lineage or _Lineage(self._bisect_budget))
        if actions.retry:
            self._reroutes += 1
            self._rerouted_items += len(actions.retry)
        _settled(actions.deliver)
        return actions

    def hung(self, now: float) -> list[WorkerId]:
        """Workers whose batch has run past its hang deadline, each reported once: the
        caller kills them, and their death re-routes the batch."""
        late = [b for b in self._batches.values() if b.hang_deadline <= now]
        for batch in late:
            batch.hang_deadline = math.inf
        return [b.worker for b in late]

    def hedge(self, now: float) -> int:
        """Batches running past their hedge deadline are queued again, ahead of new work,
        for the next idle worker, while they keep running; returns how many."""
        late = [b for b in self._batches.values() if b.hedge_deadline <= now]
        for batch in late:
            batch.hedge_deadline = math.inf
            items = [i for i in batch.items if not i.done and not i.cancelled]
            if items:
                self._hedges += 1
                for item in items:
                    item.flights += 1
                self._groups.append((items, None))
        return len(late)

    def postpone(self, seconds: float) -> None:
        """The core's own loop stood still for `seconds` (a stopped process, a long pause):
        every running batch's clock moves on by as much, since a stall of the core's is
        no evidence against a worker."""
        for batch in self._batches.values():
            batch.started += seconds
            batch.hang_deadline += seconds
            batch.hedge_deadline += seconds

    def next_hang_deadline(self) -> float:
        """When `hung` or `hedge` next has something to do."""
        return min((min(b.hang_deadline, b.hedge_deadline) for b in self._batches.values()),
                   default=math.inf)

    def abandon(self) -> list[Item]:
        """Shutdown: every item in flight or in a bisected group, which will never be
        answered now, each once; the table forgets them."""
        items = [i for group, _ in self._groups for i in group]
        items += [i for batch in self._batches.values() for i in batch.items]
        self._groups.clear()
        self._batches.clear()
        self._busy.clear()
        left = [i for i in dict.fromkeys(items) if not i.done]  # a hedge holds it twice
        for item in left:
            item.done = True
        return left

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
            hedges=self._hedges,
        )


def _settled(results: list[Result]) -> list[Result]:
    """Mark the items of `results` answered: a twin batch's answer is then dropped."""
    for item, _ in results:
        item.done = True
    return results


__all__ = ["Actions", "Dispatch", "InFlight", "InFlightTable", "TableStatistics"]
