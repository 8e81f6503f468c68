"""The dispatch core: one synchronous state machine for everything between door and pool.

It joins the batcher (tier queues, flush policy, admission) and the in-flight table
(batches on workers, fencing, re-route, bisection, hangs). Events go in (items admitted or
cancelled, a worker ready, a reply, a death, time passing) and each returns the actions to
carry out: batches to send, workers to kill, items to settle. It reads no clock and does no
I/O; `next_deadline` says when it next needs waking. One owner task feeds it and performs
its actions (`failover/owner.py`), the way httpcore's pool and h11 separate deciding from
doing.

Sends come first in every action list: when a reply arrives with work queued, the worker's
next batch is cut in the same step, so it goes out before the answers are delivered and the
GPU never idles while the front door writes sockets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from batcher import (
    LANE_OF,
    Admission,
    Batcher,
    BatcherStatistics,
    BatchgateError,
    Capacity,
    DeadlineExceeded,
    Item,
    Throughput,
    Tier,
    VersionKey,
)
from failover.actions import CoreActions, Send
from failover.errors import (
    CallerRefused,
    ContractViolation,
    ModelError,
    QueryOfDeath,
    ShuttingDown,
    SuspectInput,
)
from failover.groups import Group, Rerun
from failover.offenders import Offenders
from failover.quarantine import Quarantine
from failover.table import InFlightTable, TableStatistics
from gpu_pool import Err, Ok, Run, StartId, StartKind, WorkerId

Refusal = BatchgateError  # why `admit` turned a request away
SUSPECT_TTL = 60.0  # seconds an input stays under suspicion at most
SUSPECT_RETRY_AFTER = 5.0  # what a resent suspect is told: about one stall's judgement


@dataclass(frozen=True, slots=True)
class Demand:
    """What waits for one core's workers, as placement weighs it (`failover.fleet`)."""

    queued: int  # live items, every lane
    paid: int  # of which in the paid and retry lanes
    oldest: float  # when the oldest was queued (inf: none)
    oldest_deadline: float  # that item's deadline (inf: none)
    rate: float  # items/s offered, admitted or refused (decaying average)


@dataclass(frozen=True, slots=True)
class CoreStatistics:
    batcher: BatcherStatistics
    table: TableStatistics
    hangs: int
    busy_seconds: float  # summed over workers: time each held a batch
    batch_latency: float  # admission's measured estimate

    @classmethod
    def merged(cls, parts: Sequence[CoreStatistics]) -> CoreStatistics:
        """Several cores' statistics (one per model version) as one core's: counts add
        up; the batch latency is the longest."""
        def add(values: Sequence[Any]) -> Any:
            first = values[0]
            if isinstance(first, bool):
                return any(values)
            if isinstance(first, dict):
                return {k: sum(v.get(k, 0) for v in values)  # keys differ (accounts)
                        for k in dict.fromkeys(k for v in values for k in v)}
            return sum(values)

        batchers = [p.batcher for p in parts]
        tables = [p.table for p in parts]
        return cls(
            batcher=BatcherStatistics(**{f.name: add([getattr(b, f.name) for b in batchers])
                                         for f in fields(BatcherStatistics)}),
            table=TableStatistics(**{f.name: add([getattr(t, f.name) for t in tables])
                                     for f in fields(TableStatistics)}),
            hangs=sum(p.hangs for p in parts),
            busy_seconds=sum(p.busy_seconds for p in parts),
            batch_latency=max(p.batch_latency for p in parts),
        )


