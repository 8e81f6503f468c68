"""The memory store in front of a durable layer: what `--state sqlite:PATH` and
`--state redis://` give the door.

The memory store answers what it can alone, at its own speed: a request joins the one in
flight in this process, or replays an answer this process holds. Only a request that leads
here asks the durable layer (`claim`), which says whether it runs, replays an answer kept
by an earlier process or another cell, or waits for the one running elsewhere (polled
within the request's deadline). Its answer is then kept there first (`keep`: the first
stored wins), and only the winner is kept in memory and answered.

While the durable layer fails (a call raised StateUnavailable, or its `check`, asked every
`CHECK_S` between calls, did, or it could not be opened: it is tried again as often),
`failing` says why, for /readyz: the log says so once, and once more when it answers again.

Writes that a synchronous callback asks for (an answer that lands after its request ended,
a claim given up) run in this store's own task group (`soon`), which `run` owns and
`drain` waits for.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus

from api.kept.errors import StateUnavailable
from api.kept.idempotency import (
    Begin,
    Entry,
    IdempotencyStatistics,
    MemoryIdempotencyStore,
    StoredResponse,
)
from api.kept.seam import Busy, Claimed, KeptState, Stored
from batcher import Clock, DeadlineExceeded, Tier

log = logging.getLogger("batchgate.state")

LEASE_MARGIN_S = 5.0
"""A claim outlives its request's deadline by this much: the leader's answer is stored
after the deadline that bounds its run."""
BUSY_POLL_S = 0.025  # how often a request whose key runs elsewhere asks again
LEAST_CALL_S = 0.05  # the least time a claim is given, however late its request
CHECK_S = 1.0  # how often the durable layer is checked between calls
T = TypeVar("T")


class BackedStore:
    """`IdempotencyStore` (the memory store's calls) plus the durable layer's, bounded by
    the request's time; `budgets`: each tier's (seconds), which a call leaves its request
    for the run. Call it from the loop."""

    def __init__(self, memory: MemoryIdempotencyStore, durable: KeptState, clock: Clock,
                 poll: float = BUSY_POLL_S, check: float = CHECK_S,
                 budgets: Mapping[Tier, float] | None = None) -> None:
        self.memory, self.durable = memory, durable
        self.budgets: Mapping[Tier, float] = budgets or {}
        self._clock, self._poll, self._check = clock, poll, check
        self.failing: str | None = None  # why the durable layer last failed; None: it answers
        self._tg: TaskGroup | None = None
        self._writing = 0
        self._written: anyio.Event | None = None

    # -- the memory store, in front ----------------------------------------------------------
    def begin(self, scope: str, key: str, fingerprint: bytes, now: float) -> Begin:
        return self.memory.begin(scope, key, fingerprint, now)

    def complete(self, entry: Entry, response: StoredResponse, now: float, keep: bool
                 ) -> None:
        self.memory.complete(entry, response, now, keep)

    def abandon(self, entry: Entry, now: float) -> None:
        self.memory.abandon(entry, now)

    def statistics(self) -> IdempotencyStatistics:
        return self.memory.statistics()

    # -- the durable layer, behind -----------------------------------------------------------
    async def claim(self, scope: str, key: str, fingerprint: bytes, within: float,
                    budget: float = 0.0) -> Claimed | Stored:
        """Run it (`Claimed`) or replay (`Stored`); while another process runs it, ask
        again every `poll` seconds for `within` seconds at most (the request's time left).
        Each call may take the time left but `budget` (the run's: the tier's), so a slow
        store delays the request rather than refusing it while its deadline allows.

        Raises DeadlineExceeded past `within`, IdempotencyMismatch, StateUnavailable."""
        deadline = self._clock.now() + within
        while True:
            left = deadline - self._clock.now()
            got = await self._watched(self.durable.claim(
                scope, key, fingerprint, left + LEASE_MARGIN_S,
                within=max(left - budget, LEAST_CALL_S)))
            if not isinstance(got, Busy):
                return got
            if deadline - self._clock.now() <= self._poll:
                raise DeadlineExceeded("the original request is still running elsewhere")
            await anyio.sleep(self._poll)

    async def keep(self, scope: str, key: str, fingerprint: bytes, response: StoredResponse,
                   within: float | None = None) -> StoredResponse:
        """The answer kept for the key: `response` if it is the first stored, else the
        first's; `within`: how long the call may take (None: the store's own bound).
        Raises IdempotencyMismatch, StateUnavailable."""
        return await self._watched(
            self.durable.store(scope, key, fingerprint, response, within=within))

    def soon(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run `work` in this store's task group; False if the store is not running (it
        has not started, or it is draining). Safe in a synchronous loop callback."""
        if self._tg is None:
            return False
        self._writing += 1
        self._tg.start_soon(self._guarded, work)
        return True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Open the durable layer, serve `soon` until cancelled, then close it. A layer
        that cannot be opened (a file broken since the server's first start, found by a
        core that starts again) is failing, as one that breaks while serving is: requests
        without a key are served, and it is opened again every `check` seconds. Raises
        what else `open` raises (e.g. StateLocked)."""
        opened = await self._open()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                while True:
                    await anyio.sleep(self._check)
                    if not opened:
                        opened = await self._open()
                        continue
                    with contextlib.suppress(StateUnavailable):  # `failing` says it
                        await self._watched(self.durable.check())
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self.durable.close()

    async def drain(self, within: float = 5.0) -> None:
        """Take no more writes, wait `within` seconds at most for those under way, close."""
        tg, self._tg = self._tg, None
        with anyio.move_on_after(within):
            while self._writing:
                self._written = anyio.Event()
                await self._written.wait()
        if tg is not None:
            tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self.durable.close()

    async def _open(self) -> bool:
        """Whether the durable layer opened; if not, `failing` says why."""
        try:
            await self._watched(self.durable.open())
        except StateUnavailable:
            return False
        return True

    async def _watched(self, call: Awaitable[T]) -> T:
        """`call`'s result; whether it failed with StateUnavailable is `failing`."""
        try:
            got = await call
        except StateUnavailable as exc:
            if self.failing is None:
                log.error("the state store fails: %s; keyed requests are refused "
                          "(503 state_unavailable) until it answers", exc)
            self.failing = str(exc)
            raise
        if self.failing is not None:
            log.warning("the state store answers again")
            self.failing = None
        return got

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception:  # a write nobody waits for: its loss is logged, not raised
            log.exception("a deferred write to the state store failed")
        finally:
            self._writing -= 1
            if self._written is not None:
                self._written.set()


__all__ = ["BUSY_POLL_S", "CHECK_S", "LEASE_MARGIN_S", "LEAST_CALL_S", "BackedStore"]
