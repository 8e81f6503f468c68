"""The keyed path: a request with an Idempotency-Key runs once per account. The first one
leads; one that comes while it runs joins it and gets its answer, whatever that answer is;
one that comes after it gets the kept answer, if running the request decided it.

What ran is kept: a leader whose deadline passes (or whose client leaves) while every input
it still waits for is in a batch leaves them to finish, and the answer they bring is kept
when it lands, so that the retry replays it instead of running the model again. Until then
the key stays in flight: a retry meanwhile joins it. A leader with an input not yet started
withdraws them all (nothing ran, nothing is kept: the retry runs it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import anyio

from api.errors import ClientClosed, LeaderGone
from api.http import Answered, ClientWatch, Job, PendingRequest, Rendered, answer_body
from api.metrics import Metrics
from batcher import Clock, DeadlineExceeded, Item, Tier
from failover import Entry, IdempotencyStore, Join, Replay, StoredResponse

LINGER_S = 300.0
"""The longest a key stays in flight for a batch its leader left running: every way a batch
ends settles its items (answered, failed, re-run then answered or convicted, or shut down),
so this bounds only what nobody foresaw; past it the retry runs the request."""


class Serve(Protocol):
    """The door's `serve`: admit a job, its items answering `pending`, and wait."""

    def __call__(self, job: Job, client: ClientWatch | None,
                 register: Callable[[PendingRequest], None] | None,
                 pending: PendingRequest | None = None) -> Awaitable[Answered]: ...


Refuse = Callable[[BaseException, Tier], Rendered]


def is_kept(status: int) -> bool:
    """What running the request decided: its answer (2xx), or an error its own body causes
    (400, 413, 422). Refusals (401, 429, 503), timeouts (504) and 5xx say nothing about the
    request: a retry must run it, never replay them."""
    return 200 <= status < 300 or status in (400, 413, 422)


class KeptRequest(PendingRequest):
    """A keyed request's collation. Outputs that land after it ended unanswered (its
    deadline passed, its client left) are still collected; once the door lets its items run
    on (`runs_on`), `landed` is called once, when the last of them lands (`failed` tells
    whether one failed instead)."""

    __slots__ = ("_landed", "backstop", "failed", "running_on")

    def __init__(self, n: int, landed: Callable[[KeptRequest], None]) -> None:
        super().__init__(n)
        self._landed = landed
        self.running_on = False
        self.failed = False  # an input failed after the request ended: nothing to keep
        self.backstop: asyncio.TimerHandle | None = None

    def item_done(self, item: Item, result: str | BaseException) -> None:
        if not self.finished:
            super().item_done(item, result)
            return
        if self.failed or self.error is not None or self.remaining == 0:
            return  # ended by its own error, or already whole: nothing more to collect
        if isinstance(result, BaseException):
            self.failed = True
        else:
            self.outputs[item.index] = result
            self.remaining -= 1
        if self.running_on and (self.failed or self.remaining == 0):
            self._landed(self)

    def runs_on(self, items: Sequence[Item]) -> bool:
        """Asked as the request ends before its answer: whether its items are left to
        finish (True: the door must not withdraw them). Only when it ended by its deadline
        or its client leaving, and every input not yet answered is in a batch now: one
        that never started cannot be kept, and then every input is withdrawn."""
        if not (self.timed_out or self.client_left) or self.error is not None:
            return False
        if not all(item.done or item.flights > 0 for item in items):
            return False
        self.running_on = True
        if self.failed or self.remaining == 0:  # landed between its end and now
            self._landed(self)
        return True


class KeyedPath:
    def __init__(self, store: IdempotencyStore, clock: Clock, metrics: Metrics, serve: Serve,
                 refuse: Refuse) -> None:
        self._store, self._clock, self._metrics = store, clock, metrics
        self._serve, self._refuse = serve, refuse

    async def run(self, job: Job, client: ClientWatch | None,
                  register: Callable[[PendingRequest], None] | None) -> Rendered:
        """Join the request in flight, replay its kept answer, or lead it."""
        assert job.idempotency is not None
        key, digest = job.idempotency
        store, principal = self._store, job.principal
        assert principal.key is not None  # the routes refuse a key from anonymous callers
        begin = store.begin(principal.account, key, digest, self._clock.now())
        if isinstance(begin, Replay):
            self._metrics.replays.inc()
            return _replayed(begin.response)
        if isinstance(begin, Join):
            with anyio.move_on_after(job.timeout):
                stored = await begin.entry.wait()
                if stored is None:
                    raise LeaderGone("the original request ended unanswered: its client "
                                     "left, or its deadline passed and what ran failed")
                self._metrics.replays.inc()
                return _replayed(stored)
            raise DeadlineExceeded("the original request is still running")
        entry = begin.entry
        pending = KeptRequest(len(job.texts), lambda kept: self._landed(entry, job, kept))
        try:
            try:
                answered = await self._serve(job, client, register, pending)
                self._metrics.queue_waited(principal.tier.label, answered.waits)
                response = Rendered(200, answer_body(answered.outputs, job.single))
            except ClientClosed as exc:  # no answer of its own: its joiners retry, or
                # wait for what its inputs bring if they run on
                self._linger(entry, pending)
                return self._refuse(exc, principal.tier)
            except Exception as exc:
                response = self._refuse(exc, principal.tier)
                if self._linger(entry, pending):
                    return response  # what ran is kept when it lands; joiners wait for it
            # Its joiners get this answer whatever it is (refused, timed out included);
            # only what running it decided is kept for replays.
            store.complete(entry, StoredResponse(response.status, response.body,
                                                 response.headers),
                           self._clock.now(), keep=is_kept(response.status))
            return response
        finally:
            if not pending.running_on:
                store.abandon(entry, self._clock.now())  # a no-op once completed

    def _linger(self, entry: Entry, pending: KeptRequest) -> bool:
        """Whether the key stays in flight for the batch its leader left running; if so,
        it is given up after `LINGER_S` at the latest."""
        if pending.running_on and _open(entry):
            pending.backstop = asyncio.get_running_loop().call_later(
                LINGER_S, self._give_up, entry)
        return pending.running_on

    def _landed(self, entry: Entry, job: Job, pending: KeptRequest) -> None:
        """The inputs a leader left running are all back (called by the core's owner as it
        settles them: it must not raise). Their answer is kept, as the leader's own would
        have been; if one failed, nothing is kept and the joiners retry."""
        if pending.backstop is not None:
            pending.backstop.cancel()
        if not _open(entry):
            return
        now = self._clock.now()
        if pending.failed:
            self._store.abandon(entry, now)
            return
        body = answer_body(pending.outputs, job.single)
        self._store.complete(entry, StoredResponse(200, body), now, keep=True)

    def _give_up(self, entry: Entry) -> None:
        if _open(entry):
            self._store.abandon(entry, self._clock.now())


def _open(entry: Entry) -> bool:
    """Still in flight: neither completed nor abandoned."""
    return entry.response is None and not entry.gone


def _replayed(stored: StoredResponse) -> Rendered:
    return Rendered(stored.status, stored.body,
                    (*stored.headers, ("Idempotent-Replayed", "true")))


__all__ = ["KeptRequest", "KeyedPath", "Serve", "is_kept"]
