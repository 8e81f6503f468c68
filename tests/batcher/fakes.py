"""A fake pool with real behaviour for batcher tests: N workers, each runs one batch at a
time for a fixed latency (virtual time), answers every item with its text reversed, and
records everything the invariants are checked against."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from batcher import Batcher, Clock, FlushReason, Item


@dataclass
class Cut:
    at: float
    reason: FlushReason
    items: list[Item]


@dataclass
class FakeWorkers:
    count: int
    latency: float
    clock: Clock
    tg: TaskGroup | None = None
    batcher: Batcher | None = None
    busy: int = 0
    cuts: list[Cut] = field(default_factory=list)
    idle_log: list[tuple[float, int]] = field(default_factory=list)  # (time, idle count)

    def idle_count(self) -> int:
        return self.count - self.busy

    def ready_count(self) -> int:
        return self.count

    def submit(self, items: list[Item], reason: FlushReason) -> None:
        assert self.busy < self.count, "a batch was cut with no idle worker"
        assert self.tg is not None
        self.busy += 1
        now = self.clock.now()
        self.cuts.append(Cut(now, reason, items))
        self.idle_log.append((now, self.idle_count()))
        self.tg.start_soon(self._run, items)

    async def _run(self, items: list[Item]) -> None:
        await anyio.sleep(self.latency)
        for item in items:
            item.settle(item.text[::-1])
        self.busy -= 1
        self.idle_log.append((self.clock.now(), self.idle_count()))
        assert self.batcher is not None
        self.batcher.wake()


class Recorder:
    """An ItemSink that keeps every delivery, duplicates included, for the invariants."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.results: dict[int, list[tuple[float, str | BaseException]]] = {}

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.results.setdefault(item.id, []).append((self.clock.now(), result))