class DispatchCore:
    def __init__(self, batcher: Batcher, table: InFlightTable, admission: Admission,
                 version: VersionKey | None = None) -> None:
        """`version`: the model version it serves, for metrics (None: the only one)."""
        self._batcher = batcher
        self._table = table
        self._admission = admission
        self._max_batch = batcher.policy.max_batch
        self._sent_at: dict[WorkerId, float] = {}
        self._busy_seconds = 0.0
        self._hangs = 0
        self._quarantine = Quarantine()
        self._offenders = Offenders()
        # When each worker on its way for this version is expected up (absolute, sorted;
        # `workers_coming`): admission counts them from then on.
        self._coming: tuple[float, ...] = ()
        self._pace: Callable[[float], float] | None = None
        self._held_until = -math.inf
        self.version = version

    def pace_with(self, partners: Callable[[float], float] | None) -> None:
        """Keep in step with the cores of stages that run beside this one (parallel guard
        stages): `partners(now)` says until when one of them is about to cut (-inf: none
        is), and a timed or idle cut here waits for it. Out of step, an input waits for the
        later of its stages' cuts; in step, for one (`failover.fleet.staging`)."""
        self._pace = partners

    def next_free(self) -> float:
        """When this core can next take a batch: -inf with a worker idle, else its earliest
        busy worker's expected end (inf with none up)."""
        if self._table.idle_count() > 0:
            return -math.inf
        sent = self._sent_at.values()
        return min(sent) + self._admission.batch_latency if sent else math.inf

    # -- the front door's events -----------------------------------------------------------
    def admit(self, items: list[Item], deadline_in: float, now: float, arriving: int = 0
              ) -> bool:
        """Queue a request's items or refuse them all (raises Closed, Overloaded, QueueFull,
        and QueryOfDeath for an input in quarantine). `arriving`: workers loading this
        version while none is up, counted as ready, so that a request for a cold version
        is queued, not refused.

        Returns True when the arrival can change a decision now (a worker is idle and the
        queue was empty, is full, or the idle trigger would fire): the owner must take a
        turn. Under load two workers are often idle while the trigger holds back, and a turn
        for every arrival then cost the core process more than the dispatch itself."""
        was_empty = len(self._batcher) == 0
        self._admit(items, deadline_in, now, self._table.ready_count() or arriving,
                    self._joining(now) if self._coming else ())
        return self._must_turn(was_empty, now)

    def judge(self, version: VersionKey | None, tier: Tier, items: int, chars: int,
              deadline_in: float, now: float) -> int:
        """Judge a streamed request before any of its inputs is queued (raises what
        `Batcher.judge` raises); returns the ready workers, whom its window keeps busy.
        `version`: the one it runs on, this core's (the composite's call, as `admit`)."""
        ready = self._table.ready_count()
        self._batcher.judge(tier, items, chars, deadline_in, now, ready,
                            self._joining(now) if self._coming else ())
        return ready

    def admit_all(
        self, requests: Sequence[tuple[list[Item], float]], now: float, arriving: int = 0
    ) -> tuple[list[Refusal | None], bool]:
        """`admit` for several requests that arrived together (a gateway's frame): each
        one's refusal or None, and whether the owner must take a turn, decided once."""
        was_empty = len(self._batcher) == 0
        ready = self._table.ready_count() or arriving
        joining = self._joining(now) if self._coming else ()
        refusals: list[Refusal | None] = []
        start, end = 0, len(requests)
        while start < end:  # a run of one tier and one deadline at a time
            tier, deadline_in = requests[start][0][0].tier, requests[start][1]
            stop = start + 1
            while (stop < end and requests[stop][1] == deadline_in
                   and requests[stop][0][0].tier is tier):
                stop += 1
            if stop - start > 1 and not self._quarantine and not self._offenders and \
                    self._batcher.admit_run(
                    [items for items, _ in requests[start:stop]], deadline_in, now, ready,
                    joining):
                refusals += [None] * (stop - start)
            else:
                for items, deadline_in in requests[start:stop]:
                    try:
                        self._admit(items, deadline_in, now, ready, joining)
                        refusals.append(None)
                    except BatchgateError as exc:
                        refusals.append(exc)
            start = stop
        return refusals, self._must_turn(was_empty, now)

    def count_offered(self) -> None:
        """The pool may grow: meter what each tier offers, refused or not (`Batcher`)."""
        self._batcher.count_offered()

    def workers_coming(self, etas: tuple[float, ...]) -> None:
        """Workers on their way for this version are now expected up at `etas` (absolute,
        soonest first): admission counts each from then on."""
        self._coming = etas

    @property
    def joining(self) -> tuple[float, ...]:
        """When each worker on its way is expected up (absolute, soonest first)."""
        return self._coming

    def _joining(self, now: float) -> tuple[float, ...]:
        """Seconds from `now` until each worker on its way is expected up."""
        return tuple(max(0.0, at - now) for at in self._coming)

    def _admit(self, items: list[Item], deadline_in: float, now: float, ready: int,
               joining: tuple[float, ...] = ()) -> None:
        if self._quarantine and self._quarantine.holds((i.text for i in items), now):
            raise QueryOfDeath("this input killed a worker when run alone; refused for a while")
        if self._table.suspected and self._suspect(items, now):
            raise SuspectInput("this input's last run stalled or killed its worker; it is "
                               "being judged", retry_after=SUSPECT_RETRY_AFTER)
        if self._offenders and (wait := self._offenders.refused_for(items[0].caller, now)):
            raise CallerRefused("inputs of this caller killed workers again and again; "
                                "refused for a while", retry_after=wait)
        self._batcher.admit(items, deadline_in, now, ready, joining)

    def _suspect(self, items: list[Item], now: float) -> bool:
        """Whether an input is under suspicion; suspicions older than `SUSPECT_TTL` are
        forgotten (an input judged innocent is cleared when answered, a guilty one is
        in quarantine)."""
        suspected = self._table.suspected
        while suspected and next(iter(suspected.values())) <= now - SUSPECT_TTL:
            del suspected[next(iter(suspected))]
        return any(i.text in suspected for i in items)

    def _must_turn(self, was_empty: bool, now: float) -> bool:
        idle = self._table.idle_count()
        if idle <= 0:
            return False
        if self._table.has_groups() and self._table.runnable(self._group_may_run) is not None:
            return True
        if len(self._batcher) == 0:
            return False
        batcher = self._batcher
        if was_empty or len(batcher) >= self._max_batch:
            return True
        if batcher.queues.chars() >= batcher.max_chars():  # full by its characters
            return True
        policy = self._batcher.policy
        return idle > 1 and policy.idle_trigger and policy.spare_capacity(self._capacity(now))

    def resolve(self, model: str | None, sticky: str | None) -> VersionKey | None:
        """The version a request runs on: a core of one version serves whatever it is
        asked for (None: its own)."""
        return None

    def move_in(self, item: Item, now: float) -> None:
        """Queue an input an earlier stage passed on (`Batcher.move_in`), in a turn: the
        caller pumps this core once the turn's inputs are in."""
        self._batcher.move_in(item, now)

    def cancel(self, item: Item) -> bool:
        """The waiter gave up: never run this item (O(1)). True when the owner must take a
        turn: a group waiting behind queued work of a better tier may run now."""
        self._batcher.cancel(item)
        return self._table.has_groups() and self._table.idle_count() > 0

    def drain(self) -> None:
        """Stop admitting; everything queued is cut at once from the next step on."""
        self._batcher.drain()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The accounts' new fair-share weights (`TierQueues.set_weights`)."""
        self._batcher.queues.set_weights(weights)

    # -- the pool's events -----------------------------------------------------------------
    def worker_ready(self, worker: WorkerId, now: float, start: StartId | None = None,
                     version: VersionKey | None = None,
                     how: StartKind = StartKind.SPAWN) -> CoreActions:
        """`start`, `version`, `how`: the start it ends, what it holds and how it came up,
        for a core of several (`failover.fleet`); one version's core serves whatever its
        workers hold."""
        self._table.worker_up(worker)
        return self._pump(now, CoreActions())

    def reply(self, worker: WorkerId, reply: Ok | Err, now: float, at: float,
              hold: bool = False) -> CoreActions:
        """A worker answered (`at`: when the answer arrived). Fenced: a reply for a batch
        that is no longer in flight on this worker changes nothing. `hold`: give nobody
        new work yet (the caller may switch the worker now idle, then calls `pump`)."""
        out = CoreActions()
        if isinstance(reply, Ok):
            actions = self._table.on_ok(worker, reply.batch_id, reply.outputs, reply.seconds)
            if actions.deliver and not actions.discarded:
                chars = sum(len(item.text) for item, _ in actions.deliver)
                self._admission.observe_batch(reply.seconds, chars, len(actions.deliver))
                out.batch_seconds.append((reply.seconds, self.version))
        else:
            error_cls = ContractViolation if reply.kind == "contract" else ModelError
            error = error_cls(reply.error_type, reply.message)
            actions = self._table.on_error(worker, reply.batch_id, error)
        if not actions.discarded:
            self._stop_clock(worker, now)
        if not hold:
            self._pump(now, out, freed=(worker, at))  # the next batch first,
        out.settle += actions.deliver  # then the answers
        return out

    def pump(self, now: float) -> CoreActions:
        """Give idle workers what may run now (after a held `reply`)."""
        return self._pump(now, CoreActions())

    def worker_left(self, worker: WorkerId) -> bool:
        """Take an idle worker out (it is switched to another version): False, and nothing
        changed, when it is busy or unknown."""
        return self._table.worker_left(worker)

    def worker_died(self, worker: WorkerId, now: float, version: VersionKey | None = None,
                    restart: StartId | None = None) -> CoreActions:
        self._stop_clock(worker, now)
        actions = self._table.on_worker_died(worker, now)
        for item, result in actions.deliver:
            if isinstance(result, QueryOfDeath):
                self._quarantine.add(item.text, now)
                self._offenders.convicted(item.caller, now)
        self._table.requeue(actions.retry)
        out = CoreActions(settle=list(actions.deliver), forgive=actions.forgive)
        return self._pump(now, out)

    # -- time ------------------------------------------------------------------------------
    def poll(self, now: float) -> CoreActions:
        """Time passed: re-run stalled batches elsewhere, kill the workers of hung ones,
        cut what is due."""
        out = CoreActions()
        self._table.hedge(now)
        for worker in self._table.hung(now):
            self._hangs += 1
            out.kill.append(worker)
        return self._pump(now, out)

    def place(self, now: float) -> CoreActions:
        """Nothing to place: one version's core serves whatever its workers hold."""
        return CoreActions()

    def stalled(self, seconds: float) -> None:
        """The owner's loop stood still for `seconds`: no batch is judged hung for it."""
        self._table.postpone(seconds)

    def next_deadline(self) -> float:
        """The earliest time at which `poll` would do something (inf: only an event will)."""
        hang = self._table.next_hang_deadline()
        if self._table.idle_count() <= 0:
            return hang
        if self._table.has_groups() and self._table.runnable(self._group_may_run) is not None:
            return -math.inf
        if self._batcher.draining and len(self._batcher):
            return -math.inf
        return min(hang, max(self._batcher.due(), self._held_until))

    # -- lifecycle -------------------------------------------------------------------------
    def finished(self) -> bool:
        """Draining, nothing queued, nothing in flight: safe to stop the workers."""
        return self._batcher.draining and len(self._batcher) == 0 and self._table.quiet()

    def abandon(self) -> CoreActions:
        """Shutdown: answer everything that will never run now."""
        error = ShuttingDown("the server shut down before the item ran")
        left = self._batcher.queues.drain() + self._table.abandon()
        return CoreActions(settle=[(item, error) for item in left if not item.cancelled])

    def refuse_queued(self, error: BatchgateError) -> CoreActions:
        """Answer every queued item `error` (its version can hold no worker: the queue
        would only wait out its deadlines); what runs is left to finish."""
        left = self._batcher.queues.drain()
        return CoreActions(settle=[(item, error) for item in left if not item.cancelled])

    # -- reading ---------------------------------------------------------------------------
    def ready_count(self) -> int:
        return self._table.ready_count()

    def idle_workers(self) -> list[WorkerId]:
        return self._table.idle_workers()

    def is_idle(self, worker: WorkerId) -> bool:
        return self._table.is_idle(worker)

    def finished_empty(self) -> bool:
        """Nothing queued, nothing in flight (draining or not)."""
        return len(self._batcher) == 0 and self._table.quiet()

    def batch_latency(self) -> float:
        return self._admission.batch_latency

    def throughput(self) -> Throughput:
        """What one worker of this version drains at full batches of the current mix, as
        its admission measures it (`Admission.throughput`): the capacity placement and
        the scaling rule plan with. Until a batch is answered it is admission's first
        estimate: `max_batch` items in the version's batch latency floor or hint."""
        return self._admission.throughput()

    def demand(self, now: float) -> Demand:
        queues = self._batcher.queues
        oldest = queues.oldest()
        return Demand(
            queued=len(queues), paid=queues.depth_through(Tier.PAID),
            oldest=math.inf if oldest is None else oldest.enqueued,
            oldest_deadline=math.inf if oldest is None else oldest.deadline,
            rate=self._batcher.offered_rate(now),
        )

    def expected_wait(self, tier: Tier, now: float) -> float:
        """Admission's estimate for a new item of `tier` (seconds; inf with no worker)."""
        return self._batcher.expected_wait(tier, now, self._table.ready_count(),
                                           self._joining(now) if self._coming else ())

    @property
    def draining(self) -> bool:
        return self._batcher.draining

    def grouped(self) -> set[int]:
        """The ids of the items waiting to run again in the table's groups."""
        return self._table.grouped()

    def statistics(self, now: float) -> CoreStatistics:
        return CoreStatistics(
            batcher=self._batcher.statistics(now),
            table=self._table.statistics(),
            hangs=self._hangs,
            busy_seconds=self._busy_seconds + sum(now - t for t in self._sent_at.values()),
            batch_latency=self._admission.batch_latency,
        )

    # -- internals -------------------------------------------------------------------------
    def _needed(self, now: float) -> float:
        """Workers the current load keeps busy at full batches."""
        return self._batcher.load_rate(now) * self._admission.batch_latency / self._max_batch

    def _capacity(self, now: float) -> Capacity:
        return Capacity(self._table.idle_count(), self._table.ready_count(), self._needed(now))

    def _pump(
        self, now: float, out: CoreActions, freed: tuple[WorkerId, float] | None = None
    ) -> CoreActions:
        """Give idle workers to the groups that may run first, then cut batches while due;
        a cut can let a group of a lower tier run, so groups are asked again after each."""
        needed = -1.0
        table = self._table
        hold = self._pace(now) if self._pace is not None and table.idle_count() > 0 \
            else -math.inf
        self._held_until = hold
        while table.idle_count() > 0:
            if table.has_groups():
                group = table.next_group(now, self._group_may_run)
                if group is not None:
                    self._sent_at[group.worker] = now
                    run = Run(group.batch_id, group.texts, group.tags, group.traces)
                    out.send.append(Send(group.worker, run, None, version=self.version))
                    continue
            if needed < 0:
                needed = self._needed(now)
            capacity = Capacity(
                self._table.idle_count(), self._table.ready_count(), needed
            )
            cut = self._batcher.cut(now, capacity, hold)
            if cut is None:
                break
            for item in cut.expired:
                out.settle.append(
                    (item, DeadlineExceeded("the request's deadline passed while queued"))
                )
            if not cut.items:
                continue
            d = self._table.assign(cut.items, now)
            for item in cut.items:
                item.dispatched, item.batch = now, d.batch_id
            self._sent_at[d.worker] = now
            gap = now - freed[1] if freed is not None and freed[0] == d.worker else None
            run = Run(d.batch_id, d.texts, d.tags, d.traces)
            out.send.append(Send(d.worker, run, cut.reason, gap, self.version))
        return out

    def _group_may_run(self, group: Group) -> bool:
        """Groups keep their items' tier: none runs while a better tier has work queued.
        Runs that may never come back leave one worker of a pool of several to everyone
        else (except while draining): isolation runs of inputs that killed workers, and
        free re-runs and hedges; a paid re-run or hedge goes at once, to any worker."""
        queues = self._batcher.queues
        if queues.depth_through(group.tier) > queues.depth(LANE_OF[group.tier]):
            return False
        table = self._table
        if table.peak_ready <= 1 or self._batcher.draining:
            return True
        risky = group.killed if group.kind is Rerun.ISOLATE else group.tier is not Tier.PAID
        return not risky or table.ready_count() - table.suspect_count() >= 2

    def _stop_clock(self, worker: WorkerId, now: float) -> None:
        started = self._sent_at.pop(worker, None)
        if started is not None:
            self._busy_seconds += now - started


__all__ = ["CoreStatistics", "Demand", "DispatchCore", "Refusal"]
