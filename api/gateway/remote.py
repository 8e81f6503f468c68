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
import logging
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
    StatusCall,
    rendered,
)

log = logging.getLogger("batchgate.gateway")

CALL_TIMEOUT_S = 10.0
"""How long a gateway waits for the core to answer a call (`/admin/workers`, `/metrics`): a
core whose loop is stuck gets a 503, not a hang."""
READY_TIMEOUT_S = 1.0
"""How long `/readyz` waits for the core: it answers a ready call within a loop turn, so a
core silent this long is stalled (stopped, stuck in a turn) and the gateway is not ready."""
RECONNECT_FIRST_S = 0.02
RECONNECT_MAX_S = 0.1
"""How often a gateway whose core died tries to connect to the next one: soon at first
(the cell restarts a core at once), then no faster than this."""
BACKSTOP_MARGIN_S = 1.0
"""How long past a job's own timeout a gateway waits for the core's answer (its 504, at the
latest) before it answers 503 itself."""


class Receiver(Protocol):
    """Who takes a job's answer on a gateway without awaiting it (the direct way)."""

    def answered(self, outcome: Outcome) -> None: ...


class _Settles:
    """The ASGI way's receiver: settles the future its call awaits."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Outcome]) -> None:
        self.future = future

    def answered(self, outcome: Outcome) -> None:
        if not self.future.done():
            self.future.set_result(outcome)


class _CoreConnection(Framed):
    """One connection to one core process; what it carries is its `RemoteCore`'s, which
    outlives it."""

    spacing = GATEWAY_FRAME_SPACING_S
    busy_rate = GATEWAY_BUSY_RATE

    def __init__(self, core: RemoteCore) -> None:
        super().__init__()
        self.core = core

    def received(self, messages: list[Message]) -> None:
        jobs, calls = self.core.jobs, self.core.calls
        for message in messages:
            rid = message[1]
            job = jobs.pop(rid, None)
            if job is not None:
                job[1].answered(outcome_of(message))
                continue
            future = calls.pop(rid, None)
            if future is None or future.done():
                continue
            if message[0] == "error":
                future.set_exception(CoreUnavailable(f"the core failed a call: {message[2]}"))
            else:
                future.set_result(outcome_of(message))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.core.lost(self)


class RemoteCore:
    """The routes' `CoreView` in a gateway: every job goes to the core process.

    Every job sent is held here, by its id on the link, until its answer comes or it is
    withdrawn. When the link closes (the core process died), the held jobs stay: the gateway
    connects again, `reconnect_s` apart at first and up to `RECONNECT_MAX_S`, to the core
    the cell starts in its place, and sends them all again with their own deadlines. A job
    sent meanwhile waits to go with them. The core that died answered none of them (an
    answer it wrote before dying is read before the close), so none is answered twice; one
    it had running on a worker runs again (`resubmitted` counts them). Calls (`/readyz`,
    `/admin/workers`, `/metrics`) are not held: they fail at once, so a gateway without its
    core says it is not ready. `reconnect=False`: the jobs end 503 with the link instead.
    """

    def __init__(self, path: str, on_lost: Callable[[], None] | None = None, *,
                 reconnect: bool = True, resubmitted: Callable[[int], None] | None = None,
                 kept: Callable[[], bool] | None = None) -> None:
        """`kept`: whether the cell's supervisor is heard (a gateway whose supervisor
        stopped is not ready: nobody would restart the core if it died)."""
        self._path = path
        self._kept = kept or (lambda: True)
        self._on_lost = on_lost
        self._reconnect = reconnect
        self._resubmitted = resubmitted
        self._conn: _CoreConnection | None = None
        self._ids = itertools.count(1)
        self.jobs: dict[int, tuple[Message, Receiver]] = {}  # sent or to send, by rid
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self._unsent: set[int] = set()  # held when the link closed: sent again once
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, self._conn = await loop.create_unix_connection(lambda: _CoreConnection(self),
                                                          self._path)

    def connect_later(self) -> None:
        """No core listens yet (this gateway started while the cell restarts its core):
        connect once one does."""
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.get_running_loop().create_task(self._connect_again())

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.transport is not None

    def submit(self, job: Job, receiver: Receiver) -> int:
        """Send `job` without awaiting it: `receiver` takes its answer. Its id on the link,
        for `withdraw`; CoreUnavailable if the core is gone for good (`close`)."""
        if self._closed:
            raise CoreUnavailable("the core process is gone")
        rid = next(self._ids)
        message = run_message(rid, job)
        self.jobs[rid] = (message, receiver)
        conn = self._conn
        if conn is not None:
            conn.send(message)
        return rid

    def withdraw(self, rid: int) -> None:
        """The client of a submitted job left, or its backstop passed: the core withdraws
        it and answers nothing."""
        if self.jobs.pop(rid, None) is not None and self._conn is not None:
            self._conn.send(("cancel", rid))

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        try:
            rid = self.submit(job, _Settles(future))
        except CoreUnavailable:
            return unavailable()

        def end(outcome: Rendered) -> None:
            # The core withdraws the job and answers nothing for it: end the call here.
            if not future.done():
                self.withdraw(rid)
                future.set_result(outcome)

        backstop = loop.call_later(job.timeout + BACKSTOP_MARGIN_S, end, unresponsive(),
                                   context=QUIET)
        client.watch(lambda: end(client_closed()))
        try:
            return await future
        finally:
            backstop.cancel()
            client.unwatch()

    def lost(self, conn: _CoreConnection) -> None:
        """`conn` closed: calls fail; jobs wait for the next core, or end 503 without one."""
        if conn is not self._conn:
            return
        self._conn = None
        calls, self.calls = self.calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(CoreUnavailable("the core process is gone"))
        if self._on_lost is not None:
            self._on_lost()
        if not self._reconnect or self._closed:
            self.close()
            return
        self._unsent = set(self.jobs)
        self.connect_later()

    async def _connect_again(self) -> None:
        delay = RECONNECT_FIRST_S
        while not self._closed:
            try:
                await self.connect()
            except OSError:  # no core listens yet
                await asyncio.sleep(delay)
                delay = min(2 * delay, RECONNECT_MAX_S)
                continue
            conn = self._conn
            assert conn is not None
            again = sum(1 for rid in self._unsent if rid in self.jobs)
            self._unsent = set()
            if self.jobs:
                conn.send_all([message for message, _ in self.jobs.values()])
            log.info("connected to the core again; sent %d jobs (%d sent before)",
                     len(self.jobs), again)
            if again and self._resubmitted is not None:
                self._resubmitted(again)
            return

    def close(self) -> None:
        """No core comes back (the gateway is stopping): every held job ends 503."""
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        jobs, self.jobs = self.jobs, {}
        for _, receiver in jobs.values():
            receiver.answered(unavailable())
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()

    async def _call(self, name: str, within: float | None = None, args: tuple[Any, ...] = ()
                    ) -> Any:
        """The core's answer to call `name` with `args` (plain values), given `within`
        seconds (`CALL_TIMEOUT_S`)."""
        limit = CALL_TIMEOUT_S if within is None else within
        conn = self._conn
        if conn is None or conn.transport is None:
            raise CoreUnavailable("the core process is gone")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls[rid] = future
        conn.send(("call", rid, name, *args))
        try:
            return await asyncio.wait_for(future, limit)
        except TimeoutError:
            self.calls.pop(rid, None)
            raise CoreUnavailable(
                f"the core process did not answer within {limit:g} s") from None

    async def status(self, call: StatusCall, *args: Any) -> Any:
        """The core's answer to `call`, given `CALL_TIMEOUT_S` (`READY_TIMEOUT_S` for a
        ready call, which a core that cannot answer it answers "not ready" to)."""
        if call is not StatusCall.READY:
            return await self._call(call.value, args=args)
        try:
            body = await self._call(call.value, READY_TIMEOUT_S)
        except CoreUnavailable:
            body = {"ready": False, "workers_ready": 0, "draining": True}
        if not self._kept():
            body = {**body, "ready": False, "supervisor": "silent"}
        return body


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


__all__ = ["BACKSTOP_MARGIN_S", "CALL_TIMEOUT_S", "READY_TIMEOUT_S", "RECONNECT_FIRST_S",
           "RECONNECT_MAX_S", "Receiver", "RemoteCore",
           "RemoteRoute", "client_closed", "unavailable", "unresponsive"]
