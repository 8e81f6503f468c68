"""The hot route served by the connection itself: no ASGI cycle, no task, no future.

`POST /v1/batchstring` through ASGI made a request cycle, a task and its context, five
coroutines, a future and a timer per request: about 40 objects the collector walks while the
request waits, and half the server's CPU per request. Here the HTTP protocol
(`api.http.protocol`) hands the parsed head and body to `DirectRoute`, the request's items are
admitted straight into the core with the request itself as their `Collation`, and its answer
is written to the transport in the loop turn that settles it: about ten objects a request.

Only a plain request takes this way: a whole body of declared length within the limit, no
Idempotency-Key (a joiner waits on its leader), no `Expect: 100-continue`, HTTP/1.1. The rest
goes through ASGI (`api.http.fastpath`), which shares every check and the rendering with
this. Both ways hand the access log, if it is on, a record of each answer
(`api.http.access_log`).

Two ways to the core, each a subclass in the room that knows it: `api.door.LocalRoute`
admits into the core of this process; `api.gateway.RemoteRoute`, in a gateway, sends the job
over the link and writes the core's answer in the loop turn it arrives in, with the others of
its frame.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from api.config import Principal
from api.errors import ApiError, error_response, to_api_error
from api.http.access_log import AccessLog, hot
from api.http.collation import ClientWatch, Collation
from api.http.fastpath import HOT_PATH, header_map
from api.http.jobs import Job, Outcome
from api.http.media import framing_of
from api.http.routes import Routes, render
from batcher import Item


class Shape(Protocol):
    """What the requests of one direct route are: how a body becomes the door's job, and
    the door's outcome or a refusal the answer. `/v1/batchstring`'s is `V1`; another room
    brings its own (the Open Inference Protocol's infer, `DirectRoute.shapes`)."""

    path: str  # the route, as the access log and the request span name it

    def job(self, routes: Routes, principal: Principal, headers: Mapping[str, str],
            body: bytes) -> Job:
        """The request's job (raises what refuses it)."""

    def render(self, outcome: Outcome, job: Job) -> tuple[Response, str | None]:
        """The answer, and the id it carries (raises what refuses it)."""

    def refusal(self, err: ApiError) -> Response: ...


class _V1:
    """`POST /v1/batchstring`."""

    path = HOT_PATH

    def job(self, routes: Routes, principal: Principal, headers: Mapping[str, str],
            body: bytes) -> Job:
        return routes.job_of(principal, headers, body, routes.check_head(principal, headers))

    def render(self, outcome: Outcome, job: Job) -> tuple[Response, str | None]:
        return render(outcome, job.single)

    def refusal(self, err: ApiError) -> Response:
        return error_response(err.code, err.message, err.headers)


V1: Shape = _V1()


class Connection(Protocol):
    """What a direct call needs of its HTTP connection."""

    transport: asyncio.Transport

    @property
    def departure(self) -> ClientWatch: ...

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]: ...

    def on_response_complete(self) -> None: ...


class _Inert:
    """The cycle's message event, for uvicorn's code that sets it: nothing waits here."""

    def set(self) -> None:
        pass


class DirectCall(Collation):
    """One request on the direct way. It stands where uvicorn keeps a request's cycle
    (`protocol.cycle`), so it carries the attributes uvicorn and the guard read there."""

    __slots__ = ("body", "conn", "disconnected", "headers", "items", "job", "keep_alive",
                 "more_body", "response_complete", "response_started", "rid", "route",
                 "shape", "started")

    message_event = _Inert()

    def __init__(self, route: DirectRoute, conn: Connection, headers: dict[str, str],
                 keep_alive: bool, shape: Shape = V1) -> None:
        super().__init__(0)
        self.route, self.conn, self.headers, self.keep_alive = route, conn, headers, keep_alive
        self.shape = shape
        self.body = bytearray()
        self.more_body = True
        self.response_started = self.response_complete = self.disconnected = False
        self.job: Job | None = None
        self.items: list[Item] = []
        self.rid = 0  # its job's id on the link (`api.gateway.RemoteRoute`)
        self.started = time.perf_counter()

    def ended(self) -> None:
        self.route.ended(self)

    def answered(self, outcome: Outcome) -> None:
        """The core's answer, from a route that does not end calls through `ended`."""
        self.route.answered(self, outcome)


