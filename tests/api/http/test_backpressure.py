"""A client that leaves its answers unread is not read again until it takes them, and is cut
off after the body timeout (`api.http.backpressure`): on both ways, under the real uvicorn
server over loopback sockets; the flow control's rule itself over a recording transport.
With real server processes and their memory: tests/e2e/test_backpressure.py."""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import cast

import anyio
import pytest
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl

from api.http import ConnectionLimits, DirectCall, DirectRoute, Routes, guarded_protocol
from api.http.backpressure import WRITE_HIGH_WATER, Backpressure
from tests.api.serving import serving

pytestmark = pytest.mark.anyio
ANSWER = b"a" * 1_000_000  # more than loopback's socket buffers take in a few answers
UNREAD_S = 0.5  # the body timeout of these servers
PLAIN = b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
KEYED = PLAIN.replace(b"Host: t", b"Host: t\r\nIdempotency-Key: k")  # takes ASGI's way
# uvicorn's FlowControl, which `Backpressure` subclasses and stands in `protocol.flow`: the
# methods it overrides (uvicorn's protocol and cycle call them there), and what it reads and
# sets. The pin on uvicorn in pyproject.toml goes with these (tests/api/http/
# test_uvicorn_internals.py holds the rest).
FLOW_OVERRIDDEN = ("pause_reading", "resume_reading", "pause_writing", "resume_writing")
FLOW_NAMES = ("read_paused", "write_paused", "_transport")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


class Counted:
    """What the server did with the one connection: requests begun (by either way), and
    whether it holds the connection; a waiter hears each change."""

    def __init__(self) -> None:
        self.begun = 0
        self.opened = self.lost = False
        self._changed = anyio.Event()

    def begin(self) -> None:
        self.begun += 1
        self._poke()

    def connected(self, held: bool) -> None:
        if held:
            self.opened = True
        else:
            self.lost = True
        self._poke()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


class BigDirect(DirectRoute):
    """Answers every direct call with `ANSWER`, a loop turn later."""

    def __init__(self, counted: Counted) -> None:
        super().__init__(cast(Routes, SimpleNamespace(
            access_log=None, limits=SimpleNamespace(max_body_bytes=1000),
            record_later=lambda *args: None)))
        self.counted = counted

    def start(self, call: DirectCall) -> None:
        self.counted.begin()
        asyncio.get_running_loop().call_soon(self._write, call, Response(ANSWER), "t", ())


def big_app(counted: Counted) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            counted.begin()
            await receive()
            await Response(ANSWER)(scope, receive, send)

    return app


@asynccontextmanager
async def counted_server(counted: Counted) -> AsyncIterator[int]:
    """A real uvicorn server with the guarded protocol, its connections told to `counted`;
    its port."""
    guarded = guarded_protocol(ConnectionLimits(body_timeout=UNREAD_S), BigDirect(counted))

    class Watched(guarded):  # type: ignore[valid-type,misc]  # a class made at run time
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            counted.connected(True)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            counted.connected(False)

    async with serving(big_app(counted), http=Watched) as port:
        yield port


async def send_unread(port: int, request: bytes, n: int, counted: Counted) -> None:
    """Send `request` `n` times on one connection, each once the server has begun the one
    before it (so it is read after that one's answer is written), and read nothing; return
    once the server has begun all `n` or closed the connection."""
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setblocking(False)
    await loop.sock_connect(client, ("127.0.0.1", port))
    try:
        await counted.wait_until(lambda: counted.opened)
        for i in range(n):
            await loop.sock_sendall(client, request)
            await counted.wait_until(lambda: counted.begun > i or counted.lost)  # noqa: B023
            if counted.lost:
                return
    finally:
        client.close()


@pytest.mark.parametrize("request_", [PLAIN, KEYED], ids=["direct", "asgi"])
async def test_a_client_that_reads_nothing_is_not_read_again_and_is_cut_off(
    request_: bytes
) -> None:
    counted = Counted()
    async with counted_server(counted) as port:
        with anyio.fail_after(10):
            await send_unread(port, request_, 30, counted)
        assert counted.lost  # closed by the server, what it held unread discarded
    assert counted.begun < 10  # the rest were never read: their answers never made


@pytest.mark.parametrize("request_", [PLAIN, KEYED], ids=["direct", "asgi"])
async def test_a_client_that_reads_every_answer_gets_them_all(request_: bytes) -> None:
    """Ten requests in one write, ten 1 MB answers read whole: reading paused and resumed
    with the buffer on both ways, and nothing cut off."""
    counted = Counted()
    async with counted_server(counted) as port:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await stream.send(request_ * 10)
        received = bytearray()
        with anyio.fail_after(10):
            while received.count(ANSWER) < 10:
                received += await stream.receive(1 << 20)
        await stream.aclose()
    assert received.count(b"HTTP/1.1 200 OK") == 10


class Recording:
    """A transport that records what the flow control asks of it."""

    def __init__(self) -> None:
        self.reading = True
        self.aborted = anyio.Event()
        self.limits: dict[str, int | None] = {}

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = {"high": high, "low": low}

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 1

    def abort(self) -> None:
        self.aborted.set()


def flow(timeout: float = 60.0) -> tuple[Backpressure, Recording]:
    transport = Recording()
    return Backpressure(cast(asyncio.Transport, transport), asyncio.get_running_loop(),
                        timeout), transport


async def test_reading_waits_for_both_uvicorn_and_the_buffer() -> None:
    backpressure, transport = flow()
    assert transport.limits["high"] == WRITE_HIGH_WATER
    backpressure.pause_reading()  # uvicorn: a pipelined request waits
    backpressure.pause_writing()  # the transport: an answer waits unsent
    backpressure.resume_reading()  # uvicorn: the request before it is answered
    assert not transport.reading
    backpressure.resume_writing()  # the client took the answer
    assert transport.reading
    backpressure.stop()


async def test_an_answer_unread_past_the_timeout_aborts_the_connection() -> None:
    backpressure, transport = flow(timeout=0.05)
    backpressure.pause_writing()
    with anyio.fail_after(5):
        await transport.aborted.wait()


async def test_an_answer_taken_in_time_stops_the_deadline() -> None:
    backpressure, transport = flow(timeout=0.05)
    backpressure.pause_writing()
    backpressure.resume_writing()
    assert backpressure._deadline is None  # no timer left to abort it
    assert not transport.aborted.is_set()


def test_uvicorns_flow_control_has_what_backpressure_overrides_and_uses() -> None:
    own = {name for name in vars(Backpressure) if not name.startswith("__")}
    assert own & set(dir(FlowControl)) == set(FLOW_OVERRIDDEN)
    for name in FLOW_OVERRIDDEN:
        assert tuple(inspect.signature(getattr(FlowControl, name)).parameters) == ("self",)
    plain = FlowControl(cast(asyncio.Transport, Recording()))
    assert [name for name in FLOW_NAMES if not hasattr(plain, name)] == []
