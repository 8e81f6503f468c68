"""What batchgate's HTTP hot path uses of uvicorn's and httptools' internals, by name.

`api/http/protocol.py` subclasses uvicorn's private `HttpToolsProtocol` and drives its
httptools parser; `api/http/direct.py` stands a `DirectCall` where uvicorn keeps a request's
cycle and frames answers with uvicorn's `STATUS_LINE`; `api/http/draining.py` overrides two of
`uvicorn.Server`'s methods. pyproject.toml pins uvicorn, httptools and starlette to the minor
releases these tests passed on; after raising a pin, a failure here names what moved. Both
ways' real round trips are in test_direct.py and tests/e2e."""

from __future__ import annotations

import ast
import asyncio
import inspect
import socket
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any, cast

import anyio
import httptools
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from api.errors import ERRORS
from api.http import (
    CONNECTION,
    Connection,
    ConnectionLimits,
    DirectCall,
    DirectRoute,
    DrainingServer,
    GuardedHttpProtocol,
    Routes,
    guarded_protocol,
)

pytestmark = pytest.mark.anyio

# Everything of uvicorn's the hot path uses, in one place. It goes with the pins in
# pyproject.toml: when an upgrade fails a test here, re-read uvicorn's
# protocols/http/httptools_impl.py and server.py against these names and the modules above.

# HttpToolsProtocol's methods GuardedHttpProtocol overrides, with their parameters. __init__
# is passed on whole; it is built as uvicorn's Server.startup and loadtest/bench_guard.py do.
OVERRIDDEN = {
    "__init__": ("self", "config", "server_state", "app_state", "_loop"),
    "connection_made": ("self", "transport"),
    "connection_lost": ("self", "exc"),
    "data_received": ("self", "data"),
    "send_400_response": ("self", "msg"),
    "on_headers_complete": ("self",),
    "on_body": ("self", "body"),
    "on_message_complete": ("self",),
}
# What the guard and the direct way read, set or call on a protocol of uvicorn's.
PROTOCOL_NAMES = ("connections", "cycle", "headers", "url", "parser", "scope", "server_state",
                  "loop", "transport", "on_response_complete", "flow")
PARSER_METHODS = ("get_method", "get_http_version", "should_keep_alive")  # httptools'
# What the guard reads or sets on uvicorn's cycle (`protocol.cycle`). A DirectCall standing
# there carries these and every attribute uvicorn's protocol itself uses on its cycle.
CYCLE_NAMES = ("more_body", "response_complete", "response_started", "disconnected",
               "message_event", "keep_alive")
# uvicorn.Server's methods DrainingServer overrides, and what it and the gateway use.
SERVER_OVERRIDDEN = {
    "__init__": ("self", "config"),
    "handle_exit": ("self", "sig", "frame"),
    "on_tick": ("self", "counter"),
    "serve": ("self", "sockets"),  # to know its task: a signal while starting cancels it
    "run": ("self", "sockets"),  # that cancellation ends `run` quietly
}
SERVER_NAMES = ("should_exit", "force_exit", "started")
SERVER_SOCKETS = ("run", "serve")  # both take `sockets=` (the gateway's shared socket)
# The statuses the direct way writes with STATUS_LINE: its answer and every error's.
STATUSES = sorted({200, *(error.status for error in ERRORS.values())})


def _is_self(node: ast.expr, attr: str | None = None) -> bool:
    """`node` is `self` (or `self.<attr>`)."""
    if attr is not None:
        return isinstance(node, ast.Attribute) and node.attr == attr and _is_self(node.value)
    return isinstance(node, ast.Name) and node.id == "self"


def _tree(cls: type) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(cls)))


def cycle_attributes(cls: type) -> set[str]:
    """The attributes `cls`'s own code uses on `self.cycle`, or on a name bound to it."""
    tree = _tree(cls)
    aliases = {target.id for node in ast.walk(tree)
               if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
               and _is_self(node.value, "cycle")
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name)}
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and (_is_self(node.value, "cycle")
                 or (isinstance(node.value, ast.Name) and node.value.id in aliases))}


def set_on_self(cls: type) -> set[str]:
    """The attributes `cls`'s own code assigns on `self`."""
    return {node.attr for node in ast.walk(_tree(cls)) if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store) and _is_self(node.value)}


class App:
    """Answers every request `ok`, and keeps the scope it was called with."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


@asynccontextmanager
async def connected(protocol: type[HttpToolsProtocol], app: App
                    ) -> AsyncIterator[tuple[Any, socket.socket]]:
    """`protocol` built as uvicorn's `Server.startup` builds one, on one end of a socket
    pair; the other end, the client's, is yielded beside it."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", http=protocol)
    config.load()
    assert config.http_protocol_class is protocol
    loop = asyncio.get_running_loop()
    ours, client = socket.socketpair()
    client.setblocking(False)
    _, proto = await loop.connect_accepted_socket(
        lambda: protocol(config=config, server_state=ServerState(), app_state={}, _loop=loop),
        ours)
    try:
        yield proto, client
    finally:
        client.close()
        proto.transport.close()


REQUEST = b"POST /v1/batchstring HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"


