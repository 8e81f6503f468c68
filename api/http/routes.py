"""HTTP handlers: parse, authenticate and validate, then hand the job to the core's door and
render what it answers. None ever touches a worker, and none decides anything global (rate
limits, idempotency, admission): the door does, in process or across the link."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response

from api.config import KeyRing, Principal, Settings, load_keys
from api.errors import ApiError, KeysFileError, error_response, to_api_error
from api.http.access_log import AccessLog, hot
from api.http.calls import StatusCall
from api.http.collation import QUIET, ClientWatch
from api.http.fastpath import HttpCall, JsonAnswer
from api.http.jobs import Answered, Job, Outcome, answer_body, answer_id, guarded_answer
from api.http.media import Framing, framing_of
from api.http.parsing import Limits, parse_body, parse_timeout
from api.metrics import Metrics, pool_capacity
from batcher.tracing import SAMPLED, Tracing, parse_traceparent, request_context

log = logging.getLogger("batchgate.api")

JSON = "application/json"
MAX_IDEMPOTENCY_KEY = 255
IDEMPOTENCY_KEY = re.compile(rf"[\x21-\x7e]{{1,{MAX_IDEMPOTENCY_KEY}}}")  # visible ASCII


class CoreView(Protocol):
    """What the routes need of the core: its door, and the status calls the other endpoints
    make (`api.http.calls`). `api.door.LocalCore` serves it in process;
    `api.gateway.RemoteCore` across the link."""

    async def run(self, job: Job, client: ClientWatch) -> Outcome: ...

    async def status(self, call: StatusCall, *args: Any) -> Any:
        """The core's answer to `call` (`StatusCall` says what each answers);
        CoreUnavailable if the core cannot be asked."""


class Routes:
    def __init__(self, core: CoreView, settings: Settings, keys: KeyRing,
                 metrics: Metrics, gateway: int | None = None,
                 tracing: Tracing | None = None) -> None:
        """`tracing`: where request spans go (None: off, and nothing is traced)."""
        self.core = core
        self.tracing = tracing
        self.gateway = gateway  # this gateway's slot in a cell
        self.settings = settings
        self.keys = keys
        self.metrics = metrics
        # Both ways to the hot route hand it a record of each answer (`DirectRoute` takes it
        # from here); None: the log is off.
        self.access_log = AccessLog.of(settings)
        s = settings
        self.limits = Limits(s.max_inputs, s.max_input_chars, s.max_body_bytes)
        # The streamed way (`api.stream.StreamRoute`), given by whoever builds the routes;
        # None: a request that asks for a stream gets the JSON answer.
        self.streamed: Callable[[HttpCall, Principal, Framing], Awaitable[Response]] | None \
            = None

    def reload_keys(self) -> None:
        """SIGHUP: read the keys file again. A file that fails to load leaves the keys as
        they were (and says why in the log); tier limits keep their start-up values."""
        try:
            self.keys = load_keys(self.settings.keys, self.settings.admin_key)
        except KeysFileError as exc:
            log.error("keys not reloaded: %s", exc)
            return
        log.info("keys reloaded from %s: %d keys", self.settings.keys, len(self.keys.keys))

    async def batchstring(self, request: HttpCall) -> Response:
        started = time.perf_counter()
        tier = "unknown"
        waits: tuple[float, ...] = ()
        principal: Principal | None = None
        outcome: Outcome | None = None
        rid = code = None
        model = ""  # what the request named, or the version that ran it (metrics)
        job: Job | None = None
        try:
            principal = self.keys.identify(request.headers.get("authorization"))
            tier = principal.tier.label
            if self.streamed is not None:
                framing = framing_of(request.headers.get("accept"))
                if framing is not None:  # it answers, counts and logs itself
                    return await self.streamed(request, principal, framing)
            job = await self._job(request, principal)
            model = job.model or ""
            outcome = await self.core.run(job, request)
            if outcome.waits:  # the core ran it for this request, keyed or not
                waits, model = outcome.waits, outcome.model
            response, rid = render(outcome, job.single)
        except Exception as exc:  # translated at the boundary, never a traceback
            err = to_api_error(exc)
            response, code = error_response(err.code, err.message, err.headers), err.code
        elapsed = time.perf_counter() - started
        if not waits:  # errors and replays: the total only
            response.headers["Server-Timing"] = f"total;dur={elapsed * 1000:.1f}"
        self.record_later(tier, response.status_code, elapsed, waits, model)
        if self.access_log is not None:
            self.access_log.put(hot(principal, elapsed, outcome, rid, code))
        if job is not None and job.trace is not None:
            self.traced(job, request.headers, response.status_code, elapsed, model)
        return response

    def _record(self, tier: str, status: int, elapsed: float, waits: tuple[float, ...],
                model: str) -> None:
        ran = bool(waits)  # only an answer the core ran has waits
        self.metrics.request_done(tier, status, elapsed, model, ran)
        if ran:
            self.metrics.queue_waited(tier, waits, model)

    async def _job(self, request: HttpCall, principal: Principal) -> Job:
        key = self.check_head(principal, request.headers)
        body = await read_body(request.headers, request.stream(), self.limits.max_body_bytes)
        return self.job_of(principal, request.headers, body, key)

    def check_head(self, principal: Principal, headers: Mapping[str, str]) -> str | None:
        """What the headers alone decide; returns the Idempotency-Key, if any."""
        key = headers.get("idempotency-key")
        if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
            raise ApiError("invalid_idempotency_key", f"Idempotency-Key must be "
                           f"1..{MAX_IDEMPOTENCY_KEY} visible ASCII characters")
        if key is not None and principal.key is None:  # anonymous callers share no scope
            raise ApiError("idempotency_needs_key",
                           "Idempotency-Key needs an API key: answers are kept per account")
        kind = headers.get("content-type")
        if kind is not None and kind.partition(";")[0].strip().lower() != JSON:
            # text/plain and forms are what a web page may post cross-site without a
            # preflight. No header at all is taken as JSON (curl -d sends a form type).
            raise ApiError("unsupported_media_type", "the body must be application/json")
        return key

    def job_of(self, principal: Principal, headers: Mapping[str, str], body: bytes,
               key: str | None, limits: Limits | None = None) -> Job:
        """The job of a request whose head passed `check_head` and whose body is read
        (`limits`: a streamed request's; None: the plain route's)."""
        parsed = parse_body(body, limits or self.limits)
        timeout = parse_timeout(
            headers.get("x-request-timeout-ms"),
            self.keys.tiers[principal.tier].timeout_ms / 1000,
            self.settings.max_request_timeout_ms / 1000,
        )
        idempotency = None if key is None else (key, hashlib.sha256(body).digest())
        return Job(principal, parsed.texts, parsed.single, timeout, idempotency, parsed.model,
                   None if self.tracing is None else trace_job(self, headers))

    def traced(self, job: Job, headers: Mapping[str, str], status: int, elapsed: float,
               model: str = "", name: str = "POST /v1/batchstring",
               more: Mapping[str, str | int | bool] | None = None) -> None:
        """The request span of a traced job (`job.trace`), ended now, `elapsed` seconds
        long: a child of the request's `traceparent`, if it brought one; `more`: attributes
        of its own (a stream's). Never raises."""
        if self.tracing is None or job.trace is None:
            return
        parent, _ = request_context(headers.get("traceparent"))
        own = parse_traceparent(job.trace)
        if own is None:
            return
        end = time.monotonic()
        self.tracing.emit(name, parent, end - elapsed, end, {
            "batchgate.tier": job.principal.tier.label, "http.response.status_code": status,
            "batchgate.model": model or job.model or "", **(more or {})},
            span_id=own.span_id, trace_id=own.trace_id, server=True)

    def record_later(self, tier: str, status: int, elapsed: float,
                     waits: tuple[float, ...], model: str = "") -> None:
        """Counted once every answer woken with this one is written: a batch's hundred
        answers wake together, and each one's bookkeeping would delay the next. `model`:
        with `waits` (an answer the core ran), the version that ran it ("topics@v2"); else
        what the request named ("": nothing, or not read yet)."""
        asyncio.get_running_loop().call_soon(
            self._record, tier, status, elapsed, waits, model, context=QUIET)

    async def healthz(self, request: Request) -> Response:
        body: dict[str, object] = {"status": "ok"}
        if self.gateway is not None:
            body["gateway"] = self.gateway
        return Response(orjson.dumps(body), media_type=JSON)

    async def readyz(self, request: Request) -> Response:
        body = await self.core.status(StatusCall.READY)
        return Response(orjson.dumps(body), status_code=200 if body["ready"] else 503,
                        media_type=JSON)

    async def metrics_text(self, request: Request) -> Response:
        text = await self.core.status(StatusCall.METRICS_TEXT)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def admin_workers(self, request: Request) -> Response:
        if not self.keys.is_admin(request.headers.get("authorization")):
            return error_response("unauthorized", "an admin key is required")
        workers = await self.core.status(StatusCall.WORKERS)
        capacity = await self.core.status(StatusCall.CAPACITY)
        if capacity is None:  # a fixed pool: its size is its workers'
            capacity = pool_capacity(Counter(str(w["state"]) for w in workers))
        desired, starting, running = capacity
        body = {"workers": workers, "desired": desired, "starting": starting,
                "running": running, **await self.core.status(StatusCall.CELL)}
        return Response(orjson.dumps(body), media_type=JSON)

    async def admin_models(self, request: Request) -> Response:
        """GET /admin/models, PUT /admin/models/{name},
        DELETE /admin/models/{name}/versions/{version} and .../{name}/overrides: the core
        answers (a DELETE without a version is the overrides')."""
        if not self.keys.is_admin(request.headers.get("authorization")):
            return error_response("unauthorized", "an admin key is required")
        params = request.path_params
        body = b""
        if request.method == "PUT":  # its size checked as it arrives, never read whole first
            try:
                body = await read_body(request.headers, request.stream(),
                                        self.limits.max_body_bytes)
            except ApiError as err:
                return error_response(err.code, err.message)
        status, value = await self.core.status(StatusCall.MODELS, request.method,
                                               params.get("name"), params.get("version"), body)
        return Response(orjson.dumps(value), status_code=status, media_type=JSON)


def trace_job(routes: Routes, headers: Mapping[str, str]) -> str | None:
    """The traceparent of a request's span (what `Job.trace` carries to the core): a child
    of the request's `traceparent` header, or the root of a new trace when it brought none
    or a bad one; None while tracing is off, or when the caller's trace is not sampled
    (flags 00: nothing of it would be recorded, so nothing is traced). Every way in (HTTP,
    gRPC metadata) sets it so, and ends the span with `Routes.traced`."""
    if routes.tracing is None:
        return None
    header = headers.get("traceparent")
    sample = routes.tracing.sample
    if header is None and sample < 1.0 and random.random() >= sample:
        return None  # `--otlp-sample`: this one starts no trace
    parent, own = request_context(header)
    if parent is not None and not parent.flags & SAMPLED:
        return None
    return str(own)


def render(outcome: Outcome, single: bool) -> tuple[Response, str | None]:
    """The answer to `outcome`, and the id it gives an answer the core ran (the access log
    writes it); a rendered outcome's body is the door's, as it is. Whatever ran for this
    request (an `Answered`, or a keyed request's own run) says its timings."""
    if isinstance(outcome, Answered):
        if outcome.refused or outcome.skipped:
            return _guarded(outcome, single)
        rid = answer_id()
        return JsonAnswer(answer_body(outcome.outputs, single, rid, outcome.model),
                          server_timing(outcome.queue, outcome.batch)), rid
    headers = dict(outcome.headers)
    if outcome.waits:
        headers["Server-Timing"] = server_timing(max(outcome.waits), outcome.batch)
    return Response(outcome.body, status_code=outcome.status, media_type=JSON,
                    headers=headers), None


def _guarded(outcome: Answered, single: bool) -> tuple[Response, str | None]:
    """An answer where a guard refused an input or failed open (`guarded_answer`); its id
    only if it is a 200."""
    rid = answer_id()
    status, body, headers = guarded_answer(outcome.outputs, single, outcome.refused,
                                           outcome.skipped, rid, outcome.model)
    return Response(body, status_code=status, media_type=JSON, headers={
        **dict(headers), "Server-Timing": server_timing(outcome.queue, outcome.batch)}), \
        rid if status == 200 else None


def server_timing(queue: float, batch: float) -> str:
    """The Server-Timing of an answer the core ran: the slowest item's wait in its queue,
    and its batch (seconds in, milliseconds out)."""
    return f"queue;dur={queue * 1000:.1f}, batch;dur={batch * 1000:.1f}"


async def read_body(headers: Mapping[str, str], stream: AsyncIterator[bytes], limit: int
                     ) -> bytes:
    """The body of `stream`; 413 `body_too_large` as soon as it is known to be over `limit`
    (by its Content-Length, before anything is read; else once the chunks pass it)."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError("body_too_large", f"the body is limited to {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise ApiError("body_too_large", f"the body is limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = ["CoreView", "Routes", "read_body", "render", "trace_job"]
