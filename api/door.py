"""The core's door: what every request needs decided in one place, and the wait for its items.

Rate limits, idempotency and admission are global decisions, so they are made where the
dispatch core runs: in the single process the routes call `Door.run` directly (the direct
way, `api.direct`, calls `submit_all` and `conclude`); in a cell (`--gateways K`) each
gateway sends its jobs over the link and the core process runs them here. A gateway does
only what needs no shared state: HTTP, JSON, keys, validation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import anyio
import orjson
from starlette.requests import ClientDisconnect

from api.auth import Principal
from api.errors import ApiError, error_body, retry_after, to_api_error
from api.limits import RateLimiter, pressure_factor
from api.metrics import Metrics
from api.requests import ClientWatch, Collation, PendingRequest
from api.service import Service
from batcher import DeadlineExceeded, Item, Tier
from failover import LEADER_GONE, Join, Lead, Replay, StoredResponse, is_storable
from gpu_pool import WorkerInfo


class Job(NamedTuple):
    """One validated request, as the core sees it. The three values that cross the
    link are named tuples: a frozen dataclass's `__init__` costs four times as much, and
    the core makes one per job."""

    principal: Principal
    texts: list[str]
    single: bool  # {"input": s} rather than {"inputs": [...]}
    timeout: float  # seconds
    idempotency: tuple[str, bytes] | None = None  # (Idempotency-Key, sha256 of the body)


class Answered(NamedTuple):
    """The outputs, in order; the gateway renders them."""

    outputs: list[str]
    waits: tuple[float, ...]  # seconds each item waited in its queue
    batch: float  # seconds from the first item's dispatch to the answer
    batch_ids: tuple[int, ...] = ()  # the batches that answered it
    attempts: int = 1  # runs of its most-run item (more than 1: a worker died under it)

    @property
    def queue(self) -> float:
        """Seconds the slowest item waited in its queue."""
        return max(self.waits)


class Rendered(NamedTuple):
    """A finished HTTP answer: a refusal, an error, or an idempotent (stored) answer."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


Outcome = Answered | Rendered


def answer_body(outputs: list[str], single: bool) -> bytes:
    rid = os.urandom(8).hex()
    if single:
        return orjson.dumps({"id": rid, "output": outputs[0]})
    return orjson.dumps({"id": rid, "outputs": outputs})


