"""What a dead core's workers ran for keyed requests, for the next core to answer from.

A cell's workers outlive its core (`gpu_pool.lasting`); the gateways send the dead core's
jobs again to the next one. A keyed input whose batch ran, or still runs, on a worker the
next core attached to is answered from what that worker said (`Attached`, then `Salvaged`)
instead of running the model a second time: the door settles it from here
(`Salvage.settle`), and a keyed request waits first while one of its inputs is still
running (`Salvage.settled`). An input is matched by its tag (account, key, index), its text
and the version it runs on, so a reused key with another body, or another version, runs.

Bounded: a worker keeps `KEPT_BATCHES` batches (plus the one it runs), and what is here
is dropped `KEEP_S` after it landed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import anyio

from batcher import Item, Tag, VersionKey
from gpu_pool.protocol import Salvaged, WorkerId

KEEP_S = 300.0
"""How long a salvaged answer is kept: a gateway sends its jobs again as soon as the next
core listens, and a client's own retry comes within its request's deadline."""


class Salvage:
    """The salvaged answers by tag, and the tags still running on attached workers."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._answers: dict[Tag, tuple[str, VersionKey, str, float]] = {}
        self._running: dict[WorkerId, tuple[VersionKey, Salvaged]] = {}
        self._changed: anyio.Event | None = None  # made by a waiter, set by a change
        self.answered = 0  # inputs settled from here: never run twice

    def __bool__(self) -> bool:
        return bool(self._answers) or bool(self._running)

    # -- what the pool hears -------------------------------------------------------------
    def attached(self, worker: WorkerId, version: VersionKey,
                 batches: Sequence[Salvaged]) -> None:
        """`worker`, holding `version`, ran (or runs) `batches` for a dead core."""
        for batch in batches:
            if batch.running:
                self._running[worker] = (version, batch)
            else:
                self._keep(version, batch)
        self._change()

    def landed(self, worker: WorkerId, batch: Salvaged) -> None:
        """The batch `worker` was running for a dead core ended (answered or failed)."""
        running = self._running.pop(worker, None)
        if running is not None:
            self._keep(running[0], batch)
            self._change()

    def lost(self, worker: WorkerId) -> None:
        """`worker` died: what it was running for a dead core will not come."""
        if self._running.pop(worker, None) is not None:
            self._change()

    # -- what the door asks --------------------------------------------------------------
    def runs(self, account: str, key: str) -> bool:
        """Whether an input of (account, key) is still running for a dead core."""
        return any(tag is not None and tag[0] == account and tag[1] == key
                   for _, batch in self._running.values() for tag in batch.tags)

    async def settled(self, account: str, key: str, within: float) -> None:
        """Wait, at most `within` seconds, until no input of (account, key) runs for a
        dead core (it landed here, or its worker died)."""
        with anyio.move_on_after(within):
            while self.runs(account, key):
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()

    def settle(self, items: Sequence[Item], now: float) -> list[Item]:
        """Settle each item a dead core's worker answered; return the others, to run."""
        self._expire()
        answers, rest = self._answers, []
        for item in items:
            found = answers.get(item.tag) if item.tag is not None else None
            if found is not None and found[0] == item.text and found[1] == item.version:
                item.dispatched = now
                item.settle(found[2])
                self.answered += 1
            else:
                rest.append(item)
        return rest

    # -- internals -----------------------------------------------------------------------
    def _keep(self, version: VersionKey, batch: Salvaged) -> None:
        if batch.outputs is None:  # it failed: its inputs run again
            return
        now = self._clock()
        for tag, text, output in zip(batch.tags, batch.inputs, batch.outputs, strict=True):
            if tag is not None:  # the newest last: `_expire` reads from the front
                self._answers.pop(tag, None)
                self._answers[tag] = (text, version, output, now)

    def _expire(self) -> None:
        answers, old = self._answers, self._clock() - KEEP_S
        while answers:
            tag, answer = next(iter(answers.items()))
            if answer[3] >= old:
                return
            del answers[tag]

    def _change(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()


__all__ = ["KEEP_S", "Salvage"]
