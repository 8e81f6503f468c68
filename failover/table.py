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

Suspects: once its batch killed a worker, an item runs until it is answered or convicted,
whether or not its client is still there, so that an input that kills every worker it meets
is caught even when its sender leaves at once (re-runs are bounded by `max_attempts`). A
hedge that stalls as its original did is evidence against the inputs, not the workers: both
are killed and the items count a death each. Runs of suspects are killed once they stall
(past the time a hedge would start), not after the far longer hang limit.

Groups (`failover/groups.py`: re-runs after a death, isolation runs, hedges) wait in the
table for an idle worker.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from batcher import Item, Tag, Tier
from batcher.tracing import trace_sent
from failover.errors import ContractViolation, ModelError, QueryOfDeath, WorkerCrashed
from failover.groups import Group, Lineage, Rerun
from failover.hang import BatchTimes
from gpu_pool import BatchId, WorkerId

Result = tuple[Item, str | BaseException]


@dataclass(slots=True)
class InFlight:
    batch_id: BatchId
    worker: WorkerId
    items: list[Item]
    started: float
    hang_deadline: float  # its worker is killed past this
    hedge_deadline: float  # re-run elsewhere past this (inf: never)
    chars: int
    lineage: Lineage | None = None
    kind: Rerun | None = None  # None: a fresh batch
    twin: BatchId | None = None
    stall_deadline: float = math.inf  # a run of suspects: its worker is killed past this
    stalled: bool = False  # hedged: it ran far past its expected time

    @property
    def suspect(self) -> bool:
        """Running inputs that stalled or killed a worker: it may never come back."""
        return self.stalled or self.kind is not None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send `texts` as batch `batch_id` to `worker`."""

    batch_id: BatchId
    worker: WorkerId
    texts: tuple[str, ...]
    tags: tuple[Tag | None, ...] | None = None  # None: no input of it is keyed
    traces: tuple[str, ...] | None = None  # its attempts' traceparents; None: none traced


@dataclass(slots=True)
class Actions:
    """What the dispatcher must do after an event."""

    deliver: list[Result] = field(default_factory=list)
    retry: list[Item] = field(default_factory=list)
    discarded: bool = False  # the event was stale (fencing) and changed nothing
    forgive: list[WorkerId] = field(default_factory=list)  # deaths a convicted input caused


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
        # Groups waiting for an idle worker. A waiting hedge counts as one of its items'
        # flights: no one else re-runs them.
        self._groups: deque[Group] = deque()
        self.peak_ready = 0  # the most workers ever up at once: the pool's size, as seen
        # Texts of inputs under suspicion (their batch stalled, or its worker died), by
        # when they became suspects: the same text sent again is not run beside them.
        self.suspected: dict[str, float] = {}
        self._killed: dict[int, list[WorkerId]] = {}  # by item id: workers that died under it
        self._crashes = self._reroutes = self._rerouted_items = 0
        self._discarded = self._bisect_runs = self._model_errors = self._hedges = 0

    # -- workers -------------------------------------------------------------------------
    def worker_up(self, worker: WorkerId) -> None:
        """A worker finished loading and is idle."""
        if worker in self._busy or worker in self._idle:
            raise ValueError(f"worker {worker} is already up")
        self._idle[worker] = None
        self.peak_ready = max(self.peak_ready, self.ready_count())

    def worker_left(self, worker: WorkerId) -> bool:
        """Take idle `worker` out: it leaves this table's pool (switched to another
        version, retired), which shrinks by one. False, and nothing changed, when it is
        busy or unknown."""
        if worker not in self._idle:
            return False
        del self._idle[worker]
        self.peak_ready = self.ready_count()
        return True

    def idle_count(self) -> int:
        return len(self._idle)

    def is_idle(self, worker: WorkerId) -> bool:
        return worker in self._idle

    def idle_workers(self) -> list[WorkerId]:
        return list(self._idle)

    def has_groups(self) -> bool:
        return bool(self._groups)

    def grouped(self) -> set[int]:
        """The ids of the items waiting in groups (for tests and the status page)."""
        return {i.id for group in self._groups for i in group.items}

    def suspect_count(self) -> int:
        """Workers running suspects: re-runs, isolation runs, hedges, stalled batches."""
        return sum(b.suspect for b in self._batches.values())

    def ready_count(self) -> int:
        return len(self._idle) + len(self._busy)

    def quiet(self) -> bool:
        """No batch in flight and no bisected group waiting: safe to stop the workers."""
        return not self._batches and not self._groups

    # -- dispatch ------------------------------------------------------------------------
    def assign(self, items: list[Item], now: float) -> Dispatch:
        """Record a new batch on an idle worker; the caller sends it."""
        return self._assign(items, now, None)

    def next_group(
        self, now: float, allowed: Callable[[Group], bool] = lambda group: True
    ) -> Dispatch | None:
        """The best waiting group that `allowed` lets run (its tier first, then the
        oldest), assigned to an idle worker, if both exist. A group left with nothing to
        run is dropped."""
        while self._idle:
            group = self.runnable(allowed)
            if group is None:
                return None
            self._groups.remove(group)
            if group.kind is Rerun.HEDGE:  # its waiting flight lands
                for item in group.items:
                    item.flights -= 1
            items = group.live()
            if items:
                return self._assign(items, now, group)
        return None

    def runnable(self, allowed: Callable[[Group], bool]) -> Group | None:
        """The group `next_group` would run now, if a worker were idle."""
        best: Group | None = None
        for group in self._groups:
            if (best is None or group.tier < best.tier) and allowed(group):
                best = group
        return best

    def _assign(self, items: list[Item], now: float, group: Group | None) -> Dispatch:
        """A fresh batch may be hedged if it stalls; never a group, nor items that already
        cost a worker: a query that hangs every worker it meets must not take two at a
        time. A group's run is killed once it stalls."""
        if not items:
            raise ValueError("a batch holds at least one item")
        worker, _ = self._idle.popitem()
        batch_id = BatchId(next(self._ids))
        self._busy[worker] = batch_id
        texts = tuple(i.text for i in items)
        chars = sum(map(len, texts))
        hedge, tagged, traced = group is None, False, False
        for item in items:
            item.flights += 1
            hedge = hedge and item.attempts == 0
            tagged = tagged or item.tag is not None
            traced = traced or item.trace is not None
        times = self.times
        flight = InFlight(batch_id, worker, items, now, now + times.kill_after(chars),
                          now + times.hedge_after(chars) if hedge else math.inf, chars)
        if group is not None:
            flight.lineage, flight.kind, flight.twin = group.lineage, group.kind, group.twin
            flight.stall_deadline = now + times.stall_after(chars)
        self._batches[batch_id] = flight
        return Dispatch(batch_id, worker, texts, tuple(i.tag for i in items) if tagged else None,
                        trace_sent(items, batch_id, worker, now, flight.kind) if traced else None)

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
        if self.suspected:  # answered: cleared
            for item in batch.items:
                self.suspected.pop(item.text, None)
        if self._killed:
            for item in batch.items:
                self._killed.pop(item.id, None)
        deliver: list[Result] = []
        for item, output in zip(batch.items, outputs, strict=True):
            if not item.done:  # else its hedge (or the batch it hedged) answered first
                item.done = True
                deliver.append((item, output))
                if item.trace is not None:
                    item.trace.landed(worker, batch_id)
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
            return Actions(deliver=self._judged(_settled([(i, error) for i in items])))
        self._split(items, batch.lineage or Lineage(self._bisect_budget))
        return Actions()

    def _split(self, items: list[Item], lineage: Lineage) -> None:
        """Queue `items` again as two halves (one by one once the budget is spent). Items of
        several tiers are split by tier first: a paid item runs again at once, apart from
        the free inputs that may have failed its batch (free traffic is the one anyone can
        send), instead of waiting out their bisection."""
        tiers = [group for tier in Tier if (group := [i for i in items if i.tier is tier])]
        if len(tiers) > 1 and lineage.budget >= 2:
            lineage.budget -= 2
            groups = tiers
        elif len(items) == 1:
            groups = [items]
        elif lineage.budget >= 2:
            lineage.budget -= 2
            half = len(items) // 2
            groups = [items[:half], items[half:]]
        else:
            groups = [[item] for item in items]
        self._bisect_runs += len(groups)
        self._groups.extend(Group(group, Rerun.ISOLATE, lineage) for group in groups)

    def _rerun(self, items: list[Item]) -> None:
        """Queue the survivors of a run that lost a member as one group, a fresh isolation.
        Each such re-run holds fewer items than the run before it: bounded."""
        self._bisect_runs += 1
        self._groups.append(Group(items, Rerun.ISOLATE, Lineage(self._bisect_budget)))

    def requeue(self, items: list[Item]) -> None:
        """Run again, before new work of their tier, the items of a batch whose worker
        died once (`Actions.retry`): one group per tier, so that a paid item re-run at
        once on any worker never rides with a free input that may be the killer."""
        for tier in Tier:
            group = [i for i in items if i.tier is tier]
            if group:
                self._groups.append(Group(group, Rerun.RETRY))

    def _judged(self, results: list[Result]) -> list[Result]:
        """Settled for good: no longer suspects (a convicted input is in quarantine)."""
        if self.suspected or self._killed:
            for item, _ in results:
                self.suspected.pop(item.text, None)
                self._killed.pop(item.id, None)
        return results

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

    @staticmethod
    def _suspects(batch: InFlight) -> list[Item]:
        """The items of a batch whose worker died that stay to be judged: every member
        not answered and carried by no other batch, its client there or not."""
        return [i for i in batch.items if not i.done and i.flights == 0]

    # -- faults --------------------------------------------------------------------------
    def on_worker_died(self, worker: WorkerId, now: float = 0.0) -> Actions:
        """Forget the worker; its batch's items go back to the retry lane or fail."""
        self._idle.pop(worker, None)
        batch_id = self._busy.pop(worker, None)
        if batch_id is None:
            return Actions()
        self._crashes += 1
        batch = self._landed(self._batches.pop(batch_id))
        for item in batch.items:
            if not item.done:
                self._killed.setdefault(item.id, []).append(worker)
            if item.trace is not None:
                item.trace.died(worker, batch_id, now)
        for group in [g for g in self._groups if g.twin == batch_id]:
            self._groups.remove(group)  # a hedge still waiting: the re-run takes its place
            for item in group.items:
                item.flights -= 1
        actions = Actions()
        items = self._suspects(batch)
        alone = len(batch.items) == 1  # only a crash alone convicts (and quarantines)
        suspects: list[Item] = []
        for item in items:
            item.attempts += 1
            self.suspected.setdefault(item.text, now)
            if item.attempts >= 2 and alone:  # the evidence, however many runs it took
                killer = QueryOfDeath("run alone, this input killed its worker")
                actions.deliver.append((item, killer))
                actions.forgive += self._killed.pop(item.id, ())
            elif item.attempts >= self._max_attempts:
                crashed = WorkerCrashed(f"the item's worker died {item.attempts} times")
                actions.deliver.append((item, crashed))
            elif item.attempts >= 2:
                suspects.append(item)
            else:
                actions.retry.append(item)
        if suspects and len(items) < len(batch.items):
            self._rerun(suspects)  # a member left meanwhile: it may have been the killer
        elif suspects:
            # Died twice: the batch may hold a query of death. Halve it (then halve again)
            # until the input that kills a worker runs alone; the rest are answered.
            self._split(suspects, batch.lineage or Lineage(self._bisect_budget))
        if actions.retry:
            self._reroutes += 1
            self._rerouted_items += len(actions.retry)
        self._judged(_settled(actions.deliver))
        return actions

    def hung(self, now: float) -> list[WorkerId]:
        """Workers whose batch has run past its hang deadline, or a run of suspects past
        its stall deadline, each reported once: the caller kills them, and their death
        re-routes the batch. A stalled hedge takes the batch it copies down with it, and
        its items count the original's stall as a death: two workers stalled on them."""
        late: dict[WorkerId, None] = {}
        for batch in list(self._batches.values()):
            if batch.hang_deadline <= now:
                batch.hang_deadline = batch.stall_deadline = math.inf
                late[batch.worker] = None
            elif batch.stall_deadline <= now:
                batch.hang_deadline = batch.stall_deadline = math.inf
                late[batch.worker] = None
                twin = self._batches.get(batch.twin) if batch.twin is not None else None
                if twin is not None and twin.hang_deadline < math.inf:
                    twin.hang_deadline = twin.stall_deadline = math.inf
                    late[twin.worker] = None
                    for item in batch.items:
                        if not item.done:
                            item.attempts += 1
        return list(late)

    def hedge(self, now: float) -> int:
        """Batches running past their hedge deadline are queued again, ahead of new work,
        for the next idle worker, while they keep running; returns how many."""
        late = [b for b in self._batches.values() if b.hedge_deadline <= now]
        for batch in late:
            batch.hedge_deadline = math.inf
            batch.stalled = True
            for item in batch.items:
                self.suspected.setdefault(item.text, now)
            items = [i for i in batch.items if not i.done and not i.cancelled]
            if items:
                self._hedges += 1
                for item in items:
                    item.flights += 1
                self._groups.append(Group(items, Rerun.HEDGE, twin=batch.batch_id))
        return len(late)

    def postpone(self, seconds: float) -> None:
        """The core's own loop stood still for `seconds` (a stopped process, a long pause):
        every running batch's clock moves on by as much, since a stall of the core's is
        no evidence against a worker."""
        for batch in self._batches.values():
            batch.started += seconds
            batch.hang_deadline += seconds
            batch.hedge_deadline += seconds
            batch.stall_deadline += seconds

    def next_hang_deadline(self) -> float:
        """When `hung` or `hedge` next has something to do."""
        return min((min(b.hang_deadline, b.hedge_deadline, b.stall_deadline)
                    for b in self._batches.values()), default=math.inf)

    def abandon(self) -> list[Item]:
        """Shutdown: every item in flight or in a bisected group, which will never be
        answered now, each once; the table forgets them."""
        items = [i for group in self._groups for i in group.items]
        items += [i for batch in self._batches.values() for i in batch.items]
        self._groups.clear()
        self._batches.clear()
        self._busy.clear()
        self._killed.clear()
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


__all__ = ["Actions", "Dispatch", "Group", "InFlight", "InFlightTable", "Rerun", "TableStatistics"]
