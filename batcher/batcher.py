"""The batching half of the dispatch core: tier queues, flush policy, admission, arrival rate.

Plain synchronous code with time passed in: it never awaits and never reads a clock. It
cuts a batch only when asked with a worker idle (late binding); the core that owns it
decides when to ask, and says when it next needs asking (`due`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from batcher.admission import Admission, RateMeter
from batcher.errors import Closed
from batcher.policy import Capacity, FlushPolicy
from batcher.queues import Slots, TierQueues
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
    slots: Slots = field(default_factory=dict)  # items cut, by tier and account


class Batcher:
    def __init__(
        self, queues: TierQueues, policy: FlushPolicy, admission: Admission | None = None
    ) -> None:
        self._queues = queues
        self._policy = policy
        self._admission = admission
        self._arrivals = {tier: RateMeter() for tier in Tier}
        # Offered (admitted or refused), kept only while the pool may grow (`count_offered`).
        self._offered: dict[Tier, RateMeter] | None = None
        self._recent: deque[tuple[float, int]] = deque(maxlen=RECENT_ADMITS + 1)
        self._above = {tier: tuple(t for t in Tier if t < tier) for tier in Tier}
        self._through = {tier: tuple(t for t in Tier if t <= tier) for tier in Tier}
        self._draining = False
        self._batches = self._items = self._expired = 0
        self._flushes: Counter[FlushReason] = Counter()

    @property
    def draining(self) -> bool:
        return self._draining

    def count_offered(self) -> None:
        """Meter what each tier offers, refused or not: while workers are on their way, a
        refusal's Retry-After says when they cover it."""
        self._offered = {tier: RateMeter() for tier in Tier}

    @property
    def queues(self) -> TierQueues:
        return self._queues

    @property
    def policy(self) -> FlushPolicy:
        return self._policy

    def __len__(self) -> int:
        return len(self._queues)

    def admit(self, items: list[Item], deadline_in: float, now: float, ready: int,
              joining: Sequence[float] = ()) -> None:
        """Queue a request's items together or refuse them all (`joining`: seconds from now
        at which each worker on its way is expected up).

        Raises `Closed` while draining, `Overloaded` when admission control refuses, and
        `QueueFull` at the tier's hard cap; on any refusal no item is queued.
        """
        if self._draining:
            raise Closed("the server is shutting down")
        tier = items[0].tier
        n = len(items)
        chars = len(items[0].text) if n == 1 else sum(len(i.text) for i in items)
        if items[0].streamed:  # judged whole as its stream began
            if self._offered is not None:
                self._offered[tier].add(n, now)
        elif self._admission is not None:
            queues = self._queues
            over, over_chars = self._overtaking(tier, now)
            offered = 0.0
            if self._offered is not None:
                self._offered[tier].add(n, now)
                if joining:
                    offered = sum(self._offered[t].rate(now) for t in self._through[tier])
            queued, queued_chars = queues.ahead(tier, items[0].caller, chars)
            self._admission.check(tier, queued, ready, deadline_in, over, queued_chars, n,
                                  chars, over_chars, joining, offered)
        for item in items:
            item.enqueued = now
        self._queues.put_all(items, tier, chars)  # all or nothing
        self._arrivals[tier].add(n, now, chars)
        self._recent.append((now, n))

    def judge(self, tier: Tier, items: int, chars: int, deadline_in: float, now: float,
              ready: int, joining: Sequence[float] = ()) -> None:
        """Judge a streamed request of `items` inputs (`chars` characters) before any is
        queued (`Admission.judge`); raises `Closed` while draining."""
        if self._draining:
            raise Closed("the server is shutting down")
        if self._admission is None:
            return
        queues = self._queues
        over, over_chars = self._overtaking(tier, now)
        self._admission.judge(queues.depth_through(tier), ready, deadline_in, over,
                              queues.chars_through(tier), items, chars, over_chars, joining)

    def admit_run(self, requests: Sequence[list[Item]], deadline_in: float, now: float,
                  ready: int, joining: Sequence[float] = ()) -> bool:
        """`admit` each of several requests of one tier and one deadline at one moment, in
        one step when each of them is admitted with the ones before it queued. While
        characters cost nothing, checking the last one is enough (a wait estimate only
        grows with the queue ahead). False, with nothing queued, when not; the caller then
        admits them one by one to find which are refused."""
        if self._draining or any(request[0].streamed for request in requests):
            return False  # a stream's part is admitted alone, unjudged (`admit`)
        tier = requests[0][0].tier
        items = [item for request in requests for item in request]
        n = len(items)
        each = [sum(len(i.text) for i in request) for request in requests]
        chars = sum(each)
        admission = self._admission
        if admission is not None:
            queues = self._queues
            over, over_chars = self._overtaking(tier, now)
            queued, queued_chars = queues.depth_through(tier), queues.chars_through(tier)
            first = 0
            if admission.cost.per_char <= 0 and admission.cost.cap == math.inf:
                first = len(requests) - 1
                queued += n - len(requests[-1])
                queued_chars += chars - each[-1]
            for request, own in zip(requests[first:], each[first:], strict=True):
                if not admission.admits(tier, queued, ready, deadline_in, over, queued_chars,
                                        len(request), own, over_chars, joining):
                    return False
                queued += len(request)
                queued_chars += own
        if not self._queues.fits(n, tier):
            return False
        for item in items:
            item.enqueued = now
        self._queues.put_all(items, tier, chars)
        self._arrivals[tier].add(n, now, chars)
        if self._offered is not None:  # refused, they are counted one by one in `admit`
            self._offered[tier].add(n, now)
        self._recent.extend([(now, len(request)) for request in requests])
        return True

    def cancel(self, item: Item) -> None:
        """The waiter gave up (client gone, deadline passed): never run this item."""
        self._queues.cancel(item)

    def move_in(self, item: Item, now: float) -> None:
        """Queue an input that an earlier stage passed on (`failover.fleet.stages`): it was
        admitted at the door, so neither admission nor a drain refuses it, and it keeps its
        age, for its place in the queue and for the flush policy (it waited its batch out
        in the stage before: it does not wait `max_wait` again)."""
        item.enqueued = item.arrived
        self._queues.put_aged(item)
        self._arrivals[item.tier].add(1, now, len(item.text))
        self._recent.append((now, 1))

    def push_retry(self, items: list[Item], now: float) -> None:
        """Re-queue the items of a failed batch ahead of everything else."""
        for item in items:
            item.enqueued = now
        self._queues.push_retry(items)

    def drain(self) -> None:
        """Stop accepting; whatever is queued is cut at once from now on."""
        self._draining = True

    def cut(self, now: float, capacity: Capacity, hold_until: float = -math.inf
            ) -> Cut | None:
        """Cut the next batch if the policy says so (items may be empty when every item
        taken had expired); None to keep waiting. `hold_until`: `FlushPolicy.decide`'s."""
        oldest = self._queues.oldest()
        if oldest is None:
            return None
        queues = self._queues
        max_chars = self.max_chars()
        reason = self._policy.decide(
            pending=len(queues),
            oldest_enqueued=-math.inf if self._draining else oldest.enqueued,
            now=now,
            pool=capacity,
            retry=queues.has_retry(),
            pending_chars=queues.chars() if max_chars < math.inf else 0,
            max_chars=max_chars,
            hold_until=hold_until,
        )
        if reason is None:
            return None
        batch, expired = queues.pop_batch(self._policy.max_batch, now, max_chars)
        self._expired += len(expired)
        if batch:
            self._batches += 1
            self._items += len(batch)
            self._flushes[reason] += 1
        return Cut(batch, reason, expired)

    def max_chars(self) -> float:
        """Characters the next batch may hold: the policy's fixed cap, else what the
        measured batch cost allows (inf without admission, which holds the cost)."""
        fixed = self._policy.max_batch_chars
        if fixed is not None:
            return fixed
        return math.inf if self._admission is None else self._admission.cost.cut_chars()

    def due(self) -> float:
        """When the oldest queued item's wait runs out (inf with nothing queued)."""
        oldest = self._queues.oldest()
        return math.inf if oldest is None else self._policy.due(oldest.enqueued)

    def arrival_rate(self, now: float) -> float:
        """Items per second arriving over every tier (decaying average)."""
        return sum(meter.rate(now) for meter in self._arrivals.values())

    def offered_rate(self, now: float) -> float:
        """Items per second offered over every tier, refused or not, where that is metered
        (`count_offered`); else those admitted. Demand a door holds to its budget shows
        only here."""
        if self._offered is None:
            return self.arrival_rate(now)
        return sum(meter.rate(now) for meter in self._offered.values())

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

    def expected_wait(self, tier: Tier, now: float, ready: int,
                      joining: Sequence[float] = ()) -> float:
        """Admission's estimate for a new item of `tier` now (inf with no worker ready or
        on its way)."""
        if self._admission is None:
            return 0.0
        over, over_chars = self._overtaking(tier, now)
        return self._admission.estimate(
            self._queues.depth_through(tier), ready, over,
            queued_chars=self._queues.chars_through(tier), overtaking_chars=over_chars,
            joining=joining,
        )

    def _overtaking(self, tier: Tier, now: float) -> tuple[float, float]:
        """Items/s and characters/s arriving in tiers that will be served before `tier`."""
        above = self._above[tier]
        if not above:  # the top tier: nothing overtakes it
            return 0.0, 0.0
        items = chars = 0.0
        for t in above:
            rate, char_rate = self._arrivals[t].rates(now)
            items += rate
            chars += char_rate
        return items, chars

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
            slots=q.slots,
        )


__all__ = ["Batcher", "BatcherStatistics", "Cut"]
