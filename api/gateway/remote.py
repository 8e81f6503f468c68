"""The gateway's end of the link: the routes' `CoreView` (`RemoteCore`) and the direct way's
route (`RemoteRoute`), both sending jobs to the core process.

The core keeps each job's deadline. The gateway keeps a backstop of its own, the job's
timeout plus `BACKSTOP_MARGIN_S`: a core that stops answering with its socket open (stopped,
stuck in a long turn) costs each waiting request a 503 `core_unavailable` with Retry-After in
bounded time, never a hang.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, Protocol

from api.errors import ClientClosed, CoreUnavailable, to_api_error
from api.gateway.frames import (
    GATEWAY_BUSY_RATE,
    GATEWAY_FRAME_SPACING_S,
    Framed,
    Message,
    outcome_of,
    run_message,
)
from api.http import (
    QUIET,
    ClientWatch,
    Deadlines,
    DirectCall,
    DirectRoute,
    Job,
    Outcome,
    Rendered,
    Routes,
    rendered,
)

CALL_TIMEOUT_S = 10.0
"""How long a gateway waits for the core to answer a call (`/admin/workers`, `/metrics`): a
core whose loop is stuck gets a 503, not a hang."""
READY_TIMEOUT_S = 1.0
"""How long `/readyz` waits for the core: it answers a ready call within a loop turn, so a
core silent this long is stalled (stopped, stuck in a turn) and the gateway is not ready."""
BACKSTOP_MARGIN_S = 1.0
"""How long past a job's own timeout a gateway waits for the core's answer (its 504, at the
latest) before it answers 503 itself."""


class Receiver(Protocol):
    """Who takes a job's answer on a gateway without awaiting it (the direct way)."""

    def answered(self, outcome: Outcome) -> None: ...


class _CoreConnection(Framed):
    spacing = GATEWAY_FRAME_SPACING_S
    busy_rate = GATEWAY_BUSY_RATE

    def __init__(self, lost: Callable[[], None]) -> None:
        super().__init__()
        self.receivers: dict[int, Receiver] = {}  # the direct way's jobs, by rid
        self.waiting: dict[int, asyncio.Future[Any]] = {}  # the rest: awaited answers
        self._lost = lost

    def received(self, messages: list[Message]) -> None:
        receivers, waiting = self.receivers, self.waiting
        for message in messages:
            rid = message[1]
            receiver = receivers.pop(rid, None)
            if receiver is not None:
                receiver.answered(outcome_of(message))
                continue
            future = waiting.pop(rid, None)
            if future is None or future.done():
                continue
            if message[0] == "error":
                future.set_exception(CoreUnavailable(f"the core failed a call: {message[2]}"))
            else:
                future.set_result(outcome_of(message))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        receivers, self.receivers = self.receivers, {}
        for receiver in receivers.values():
            receiver.answered(unavailable())
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(CoreUnavailable("the core process is gone"))
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

    def submit(self, job: Job, receiver: Receiver) -> int:
        """Send `job` without awaiting it: `receiver` takes its answer (or a 503 if the
        core goes first). Its id on the link, for `withdraw`; CoreUnavailable if the core is
        gone."""
        conn = self._conn
        if conn is None or conn.transport is None:
            raise CoreUnavailable("the core process is gone")
        rid = next(self._ids)
        conn.receivers[rid] = receiver
        conn.send(run_message(rid, job))
        return rid

    def withdraw(self, rid: int) -> None:
        """The client of a submitted job left, or its backstop passed: the core withdraws
        it and answers nothing."""
        conn = self._conn
        if conn is not None and conn.receivers.pop(rid, None) is not None:
            conn.send(("cancel", rid))

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        conn = self._conn
        if conn is None or conn.transport is None:
            return unavailable()
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        conn.waiting[rid] = future
        conn.send(run_message(rid, job))

        def end(outcome: Rendered) -> None:
            # The core withdraws the job and answers nothing for it: end the call here.
            if not future.done():
                conn.waiting.pop(rid, None)
                conn.send(("cancel", rid))
                future.set_result(outcome)

        backstop = loop.call_later(job.timeout + BACKSTOP_MARGIN_S, end, unresponsive(),
                                   context=QUIET)
        client.watch(lambda: end(client_closed()))
        try:
            return await future
        except CoreUnavailable:
            return unavailable()
        finally:
            backstop.cancel()
            client.unwatch()

    async def _call(self, name: str, within: float | None = None) -> Any:
        """The core's answer to call `name`, given `within` seconds (`CALL_TIMEOUT_S`)."""
        limit = CALL_TIMEOUT_S if within is None else within
        conn = self._conn
        if conn is None or conn.transport is None:
            raise CoreUnavailable("the core process is gone")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = future
        conn.send(("call", rid, name))
        try:
            return await asyncio.wait_for(future, limit)
        except TimeoutError:
            conn.waiting.pop(rid, None)
            raise CoreUnavailable(
                f"the core process did not answer within {limit:g} s") from None

    async def ready(self) -> dict[str, object]:
        try:
            result: dict[str, object] = await self._call("ready", READY_TIMEOUT_S)
            return result
        except CoreUnavailable:
            return {"ready": False, "workers_ready": 0, "draining": True}

    async def workers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("workers")
        return result

    async def gateways(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("gateways")
        return result

    async def metrics_text(self) -> bytes:
        result: bytes = await self._call("metrics_text")
        return result


class RemoteRoute(DirectRoute):
    """The direct way of a gateway: the job goes over the link, and the core's answer comes
    back to the call (`DirectCall.answered`). A client that leaves has its job withdrawn
    there; a core that does not answer by the backstop gets the call a 503."""

    def __init__(self, routes: Routes, core: RemoteCore) -> None:
        super().__init__(routes)
        self.core = core
        self._backstops = Deadlines()

    def admit(self, call: DirectCall, job: Job) -> None:
        try:
            call.rid = self.core.submit(job, call)
        except CoreUnavailable:
            self.answer(call, unavailable())
            return
        self._backstops.add(call, job.timeout + BACKSTOP_MARGIN_S,
                            asyncio.get_running_loop().time())
        call.conn.departure.watch(call.leave)

    def answered(self, call: DirectCall, outcome: Outcome) -> None:
        call.finished = True  # a hang-up from now on changes nothing
        self._backstops.discard(call)
        call.conn.departure.unwatch()
        self.answer(call, outcome)

    def ended(self, call: DirectCall) -> None:
        """A hang-up, or the backstop (the call's collation expired), before the answer."""
        self._backstops.discard(call)
        call.conn.departure.unwatch()
        self.core.withdraw(call.rid)
        self.answer(call, unresponsive() if call.timed_out else client_closed())


def client_closed() -> Rendered:
    """What a call whose client left ends with (the routes count it, write nothing)."""
    return rendered(to_api_error(ClientClosed("the client closed the connection")))


def unavailable() -> Rendered:
    return rendered(to_api_error(CoreUnavailable("the core process is unavailable")))


def unresponsive() -> Rendered:
    return rendered(to_api_error(CoreUnavailable(
        "the core process did not answer by the request's deadline")))


__all__ = ["BACKSTOP_MARGIN_S", "CALL_TIMEOUT_S", "READY_TIMEOUT_S", "Receiver", "RemoteCore",
           "RemoteRoute", "client_closed", "unavailable", "unresponsive"]
