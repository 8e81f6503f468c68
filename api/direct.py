"""The hot route served by the connection itself: no ASGI cycle, no task, no future.

`POST /v1/batchstring` through ASGI made a request cycle, a task and its context, five
coroutines, a future and a timer per request: about 40 objects the collector walks while the
request waits, and half the server's CPU per request. Here the HTTP protocol
(`api.http_guard`) hands the parsed head and body to `DirectRoute`, the request's items are
admitted straight into the core with the request itself as their `Collation`, and its answer
is written to the transport in the loop turn that settles it: about ten objects a request.

Only a plain request takes this way: a whole body of declared length within the limit, no
Idempotency-Key (a joiner waits on its leader), no `Expect: 100-continue`, HTTP/1.1 and the
access log off. The rest goes through ASGI (`api.fastpath`), which shares every check and
the rendering with this.

Two ways to the core: `LocalRoute` admits into the core of this process; `RemoteRoute`, in
a gateway, sends the job over the link (`api.link`) and writes the core's answer in the
loop turn it arrives in, with the others of its frame.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from api.door import Answered, Door, Job, Outcome, Rendered
from api.errors import error_response, to_api_error
from api.fastpath import JsonAnswer, header_map
from api.link import CoreLost, RemoteCore, client_closed, unavailable
from api.requests import QUIET, ClientWatch, Collation, Deadlines
from api.routes import Routes, render
from batcher import Item


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
                 "started")

    message_event = _Inert()

    def __init__(self, route: DirectRoute, conn: Connection, headers: dict[str, str],
                 keep_alive: bool) -> None:
        super().__init__(0)
        self.route, self.conn, self.headers, self.keep_alive = route, conn, headers, keep_alive
        self.body = bytearray()
        self.more_body = True
        self.response_started = self.response_complete = self.disconnected = False
        self.job: Job | None = None
        self.items: list[Item] = []
        self.rid = 0  # its job's id on the link (`RemoteRoute`)
        self.started = time.perf_counter()

    def ended(self) -> None:
        self.route.ended(self)

    def answered(self, outcome: Outcome) -> None:
        """The core's answer over the link (`RemoteRoute`)."""
        cast("RemoteRoute", self.route).answered(self, outcome)


class DirectRoute:
    """The direct way of one server process; every connection's protocol shares it. How a
    job reaches the core is the subclass's (`admit`); the checks and the answer are shared."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes

    def call(self, conn: Connection, raw: list[tuple[bytes, bytes]], keep_alive: bool
             ) -> DirectCall | None:
        """A call for this request once its head is in, or None: it takes ASGI's way."""
        headers = header_map(raw)
        length = headers.get("content-length")
        if length is None or not length.isdigit() \
                or int(length) > self.routes.limits.max_body_bytes \
                or "idempotency-key" in headers or "expect" in headers \
                or "transfer-encoding" in headers:
            return None
        return DirectCall(self, conn, headers, keep_alive)

    def start(self, call: DirectCall) -> None:
        """The whole body is in: admit the job or answer at once. Runs inside the parser's
        callback, so nothing may escape it."""
        tier = "unknown"
        try:
            routes, headers = self.routes, call.headers
            principal = routes.keys.identify(headers.get("authorization"))
            tier = principal.tier.label
            key = routes.check_head(principal, headers)
            job = routes.job_of(principal, headers, bytes(call.body), key)
            call.body = bytearray()
            call.job = job
            self.admit(call, job)
        except Exception as exc:  # translated at the boundary, never a traceback
            self._fail(call, exc, tier)

    def admit(self, call: DirectCall, job: Job) -> None:
        """Hand `job` to the core; `answer` once it is over (the client's leaving included:
        the connection calls `call.leave`, which ends the call through `ended`)."""
        raise NotImplementedError

    def ended(self, call: DirectCall) -> None:
        """A call's collation ended: answered, failed, out of time, or its client left."""
        raise NotImplementedError

    def answer(self, call: DirectCall, outcome: Outcome) -> None:
        """The call is over: write its outcome, or count a client that left."""
        job = call.job
        assert job is not None
        tier = job.principal.tier.label
        try:
            if call.response_started:  # failed on its way in, and answered then
                return
            if call.client_left:  # counted as ASGI's way counts it, not written
                self.routes.record_later(tier, 499, time.perf_counter() - call.started, ())
                return
            waits = outcome.waits if isinstance(outcome, Answered) else ()
            self._write(call, render(outcome, job.single), tier, waits)
        except Exception as exc:
            self._fail(call, exc, tier)

    def _fail(self, call: DirectCall, exc: Exception, tier: str) -> None:
        err = to_api_error(exc)  # logs what it does not know
        if not call.response_started:
            self._write(call, error_response(err.status, err.code, err.message, err.headers),
                        tier, ())

    def _write(self, call: DirectCall, response: Response, tier: str,
               waits: tuple[float, ...]) -> None:
        """The whole answer in one write, as uvicorn would frame it; then the connection
        goes on as after any answer (keep-alive, or the next pipelined request)."""
        elapsed = time.perf_counter() - call.started
        conn = call.conn
        content = [STATUS_LINE[response.status_code]]
        for name, value in conn.default_headers:
            content += (name, b": ", value, b"\r\n")
        for name, value in response.raw_headers:
            content += (name, b": ", value, b"\r\n")
        if not isinstance(response, JsonAnswer):  # errors: the total only
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
        self.routes.record_later(tier, response.status_code, elapsed, waits)


