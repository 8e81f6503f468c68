"""Bounded queues, one per tier, beneath a retry lane that outranks them all.

Tier order is strict: retry, then paid, then free. Within a tier, items go either first come,
first served (one FIFO deque), or, with fair share on, by weighted fair share between the
accounts (`Item.caller`) charged in characters, first come, first served within an account
(`batcher.fair`): one account's long request no longer holds the pool while another
account's single input waits behind it. The retry lane is always FIFO.

Cancelled items (client gone, deadline passed) stay in their deque until they reach its
head, where they are trimmed: removal from the middle of a deque is O(n), and a flag is
O(1). Counts, of items and of their characters (what admission weighs and a cut is capped
by), always reflect live items only. So that memory stays bounded by the caps however
items leave (a busy pool and clients that all give up), a lane that holds more than twice
its live items is compacted: amortised O(1) per cancellation.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from batcher.errors import QueueFull
from batcher.fair import FairLane
from batcher.types import LANE_OF, Item, Lane, Tier

Slots = dict[tuple[str, str | None], int]
"""Items cut into batches by (tier label, account); None: an item of no account."""


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    depth: dict[str, int]
    total: int
    held: int  # items in memory, cancelled ones not yet trimmed included
    slots: Slots = field(default_factory=dict)  # batch slots so far, by tier and account


_TIER_OF_LANE = {LANE_OF[tier]: tier for tier in Tier}

COMPACT_SLACK = 64  # cancelled items a lane may hold beyond its live ones, at the least


def _checked(weights: Mapping[str, float]) -> dict[str, float]:
    bad = sorted(a for a, w in weights.items() if not (0 < w < math.inf))
    if bad:
        raise ValueError(f"account weights must be > 0 and finite: {bad[:5]}")
    return dict(weights)


class TierQueues:
    """Queues for every lane. Not thread-safe: owned by one event loop.

    `fair`: share each tier between its accounts by `weights` (account -> weight > 0; an
    account not named weighs 1); off, first come, first served within a tier.
    """

    def __init__(self, capacity: dict[Tier, int], fair: bool = False,
                 weights: Mapping[str, float] | None = None) -> None:
        missing = set(Tier) - set(capacity)
        if missing:
            raise ValueError(f"no queue capacity given for {sorted(t.name for t in missing)}")
        if any(c < 1 for c in capacity.values()):
            raise ValueError("queue capacities must be at least 1")
        weights = _checked(weights or {})
        self._capacity = dict(capacity)
        self._lanes: list[deque[Item]] = [deque() for _ in Lane]
        # The tier lanes' fair structures (None: the lane is its FIFO deque).
        self._fair: list[FairLane | None] = [
            FairLane(weights) if fair and lane is not Lane.RETRY else None for lane in Lane]
        self._live = [0 for _ in Lane]
        self._chars = [0 for _ in Lane]  # characters of the live items, per lane
        self._total = 0  # sum of _live, kept on every change: read on every arrival
        self._slots: Slots = {}

    def __len__(self) -> int:
        return self._total

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The accounts' new weights (`FairLane.set_weights`); nothing without fair share."""
        weights = _checked(weights)
        for fair in self._fair:
            if fair is not None:
                fair.set_weights(weights)

    def depth(self, lane: Lane) -> int:
        return self._live[lane]

    def depth_through(self, tier: Tier) -> int:
        """Live items that would run before a new item of `tier` (its own tier and above)."""
        return sum(self._live[: LANE_OF[tier] + 1])

    def ahead(self, tier: Tier, account: str | None, chars: int) -> tuple[int, int]:
        """(items, characters) that would run before the last input of a request of
        `account` in `tier` (`chars` characters) arriving now: every lane above, and in its
        own what fair share serves first (`FairLane.ahead`), or all of it (first come,
        first served)."""
        lane = LANE_OF[tier]
        fair = self._fair[lane]
        if fair is None:
            return sum(self._live[: lane + 1]), sum(self._chars[: lane + 1])
        items, chars_ahead = fair.ahead(account, chars)
        return (sum(self._live[:lane]) + math.ceil(items),
                sum(self._chars[:lane]) + math.ceil(chars_ahead))

    def chars_through(self, tier: Tier) -> int:
        """Characters of the live items that would run before a new item of `tier`."""
        return sum(self._chars[: LANE_OF[tier] + 1])

    def chars(self) -> int:
        """Characters of every live item."""
        return sum(self._chars)

    def fits(self, n: int, tier: Tier) -> bool:
        """Whether `n` more items of `tier` stay within its hard cap."""
        return self._live[LANE_OF[tier]] + n <= self._capacity[tier]

    def put_all(self, items: list[Item], tier: Tier, chars: int = -1) -> None:
        """Append a request's items (all of `tier`, `chars` characters when the caller has
        counted them) together, or raise QueueFull at the tier's hard cap and queue none."""
        lane = LANE_OF[tier]
        n = len(items)
        if self._live[lane] + n > self._capacity[tier]:
            raise QueueFull(f"the {tier.label} queue is full", retry_after=1.0)
        for item in items:
            item.lane = lane
        fair = self._fair[lane]
        if fair is None:
            self._lanes[lane].extend(items)
        elif n == 1:
            fair.append(items[0])
        else:
            fair.extend(items)
        self._live[lane] += n
        self._chars[lane] += chars if chars >= 0 else sum(len(i.text) for i in items)
        self._total += n

    def put_nowait(self, item: Item) -> None:
        """Append to the item's tier; raise QueueFull at the tier's hard cap."""
        self.put_all([item], item.tier)

    def put_aged(self, item: Item) -> None:
        """Queue an item that comes from an earlier stage (`failover.fleet.stages`) where
        its age puts it: behind the items that arrived before it, ahead of the later ones
        (of its account, with fair share on). They mostly come in order: the scan from the
        tail is short. No cap: the input was admitted once, and it is in one stage at a
        time."""
        lane = LANE_OF[item.tier]
        item.lane = lane
        fair = self._fair[lane]
        if fair is not None:
            fair.insert_aged(item)
        else:
            dq, at = self._lanes[lane], len(self._lanes[lane])
            while at > 0 and dq[at - 1].arrived > item.arrived:
                at -= 1
            dq.insert(at, item)
        self._live[lane] += 1
        self._chars[lane] += len(item.text)
        self._total += 1

    def push_retry(self, items: Iterable[Item]) -> None:
        """Put re-routed items at the head of the retry lane, keeping their order."""
        fresh = [i for i in items if not i.cancelled]
        for item in fresh:
            item.lane = Lane.RETRY
        self._lanes[Lane.RETRY].extendleft(reversed(fresh))
        self._live[Lane.RETRY] += len(fresh)
        self._chars[Lane.RETRY] += sum(len(i.text) for i in fresh)
        self._total += len(fresh)

    def cancel(self, item: Item) -> None:
        """Mark an item cancelled; if it is queued it stops counting at once (O(1))."""
        if item.cancelled:
            return
        item.cancelled = True
        lane = item.lane
        if lane >= 0:
            self._live[lane] -= 1
            self._chars[lane] -= len(item.text)
            self._total -= 1
            item.lane = -1
            fair = self._fair[lane]
            if fair is not None:
                fair.cancel(item)
                if fair.dead > self._live[lane] + COMPACT_SLACK:
                    fair.compact()
                return
            dq = self._lanes[lane]
            if len(dq) > 2 * self._live[lane] + COMPACT_SLACK:
                self._lanes[lane] = deque(i for i in dq if not i.cancelled)

    def oldest(self) -> Item | None:
        """The live item that has waited longest, over all lanes (retry items count too):
        with fair share, the oldest of the accounts' heads (O(1) with one account)."""
        best: Item | None = None
        for lane in Lane:
            fair = self._fair[lane]
            head = self._head(lane) if fair is None else fair.oldest()
            if head is not None and (best is None or head.enqueued < best.enqueued):
                best = head
        return best

    def has_retry(self) -> bool:
        return self._head(Lane.RETRY) is not None

    def pop_batch(
        self, limit: int, now: float, max_chars: float = math.inf
    ) -> tuple[list[Item], list[Item]]:
        """Take up to `limit` live items in priority order (tier, then fair share or age),
        holding at most `max_chars` characters, except that the first item is always
        taken (one input longer than the cap runs alone). The cut stops at the first item
        that does not fit: no later or lower-tier item goes ahead of it.

        Returns (batch, expired): expired items had passed their deadline and are removed
        without running; the caller answers them.
        """
        batch: list[Item] = []
        expired: list[Item] = []
        held = 0  # characters in the batch
        full = False
        for lane in Lane:
            held_before, taken_before = held, len(batch) + len(expired)
            fair = self._fair[lane]
            if fair is None:
                held, gone, full = self._take(lane, batch, expired, limit, now, max_chars,
                                              held)
            else:  # it counts its accounts' slots itself, one count per run
                held, gone, full = fair.take(batch, expired, limit, now, max_chars, held)
            taken = len(batch) + len(expired) - taken_before
            self._live[lane] -= taken
            self._total -= taken
            self._chars[lane] -= held - held_before + gone
            if full or len(batch) >= limit:
                break
        return batch, expired

    def _take(self, lane: Lane, batch: list[Item], expired: list[Item], limit: int,
              now: float, max_chars: float, held: int) -> tuple[int, int, bool]:
        """A FIFO lane's share of a cut: (held, characters expired, full). It counts the
        accounts' slots as it goes, one count per run of an account's items."""
        dq, slots, gone, full = self._lanes[lane], self._slots, 0, False
        tier = _TIER_OF_LANE.get(lane)  # None: the retry lane, of either tier
        label = None if tier is None else tier.label
        caller: str | None = None
        run = 0
        while dq and len(batch) < limit:
            item = dq.popleft()
            if item.cancelled:
                continue
            size = len(item.text)
            if held + size > max_chars and batch and item.deadline > now:
                dq.appendleft(item)  # it heads the next batch
                full = True
                break
            item.lane = -1
            if item.deadline <= now:
                expired.append(item)
                gone += size
                continue
            batch.append(item)
            held += size
            if item.caller == caller and label is not None:
                run += 1
                continue
            if run:
                key = (label or batch[-2].tier.label, caller)
                slots[key] = slots.get(key, 0) + run
            caller, run = item.caller, 1
        if run:
            key = (label or batch[-1].tier.label, caller)
            slots[key] = slots.get(key, 0) + run
        return held, gone, full

    def drain(self) -> list[Item]:
        """Remove and return every live item (shutdown)."""
        out = [i for dq in self._lanes for i in dq if not i.cancelled]
        for dq in self._lanes:
            dq.clear()
        for fair in self._fair:
            if fair is not None:
                out += fair.drain()
        for item in out:
            item.lane = -1
        self._live = [0 for _ in Lane]
        self._chars = [0 for _ in Lane]
        self._total = 0
        return out

    def statistics(self) -> QueueStatistics:
        depth = {lane.label: self._live[lane] for lane in Lane}
        held = sum(len(dq) for dq in self._lanes)
        held += sum(fair.held() for fair in self._fair if fair is not None)
        slots = dict(self._slots)
        for lane, fair in zip(Lane, self._fair, strict=True):
            if fair is not None:
                label = _TIER_OF_LANE[lane].label
                for account, n in fair.served.items():
                    slots[label, account] = slots.get((label, account), 0) + n
        return QueueStatistics(depth=depth, total=sum(self._live), held=held, slots=slots)

    def _head(self, lane: Lane) -> Item | None:
        dq = self._lanes[lane]
        while dq and dq[0].cancelled:
            dq.popleft()
        return dq[0] if dq else None


__all__ = ["QueueStatistics", "Slots", "TierQueues"]
