"""Weighted fair share between the accounts of one tier lane (`FairLane`).

Self-clocked fair queueing (SCFQ, Golestani 1994), charged in characters: each account has
an age-ordered deque; its head's finish tag is F = S + cost / weight, where S is the tag of
the account's last item served, or the lane's virtual time V when the account was idle
(cost: `max(1, len(text))`, so an empty input still costs). The lane serves the head with
the smallest tag and V moves to that tag. So over any stretch in which two accounts stay
backlogged, their served characters over their weights differ by at most one item's cost
over its weight; a small input of an account that just arrived gets F = V + small and goes
ahead of another account's long backlog at once; an account that went idle restarts from
V, so it banks no credit.

Why SCFQ rather than deficit round robin: DRR's quantum must be at least the largest item
(10,000 characters) to be O(1), and a new account then waits up to a whole round of every
backlogged account's quantum; SCFQ's tags order single items exactly, and with one or a
few active accounts (most traffic) serving is a tight loop over one deque that consults
the heap of the others once per run of items, not per item.

Tags are kept per account (of its head), not per item. Every account queued has a live
head and one valid heap entry holding its head's tag; a head that changes otherwise than
by being served (an aged item put ahead of it, the head cancelled: it is trimmed at once,
so a cancelled input charges nothing and delays nobody) gets a fresh entry, and the one it
leaves is recognised as stale by its sequence number and skipped.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping

from batcher.types import Item


def cost(item: Item) -> int:
    """What serving `item` charges its account: its characters, at least 1."""
    return len(item.text) or 1


class Flow:
    """One account's items in a lane, in age order, and the tag its head starts from."""

    __slots__ = ("account", "chars", "items", "live", "rate", "seq", "start")

    def __init__(self, account: str | None, rate: float, start: float) -> None:
        self.account = account
        self.items: deque[Item] = deque()
        self.live = 0  # its items not cancelled, and their characters (admission reads them)
        self.chars = 0
        self.rate = rate  # 1 / weight: tag units per character
        self.start = start  # S: the tag the head's finish is counted from
        self.seq = -1  # the sequence of its live heap entry; -1: in no heap

    def finish(self) -> float:
        return self.start + cost(self.items[0]) * self.rate


Entry = tuple[float, int, Flow]  # (the head's finish tag, a sequence number, its flow)
STALE_SLACK = 64  # stale heap entries kept beyond one per account, at the most


