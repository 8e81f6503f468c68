"""The hot route without the framework: `POST /v1/batchstring` straight from the ASGI server.

Every other path goes through Starlette. This one skips its routing, middleware and Request
object (a large share of the gateway's CPU per request when profiled), because the
contract's 100 ms floor leaves the gateway only a few milliseconds of its own. Under
batchgate's own HTTP protocol its plain requests skip ASGI too (`api.http.direct`): this serves
the rest (keyed, chunked, behind the access log, in a gateway) and any other ASGI server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Protocol

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.collation import CONNECTION, ClientWatch, ReceiveWatch

HOT_PATH = "/v1/batchstring"


class HttpCall(ClientWatch, Protocol):
    """What a handler reads of a request, and how it hears the client hang up."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def scope(self) -> Scope: ...

    def stream(self) -> AsyncIterator[bytes]: ...


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers by name. Names arrive lower-cased (ASGI's rule, and uvicorn's parser); a
    repeated header keeps its last value."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}


class RawCall:
    __slots__ = ("_receive", "_scope", "_watch", "headers")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.headers = header_map(scope["headers"])
        self._receive = receive
        self._scope = scope
        self._watch: ClientWatch | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        watch = self._scope.get(CONNECTION)  # batchgate's own protocol hands its connection
        self._watch = ReceiveWatch(self._receive) if watch is None else watch
        self._watch.watch(leave)

    def unwatch(self) -> None:
        if self._watch is not None:
            self._watch.unwatch()
            self._watch = None

    @property
    def scope(self) -> Scope:
        return self._scope

    async def stream(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            body: bytes = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return


class JsonAnswer(Response):
    """A 200 JSON answer with its raw headers built directly: Starlette's header
    normalisation costs more than the rest of the response on this route."""

    media_type = "application/json"

    def __init__(self, body: bytes, server_timing: str) -> None:
        self.status_code = 200
        self.body = body
        self.background = None
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
            (b"server-timing", server_timing.encode()),
        ]


def with_fast_path(app: ASGIApp, handler: Callable[[HttpCall], Awaitable[Response]]) -> ASGIApp:
    """Serve the hot route with `handler`, everything else with `app`."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == HOT_PATH and scope["method"] == "POST":
            response = await handler(RawCall(scope, receive))
            await response(scope, receive, send)
        else:
            await app(scope, receive, send)

    return asgi


__all__ = ["HOT_PATH", "HttpCall", "JsonAnswer", "RawCall", "header_map", "with_fast_path"]