class LocalRoute(DirectRoute):
    """The direct way to the core in this process: the call is its items' `Collation`, its
    deadline shares a 10 ms slot's timer, and the calls that end in one loop turn are
    answered together once it is over."""

    def __init__(self, routes: Routes, door: Door) -> None:
        super().__init__(routes)
        self.door = door
        self._deadlines = Deadlines()
        self._ended: list[DirectCall] = []

    def admit(self, call: DirectCall, job: Job) -> None:
        n = len(job.texts)
        call.outputs, call.remaining = [""] * n, n
        result = self.door.submit_all((job,), (call,))[0]
        if isinstance(result, Rendered):  # refused
            self.answer(call, result)
            return
        call.items = result
        self._deadlines.add(call, job.timeout, asyncio.get_running_loop().time())
        call.conn.departure.watch(call.leave)

    def ended(self, call: DirectCall) -> None:
        """Concluded once the turn is over (the owner's, a timer's or a hang-up's), with
        the others that end in it."""
        if not self._ended:
            asyncio.get_running_loop().call_soon(self._conclude, context=QUIET)
        self._ended.append(call)

    def _conclude(self) -> None:
        calls, self._ended = self._ended, []
        conclude, discard = self.door.conclude, self._deadlines.discard
        now = self.door.service.clock.now()
        for call in calls:
            job = call.job
            assert job is not None
            try:
                discard(call)
                call.conn.departure.unwatch()
                outcome = conclude(job, call.items, call, now)
                call.items = []
            except Exception as exc:
                self._fail(call, exc, job.principal.tier.label)
                continue
            self.answer(call, outcome)


class RemoteRoute(DirectRoute):
    """The direct way of a gateway: the job goes over the link, and the core's answer comes
    back to the call (`DirectCall.answered`). The core keeps the deadline; a client that
    leaves has its job withdrawn there."""

    def __init__(self, routes: Routes, core: RemoteCore) -> None:
        super().__init__(routes)
        self.core = core

    def admit(self, call: DirectCall, job: Job) -> None:
        try:
            call.rid = self.core.submit(job, call)
        except CoreLost:
            self.answer(call, unavailable())
            return
        call.conn.departure.watch(call.leave)

    def answered(self, call: DirectCall, outcome: Outcome) -> None:
        call.finished = True  # a hang-up from now on changes nothing
        call.conn.departure.unwatch()
        self.answer(call, outcome)

    def ended(self, call: DirectCall) -> None:
        """Only a hang-up ends a call here before its answer."""
        self.core.withdraw(call.rid)
        self.answer(call, client_closed())


__all__ = ["DirectCall", "DirectRoute", "LocalRoute", "RemoteRoute"]
