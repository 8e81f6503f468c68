"""The hot route served by the connection itself: no ASGI cycle, no task, no future.

`POST /v1/batchstring` through ASGI made a request cycle, a task and its context, five
coroutines, a future and a timer per request: about 40 objects the collector walks while the
request waits, and half the server's CPU per request. Here the HTTP protocol
(`api.http_guard`) hands the parsed head and body to `DirectRoute`, the request's items are
admitted straight into the core with the request itself as their `Collation`, and its answer
is written to the transport in the loop turn that settles it: about ten objects a request.

Only a plain request takes this way: a whole body of declared length within the limit, no
Idempotency-Key (a joiner waits on its leader), no `Expect: 100-continue`, HTTP/1.1, the
core in this process and the access log off. The rest goes through ASGI
(`api.fastpath`), which shares every check and the rendering with this.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from api.door import Answered, Door, Job, Rendered
from api.errors import error_response, to_api_error
from api.fastpath import JsonAnswer, header_map
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
                 "more_body", "response_complete", "response_started", "route", "started")

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
        self.started = time.perf_counter()

    def ended(self) -> None:
        self.route.ended(self)


class DirectRoute:
    """The direct way of one server process; every connection's protocol shares it."""

    def __init__(self, routes: Routes, door: Door) -> None:
        self.routes = routes
        self.door = door
        self._deadlines = Deadlines()
        self._ended: list[DirectCall] = []

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
            n = len(job.texts)
            call.outputs, call.remaining = [""] * n, n
            result = self.door.submit_all((job,), (call,))[0]
            if isinstance(result, Rendered):  # refused
                self._write(call, render(result, job.single), tier, ())
                return
            call.items = result
            self._deadlines.add(call, job.timeout, asyncio.get_running_loop().time())
            call.conn.departure.watch(call.leave)
        except Exception as exc:  # translated at the boundary, never a traceback
            self._fail(call, exc, tier)

    def ended(self, call: DirectCall) -> None:
        """A call's collation ended (in the owner's turn, a timer or a hang-up): concluded
        once the turn is over, with the others that end in it."""
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
            tier = job.principal.tier.label
            try:
                discard(call)
                call.conn.departure.unwatch()
                outcome = conclude(job, call.items, call, now)
                call.items = []
                if call.response_started:  # failed on its way in, and answered then
                    continue
                if call.client_left:  # counted as ASGI's way counts it, not written
                    elapsed = time.perf_counter() - call.started
                    self.routes.record_later(tier, 499, elapsed, ())
                    continue
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


__all__ = ["DirectCall", "DirectRoute"]
