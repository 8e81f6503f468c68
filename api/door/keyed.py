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

from api.door.positions import STREAM_POSITION, StreamPositions
from api.errors import ClientClosed, LeaderGone
from api.http import (
    Answered,
    ClientWatch,
    Job,
    PendingRequest,
    Refusals,
    Rendered,
    answer_body,
    guarded_answer,
)
from api.kept import (
    LEASE_MARGIN_S,
    BackedStore,
    Entry,
    IdempotencyStore,
    Join,
    Replay,
    StateUnavailable,
    Stored,
    StoredResponse,
)
from api.metrics import Metrics
from batcher import Clock, DeadlineExceeded, Item, Refused, Tier

REPLAYED = ("Idempotent-Replayed", "true")  # the header of an answer another run kept
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
    (400, 413, 422: a guard's `refused` verdict on every input too). Refusals (401, 429,
    503: `guard_unavailable` too), timeouts (504) and 5xx say nothing about the request: a
    retry must run it, never replay them."""
    return 200 <= status < 300 or status in (400, 413, 422)


class KeptRequest(PendingRequest):
    """A keyed request's collation. Outputs that land after it ended unanswered (its
    deadline passed, its client left) are still collected; once the door lets its items run
    on (`runs_on`), `landed` is called once, when the last of them lands (`failed` tells
    whether one failed instead)."""

    __slots__ = ("_landed", "backstop", "failed", "model", "running_on")

    def __init__(self, n: int, landed: Callable[[KeptRequest], None]) -> None:
        super().__init__(n)
        self._landed = landed
        self.running_on = False
        self.failed = False  # an input failed after the request ended: nothing to keep
        self.backstop: asyncio.TimerHandle | None = None
        self.model = ""  # the version its items ran on

    def item_done(self, item: Item, result: str | BaseException) -> None:
        self.model = item.version or ""
        if not self.finished:
            super().item_done(item, result)
            return
        if self.failed or self.error is not None or self.remaining == 0:
            return  # ended by its own error, or already whole: nothing more to collect
        if isinstance(result, Refused):  # a verdict, kept with the outputs
            self.refuse(item, result)
            self.remaining -= 1
        elif isinstance(result, BaseException):
            self.failed = True
        else:
            if item.skipped:
                self.skip(item.skipped)
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
        if not all(item.done or item.flights > 0
                   or (item.route is not None and item.route.in_flight()) for item in items):
            return False
        self.running_on = True
        if self.failed or self.remaining == 0:  # landed between its end and now
            self._landed(self)
        return True


class _Lease:
    """A key this process claimed in the durable layer: what `store` and `release` need
    (`deadline`: its request's, on the door's clock; `budget`: its tier's)."""

    __slots__ = ("budget", "deadline", "fingerprint", "kept", "key", "scope", "tier",
                 "token")

    def __init__(self, scope: str, key: str, fingerprint: bytes, token: str, tier: Tier,
                 deadline: float, budget: float) -> None:
        self.scope, self.key, self.fingerprint, self.token = scope, key, fingerprint, token
        self.tier, self.deadline, self.budget = tier, deadline, budget
        self.kept = False  # an answer is stored under the key (the claim is gone)


class KeyedPath:
    """Given a `BackedStore` (`--state sqlite:` or `redis://`), a request that leads in
    this process also claims the key in the durable layer, and what is kept goes there
    first; with the memory store alone (the default), it never awaits the store."""

    def __init__(self, store: IdempotencyStore, clock: Clock, metrics: Metrics, serve: Serve,
                 refuse: Refuse, positions: StreamPositions | None = None) -> None:
        """`positions`: where keyed streams' parts are numbered (`api.door.positions`)."""
        self._backed = store if isinstance(store, BackedStore) else None
        self._store = store.memory if isinstance(store, BackedStore) else store
        self._clock, self._metrics = clock, metrics
        self._serve, self._refuse = serve, refuse
        self._positions = positions if positions is not None else StreamPositions()

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
        return await self._lead(begin.entry, job, client, register)

    async def _lead(self, entry: Entry, job: Job, client: ClientWatch | None,
                    register: Callable[[PendingRequest], None] | None) -> Rendered:
        store, tier = self._store, job.principal.tier
        lease: _Lease | None = None
        pending: KeptRequest | None = None
        try:
            if self._backed is not None:
                try:
                    lease, job, kept = await self._claim(self._backed, job)
                except Exception as exc:  # refused: its joiners get the same answer
                    response = self._placed(job, self._refused(exc, tier))
                    store.complete(entry, _stored(response), self._clock.now(), keep=False)
                    return response
                if kept is not None:  # answered before: by an earlier process, or a cell
                    store.complete(entry, kept, self._clock.now(), keep=True)
                    self._metrics.replays.inc()
                    return _replayed(kept)
            pending = KeptRequest(len(job.texts),
                                  lambda ran: self._landed(entry, job, ran, lease))
            try:
                answered = await self._serve(job, client, register, pending)
                # What ran goes with the answer, to be counted and timed where it is sent.
                status, body, headers = _answer(answered.outputs, job.single,
                                                answered.refused, answered.skipped,
                                                answered.model)
                response = self._placed(job, Rendered(
                    status, body, headers, answered.waits, answered.batch, answered.model))
            except ClientClosed as exc:  # no answer of its own: its joiners retry, or
                # wait for what its inputs bring if they run on
                self._linger(entry, pending, lease)
                return self._refuse(exc, tier)
            except Exception as exc:
                response = self._placed(job, self._refuse(exc, tier))
                if self._linger(entry, pending, lease):
                    return response  # what ran is kept when it lands; joiners wait for it
            # Its joiners get this answer whatever it is (refused, timed out included);
            # only what running it decided is kept for replays.
            keep = is_kept(response.status)
            if keep and lease is not None:
                response, keep = await self._keep(lease, response)
            store.complete(entry, _stored(response), self._clock.now(), keep=keep)
            return response
        finally:
            if pending is None or not pending.running_on:
                store.abandon(entry, self._clock.now())  # a no-op once completed
                if lease is not None and not lease.kept:
                    self._release_soon(lease)

    async def _claim(self, backed: BackedStore, job: Job
                     ) -> tuple[_Lease | None, Job, StoredResponse | None]:
        """The durable layer's word on a key this process leads: run it (a lease, and
        the job with the time its wait took off), or replay what is kept."""
        assert job.idempotency is not None
        key, digest = job.idempotency
        scope, started = job.principal.account, self._clock.now()
        tier = job.principal.tier
        budget = backed.budgets.get(tier, 0.0)
        got = await backed.claim(scope, key, digest, job.timeout, budget)
        if isinstance(got, Stored):
            return None, job, got.response
        waited = self._clock.now() - started
        if waited > 0:
            job = job._replace(timeout=job.timeout - waited)
        return _Lease(scope, key, digest, got.token, tier, started + job.timeout + waited,
                      budget), job, None

    async def _keep(self, lease: _Lease, response: Rendered) -> tuple[Rendered, bool]:
        """Store the leader's answer; (what its client gets, whether it is kept). The
        first stored wins: another's answer is replayed. An answer the store cannot keep
        is not given out (a retry could not replay it): 503, not kept."""
        assert self._backed is not None
        try:
            winner = await self._backed.keep(  # the time left, at least the tier's budget
                lease.scope, lease.key, lease.fingerprint, _stored(response),
                within=max(lease.deadline - self._clock.now(), lease.budget))
        except Exception as exc:
            return self._refused(exc, lease.tier), False
        lease.kept = True
        if winner.body == response.body:
            return response, True
        self._metrics.replays.inc()
        return _replayed(winner), True

    def _placed(self, job: Job, response: Rendered) -> Rendered:
        """`response` numbered in its stream, if `job` is a part of a keyed stream."""
        if not job.stream:
            return response
        return response._replace(headers=self._place(job, response.headers))

    def _place(self, job: Job, headers: tuple[tuple[str, str], ...]
               ) -> tuple[tuple[str, str], ...]:
        if not job.stream:
            return headers
        at = self._positions.take(job.principal.account, job.stream, len(job.texts))
        return (*headers, (STREAM_POSITION, str(at)))

    def _refused(self, exc: BaseException, tier: Tier) -> Rendered:
        if isinstance(exc, StateUnavailable):
            self._metrics.state_errors.labels("kept").inc()
        return self._refuse(exc, tier)

    def _linger(self, entry: Entry, pending: KeptRequest, lease: _Lease | None) -> bool:
        """Whether the key stays in flight for the batch its leader left running; if so,
        it is given up after `LINGER_S` at the latest (and its claim held as long)."""
        if pending.running_on and _open(entry):
            pending.backstop = asyncio.get_running_loop().call_later(
                LINGER_S, self._give_up, entry, lease)
            if lease is not None:
                self._soon(lambda: self._durably(
                    self._backed_store().durable.extend(lease.scope, lease.key, lease.token,
                                                        LINGER_S + LEASE_MARGIN_S)))
        return pending.running_on

    def _landed(self, entry: Entry, job: Job, pending: KeptRequest, lease: _Lease | None
                ) -> None:
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
            if lease is not None:
                self._release_soon(lease)
            return
        status, body, headers = _answer(
            pending.outputs, job.single, tuple(sorted(pending.refused or ())),
            tuple(pending.skipped or ()), pending.model)
        response = StoredResponse(status, body, self._place(job, headers))
        if lease is None:
            self._store.complete(entry, response, now, keep=True)
        elif not self._soon(lambda: self._keep_landed(entry, lease, response)):
            self._store.abandon(entry, now)  # the store is closing: nothing is kept

    async def _keep_landed(self, entry: Entry, lease: _Lease, response: StoredResponse
                           ) -> None:
        try:
            winner = await self._backed_store().keep(lease.scope, lease.key,
                                                     lease.fingerprint, response)
        except Exception as exc:
            if isinstance(exc, StateUnavailable):
                self._metrics.state_errors.labels("kept").inc()
            if _open(entry):
                self._store.abandon(entry, self._clock.now())
            return
        lease.kept = True
        if _open(entry):
            self._store.complete(entry, winner, self._clock.now(), keep=True)

    def _give_up(self, entry: Entry, lease: _Lease | None) -> None:
        if _open(entry):
            self._store.abandon(entry, self._clock.now())
            if lease is not None:
                self._release_soon(lease)

    def _release_soon(self, lease: _Lease) -> None:
        """Let the next request run the key at once, not after the claim's lease."""
        self._soon(lambda: self._durably(self._backed_store().durable.release(
            lease.scope, lease.key, lease.token)))

    def _soon(self, work: Callable[[], Awaitable[None]]) -> bool:
        return self._backed_store().soon(work)

    async def _durably(self, call: Awaitable[None]) -> None:
        """A write nobody waits for; a store that is down only counts (the claim's
        lease ends it)."""
        try:
            await call
        except StateUnavailable:
            self._metrics.state_errors.labels("kept").inc()

    def _backed_store(self) -> BackedStore:
        assert self._backed is not None
        return self._backed


def _answer(outputs: list[str | None], single: bool, refused: Refusals,
            skipped: tuple[str, ...], model: str
            ) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
    """The answer a keyed request's run gave, as it is kept: its guards' verdicts (a 422
    when every input was refused) and the guards that failed open go with it, so that a
    replay says the same."""
    if refused or skipped:
        return guarded_answer(outputs, single, refused, skipped, model=model)
    return 200, answer_body(outputs, single, model=model), ()


def _open(entry: Entry) -> bool:
    """Still in flight: neither completed nor abandoned."""
    return entry.response is None and not entry.gone


def _stored(response: Rendered) -> StoredResponse:
    return StoredResponse(response.status, response.body, response.headers)


def _replayed(stored: StoredResponse) -> Rendered:
    return Rendered(stored.status, stored.body, (*stored.headers, REPLAYED))


__all__ = ["REPLAYED", "KeptRequest", "KeyedPath", "Serve", "is_kept"]