class Door:
    """Implements the routes' `CoreView` in process; the link serves it to gateways."""

    def __init__(
        self, service: Service, metrics: Metrics,
        gateways: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.rate_limiter = RateLimiter(service.tiers)
        self._gateways = gateways

    async def run(
        self, job: Job, client: ClientWatch | None = None,
        register: Callable[[PendingRequest], None] | None = None,
    ) -> Outcome:
        """Decide and wait. `client` hears the client hang up (in process); a remote caller
        passes `register` instead and calls `leave()` on the request when its client goes."""
        try:
            self._check_rate(job)  # replays and joins count against the rate too
            if job.idempotency is None:
                return await self._serve(job, client, register)
            return await self._idempotent(job, client, register)
        except Exception as exc:  # translated at the boundary, never a traceback
            return self.refusal(exc, job.principal.tier)

    def submit_all(
        self, jobs: Sequence[Job], collations: Sequence[Collation]
    ) -> list[list[Item] | Rendered]:
        """`run` without a task, for jobs without an Idempotency-Key (a keyed one may wait
        on its leader: it takes `run`), a gateway's frame or a direct call: each job's
        items, queued to answer its collation, or its refusal. The caller then waits for
        each collation to end and asks `conclude`. One reading of the clock and of each
        tier's pressure serves the whole frame of jobs: the rate limits tighten by a factor
        that moves by a few items per frame. A run of one caller's jobs takes its tokens at
        once, and the core admits a run of one tier at once; each job is still refused
        exactly as it would be alone, after the jobs before it."""
        service, limiter = self.service, self.rate_limiter
        now = service.clock.now()
        factors: dict[Tier, float] = {}
        out: list[list[Item] | Rendered] = []
        admitting: list[tuple[list[Item], float]] = []
        where: list[int] = []
        start, end = 0, len(jobs)
        while start < end:  # a run of one caller's jobs at a time
            principal = jobs[start].principal
            stop = start + 1
            while stop < end and jobs[stop].principal is principal:
                stop += 1
            tier = principal.tier
            try:
                factor = factors.get(tier)
                if factor is None:
                    factor = factors[tier] = pressure_factor(service.pressure(tier))
                passed = start + limiter.allow(principal, stop - start, now, factor)
            except Exception as exc:
                out += [self.refusal(exc, tier) for _ in range(start, stop)]
                start = stop
                continue
            for at in range(start, stop):
                job = jobs[at]
                if at >= passed:
                    try:
                        limiter.check(principal, now, factor)
                    except Exception as exc:
                        out.append(self.refusal(exc, tier))
                        continue
                items = service.new_items(job.texts, tier, now, job.timeout, collations[at])
                where.append(len(out))
                out.append(items)
                admitting.append((items, job.timeout))
            start = stop
        for at, refusal in zip(where, service.core.admit_all(admitting, now), strict=True):
            if refusal is not None:
                out[at] = self.refusal(refusal, jobs[at].principal.tier)
        return out

    def conclude(self, job: Job, items: list[Item], collation: Collation,
                 now: float) -> Outcome:
        """What a submitted job's client gets, once its collation has ended (`now`: one
        reading of the clock serves every job concluded together)."""
        self._withdraw(items, collation)
        try:
            return self._answered(job, items, collation, now)
        except Exception as exc:
            return self.refusal(exc, job.principal.tier)

    async def ready(self) -> dict[str, object]:
        service = self.service
        return {"ready": service.ready(), "workers_ready": service.pool.ready_count(),
                "draining": service.draining or service.leaving}

    async def workers(self) -> list[WorkerInfo]:
        return self.service.workers()

    async def metrics_text(self) -> bytes:
        return self.metrics.render()

    async def gateways(self) -> list[dict[str, Any]]:
        """The gateway processes in front of this core (none in a single process)."""
        return self._gateways() if self._gateways is not None else []

    def refusal(self, exc: BaseException, tier: Tier) -> Rendered:
        err = to_api_error(exc)
        if err.status in (429, 503):
            self.metrics.rejected.labels(tier.label, err.code).inc()
        return rendered(err)

    def _check_rate(self, job: Job) -> None:
        factor = pressure_factor(self.service.pressure(job.principal.tier))
        self.rate_limiter.check(job.principal, self.service.clock.now(), factor)

    def _admit(self, job: Job, collation: Collation, now: float) -> list[Item]:
        service = self.service
        items = service.new_items(job.texts, job.principal.tier, now, job.timeout, collation)
        service.core.admit(items, job.timeout, now)
        return items

    def _withdraw(self, items: list[Item], collation: Collation) -> None:
        if collation.remaining:  # not all answered: never run what is left
            for item in items:
                self.service.core.cancel(item)

    async def _serve(
        self, job: Job, client: ClientWatch | None,
        register: Callable[[PendingRequest], None] | None,
    ) -> Answered:
        pending = PendingRequest(len(job.texts))
        items = self._admit(job, pending, self.service.clock.now())
        if register is not None:
            register(pending)
        try:
            await pending.wait(job.timeout, client)
        finally:
            self._withdraw(items, pending)
        return self._answered(job, items, pending, self.service.clock.now())

    def _answered(self, job: Job, items: list[Item], collation: Collation,
                  now: float) -> Answered:
        """The finished request's answer, or the error that ended it (raised). Its queue
        waits are observed where it is rendered (in a gateway, off the core's CPU)."""
        if collation.client_left:
            raise ClientDisconnect()
        if collation.error is not None:
            raise collation.error
        if collation.timed_out:
            raise DeadlineExceeded("the request's deadline passed before it was answered")
        if len(items) == 1:  # most requests: the same figures without the folds
            item = items[0]
            return Answered(collation.outputs, (item.dispatched - item.arrived,),
                            now - item.dispatched, (item.batch,),
                            1 + item.attempts)
        waits = tuple(i.dispatched - i.arrived for i in items)
        batch = now - min(i.dispatched for i in items)
        batch_ids = tuple(sorted({i.batch for i in items}))
        return Answered(collation.outputs, waits, batch, batch_ids,
                        1 + max(i.attempts for i in items))

    async def _idempotent(
        self, job: Job, client: ClientWatch | None,
        register: Callable[[PendingRequest], None] | None,
    ) -> Rendered:
        """Run a keyed request once per account: join it in flight, or replay its answer."""
        assert job.idempotency is not None
        key, digest = job.idempotency
        store, clock, principal = self.service.idempotency, self.service.clock, job.principal
        assert principal.key is not None  # the routes refuse a key from anonymous callers
        begin = store.begin(principal.account, key, digest, clock.now())
        if isinstance(begin, Replay):
            self.metrics.replays.inc()
            return _replayed(begin.response)
        if isinstance(begin, Join):
            with anyio.move_on_after(job.timeout):
                stored = await begin.entry.wait()
                if stored is LEADER_GONE:
                    raise ApiError(503, "retry", "the original request did not finish",
                                   retry_after(1))
                self.metrics.replays.inc()
                return _replayed(stored)
            raise DeadlineExceeded("the original request is still running")
        assert isinstance(begin, Lead)
        try:
            try:
                answered = await self._serve(job, client, register)
                self.metrics.queue_waited(principal.tier.label, answered.waits)
                response = Rendered(200, answer_body(answered.outputs, job.single))
            except Exception as exc:
                response = self.refusal(exc, principal.tier)
            if is_storable(response.status):
                store.complete(begin.entry, StoredResponse(response.status, response.body),
                               clock.now())
            return response
        finally:
            # Not decided (refused, cancelled, timed out): nothing kept; joiners are told
            # to retry, and the next request with this key runs it afresh.
            store.abandon(begin.entry, clock.now())  # a no-op once completed


def rendered(err: ApiError) -> Rendered:
    """An error as the answer its client gets."""
    return Rendered(err.status, error_body(err.code, err.message), tuple(err.headers.items()))


def _replayed(stored: StoredResponse) -> Rendered:
    return Rendered(stored.status, stored.body, (("Idempotent-Replayed", "true"),))


__all__ = ["Answered", "Door", "Job", "Outcome", "Rendered", "answer_body", "rendered"]
