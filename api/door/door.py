"""The core's door: rate limits and admission for every request, and the wait for its items.

Rate limits, idempotency and admission are global decisions, so they are made where the
dispatch core runs: in a single process the routes call `Door.run` (the direct way,
`api.door.local`, calls `submit_all` and `conclude`); in a cell (`--gateways K`) each gateway
sends its jobs over the link and the core process runs them here (`api.cell.link`). A
gateway does only what needs no shared state: HTTP, JSON, keys, validation.

With rate limits shared between cells (`shared`, `--state redis://`) a check is a round
trip, so no job takes the synchronous `submit_all`: keyless jobs take `submit_shared`, which
checks a frame's jobs in one call and then admits them as `submit_all` would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from api.door.keyed import KeptRequest, KeyedPath
from api.door.limits import RateLimiter, pressure_factor
from api.door.shared_limits import Check, SharedLimits
from api.errors import RETRIED, ClientClosed, to_api_error
from api.http import (
    Answered,
    ClientWatch,
    Collation,
    Job,
    Outcome,
    PendingRequest,
    Rendered,
    rendered,
)
from api.kept import IdempotencyStore
from api.metrics import Metrics
from batcher import BatchgateError, Clock, DeadlineExceeded, Item, ItemId, ItemSink, Tier


class Core(Protocol):
    """What the door needs of the core's owner (`failover.CoreOwner`)."""

    def admit(self, items: list[Item], deadline_in: float, now: float) -> None: ...

    def admit_all(self, requests: Sequence[tuple[list[Item], float]], now: float
                  ) -> list[BatchgateError | None]: ...

    def cancel(self, item: Item) -> None: ...

    def resolve(self, model: str | None, sticky: str | None) -> str:
        """The version a request naming `model` runs on (raises UnknownModel)."""


