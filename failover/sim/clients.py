"""The callers and the door as the core sees them: each request admitted at its time
through `CoreOwner.admit` (its items carrying their deadline), refused at once or answered
later, and given up at its deadline as the door gives it up (answered `DeadlineExceeded`,
its items cancelled in the core, whatever comes of them later ignored).

One task does it all: it sleeps until the next arrival or the next deadline of a request
still open, whichever comes first. A stream's deadlines come in the order of its arrivals,
so each stream keeps its open requests in one queue and the answered ones fall off its
front unseen: a deadline costs a wake-up only for a request still open at it.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterator, Sequence

import anyio

from batcher import BatchgateError, Clock, DeadlineExceeded, Item, ItemId
from failover import CoreOwner
from failover.sim.arrivals import Stream
from failover.sim.loop import EPSILON_S
from failover.sim.record import Record, Request


class Clients:
    def __init__(self, streams: Sequence[Stream], arrivals: Iterator[tuple[float, int]],
                 record: Record, clock: Clock, door: bool = True) -> None:
        """`door`: False admits every request as if its deadline were past reach (no
        refusal for it), while still giving it up at its deadline."""
        self._streams = streams
        self._door = door
        self._arrivals = arrivals
        self._record = record
        self._clock = clock
        self._ids = itertools.count()
        self._open: list[deque[Request]] = [deque() for _ in streams]

    async def run(self, owner: CoreOwner, until: float = math.inf) -> None:
        """Call until every arrival has come and every request is answered or given up,
        or until `until`."""
        upcoming = next(self._arrivals, None)
        while True:
            due = self._next_deadline()
            at = upcoming[0] if upcoming is not None else math.inf
            wake = min(at, due)
            if wake == math.inf or wake > until:
                if upcoming is None and self._record.open:  # open, with no deadline
                    with anyio.move_on_after(until - self._clock.now()):
                        await self._record.wait_answered()
                return
            if wake > self._clock.now() + EPSILON_S:
                await anyio.sleep_until(wake)
            now = self._clock.now()
            if due <= now + EPSILON_S:
                self._give_up(now, owner)
            if upcoming is not None and upcoming[0] <= now + EPSILON_S:
                self._call(upcoming[1], now, owner)
                upcoming = next(self._arrivals, None)

    def _call(self, index: int, now: float, owner: CoreOwner) -> None:
        """One request of stream `index`, admitted as the door admits one."""
        s, record = self._streams[index], self._record
        request = record.request(index, now, s.inputs)
        try:
            version = owner.resolve(s.model, None)
            deadline = now + s.timeout_s
            request.items = [Item(ItemId(n := next(self._ids)), f"{n:08x}", s.tier, now,
                                  deadline, request, k, version=version)
                             for k in range(s.inputs)]
            owner.admit(request.items, s.timeout_s if self._door else math.inf, now)
        except BatchgateError as exc:
            record.refused(index, exc)
            return
        record.admitted(request)
        if deadline < math.inf:
            self._open[index].append(request)

    def _next_deadline(self) -> float:
        """The earliest deadline of a request still open (answered ones fall off)."""
        due = math.inf
        for open_ in self._open:
            while open_ and open_[0].done:
                open_.popleft()
            if open_:
                due = min(due, open_[0].arrived + self._streams[open_[0].stream].timeout_s)
        return due

    def _give_up(self, now: float, owner: CoreOwner) -> None:
        """The door answers every request open past its deadline, and cancels its items."""
        for index, open_ in enumerate(self._open):
            timeout = self._streams[index].timeout_s
            while open_ and (open_[0].done or open_[0].arrived + timeout <= now + EPSILON_S):
                request = open_.popleft()
                if request.done:
                    continue
                self._record.give_up(request, DeadlineExceeded("the door gave up waiting"))
                for item in request.items:
                    owner.cancel(item)


__all__ = ["Clients"]