async def ask(client: socket.socket, request: bytes = REQUEST) -> bytes:
    """Send `request`; one whole answer (head, and a body of its declared length)."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(client, request)
    received = b""
    with anyio.fail_after(5):
        while b"\r\n\r\n" not in received:
            received += await loop.sock_recv(client, 65536)
        head, body = received.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += await loop.sock_recv(client, 65536)
    return head + b"\r\n\r\n" + body


SUBCLASSES = pytest.mark.parametrize(("ours", "theirs", "overridden"), [
    (GuardedHttpProtocol, HttpToolsProtocol, OVERRIDDEN),
    (DrainingServer, uvicorn.Server, SERVER_OVERRIDDEN),
], ids=["protocol", "server"])


@SUBCLASSES
def test_the_overridden_methods_keep_their_parameters(
    ours: type, theirs: type, overridden: dict[str, tuple[str, ...]]
) -> None:
    for name, parameters in overridden.items():
        assert tuple(inspect.signature(getattr(theirs, name)).parameters) == parameters, name
        if name != "__init__":  # ours take what they need, and pass uvicorn's on
            assert tuple(inspect.signature(getattr(ours, name)).parameters) == parameters, name


@SUBCLASSES
def test_a_subclass_overrides_only_the_listed_methods_of_uvicorns(
    ours: type, theirs: type, overridden: dict[str, tuple[str, ...]]
) -> None:
    own = {name for name in vars(ours) if not name.startswith("__") or name == "__init__"}
    assert own & set(dir(theirs)) == set(overridden)


async def test_of_the_attributes_the_guard_sets_only_the_cycle_and_the_flow_are_uvicorns(
) -> None:
    async with connected(HttpToolsProtocol, App()) as (plain, client):
        await ask(client)  # uvicorn sets some only once a request begins
        uvicorns = set(vars(plain)) | set(dir(HttpToolsProtocol))
    assert set_on_self(GuardedHttpProtocol) & uvicorns == {"cycle", "flow"}


def test_of_the_attributes_draining_sets_only_should_exit_is_uvicorns() -> None:
    server = uvicorn.Server(uvicorn.Config(App()))
    uvicorns = set(vars(server)) | set(dir(uvicorn.Server))
    assert set_on_self(DrainingServer) & uvicorns == {"should_exit"}


async def test_a_protocol_built_as_uvicorn_builds_it_has_every_name_the_hot_path_uses() -> None:
    async with connected(guarded_protocol(ConnectionLimits()), App()) as (proto, client):
        assert (await ask(client)).startswith(b"HTTP/1.1 200 ")
        assert [name for name in PROTOCOL_NAMES if not hasattr(proto, name)] == []
        assert [name for name in PARSER_METHODS if not callable(getattr(proto.parser, name))
                ] == []
        assert proto in proto.connections  # counted once made: the guard's limit counts it
        assert proto.default_headers is proto.server_state.default_headers
        assert isinstance(proto.cycle, RequestResponseCycle)
        assert [name for name in CYCLE_NAMES if not hasattr(proto.cycle, name)] == []


async def test_the_key_the_guard_adds_to_the_scope_reaches_the_app() -> None:
    app = App()
    async with connected(guarded_protocol(ConnectionLimits()), app) as (proto, client):
        await ask(client)
        (scope,) = app.scopes
        assert scope is proto.cycle.scope is proto.scope
        assert scope[CONNECTION] is proto.departure


def test_a_direct_call_carries_every_attribute_uvicorn_uses_on_its_cycle() -> None:
    used = cycle_attributes(HttpToolsProtocol)
    assert "response_complete" in used  # the scan found uvicorn's cycle
    no_log = cast(Routes, SimpleNamespace(access_log=None))
    call = DirectCall(DirectRoute(no_log), cast(Connection, None), {}, True)
    assert [name for name in sorted(used | set(CYCLE_NAMES)) if not hasattr(call, name)] == []


@pytest.mark.parametrize("status", STATUSES)
def test_status_line_frames_every_status_the_direct_way_writes(status: int) -> None:
    phrase = {known.value: known.phrase for known in HTTPStatus}.get(status, "")  # 499: none
    assert STATUS_LINE[status] == b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode())


async def test_a_refusal_raised_in_a_parser_callback_is_the_only_answer() -> None:
    # The guard stops httptools by raising from on_headers_complete; httptools raises it as
    # an HttpParserError, which uvicorn answers with a 400 unless the guard holds it back.
    assert issubclass(httptools.HttpParserCallbackError, httptools.HttpParserError)
    headers = b"".join(b"X-%d: 1\r\n" % i for i in range(ConnectionLimits().max_headers + 1))
    async with connected(guarded_protocol(ConnectionLimits()), App()) as (_, client):
        reply = await ask(client, b"GET / HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n")
        with anyio.fail_after(5):  # then the half-close, and nothing more
            rest = await asyncio.get_running_loop().sock_recv(client, 65536)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert rest == b""


def test_the_server_has_what_the_gateway_and_draining_use() -> None:
    server = uvicorn.Server(uvicorn.Config(App()))
    assert [name for name in SERVER_NAMES if not hasattr(server, name)] == []
    assert inspect.iscoroutinefunction(uvicorn.Server.on_tick)  # DrainingServer awaits it
    for name in SERVER_SOCKETS:
        assert "sockets" in inspect.signature(getattr(server, name)).parameters, name


def test_the_lifespan_task_draining_cancels_is_found_as_it_looks_for_it() -> None:
    """`DrainingServer._lifespan_task` looks for the task running `self.lifespan.main()`
    (uvicorn's serve sets `lifespan`; its startup runs `main` in a task of its own)."""
    from uvicorn.lifespan.on import LifespanOn

    assert "self.lifespan = config.lifespan_class(config)" in inspect.getsource(
        uvicorn.Server._serve)
    assert "create_task(self.main())" in inspect.getsource(LifespanOn.startup)
    assert inspect.iscoroutinefunction(LifespanOn.main)
