"""A real uvicorn server with batchgate's HTTP protocol, on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http import ConnectionLimits, DirectRoute, guarded_protocol


@asynccontextmanager
async def serving(app: ASGIApp, direct: DirectRoute | None = None,
                  http: type[asyncio.Protocol] | None = None) -> AsyncIterator[int]:
    """Its port; `http`: the protocol class, if not the guarded one with `direct`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until uvicorn accepts them
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=1,
                            http=http or guarded_protocol(ConnectionLimits(), direct))
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        try:
            yield sock.getsockname()[1]
        finally:
            server.should_exit = True


def echoing(prefix: bytes) -> ASGIApp:
    """An app that answers every HTTP request with `prefix` and the body it read."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await Response(prefix + body)(scope, receive, send)

    return app
