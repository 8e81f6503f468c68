"""Which requests the HTTP protocol serves itself (`api.http.direct`) and which go through ASGI,
under the real uvicorn server: the answers' order on a connection, pipelined or not, and an
error inside the direct way. The direct way with the real core runs in every end-to-end
test (`tests/e2e`)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest
from starlette.responses import Response

from api.http import V1, DirectCall, DirectRoute, Routes, Shape
from tests.api.serving import echoing, serving

pytestmark = pytest.mark.anyio
LIMIT = 1000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


class Recorded:
    """Routes enough for `DirectRoute`'s framing: the body limit, the bookkeeping, and no
    access log."""

    access_log = None

    def __init__(self) -> None:
        self.limits = SimpleNamespace(max_body_bytes=LIMIT)
        self.recorded: list[int] = []

    def record_later(self, tier: str, status: int, elapsed: float, waits: Any,
                     model: str = "") -> None:
        self.recorded.append(status)


class Echo(DirectRoute):
    """Answers each direct call with "direct:" and its body, a loop turn later (the real
    route answers when the core settles the call's items)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__(cast(Routes, Recorded()))
        self.failing = fail
        self.freed = anyio.Event()  # a connection of a direct call was freed
        self.connections: list[weakref.ref[Any]] = []

    def start(self, call: DirectCall) -> None:
        self.connections.append(weakref.ref(call.conn, lambda _: self.freed.set()))
        if self.failing:
            self.fail(call, RuntimeError("a bug"), "unknown")
            return
        asyncio.get_running_loop().call_soon(
            self._write, call, Response(b"direct:" + bytes(call.body)), "t", ())


asgi = echoing(b"asgi:")  # what took ASGI's way says so


def post(body: bytes, *headers: bytes, path: bytes = b"/v1/batchstring",
         version: bytes = b"1.1") -> bytes:
    head = [b"POST " + path + b" HTTP/" + version, b"Host: t", *headers]
    if not any(h.lower().startswith(b"transfer-encoding") for h in headers):
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def exchange(data: bytes, answers: int, direct: DirectRoute) -> list[bytes]:
    """Send `data` in one write; the bodies of the first `answers` answers, in order."""
    async with serving(asgi, direct) as port:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await stream.send(data)
        received = b""
        bodies: list[bytes] = []
        with anyio.fail_after(10):
            while len(bodies) < answers:
                received += await stream.receive()
                while b"\r\n\r\n" in received:
                    head, rest = received.split(b"\r\n\r\n", 1)
                    if head.startswith(b"HTTP/1.1 100 "):  # interim: the answer follows
                        received = rest
                        continue
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(rest) < length:
                        break
                    bodies.append(rest[:length])
                    received = rest[length:]
        await stream.aclose()
    return bodies


@pytest.mark.parametrize(("request_", "way"), [
    (post(b"{}"), b"direct"),
    (post(b"{}", b"Idempotency-Key: k"), b"asgi"),  # may join a leader: it waits in a task
    (post(b"{}", b"Expect: 100-continue"), b"asgi"),  # the interim answer is uvicorn's
    (post(b"{}", b"Accept: text/event-stream"), b"asgi"),  # a stream: `api.stream`
    (post(b"{}", b"Accept: application/x-ndjson"), b"asgi"),
    (post(b"{}", b"Accept: application/json, */*"), b"direct"),
    (post(b"x" * (LIMIT + 1)), b"asgi"),  # over the limit: refused there, as it arrives
    (post(b"{}", version=b"1.0"), b"asgi"),
    (post(b"{}", path=b"/v1/batchstring?x=1"), b"asgi"),
    (post(b"{}", path=b"/other"), b"asgi"),
    (b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"2\r\n{}\r\n0\r\n\r\n", b"asgi"),
])
async def test_only_a_plain_request_on_the_hot_route_takes_the_direct_way(
    request_: bytes, way: bytes
) -> None:
    (body,) = await exchange(request_, 1, Echo())
    assert body.split(b":", 1)[0] == way


def v2_only(url: bytes) -> Shape | None:
    """Another room's shape for /v2/... (what `api.oip.infer_call` is to the server)."""
    return V1 if url.startswith(b"/v2/") else None


@pytest.mark.parametrize(("path", "method", "way"), [
    (b"/v2/models/m/infer", b"POST", b"direct"),
    (b"/v2/models/m/infer", b"PUT", b"asgi"),
    (b"/other", b"POST", b"asgi"),
    (b"/v1/batchstring", b"POST", b"direct"),
])
async def test_a_shape_given_for_other_urls_takes_them_the_direct_way(
    path: bytes, method: bytes, way: bytes
) -> None:
    route = Echo()
    route.shapes = v2_only
    request_ = post(b"{}", path=path).replace(b"POST ", method + b" ", 1)
    (body,) = await exchange(request_, 1, route)
    assert body.split(b":", 1)[0] == way


@pytest.mark.parametrize("first", [post(b"1"), post(b"1", b"Idempotency-Key: k")])
async def test_pipelined_requests_are_answered_in_order_whichever_way_they_take(
    first: bytes
) -> None:
    """A request pipelined behind one still unanswered waits in uvicorn's queue, then runs
    through ASGI, whichever way the one before it took."""
    direct = Echo()
    bodies = await exchange(first + post(b"2") + post(b"3"), 3, direct)
    way = b"asgi" if b"Idempotency-Key" in first else b"direct"
    assert bodies == [way + b":1", b"asgi:2", b"asgi:3"]
    assert cast(Recorded, direct.routes).recorded == [200] * (way == b"direct")


async def test_an_error_on_the_direct_way_is_a_json_500_and_the_connection_goes_on() -> None:
    bodies = await exchange(post(b"{}") + post(b"{}", b"Idempotency-Key: k"), 2,
                            Echo(fail=True))
    assert bodies == [b'{"error":{"code":"internal","message":"internal error"}}', b"asgi:{}"]


async def test_a_closed_connection_is_freed_without_the_collector() -> None:
    """A direct call and its connection refer to each other; once the connection is closed
    nothing may be left for the collector (it would walk ~25 objects per connection)."""
    direct = Echo()
    gc.disable()
    try:
        assert await exchange(post(b"{}"), 1, direct) == [b"direct:{}"]
        with anyio.fail_after(10):
            await direct.freed.wait()  # as soon as the server sees the close
    finally:
        gc.enable()
