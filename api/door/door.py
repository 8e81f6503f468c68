"""The core's door: rate limits and admission for every request, and the wait for its items.

Rate limits, idempotency and admission are global decisions, so they are made where the
dispatch core runs: in a single process the direct way (`api.door.local`) and the routes
(`Door.run`) come here; in a cell (`--gateways K`) each gateway sends its jobs over the
link and the core process runs them here (`api.cell.link`); gateways do HTTP, JSON, keys.

Requests come in a frame at a time (a gateway's frame, or a request alone: a frame of one)
and take one path: the frame's checks go to the rate step (`RateStep`: this cell's own
buckets, which decide at once, or the buckets cells share in Redis, a round trip), then the
jobs that passed are admitted together (`Door.admit`). A keyed job passes the rate step in
`run` before its key is looked at (replays and joins count against the rate too), and is
admitted once it leads.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar, cast

from api.config import Principal
from api.door.keyed import REPLAYED, KeptRequest, KeyedPath
from api.door.limits import Check, Checked, RateStep, pressure_factor
from api.door.positions import PartsSkipped, Promised
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
from batcher import (
    BatchgateError,
    Clock,
    DeadlineExceeded,
    Item,
    ItemId,
    ItemSink,
    Tier,
    VersionKey,
)
from batcher.tracing import ANSWERED, RequestTrace, Tracing, error_code, parse_traceparent
from gpu_pool import Salvage

C = TypeVar("C", bound=Collation)
C_contra = TypeVar("C_contra", bound=Collation, contravariant=True)
R = TypeVar("R")  # what a refused job gets: its rendered answer, or its error
_PASSED: tuple[None] = (None,)  # the rate step's verdict on a job already checked


class Core(Protocol):
    """What the door needs of the core's owner (`failover.CoreOwner`)."""

    def admit_all(self, requests: Sequence[tuple[list[Item], float]], now: float
                  ) -> list[BatchgateError | None]: ...

    def cancel(self, item: Item) -> None: ...
    def after_turns(self, callback: Callable[[], None]) -> Callable[[], None]: ...

    def judge(self, version: VersionKey | None, tier: Tier, items: int, chars: int,
              deadline_in: float) -> int:
        """A streamed request judged whole (raises its refusal); its version's workers."""

    def resolve(self, model: str | None, sticky: str | None) -> VersionKey | None:
        """The version a request naming `model` runs on (None: a core of one version's
        own; raises UnknownModel)."""


class Admitted(Protocol[C_contra]):
    """Who takes a submitted frame's outcome (the direct way's route, a gateway's link)."""

    def admitted(self, collations: Sequence[C_contra],
                 results: Sequence[list[Item] | Rendered], late: float) -> None:
        """Each job's items, queued to answer its collation, or its refusal; `late`: the
        seconds its rate check took, which came off each job's timeout. A job whose
        collation ended meanwhile (its client left) was not admitted: it needs nothing."""


