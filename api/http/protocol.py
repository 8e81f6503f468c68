"""uvicorn's HTTP protocol with the limits a public port needs.

Left alone, an idle socket, a head sent one byte every 2 s and a body sent one byte every
2 s were all still open after 20 s, and a 16 MB header and 20,000 headers were read whole.
Each connection here is held to:

- `max_connections` open at once in the server (all of a cell's gateways together,
  `api.http.connections`): one more is answered 503 `too_many_connections` and closed
  before anything is read from it;
- `head_timeout` to deliver a request's head, counted from the connection's opening (or the
  previous request's end): an idle connection is closed quietly, a half-sent head gets 408
  `request_timeout`; between requests uvicorn's keep-alive timeout applies as before;
- `body_timeout` to deliver the body once the head is in: 408 `request_timeout`, and the
  handler waiting for the body sees the client gone;
- `max_header_bytes` of head (request line and headers) and `max_headers` headers: 431
  `headers_too_large`, counted as bytes arrive, so an oversized head is never buffered;
- well-formed HTTP/1.1: what the parser rejects (a repeated Content-Length, one beside
  Transfer-Encoding, a bad chunk size, a NUL in a header), and a transfer coding other than
  plain `chunked` (`gzip, chunked` would hand the handler compressed bytes), are answered
  400 `invalid_request`; an HTTP/1.1 request without exactly one Host, 400 `invalid_host`;
  a repeated Authorization, Idempotency-Key or X-Request-Timeout-Ms, 400 `repeated_header`;
- answers the client leaves unread: while an answer waits in the process for the client to
  take it, the connection is not read; once it has waited `body_timeout`, the connection is
  aborted (`api.http.backpressure`).

Each refusal is a JSON error with `Connection: close`, written by the protocol itself.

It also hands each request its connection in the scope (`api.http.CONNECTION`): a
handler awaiting an answer hears from the connection itself that the client hung up, with
no task waiting on `receive()` for it.

Given a `DirectRoute`, it serves the hot route's plain requests itself (`api.http.direct`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.config import Settings
from api.errors import ERRORS, ApiError, error_body
from api.http.backpressure import Backpressure
from api.http.collation import CONNECTION
from api.http.connections import Connections, LocalConnections
from api.http.direct import V1, DirectCall, DirectRoute
from api.http.fastpath import HOT_PATH

log = logging.getLogger("batchgate.http")

LINGER_S = 2.0  # after a refusal, how long what the client still sends is read and dropped


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 4096
    head_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 16_384
    max_headers: int = 100

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(max_connections=settings.max_connections,
                   head_timeout=settings.head_timeout_s, body_timeout=settings.body_timeout_s,
                   max_header_bytes=settings.max_header_bytes, max_headers=settings.max_headers)


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the refusal is already written."""


HOT_URL = HOT_PATH.encode()  # as the request line carries it: no query string


def guarded_protocol(
    limits: ConnectionLimits, direct: DirectRoute | None = None,
    connections: Connections | None = None,
) -> type[HttpToolsProtocol]:
    """uvicorn's `http=` protocol class holding every connection to `limits`, and serving
    the hot route's plain requests through `direct` if given. Connections are counted in
    `connections` (a cell's, shared by its gateways), else in this process."""

    class Guarded(GuardedHttpProtocol):
        LIMITS = limits
        DIRECT = direct
        CONNECTIONS = connections or LocalConnections(limits.max_connections)

    return Guarded


class Departure:
    """A connection's `ClientWatch`. One request at a time waits on it: uvicorn runs a
    pipelined request once the one before it is answered. (Its own `receive()` marks only
    the newest request disconnected, so a handler whose request had a pipelined successor
    never heard its client go.) It holds no reference to the protocol, so the scopes that
    hold it leave no reference cycle behind."""

    __slots__ = ("_gone", "_leave")

    def __init__(self) -> None:
        self._gone = False
        self._leave: Callable[[], object] | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        if self._gone:
            leave()
        else:
            self._leave = leave

    def unwatch(self) -> None:
        self._leave = None

    def lost(self) -> None:
        self._gone = True
        leave, self._leave = self._leave, None
        if leave is not None:
            leave()