class Door:
    """Implements the routes' `run` in process; the link serves it to gateways."""

    def __init__(
        self, core: Core, clock: Clock, limiter: RateLimiter, store: IdempotencyStore,
        pressure: Callable[[Tier], float], metrics: Metrics,
        shared: SharedLimits | None = None,
    ) -> None:
        self.core, self.clock, self.limiter = core, clock, limiter
        self.shared = shared  # if set, it decides every rate check (`limiter` its fallback)
        self.pressure = pressure  # a tier's expected wait over its budget
        self.metrics = metrics
        self._ids = itertools.count(1)
        self._keyed = KeyedPath(store, clock, metrics, self.serve, self.refusal)

    async def run(
        self, job: Job, client: ClientWatch | None = None,
        register: Callable[[PendingRequest], None] | None = None,
    ) -> Outcome:
        """Decide and wait. `client` hears the client hang up (in process); a remote caller
        passes `register` instead and calls `leave()` on the request when its client goes."""
        try:  # replays and joins count against the rate too
            if self.shared is None:
                self._check_rate(job)
            else:
                await self.shared.check(job.principal,
                                        pressure_factor(self.pressure(job.principal.tier)))
            if job.idempotency is None:
                return await self.serve(job, client, register)
            return await self._keyed.run(job, client, register)
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
        limiter, now, resolve = self.limiter, self.clock.now(), self.core.resolve
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
                    factor = factors[tier] = pressure_factor(self.pressure(tier))
                passed = start + limiter.allow(principal, stop - start, now, factor)
            except Exception as exc:
                out += [self.refusal(exc, tier) for _ in range(start, stop)]
                start = stop
                continue
            for at in range(start, stop):
                job = jobs[at]
                try:
                    if at >= passed:
                        limiter.check(principal, now, factor)
                    version = resolve(job.model, job.sticky)
                except Exception as exc:
                    out.append(self.refusal(exc, tier))
                    continue
                items = self.new_items(job.texts, tier, now, job.timeout, collations[at],
                                       principal.account, version)
                where.append(len(out))
                out.append(items)
                admitting.append((items, job.timeout))
            start = stop
        for at, refusal in zip(where, self.core.admit_all(admitting, now), strict=True):
            if refusal is not None:
                out[at] = self.refusal(refusal, jobs[at].principal.tier)
        return out

    async def submit_shared(
        self, jobs: Sequence[Job], collations: Sequence[Collation]
    ) -> list[list[Item] | Rendered]:
        """`submit_all` with the shared rate limits: the jobs' checks in one round trip,
        then those that passed are admitted. A job's deadline stays where it was: the
        time the check took comes off its timeout."""
        shared = self.shared
        assert shared is not None, "submit_shared needs shared limits"
        started = self.clock.now()
        try:
            factors = {tier: pressure_factor(self.pressure(tier)) for tier in Tier}
            checks: list[Check] = [(job.principal, factors[job.principal.tier])
                                   for job in jobs]
            refusals: Sequence[BaseException | None] = await shared.check_all(checks)
        except Exception as exc:  # answered, never lost: to_api_error logs what it is
            refusals = [exc] * len(jobs)
        now = self.clock.now()
        late = now - started
        out: list[list[Item] | Rendered] = []
        admitting: list[tuple[list[Item], float]] = []
        where: list[int] = []
        for at, (job, refusal) in enumerate(zip(jobs, refusals, strict=True)):
            tier, timeout = job.principal.tier, job.timeout - late
            if refusal is None and timeout <= 0:
                refusal = DeadlineExceeded("the request's deadline passed before it was "
                                           "admitted")
            version = ""
            if refusal is None:
                try:
                    version = self.core.resolve(job.model, job.sticky)
                except Exception as exc:
                    refusal = exc
            if refusal is not None:
                out.append(self.refusal(refusal, tier))
                continue
            items = self.new_items(job.texts, tier, now, timeout, collations[at],
                                   job.principal.account, version)
            where.append(at)
            out.append(items)
            admitting.append((items, timeout))
        for at, admitted in zip(where, self.core.admit_all(admitting, now), strict=True):
            if admitted is not None:
                out[at] = self.refusal(admitted, jobs[at].principal.tier)
        return out

    async def aclose(self) -> None:
        """Let go of the shared limits' connections (the server is draining)."""
        if self.shared is not None:
            await self.shared.aclose()

    def conclude(self, job: Job, items: list[Item], collation: Collation,
                 now: float) -> Outcome:
        """What a submitted job's client gets, once its collation has ended (`now`: one
        reading of the clock serves every job concluded together)."""
        self._withdraw(items, collation)
        try:
            return self._answered(job, items, collation, now)
        except Exception as exc:
            return self.refusal(exc, job.principal.tier)

    def refusal(self, exc: BaseException, tier: Tier) -> Rendered:
        err = to_api_error(exc)
        if err.status in RETRIED:
            self.metrics.rejected.labels(tier.label, err.code).inc()
        return rendered(err)

    def new_items(
        self, texts: Sequence[str], tier: Tier, now: float, timeout: float, sink: ItemSink,
        caller: str | None = None, version: str = "",
    ) -> list[Item]:
        """`caller`: the account charged if one of these inputs keeps killing workers;
        `version`: the model version they run on."""
        deadline = now + timeout
        ids = self._ids
        if len(texts) == 1:  # most requests
            return [Item(cast(ItemId, next(ids)), texts[0], tier, now, deadline, sink,
                         caller=caller, version=version)]
        return [
            Item(cast(ItemId, next(ids)), text, tier, now, deadline, sink, index,
                 caller=caller, version=version)
            for index, text in enumerate(texts)
        ]

    async def serve(
        self, job: Job, client: ClientWatch | None,
        register: Callable[[PendingRequest], None] | None,
        pending: PendingRequest | None = None,
    ) -> Answered:
        """Admit a job and wait for its answer (raises what ended it otherwise). `pending`:
        the collation its items answer, if the caller brings one (the keyed path's, which
        may keep what runs on after the request ended: `KeptRequest.runs_on`)."""
        if pending is None:
            pending = PendingRequest(len(job.texts))
        now = self.clock.now()
        version = self.core.resolve(job.model, job.sticky)
        items = self.new_items(job.texts, job.principal.tier, now, job.timeout, pending,
                               job.principal.account, version)
        self.core.admit(items, job.timeout, now)
        if register is not None:
            register(pending)
        try:
            await pending.wait(job.timeout, client)
        finally:
            if not (isinstance(pending, KeptRequest) and pending.runs_on(items)):
                self._withdraw(items, pending)
        return self._answered(job, items, pending, self.clock.now())

    def _check_rate(self, job: Job) -> None:
        factor = pressure_factor(self.pressure(job.principal.tier))
        self.limiter.check(job.principal, self.clock.now(), factor)

    def _withdraw(self, items: list[Item], collation: Collation) -> None:
        if collation.remaining:  # not all answered: never run what is left
            for item in items:
                self.core.cancel(item)

    def _answered(self, job: Job, items: list[Item], collation: Collation,
                  now: float) -> Answered:
        """The finished request's answer, or the error that ended it (raised). Its queue
        waits are observed where it is rendered (in a gateway, off the core's CPU)."""
        if collation.client_left:
            raise ClientClosed("the client closed the connection")
        if collation.error is not None:
            raise collation.error
        if collation.timed_out:
            raise DeadlineExceeded("the request's deadline passed before it was answered")
        if len(items) == 1:  # most requests: the same figures without the folds
            item = items[0]
            return Answered(collation.outputs, (item.dispatched - item.arrived,),
                            now - item.dispatched, (item.batch,),
                            1 + item.attempts, item.version)
        waits = tuple(i.dispatched - i.arrived for i in items)
        batch = now - min(i.dispatched for i in items)
        batch_ids = tuple(sorted({i.batch for i in items}))
        return Answered(collation.outputs, waits, batch, batch_ids,
                        1 + max(i.attempts for i in items), items[0].version)


__all__ = ["Core", "Door"]