class FairLane:
    """A lane's items by account, served in weighted fair order (see the module).

    Holds items only: the caller (`TierQueues`) keeps the counts of live items and their
    characters. A cancelled item behind its account's head stays until it reaches the
    head or `compact` runs; `dead` counts them.
    """

    __slots__ = ("_flows", "_heap", "_seq", "_vtime", "_weights", "dead", "served")

    def __init__(self, weights: Mapping[str, float]) -> None:
        self._weights = weights
        self._flows: dict[str | None, Flow] = {}
        self._heap: list[Entry] = []
        self._seq = 0
        self._vtime = 0.0  # V: the tag of the item served last
        self.dead = 0  # cancelled items still held
        self.served: dict[str | None, int] = {}  # items cut so far, by account

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """New weights (a keys file read again): the accounts queued now share by them from
        here, as if each had just come (its tag counts from V: no credit or debt kept from
        the old weights, which would be charged at the new ones); one that comes later
        at its own."""
        self._weights = weights
        heap = self._heap
        heap.clear()
        for flow in self._flows.values():  # each holds a live head
            flow.rate = self._new_flow_rate(flow.account)
            flow.start = self._vtime
            self._seq += 1
            flow.seq = self._seq
            heap.append((flow.finish(), self._seq, flow))
        heapq.heapify(heap)

    def held(self) -> int:
        """Items in memory, cancelled ones not yet trimmed included."""
        return sum(len(f.items) for f in self._flows.values())

    def append(self, item: Item) -> None:
        """Append an item behind its account's earlier ones (a request of one input)."""
        flow = self._flows.get(item.caller)
        if flow is not None:
            flow.items.append(item)
            flow.live += 1
            flow.chars += len(item.text)
            return
        flow = self._flows[item.caller] = self._new_flow(item.caller)
        flow.items.append(item)
        flow.live += 1
        flow.chars += len(item.text)
        self._push(flow)

    def extend(self, items: Iterable[Item]) -> None:
        """Append items behind their accounts' earlier ones."""
        flows, fresh = self._flows, []
        flow: Flow | None = None
        for item in items:
            if flow is None or item.caller != flow.account:
                flow = flows.get(item.caller)
                if flow is None:
                    flow = flows[item.caller] = self._new_flow(item.caller)
                    fresh.append(flow)
            flow.items.append(item)
            flow.live += 1
            flow.chars += len(item.text)
        for flow in fresh:
            self._push(flow)

    def insert_aged(self, item: Item) -> None:
        """Put `item` in its account's deque by `arrived`: behind the older ones, ahead of
        the younger. They mostly come in order: the scan from the tail is short."""
        flow = self._flows.get(item.caller)
        if flow is None:
            self.append(item)
            return
        dq, at = flow.items, len(flow.items)
        while at > 0 and dq[at - 1].arrived > item.arrived:
            at -= 1
        dq.insert(at, item)
        flow.live += 1
        flow.chars += len(item.text)
        if at == 0:  # a new head, a new tag
            self._push(flow)

    def cancel(self, item: Item) -> None:
        """`item`, queued here, was cancelled. A head is trimmed at once (with the
        cancelled ones behind it), so that the tag of what is left is right."""
        flow = self._flows[item.caller]
        flow.live -= 1
        flow.chars -= len(item.text)
        if flow.items[0] is not item:
            self.dead += 1  # trimmed when it reaches the head, or compacted
            return
        self.dead += 1
        self._trim(flow)
        if flow.items:
            self._push(flow)
        else:
            self._drop(flow)

    def oldest(self) -> Item | None:
        """The head that waited longest (by `enqueued`): O(accounts queued)."""
        best: Item | None = None
        for flow in self._flows.values():
            head = flow.items[0]
            if best is None or head.enqueued < best.enqueued:
                best = head
        return best

    def ahead(self, account: str | None, chars: int) -> tuple[float, float]:
        """About how many items, of how many characters, would be served before the last
        input of a request of `account` (`chars` characters) that came now: its account's
        queued ones, and of each other account's, those whose tags come first: as many
        characters as the request and its account's queue cost, over its weight, times the
        other's weight. What admission weighs a request's wait by (O(accounts queued)): a
        small request of one account is not judged by another's long queue, as it would
        not wait for it."""
        flow = self._flows.get(account)
        items = chars_ahead = 0.0
        rate = self._new_flow_rate(account)
        if flow is not None:
            items, chars_ahead = float(flow.live), float(flow.chars)
        reach = (chars_ahead + max(chars, 1)) * rate  # its last tag, from V
        for other in self._flows.values():
            if other is flow or other.live <= 0:
                continue
            cost = max(other.chars, other.live)  # an empty input costs 1
            taken = min(float(cost), reach / other.rate)
            items += other.live * taken / cost
            chars_ahead += other.chars * taken / cost
        return items, chars_ahead

    def take(self, batch: list[Item], expired: list[Item], limit: int, now: float,
             max_chars: float, held: int) -> tuple[int, int, bool]:
        """Move heads in fair order into `batch` (or `expired`, past their deadline,
        uncharged) until `limit`, or until the head picked does not fit `max_chars` (then
        it stays, and `full` is True) with `held` characters in the batch already.
        Returns (held, characters expired, full)."""
        gone = 0
        heap = self._heap
        while len(batch) < limit:
            while heap and heap[0][2].seq != heap[0][1]:
                heapq.heappop(heap)  # stale
            if not heap:
                return held, gone, False
            flow = heap[0][2]
            if len(heap) == 1:
                held, gone, full = self._run_alone(flow, batch, expired, limit, now,
                                                   max_chars, held, gone)
            else:
                held, gone, full = self._run(flow, batch, expired, limit, now, max_chars,
                                             held, gone)
            if full:
                return held, gone, True
        return held, gone, False

    def _run(self, flow: Flow, batch: list[Item], expired: list[Item], limit: int,
             now: float, max_chars: float, held: int, gone: int) -> tuple[int, int, bool]:
        """Serve `flow` (the heap's top) while its head's tag stays below every other
        account's: one heap operation per run of items, not per item."""
        heap, dq, rate = self._heap, flow.items, flow.rate
        bound = heap[1][0] if len(heap) == 2 else min(heap[1][0], heap[2][0])
        start, key, full, served = flow.start, heap[0][0], False, 0
        while True:
            item = dq.popleft()
            if item.cancelled:  # one behind the head, trimmed on the way
                self.dead -= 1
            elif item.deadline <= now:
                item.lane = -1
                expired.append(item)
                gone += len(item.text)
                flow.live -= 1
                flow.chars -= len(item.text)
            elif held + len(item.text) > max_chars and batch:
                dq.appendleft(item)  # it heads the next batch
                full = True
                break
            else:
                item.lane = -1
                batch.append(item)
                held += len(item.text)
                flow.live -= 1
                flow.chars -= len(item.text)
                start = key  # the tag served: the account's next head counts from it
                served += 1
            if not dq or len(batch) >= limit:
                break
            head = dq[0]
            if head.cancelled:
                continue
            key = start + (len(head.text) or 1) * rate
            if key >= bound:  # another account's turn (ties go to the one waiting)
                break
        self._ran(flow, start, served)
        return held, gone, full

    def _run_alone(self, flow: Flow, batch: list[Item], expired: list[Item], limit: int,
                   now: float, max_chars: float, held: int, gone: int
                   ) -> tuple[int, int, bool]:
        """`_run` for the only account with items waiting (most traffic): first come, first
        served, as cheap as a FIFO lane, its tag advanced once by what it was charged."""
        dq, first, charged, full = flow.items, len(batch), 0, False
        while dq and len(batch) < limit:
            item = dq.popleft()
            if item.cancelled:
                self.dead -= 1
                continue
            size = len(item.text)
            if held + size > max_chars and batch and item.deadline > now:
                dq.appendleft(item)  # it heads the next batch
                full = True
                break
            item.lane = -1
            flow.live -= 1
            flow.chars -= size
            if item.deadline <= now:
                expired.append(item)
                gone += size
                continue
            batch.append(item)
            held += size
            charged += size or 1
        self._ran(flow, flow.start + charged * flow.rate, len(batch) - first)
        return held, gone, full

    def _ran(self, flow: Flow, start: float, served: int) -> None:
        """After a run of `flow` (the heap's top): its tag and V move to the last tag
        served, and it is queued again by its next live head, or leaves."""
        if served:
            self.served[flow.account] = self.served.get(flow.account, 0) + served
            flow.start = start
            if start > self._vtime:
                self._vtime = start
        self._trim(flow)
        if flow.items:
            self._push(flow, replace=True)
        else:
            heapq.heappop(self._heap)
            self._drop(flow)

    def compact(self) -> None:
        """Drop every cancelled item (amortised: the caller runs it when they pile up).
        Heads are live: no account leaves, no tag changes."""
        for flow in self._flows.values():
            flow.items = deque(i for i in flow.items if not i.cancelled)
        self.dead = 0
        self._reheap()

    def drain(self) -> list[Item]:
        """Remove and return every live item."""
        out = [i for f in self._flows.values() for i in f.items if not i.cancelled]
        for flow in self._flows.values():
            flow.seq = -1
        self._flows.clear()
        self._heap.clear()
        self.dead = 0
        return out

    def _new_flow(self, account: str | None) -> Flow:
        return Flow(account, self._new_flow_rate(account), self._vtime)  # idle: bank nothing

    def _new_flow_rate(self, account: str | None) -> float:
        """Tag units per character of `account`: 1 over its weight."""
        return 1.0 / (1.0 if account is None else self._weights.get(account, 1.0))

    def _trim(self, flow: Flow) -> None:
        """Pop the cancelled items at the head of `flow`."""
        dq = flow.items
        while dq and dq[0].cancelled:
            dq.popleft()
            self.dead -= 1

    def _push(self, flow: Flow, replace: bool = False) -> None:
        """Give `flow` a fresh heap entry for its head (`replace`: it is the top's)."""
        self._seq += 1
        flow.seq = self._seq
        entry = (flow.finish(), self._seq, flow)
        heap = self._heap
        if replace:
            heapq.heapreplace(heap, entry)
        else:
            heapq.heappush(heap, entry)
            if len(heap) > len(self._flows) + STALE_SLACK:
                self._reheap()

    def _drop(self, flow: Flow) -> None:
        flow.seq = -1
        del self._flows[flow.account]

    def _reheap(self) -> None:
        """Keep only live entries: stale ones must not pile up while nothing is served."""
        self._heap[:] = [e for e in self._heap if e[2].seq == e[1]]
        heapq.heapify(self._heap)


__all__ = ["FairLane", "Flow", "cost"]