class GuardedHttpProtocol(HttpToolsProtocol):
    LIMITS = ConnectionLimits()
    DIRECT: DirectRoute | None = None
    CONNECTIONS: Connections = LocalConnections(LIMITS.max_connections)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True  # the next bytes are (part of) a request's head
        self._head_bytes = 0  # raw bytes received since the head began
        self._refused = False
        self._counted = False  # holds a place in CONNECTIONS
        self._departure = Departure()

    # A request whose head and body arrive in one read, the usual case, arms no timer: the
    # checks run once per read and once per head, and cost about a microsecond a request.

    # -- the connection --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._backpressure = Backpressure(transport, self.loop, self.LIMITS.body_timeout)
        self.flow = self._backpressure  # uvicorn's own calls reach it there
        self._counted = self.CONNECTIONS.enter()
        if not self._counted:
            log.warning("refused a connection: %d open", self.LIMITS.max_connections)
            self._refuse("too_many_connections",
                         "the server holds as many connections as it takes; retry shortly",
                         retry_after=1)
            return
        self._arm(self.LIMITS.head_timeout, self._head_timed_out)  # until the first head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._backpressure.stop()
        if self._counted:
            self._counted = False
            self.CONNECTIONS.leave()
        super().connection_lost(exc)
        self._departure.lost()
        call: object = self.cycle
        if type(call) is DirectCall:
            # A direct call refers to its connection: left in place, the pair (and the
            # transport, parser and buffers they hold) would wait for the collector, ~25
            # objects per closed connection. A call still in the core keeps what it needs.
            self.cycle = None  # type: ignore[assignment]  # as before the first request

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or self._timer is not None:
            return
        if self._in_head:
            if self._head_bytes > self.LIMITS.max_header_bytes:
                # No whole head yet, so every byte counted is head (httptools buffers it).
                self._too_large(f"the request head is over {self.LIMITS.max_header_bytes} "
                                "bytes")
            elif self._head_bytes:  # a head begun and not finished
                self._arm(self.LIMITS.head_timeout, self._head_timed_out)
        elif self.cycle is not None and self.cycle.more_body:  # a body begun and not finished
            self._arm(self.LIMITS.body_timeout, self._body_timed_out)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own answer is text/plain; every error here is JSON.
        if not self._refused:  # a refusal stopped the parser: its answer is already out
            self._refuse("invalid_request", "the request is not well-formed HTTP/1.1")

    # -- parser callbacks ------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self._disarm()
        limits = self.LIMITS
        if len(self.headers) > limits.max_headers:
            self._too_large(f"the request has more than {limits.max_headers} headers")
            raise _Refused
        if self._head_bytes > limits.max_header_bytes and len(self.url) + sum(
                len(name) + len(value) + 4 for name, value in self.headers
        ) > limits.max_header_bytes:  # the read held more than the head: measure the head
            self._too_large(f"the request head is over {limits.max_header_bytes} bytes")
            raise _Refused
        if not _plain_chunked(self.headers):
            self._refuse("invalid_request",
                         "Transfer-Encoding may only be chunked: no other coding is decoded")
            raise _Refused
        http11 = self.parser.get_http_version() == "1.1"
        fault = _ambiguous(self.headers, http11)
        if fault is not None:
            self._refuse(fault.code, fault.message)
            raise _Refused
        self._in_head, self._head_bytes = False, 0
        direct = self.DIRECT
        if direct is not None:
            shape = V1 if self.url == HOT_URL else \
                direct.shapes(self.url) if direct.shapes is not None else None
            if shape is not None and (self.cycle is None or self.cycle.response_complete) \
                    and self.parser.get_method() == b"POST" and http11:
                # Not pipelined behind an unanswered request: that one may take ASGI's way,
                # and uvicorn queues what comes after it.
                call = direct.call(self, self.headers, self.parser.should_keep_alive(), shape)
                if call is not None:
                    self.cycle = call  # type: ignore[assignment]  # stands in for the cycle
                    return
        super().on_headers_complete()
        # The request's own scope, not yet seen by its task; a key of batchgate's own.
        cast("dict[str, Any]", self.scope)[CONNECTION] = self._departure

    def on_body(self, body: bytes) -> None:
        call: object = self.cycle
        if type(call) is not DirectCall:
            super().on_body(body)
        elif not call.response_complete:  # within the declared length, itself in the limit
            call.body += body

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        call: object = self.cycle
        if type(call) is not DirectCall:
            super().on_message_complete()
        elif not call.response_complete:
            call.more_body = False
            call.route.start(call)

    # -- what a direct call needs of its connection ---------------------------------------
    @property
    def departure(self) -> Departure:
        return self._departure

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server_state.default_headers

    # -- timers ------------------------------------------------------------------------------
    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes == 0:  # idle: nothing to answer
            self.transport.close()
            return
        self._refuse("request_timeout",
                     f"the request head did not arrive within {self.LIMITS.head_timeout:g} s")

    def _body_timed_out(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_started:
            return
        cycle.disconnected = True  # the handler waiting for the body sees the client gone
        cycle.message_event.set()
        self._refuse("request_timeout",
                     f"the request body did not arrive within {self.LIMITS.body_timeout:g} s")

    # -- refusals ----------------------------------------------------------------------------
    def _too_large(self, message: str) -> None:
        if not self._refused:
            self._refuse("headers_too_large", message)

    def _refuse(self, code: str, message: str, retry_after: int | None = None) -> None:
        self._refused = True
        self._disarm()
        body = error_body(code, message)
        status = ERRORS[code].status
        head = [b"HTTP/1.1 %d %s" % (status, HTTPStatus(status).phrase.encode()),
                b"content-type: application/json",
                b"content-length: %d" % len(body), b"connection: close"]
        if retry_after is not None:
            head.append(b"retry-after: %d" % retry_after)
        if not self.transport.is_closing():
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self._linger()

    def _linger(self) -> None:
        """Close after the answer without losing it. Closing a socket with unread input makes
        the kernel send a reset, and a client still sending (a slow body) then lost the
        answer it had not read yet: seen with two test runs sharing the cores. So half-close,
        drop what still arrives, and close when the client does or after `LINGER_S`, as
        servers' lingering close does."""
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()


ONCE = (b"authorization", b"idempotency-key", b"x-request-timeout-ms")
"""Headers the server reads that a request may send once: of two, the direct way's header
map kept the last and Starlette's the first, so which key a request ran under was a guess."""


def _ambiguous(headers: list[tuple[bytes, bytes]], http11: bool) -> ApiError | None:
    """The refusal of a head the parser took but whose meaning is a guess: an HTTP/1.1
    request with no Host or several (RFC 9112 3.2), or a header of `ONCE` sent twice."""
    names = {name for name, _ in headers}
    if len(names) == len(headers) and (b"host" in names or not http11):
        return None  # the usual head: no name twice, and a Host where one is due
    listed = [name for name, _ in headers]
    hosts = listed.count(b"host")
    if hosts > 1 or (hosts == 0 and http11):
        return ApiError("invalid_host", "an HTTP/1.1 request carries exactly one Host header")
    for name in ONCE:
        if listed.count(name) > 1:
            return ApiError("repeated_header",
                            f"the {name.decode()} header may be sent only once")
    return None


def _plain_chunked(headers: list[tuple[bytes, bytes]]) -> bool:
    """No Transfer-Encoding, or exactly `chunked`: the parser accepts any codings ending
    in chunked, and decodes none of the others (RFC 9112 6.1)."""
    codings = [value for name, value in headers if name == b"transfer-encoding"]
    return not codings or (len(codings) == 1 and codings[0].strip().lower() == b"chunked")


__all__ = ["HOT_URL", "ConnectionLimits", "Departure", "GuardedHttpProtocol",
           "guarded_protocol"]
