"""What the callers saw: each request's answer, refusal or error, and when, per stream.

A request is answered when its last item is (arrival to last output, the door's latency);
one whose item failed, or that the door gave up at its deadline, counts once, by the
first error's type (`DeadlineExceeded`, `WorkerCrashed`, ...); a refusal at admission counts
by its type too (`OverBudget`, `ModelLoading`, ...). Requests that arrived before
`measure_from` (a warm-up) are counted but leave no latency.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio

from batcher import Clock, Item


@dataclass(slots=True)
class Tally:
    """One stream's requests (or several streams', merged)."""

    offered: int = 0
    latencies: list[float] = field(default_factory=list)  # answered, arrival to answer
    refused: Counter[str] = field(default_factory=Counter)  # at admission, by error type
    failed: Counter[str] = field(default_factory=Counter)  # admitted, answered with an error
    unanswered: int = 0  # admitted, still open when the run ended

    @property
    def answered(self) -> int:
        return len(self.latencies)

    def percentile(self, q: float) -> float:
        """The q-quantile of the latencies (nearest rank; nan with none). Sorts them."""
        lat = self.latencies
        if not lat:
            return math.nan
        lat.sort()
        return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))]

    def over(self, budget: float) -> int:
        """Requests not answered within `budget` seconds: answered later, refused, failed
        or left open."""
        late = sum(1 for x in self.latencies if x > budget + 1e-9)
        return late + sum(self.refused.values()) + sum(self.failed.values()) + self.unanswered

    @classmethod
    def merged(cls, parts: Iterable[Tally]) -> Tally:
        out = cls()
        for p in parts:
            out.offered += p.offered
            out.latencies += p.latencies
            out.refused += p.refused
            out.failed += p.failed
            out.unanswered += p.unanswered
        return out


class Request:
    """One request: the sink of its items (`batcher.ItemSink`)."""

    __slots__ = ("arrived", "done", "error", "items", "left", "record", "stream")

    def __init__(self, record: Record, stream: int, arrived: float, inputs: int) -> None:
        self.record, self.stream, self.arrived, self.left = record, stream, arrived, inputs
        self.error: BaseException | None = None
        self.items: list[Item] = []
        self.done = False  # answered, failed or given up: nothing more counts

    def item_done(self, item: Item, result: str | BaseException) -> None:
        if self.done:  # given up at the door: what comes later is nobody's
            return
        if isinstance(result, BaseException) and self.error is None:
            self.error = result
        self.left -= 1
        if not self.left:
            self.record.finish(self)


class Record:
    """Every request of a run, by stream."""

    def __init__(self, streams: int, clock: Clock, measure_from: float = -math.inf) -> None:
        self.tallies = [Tally() for _ in range(streams)]
        self._clock = clock
        self._from = measure_from
        self._open_by = [0] * streams  # admitted, not answered yet
        self.open = 0
        self._quiet: anyio.Event | None = None

    def request(self, stream: int, arrived: float, inputs: int) -> Request:
        """A new request (counted as offered)."""
        self.tallies[stream].offered += 1
        return Request(self, stream, arrived, inputs)

    def admitted(self, request: Request) -> None:
        self.open += 1
        self._open_by[request.stream] += 1

    def refused(self, stream: int, error: BaseException) -> None:
        self.tallies[stream].refused[type(error).__name__] += 1

    def give_up(self, request: Request, error: BaseException) -> None:
        """The door answers `request` with `error` (its deadline passed)."""
        request.error = error
        self.finish(request)

    def finish(self, request: Request) -> None:
        request.done = True
        tally = self.tallies[request.stream]
        if request.error is not None:
            tally.failed[type(request.error).__name__] += 1
        elif request.arrived >= self._from:
            tally.latencies.append(self._clock.now() - request.arrived)
        self.open -= 1
        self._open_by[request.stream] -= 1
        if not self.open and self._quiet is not None:
            self._quiet.set()

    async def wait_answered(self) -> None:
        """Wait until every request admitted so far is answered."""
        while self.open:
            self._quiet = anyio.Event()
            await self._quiet.wait()

    def close(self) -> None:
        """The run ended: what is still open stays unanswered; nothing more counts."""
        for tally, left in zip(self.tallies, self._open_by, strict=True):
            tally.unanswered = left


__all__ = ["Record", "Request", "Tally"]
