"""The batching half of the dispatch core: tier queues, flush policy, admission, arrival rate.

Plain synchronous code with time passed in: it never awaits and never reads a clock. It
cuts a batch only when asked with a worker idle (late binding); the core that owns it
decides when to ask, and says when it next needs asking (`due`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from batcher.admission import Admission, RateMeter
from batcher.errors import Closed
from batcher.policy import Capacity, FlushPolicy
from batcher.queues import TierQueues
from batcher.types import FlushReason, Item, Tier

RECENT_ADMITS = 4  # requests over which `load_rate` sees a step in load


@dataclass(frozen=True, slots=True)
class Cut:
    """A batch to run (possibly empty) and the items found past their deadline on the way."""

    items: list[Item]
    reason: FlushReason
    expired: list[Item]


@dataclass(frozen=True, slots=True)
class BatcherStatistics:
    pending: int
    depth: dict[str, int]
    batches: int
    items: int
    flushes: dict[str, int]
    expired: int
    draining: bool
    arrival_rate: float


class Batcher:
    def __init__(
        self, queues: TierQueues, policy: FlushPolicy, admission: Admission | None = None
    ) -> None:
        self._queues = queues
        self._policy = policy
        self._admission = admission
        self._arrivals = {tier: RateMeter() for tier in Tier}
        self._recent: deque[tuple[float, int]] = deque(maxlen=RECENT_ADMITS + 1)
        self._above = {tier: tuple(t for t in Tier if t < tier) for tier in Tier}
        self._draining = False
        self._batches = self._items = self._expired = 0
        self._flushes: Counter[FlushReason] = Counter()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queues(self) -> TierQueues:
        return self._queues

    @property
    def policy(self) -> FlushPolicy:
        return self._policy

    def __len__(self) -> int:
        return len(self._queues)

    def admit(self, items: list[Item], deadline_in: float, now: float, ready: int) -> None:
        """Queue a request's items together or refuse them all.

        Raises `Closed` while draining, `Overloaded` when admission control refuses, and
        `QueueFull` at the tier's hard cap; on any refusal no item is queued.
        """
        if self._draining:
            raise Closed("the server is shutting down")
        tier = items[0].tier
        n = len(items)
        if self._admission is not None:
            ahead = self._queues.depth_through(tier) + n - 1
            self._admission.check(tier, ahead, ready, deadline_in, self._overtaking(tier, now))
        for item in items:
            item.enqueued = now
        self._queues.put_all(items, tier)  # all or nothing
        self._arrivals[tier].add(n, now)
        self._recent.append((now, n))

    def admit_run(self, requests: Sequence[list[Item]], deadline_in: float, now: float,
                  ready: int) -> bool:
        """`admit` each of several requests of one tier and one deadline at one moment, in
        one step when the last of them is admitted (then so is every earlier one: a wait
        estimate only grows with the queue ahead). False, with nothing queued, when not;
        the caller then admits them one by one to find which are refused."""
        if self._draining:
            return False
        tier = requests[0][0].tier
        n = sum(map(len, requests))
        if self._admission is not None:
            ahead = self._queues.depth_through(tier) + n - 1
            if not self._admission.admits(tier, ahead, ready, deadline_in,
                                          self._overtaking(tier, now)):
                return False
        items = [item for request in requests for item in request]
        if not self._queues.fits(len(items), tier):
            return False
        for item in items:
            item.enqueued = now
        self._queues.put_all(items, tier)
        self._arrivals[tier].add(n, now)
        self._recent.extend([(now, len(request)) for request in requests])
        return True

    def cancel(self, item: Item) -> None:
        """The waiter gave up (client gone, deadline passed): never run this item."""
        self._queues.cancel(item)

    def push_retry(self, items: list[Item], now: float) -> None:
        """Re-queue the items of a failed batch ahead of everything else."""
        for item in items:
            item.enqueued = now
        self._queues.push_retry(items)

    def drain(self) -> None:
        """Stop accepting; whatever is queued is cut at once from now on."""
        self._draining = True

    def cut(self, now: float, capacity: Capacity) -> Cut | None:
        """Cut the next batch if the policy says so (items may be empty when every item
        taken had expired); None to keep waiting."""
        oldest = self._queues.oldest()
        if oldest is None:
            return None
        reason = self._policy.decide(
            pending=len(self._queues),
            oldest_enqueued=-math.inf if self._draining else oldest.enqueued,
            now=now,
            pool=capacity,
            retry=self._queues.has_retry(),
        )
        if reason is None:
            return None
        batch, expired = self._queues.pop_batch(self._policy.max_batch, now)
        self._expired += len(expired)
        if batch:
            self._batches += 1
            self._items += len(batch)
            self._flushes[reason] += 1
        return Cut(batch, reason, expired)

    def due(self) -> float:
        """When the oldest queued item's wait runs out (inf with nothing queued)."""
        oldest = self._queues.oldest()
        return math.inf if oldest is None else self._policy.due(oldest.enqueued)

    def arrival_rate(self, now: float) -> float:
        """Items per second arriving over every tier (decaying average)."""
        return sum(meter.rate(now) for meter in self._arrivals.values())

    def load_rate(self, now: float) -> float:
        """The rate the idle trigger plans for: the decaying average, or the rate of the last
        few requests when higher. The average takes a second to see a step from idle to full
        load, and an idle pool would spend that second cutting one-item batches that hold
        every worker while the queue builds; the last few requests show the step at once."""
        average = self.arrival_rate(now)
        if len(self._recent) <= RECENT_ADMITS:
            return average
        span = now - self._recent[0][0]
        items = sum(n for _, n in self._recent) - self._recent[0][1]
        return max(average, items / span if span > 0 else math.inf)

    def expected_wait(self, tier: Tier, now: float, ready: int) -> float:
        """Admission's estimate for a new item of `tier` now (inf with no worker ready)."""
        if self._admission is None:
            return 0.0
        return self._admission.estimate(
            self._queues.depth_through(tier), ready, self._overtaking(tier, now)
        )

    def _overtaking(self, tier: Tier, now: float) -> float:
        """Items/s arriving in tiers that will be served before `tier`."""
        above = self._above[tier]
        if not above:  # the top tier: nothing overtakes it
            return 0.0
        return sum(self._arrivals[t].rate(now) for t in above)

    def statistics(self, now: float) -> BatcherStatistics:
        q = self._queues.statistics()
        return BatcherStatistics(
            pending=q.total,
            depth=q.depth,
            batches=self._batches,
            items=self._items,
            flushes={r.value: self._flushes[r] for r in FlushReason},
            expired=self._expired,
            draining=self._draining,
            arrival_rate=self.arrival_rate(now),
        )


__all__ = ["Batcher", "BatcherStatistics", "Cut"]