class Door:
    """Implements the routes' `run` in process; the link serves it to gateways. `rates`:
    the rate step every frame passes (its `run` goes in the host's task group)."""

    def __init__(
        self, core: Core, clock: Clock, rates: RateStep, store: IdempotencyStore,
        pressure: Callable[[Tier], float], metrics: Metrics, salvage: Salvage | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """`salvage`: what a dead core's workers ran for keyed requests (a cell's core);
        `tracing`: where a traced job's spans go (None: off)."""
        self.core, self.clock, self.rates = core, clock, rates
        self.tracing = tracing
        self.salvage = salvage if salvage is not None else Salvage()
        self.pressure = pressure  # a tier's expected wait over its budget
        self.metrics = metrics
        self._ids = itertools.count(1)
        self._keyed = KeyedPath(store, clock, metrics, self.serve, self.refusal)
        self.promised = Promised()  # what the streams running now have yet to send

    async def run(
        self, job: Job, client: ClientWatch | None = None,
        register: Callable[[PendingRequest], None] | None = None,
    ) -> Outcome:
        """Decide and wait. `client` hears the client hang up (in process); a remote caller
        passes `register` instead and calls `leave()` on the request when its client goes."""
        try:  # replays and joins count against the rate too (a stream's parts: its own)
            if job.stream is None:
                await self.rate_passed(job.principal)
            if job.idempotency is None:
                return await self.serve(job, client, register)
            if job.trace is None or self.tracing is None:
                return await self._keyed.run(job, client, register)
            return await self._kept(job, job.trace, self.tracing, client, register)
        except Exception as exc:  # translated at the boundary, never a traceback
            return self.refusal(exc, job.principal.tier)

    async def rate_passed(self, principal: Principal) -> None:
        """One request of `principal` through the rate step; raises its refusal."""
        waiting = _Verdict(asyncio.get_running_loop().create_future())
        self.rates.pass_frame([(principal, pressure_factor(self.pressure(principal.tier)))],
                              self.clock.now(), waiting)
        if (refusal := (await waiting.future)[0]) is not None:
            raise refusal

    async def _kept(self, job: Job, trace: str, tracing: Tracing, client: ClientWatch | None,
                    register: Callable[[PendingRequest], None] | None) -> Rendered:
        """A traced keyed request: one answered with what another run kept (a replay, or
        a join of the run in flight) shows as a "kept answer" span; one that leads runs,
        and its batches show."""
        began = self.clock.now()
        answer = await self._keyed.run(job, client, register)
        if REPLAYED in answer.headers:
            tracing.emit("kept answer", trace, began, self.clock.now(),
                         {"http.response.status_code": answer.status})
        return answer

    def submit(self, jobs: Sequence[Job], collations: Sequence[C], to: Admitted[C]) -> None:
        """The way in for a frame of jobs without an Idempotency-Key (a keyed one may wait
        on its leader: it takes `run`): a gateway's frame, or a direct call alone. The
        frame passes the rate step, then `admit`; `to.admitted` takes the outcome, within
        this call when the step decides at once. Each job is refused exactly as it would
        be alone, after the jobs before it. The caller then waits for each collation to
        end and asks `conclude`."""
        now = self.clock.now()
        frame: Checked = _Frame(self, jobs, collations, to, now)
        rated = jobs
        if any(job.stream is not None for job in jobs):  # a stream's parts passed already
            frame = PartsSkipped(frame, [job.stream is None for job in jobs])
            if not (rated := [job for job in jobs if job.stream is None]):
                frame.checked([])
                return
        try:
            checks = self.checks(rated)
        except Exception as exc:  # answered, never lost: the refusal logs what it is
            frame.checked([exc] * len(rated))
            return
        self.rates.pass_frame(checks, now, frame)

    def checks(self, jobs: Sequence[Job]) -> list[Check]:
        """Each job's caller and its tier's pressure factor: one reading of each tier's
        pressure serves a frame (the factor moves by a few items per frame)."""
        if len(jobs) == 1:  # most frames: a direct call
            principal = jobs[0].principal
            return [(principal, pressure_factor(self.pressure(principal.tier)))]
        factors: dict[Tier, float] = {}
        out: list[Check] = []
        for job in jobs:
            principal = job.principal
            factor = factors.get(principal.tier)
            if factor is None:
                factor = factors[principal.tier] = pressure_factor(self.pressure(principal.tier))
            out.append((principal, factor))
        return out

    def admit(self, jobs: Sequence[Job], collations: Sequence[Collation],
              refusals: Sequence[BaseException | None], now: float, late: float,
              refuse: Callable[[BaseException, Tier], R]) -> list[list[Item] | R]:
        """Admit a frame whose rate checks are done (`refusals`: the step's verdicts): each
        job that passed gets its version and its items, queued to answer its collation,
        and the core admits the frame's jobs together; each other job gets `refuse` of its
        error. The `late` seconds since the frame came come off each job's timeout; a job
        whose collation ended meanwhile (its client left) is not admitted."""
        resolve = self.core.resolve
        out: list[list[Item] | R] = []
        admitting: list[tuple[list[Item], float]] = []
        where: list[int] = []
        for at, (job, refusal) in enumerate(zip(jobs, refusals, strict=True)):
            collation, timeout = collations[at], job.timeout - late
            if refusal is None:
                try:
                    if collation.finished:
                        raise ClientClosed("the client closed the connection")
                    if timeout <= 0:
                        raise DeadlineExceeded("the request's deadline passed before it "
                                               "was admitted")
                    version = resolve(job.model, job.sticky)
                except Exception as exc:
                    refusal = exc
            if refusal is not None:
                out.append(refuse(refusal, job.principal.tier))
                continue
            principal, keyed = job.principal, job.idempotency
            items = self.new_items(job.texts, principal.tier, now, timeout, collation,
                                   principal.account, version,
                                   None if keyed is None else (principal.account or "", keyed[0]))
            out.append(items)
            if job.stream is not None:  # judged whole as its stream began
                self.promised.sent(job.stream, items)
            if job.trace is not None and self.tracing is not None:
                _traced(job.trace, items, now, late)
            if keyed is not None and self.salvage:  # a dead core's worker may have run them
                rest = self.salvage.settle(items, now)
                if not rest:
                    continue
                items = rest
            where.append(at)
            admitting.append((items, timeout))
        if admitting:
            for (items, _), at, refused in zip(admitting, where,
                                               self.core.admit_all(admitting, now), strict=True):
                if refused is not None:
                    out[at] = refuse(refused, jobs[at].principal.tier)
                    if items[0].trace is not None and self.tracing is not None:
                        self.tracing.refused(items[0].trace, error_code(refused))
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

    def refusal(self, exc: BaseException, tier: Tier) -> Rendered:
        err = to_api_error(exc)
        if err.status in RETRIED:
            self.metrics.rejected.labels(tier.label, err.code).inc()
        return rendered(err)

    def new_items(
        self, texts: Sequence[str], tier: Tier, now: float, timeout: float, sink: ItemSink,
        caller: str | None = None, version: VersionKey | None = None,
        keyed: tuple[str, str] | None = None,
    ) -> list[Item]:
        """`caller`: the account charged if one of these inputs keeps killing workers;
        `version`: the model version they run on; `keyed`: the account and the
        Idempotency-Key that tag them (`batcher.Tag`)."""
        deadline = now + timeout
        ids = self._ids
        if keyed is not None:
            account, key = keyed
            return [Item(cast(ItemId, next(ids)), text, tier, now, deadline, sink, index,
                         caller=caller, version=version, tag=(account, key, index))
                    for index, text in enumerate(texts)]
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
        """Admit a job whose rate passed, a frame of one, and wait for its answer (raises
        what ended it otherwise). `pending`: the collation its items answer, if the caller
        brings one (the keyed path's, which may keep what runs on after the request ended:
        `KeptRequest.runs_on`)."""
        if pending is None:
            pending = PendingRequest(len(job.texts))
        late = 0.0
        if job.idempotency is not None and self.salvage:  # a dead core's batch may bring it
            began = self.clock.now()
            await self.salvage.settled(job.principal.account or "", job.idempotency[0],
                                       job.timeout)
            late = self.clock.now() - began
        admitted = self.admit((job,), (pending,), _PASSED, self.clock.now(), late, _as_is)[0]
        if not isinstance(admitted, list):
            raise admitted
        if register is not None:
            register(pending)
        try:
            await pending.wait(job.timeout, client)
        finally:
            if not (isinstance(pending, KeptRequest) and pending.runs_on(admitted)):
                self._withdraw(admitted, pending)
        return self._answered(job, admitted, pending, self.clock.now())

    def _withdraw(self, items: list[Item], collation: Collation) -> None:
        if collation.remaining:  # not all answered: never run what is left
            for item in items:
                self.core.cancel(item)

    def _answered(self, job: Job, items: list[Item], collation: Collation,
                  now: float) -> Answered:
        """The finished request's answer, or the error that ended it (raised). Its queue
        waits are observed where it is rendered (in a gateway, off the core's CPU)."""
        if items and items[0].trace is not None:
            self._trace_ended(items[0].trace, items, collation, now)
        if collation.client_left:
            raise ClientClosed("the client closed the connection")
        if collation.error is not None:
            raise collation.error
        if collation.timed_out:
            raise DeadlineExceeded("the request's deadline passed before it was answered")
        if len(items) == 1:  # most requests: the same figures without the folds
            item = items[0]
            answered = Answered(collation.outputs, (item.dispatched - item.arrived,),
                                now - item.dispatched, (item.batch,),
                                1 + item.attempts, item.version or "")
        else:
            waits = tuple(i.dispatched - i.arrived for i in items)
            batch = now - min(i.dispatched for i in items)
            batch_ids = tuple(sorted({i.batch for i in items}))
            answered = Answered(collation.outputs, waits, batch, batch_ids,
                                1 + max(i.attempts for i in items), items[0].version or "")
        if collation.refused is None and collation.skipped is None:
            return answered
        return answered._replace(refused=tuple(sorted(collation.refused or ())),
                                 skipped=tuple(collation.skipped or ()))

    def _trace_ended(self, trace: RequestTrace, items: list[Item], collation: Collation,
                     now: float) -> None:
        """A traced job ended: its spans are made once this turn's answers are out."""
        if self.tracing is None:
            return
        if collation.client_left:
            outcome = "client_closed"
        elif collation.error is not None:
            outcome = error_code(collation.error)
        elif collation.timed_out:
            outcome = "deadline_exceeded"
        else:
            outcome = ANSWERED
        arrived = min(item.arrived for item in items)
        asyncio.get_running_loop().call_soon(self.tracing.request_spans, trace, arrived,
                                             now, outcome)


def _traced(traceparent: str, items: list[Item], now: float, late: float) -> None:
    """A job whose request is traced: one record of its trace, shared by its items (a
    traceparent that does not parse, which the HTTP side never sends, traces nothing)."""
    parent = parse_traceparent(traceparent)
    if parent is not None:
        trace = RequestTrace(parent, now - late, now)
        for item in items:
            item.trace = trace


class _Frame(Generic[C]):
    """A submitted frame on its way in: the rate step's verdicts admit it."""

    __slots__ = ("collations", "door", "jobs", "started", "to")

    def __init__(self, door: Door, jobs: Sequence[Job], collations: Sequence[C],
                 to: Admitted[C], started: float) -> None:
        self.door, self.jobs, self.collations, self.to = door, jobs, collations, to
        self.started = started

    def checked(self, refusals: Sequence[BaseException | None]) -> None:
        door = self.door
        now = door.clock.now()
        late = now - self.started
        results = door.admit(self.jobs, self.collations, refusals, now, late, door.refusal)
        self.to.admitted(self.collations, results, late)


class _Verdict:
    """`run`'s wait for its job's rate check."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Sequence[BaseException | None]]) -> None:
        self.future = future

    def checked(self, refusals: Sequence[BaseException | None]) -> None:
        if not self.future.done():  # its caller may have gone meanwhile
            self.future.set_result(refusals)


def _as_is(exc: BaseException, tier: Tier) -> BaseException:
    """`serve`'s refusal: the error itself, which it raises."""
    return exc


__all__ = ["Admitted", "Core", "Door"]