class DirectRoute:
    """The direct way of one server process; every connection's protocol shares it. How a
    job reaches the core is the subclass's (`admit`); the checks and the answer are shared."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes
        self.access_log: AccessLog | None = routes.access_log  # the routes' sink, if on
        # Other POST routes served this way: a URL's shape, or None (ASGI's way).
        self.shapes: Callable[[bytes], Shape | None] | None = None

    def call(self, conn: Connection, raw: list[tuple[bytes, bytes]], keep_alive: bool,
             shape: Shape = V1) -> DirectCall | None:
        """A call for this request once its head is in, or None: it takes ASGI's way."""
        headers = header_map(raw)
        length = headers.get("content-length")
        if length is None or not length.isdigit() \
                or int(length) > self.routes.limits.max_body_bytes \
                or "idempotency-key" in headers or "expect" in headers \
                or "transfer-encoding" in headers \
                or ("accept" in headers and framing_of(headers["accept"]) is not None):
            return None
        return DirectCall(self, conn, headers, keep_alive, shape)

    def start(self, call: DirectCall) -> None:
        """The whole body is in: admit the job or answer at once. Runs inside the parser's
        callback, so nothing may escape it."""
        tier, principal = "unknown", None
        try:
            routes, headers = self.routes, call.headers
            principal = routes.keys.identify(headers.get("authorization"))
            tier = principal.tier.label
            job = call.shape.job(routes, principal, headers, bytes(call.body))
            call.body = bytearray()
            call.job = job
            self.admit(call, job)
        except Exception as exc:  # translated at the boundary, never a traceback
            self._failed(call, exc, tier, principal)

    def admit(self, call: DirectCall, job: Job) -> None:
        """Hand `job` to the core; `answer` once it is over (the client's leaving included:
        the connection calls `call.leave`, which ends the call through `ended`)."""
        raise NotImplementedError

    def ended(self, call: DirectCall) -> None:
        """A call's collation ended: answered, failed, out of time, or its client left."""
        raise NotImplementedError

    def answered(self, call: DirectCall, outcome: Outcome) -> None:
        """The core's answer to `call` came (over the link)."""
        raise NotImplementedError

    def answer(self, call: DirectCall, outcome: Outcome) -> None:
        """The call is over: write its outcome, or count a client that left."""
        job = call.job
        assert job is not None
        tier = job.principal.tier.label
        try:
            if call.response_started:  # failed on its way in, and answered then
                return
            if call.client_left:  # counted and logged as ASGI's way does, not written
                elapsed = time.perf_counter() - call.started
                self.routes.record_later(tier, 499, elapsed, (), job.model or "")
                if self.access_log is not None:
                    self.access_log.put(hot(job.principal, elapsed, code="client_closed",
                                            path=call.shape.path))
                return
            waits = outcome.waits  # none unless the core ran it for this request
            model = outcome.model if waits else job.model or ""
            response, rid = call.shape.render(outcome, job)
            elapsed = self._write(call, response, tier, waits, model)
            if self.access_log is not None:
                self.access_log.put(hot(job.principal, elapsed, outcome, rid,
                                        path=call.shape.path))
        except Exception as exc:
            self.fail(call, exc, tier)

    def fail(self, call: DirectCall, exc: Exception, tier: str) -> None:
        self._failed(call, exc, tier, call.job.principal if call.job is not None else None)

    def _failed(self, call: DirectCall, exc: Exception, tier: str,
                principal: Principal | None) -> None:
        err = to_api_error(exc)  # logs what it does not know
        if not call.response_started:
            model = (call.job.model or "") if call.job is not None else ""
            elapsed = self._write(call, call.shape.refusal(err), tier, (), model)
            if self.access_log is not None:
                self.access_log.put(hot(principal, elapsed, code=err.code,
                                        path=call.shape.path))

    def _write(self, call: DirectCall, response: Response, tier: str,
               waits: tuple[float, ...], model: str = "") -> float:
        """The whole answer in one write, as uvicorn would frame it; then the connection
        goes on as after any answer (keep-alive, or the next pipelined request), read again
        once the client has taken it (`api.http.backpressure`). Returns the seconds the
        call took."""
        elapsed = time.perf_counter() - call.started
        conn = call.conn
        content = [STATUS_LINE[response.status_code]]
        for name, value in conn.default_headers:
            content += (name, b": ", value, b"\r\n")
        for name, value in response.raw_headers:
            content += (name, b": ", value, b"\r\n")
        if not waits:  # errors and replays: the total only
            content.append(b"server-timing: total;dur=%.1f\r\n" % (elapsed * 1000))
        if not call.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", bytes(response.body))
        call.response_started = call.response_complete = True
        transport = conn.transport
        if not transport.is_closing():
            transport.write(b"".join(content))
            if not call.keep_alive:
                transport.close()
            conn.on_response_complete()
        self.routes.record_later(tier, response.status_code, elapsed, waits, model)
        job = call.job
        if job is not None and job.trace is not None:
            self.routes.traced(job, call.headers, response.status_code, elapsed, model,
                               name=f"POST {call.shape.path}")
        return elapsed


__all__ = ["V1", "Connection", "DirectCall", "DirectRoute", "Shape"]
