"""The keyed path: a request with an Idempotency-Key runs once per account. The first one
leads; one that comes while it runs joins it and gets its answer, whatever that answer is;
one that comes after it gets the kept answer, if running the request decided it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from api.errors import ClientClosed, LeaderGone
from api.http import Answered, ClientWatch, Job, PendingRequest, Rendered, answer_body
from api.metrics import Metrics
from batcher import Clock, DeadlineExceeded, Tier
from failover import IdempotencyStore, Join, Replay, StoredResponse

Serve = Callable[[Job, ClientWatch | None, Callable[[PendingRequest], None] | None],
                 Awaitable[Answered]]
Refuse = Callable[[BaseException, Tier], Rendered]


def is_kept(status: int) -> bool:
    """What running the request decided: its answer (2xx), or an error its own body causes
    (400, 413, 422). Refusals (401, 429, 503), timeouts (504) and 5xx say nothing about the
    request: a retry must run it, never replay them."""
    return 200 <= status < 300 or status in (400, 413, 422)


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
                    raise LeaderGone("the original request ended unanswered: its client left")
                self._metrics.replays.inc()
                return _replayed(stored)
            raise DeadlineExceeded("the original request is still running")
        try:
            try:
                answered = await self._serve(job, client, register)
                self._metrics.queue_waited(principal.tier.label, answered.waits)
                response = Rendered(200, answer_body(answered.outputs, job.single))
            except ClientClosed as exc:  # no answer of its own: its joiners retry
                return self._refuse(exc, principal.tier)
            except Exception as exc:
                response = self._refuse(exc, principal.tier)
            # Its joiners get this answer whatever it is (refused, timed out included);
            # only what running it decided is kept for replays.
            store.complete(begin.entry,
                           StoredResponse(response.status, response.body, response.headers),
                           self._clock.now(), keep=is_kept(response.status))
            return response
        finally:
            store.abandon(begin.entry, self._clock.now())  # a no-op once completed


def _replayed(stored: StoredResponse) -> Rendered:
    return Rendered(stored.status, stored.body,
                    (*stored.headers, ("Idempotent-Replayed", "true")))


__all__ = ["KeyedPath", "is_kept"]
