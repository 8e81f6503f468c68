"""The link between a gateway process and the core process: one Unix-domain socket each.

Frames are length-prefixed pickles of a list of messages, and each side coalesces what it
sends during one event-loop turn into one frame: a batch of 100 answers leaves the core as
one write, not 100. Both peers are processes of the same server, started from the same
code, so pickle is safe here and is the fastest codec for these small tuples.

Gateway -> core: ("run", rid, Job), ("cancel", rid), ("call", rid, name).
Core -> gateway: ("done", rid, result) — an Outcome for "run", the value for "call".

`RemoteCore` is the gateway's `CoreView`: the routes call it exactly as they call the
core's `Door` in a single process. `LinkServer` runs in the core process and serves each
gateway's jobs through the one `Door`, so priority, batching, admission, rate limits and
idempotency stay global.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import pickle
import struct
from collections.abc import Callable
from typing import Any, cast

from starlette.types import Receive

from api.door import Door, Job, Outcome, Rendered
from api.errors import error_body
from api.requests import PendingRequest
from gpu_pool import WorkerInfo

log = logging.getLogger("batchgate.link")

_LENGTH = struct.Struct("!I")
CALLS = ("ready", "workers", "metrics_text", "gateways")


class _Framed(asyncio.Protocol):
    """Length-prefixed frames in, coalesced frames out."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._outbox: list[tuple[Any, ...]] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass).
        self.transport = cast(asyncio.Transport, transport)

    def send(self, message: tuple[Any, ...]) -> None:
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if self.transport is None or self.transport.is_closing():
            return
        frame = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
        self.transport.write(_LENGTH.pack(len(frame)) + frame)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if len(buffer) - start - 4 < size:
                break
            messages = pickle.loads(memoryview(buffer)[start + 4:start + 4 + size])
            start += 4 + size
            for message in messages:
                self.received(message)
        del buffer[:start]

    def received(self, message: tuple[Any, ...]) -> None:
        raise NotImplementedError


# -- the core's side ---------------------------------------------------------------------------
class _GatewayConnection(_Framed):
    def __init__(self, door: Door, calls: dict[str, Callable[[], Any]]) -> None:
        super().__init__()
        self._door = door
        self._calls = calls
        self._live: dict[int, PendingRequest] = {}
        self._gone: set[int] = set()  # cancelled before their job started waiting
        self._tasks: set[asyncio.Task[None]] = set()

    def received(self, message: tuple[Any, ...]) -> None:
        kind, rid = message[0], message[1]
        if kind == "run":
            job: Job = message[2]
            if job.idempotency is None:
                self._door.submit(job, functools.partial(self._register, rid),
                                  functools.partial(self._done, rid))
            else:
                self._spawn(self._run(rid, job))
        elif kind == "cancel":
            pending = self._live.pop(rid, None)
            if pending is not None:
                pending.leave()
            else:
                self._gone.add(rid)
        elif kind == "call":
            self._spawn(self._call(rid, message[2]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _register(self, rid: int, pending: PendingRequest) -> None:
        if rid in self._gone or self.transport is None:  # its client already left
            self._gone.discard(rid)
            pending.leave()
        else:
            self._live[rid] = pending

    def _done(self, rid: int, outcome: Outcome) -> None:
        self._live.pop(rid, None)
        self._gone.discard(rid)
        self.send(("done", rid, outcome))

    async def _run(self, rid: int, job: Job) -> None:
        try:
            outcome = await self._door.run(job, None, functools.partial(self._register, rid))
        finally:
            self._live.pop(rid, None)
            self._gone.discard(rid)
        self.send(("done", rid, outcome))

    async def _call(self, rid: int, name: str) -> None:
        result = self._calls[name]()
        if asyncio.iscoroutine(result):
            result = await result
        self.send(("done", rid, result))

    def connection_lost(self, exc: Exception | None) -> None:
        """The gateway is gone: its clients are too. Withdraw what has not run."""
        self.transport = None
        for pending in self._live.values():
            pending.leave()
        self._live.clear()


class LinkServer:
    """Serves every gateway's link in the core process."""

    def __init__(self, door: Door) -> None:
        self._door = door
        self._calls: dict[str, Callable[[], Any]] = {
            "ready": door.ready, "workers": door.workers, "metrics_text": door.metrics_text,
            "gateways": door.gateways,
        }
        self._server: asyncio.AbstractServer | None = None

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _GatewayConnection(self._door, self._calls), path
        )

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


# -- the gateway's side ------------------------------------------------------------------------
class CoreLost(ConnectionError):
    """The core process went away; the gateway cannot serve without it."""


class _CoreConnection(_Framed):
    def __init__(self, lost: Callable[[], None]) -> None:
        super().__init__()
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self._lost = lost

    def received(self, message: tuple[Any, ...]) -> None:
        future = self.waiting.pop(message[1], None)
        if future is not None and not future.done():
            future.set_result(message[2])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(CoreLost("the core process is gone"))
        self.waiting.clear()
        self._lost()


class RemoteCore:
    """The routes' `CoreView` in a gateway: every job goes to the core process."""

    def __init__(self, path: str, on_lost: Callable[[], None]) -> None:
        self._path = path
        self._on_lost = on_lost
        self._conn: _CoreConnection | None = None
        self._ids = itertools.count(1)

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, self._conn = await loop.create_unix_connection(
            lambda: _CoreConnection(self._on_lost), self._path
        )

    async def run(self, job: Job, receive: Receive) -> Outcome:
        conn = self._conn
        if conn is None or conn.transport is None:
            return _unavailable()
        rid = next(self._ids)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = future
        conn.send(("run", rid, job))
        watch = asyncio.ensure_future(receive())

        def left(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None \
                    and done.result()["type"] == "http.disconnect" and not future.done():
                conn.send(("cancel", rid))

        watch.add_done_callback(left)
        try:
            return await future
        except CoreLost:
            return _unavailable()
        finally:
            watch.cancel()

    async def _call(self, name: str) -> Any:
        conn = self._conn
        if conn is None or conn.transport is None:
            raise CoreLost("the core process is gone")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = future
        conn.send(("call", rid, name))
        return await future

    async def ready(self) -> dict[str, object]:
        try:
            result: dict[str, object] = await self._call("ready")
            return result
        except CoreLost:
            return {"ready": False, "workers_ready": 0, "draining": True}

    async def workers(self) -> list[WorkerInfo]:
        result: list[WorkerInfo] = await self._call("workers")
        return result

    async def gateways(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("gateways")
        return result

    async def metrics_text(self) -> bytes:
        result: bytes = await self._call("metrics_text")
        return result


def _unavailable() -> Rendered:
    return Rendered(503, error_body("no_healthy_worker", "the core process is unavailable"),
                    (("Retry-After", "1"),))


__all__ = ["CALLS", "CoreLost", "LinkServer", "RemoteCore"]
