"""The link between a gateway process and the core process: one Unix-domain socket each.

Frames are length-prefixed pickles of a list of messages, and each side coalesces what it
sends during one event-loop turn into one frame: a batch of 100 answers leaves the core as
one write, not 100. Both peers are processes of the same server, started from the same
code, so pickle is safe here and is the fastest codec for these small tuples.

Messages are tuples of plain values (`run_message`, `outcome_message`): unpickling a
dataclass calls back into Python for every object, and that cost the core process more
per job than admitting it.

Gateway -> core: ("run", rid, tier, account, key, texts, single, timeout, idempotency),
("cancel", rid), ("call", rid, name).
Core -> gateway: ("ok", rid, outputs, waits, batch, batch_ids, attempts) for an `Answered`,
("no", rid, status, body, headers) for a `Rendered`, ("value", rid, value) for a "call".

`RemoteCore` is the gateway's `CoreView`: the routes call it exactly as they call the
core's `Door` in a single process, and the direct way (`api.direct.RemoteRoute`) submits to
it and takes each answer as a `Receiver`, with no future or task. `LinkServer` runs in the
core process and serves each gateway's jobs through the one `Door`, so priority, batching,
admission, rate limits and idempotency stay global. It admits each frame's jobs together
and waits for them without a task, a future or a timer each: a job's `Collation` tells the
connection when it ends, deadlines fall due in 10 ms slots with one timer per slot, and the
answers of a turn are concluded together.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import pickle
import struct
from collections.abc import Callable
from typing import Any, Protocol, cast

from starlette.requests import ClientDisconnect

from api.auth import Principal
from api.door import Answered, Door, Job, Outcome, Rendered, rendered
from api.errors import to_api_error
from api.requests import ClientWatch, Collation, Deadlines
from batcher import Item, RateMeter, Tier
from failover import NoHealthyWorker
from gpu_pool import WorkerInfo

log = logging.getLogger("batchgate.link")

_LENGTH = struct.Struct("!I")
CALLS = ("ready", "workers", "metrics_text", "gateways")
GATEWAY_FRAME_SPACING_S = 0.005
GATEWAY_BUSY_RATE = 1000.0
"""A gateway sending more than `GATEWAY_BUSY_RATE` messages a second to the core spaces
its frames `GATEWAY_FRAME_SPACING_S` apart. Every frame wakes the core, and a wake-up with
its frame's bookkeeping costs the core about as much CPU as admitting five jobs: at
thousands of requests a second a gateway would send a frame of one or two jobs every loop
turn. Spaced, the frames carry more jobs each, for at most the spacing in latency; below
the rate, where the core has CPU to spare, nothing waits."""
DEADLINE_SLOT_S = 0.01  # a gateway's job times out at most this late
CALL_TIMEOUT_S = 10.0
"""How long a gateway waits for the core to answer a call (`/readyz`, `/admin/workers`,
`/metrics`): a core whose loop is stuck gets a 503 (and `/readyz` a not-ready), not a hang."""
PRINCIPALS_KEPT = 4096  # distinct callers whose Principal a connection reuses


def run_message(rid: int, job: Job) -> tuple[Any, ...]:
    p = job.principal
    return ("run", rid, int(p.tier), p.account, p.key, job.texts, job.single, job.timeout,
            job.idempotency)


def outcome_message(rid: int, outcome: Outcome) -> tuple[Any, ...]:
    if isinstance(outcome, Answered):
        return ("ok", rid, outcome.outputs, outcome.waits, outcome.batch, outcome.batch_ids,
                outcome.attempts)
    return ("no", rid, outcome.status, outcome.body, outcome.headers)


def outcome_of(message: tuple[Any, ...]) -> Any:
    """The value a core -> gateway message carries: an `Outcome`, or a call's value."""
    kind = message[0]
    if kind == "ok":
        return Answered(*message[2:])
    if kind == "no":
        return Rendered(*message[2:])
    return message[2]


class _Framed(asyncio.Protocol):
    """Length-prefixed frames in, coalesced frames out: what is sent during one loop turn
    leaves as one frame, and, while more than `busy_rate` messages a second are sent, no
    sooner than `spacing` after the previous one."""

    spacing = 0.0
    busy_rate = 0.0

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._outbox: list[tuple[Any, ...]] = []
        self._last_flush = -math.inf
        self._sent = RateMeter()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass).
        self.transport = cast(asyncio.Transport, transport)

    def send(self, message: tuple[Any, ...]) -> None:
        self.send_all([message])

    def send_all(self, messages: list[tuple[Any, ...]]) -> None:
        """Queue `messages` for this turn's frame (or the next spaced one)."""
        if not self._outbox:
            loop = asyncio.get_running_loop()
            wait = -1.0
            if self.spacing:
                now = loop.time()
                self._sent.add(len(messages), now)
                if self._sent.rate(now) > self.busy_rate:
                    wait = self._last_flush + self.spacing - now
            if wait > 0:
                loop.call_later(wait, self._flush)
            else:
                loop.call_soon(self._flush)
        elif self.spacing:
            self._sent.add(len(messages), asyncio.get_running_loop().time())
        self._outbox += messages

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if self.transport is None or self.transport.is_closing():
            return
        if self.spacing:
            self._last_flush = asyncio.get_running_loop().time()
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
            self.received(messages)
        del buffer[:start]

    def received(self, messages: list[tuple[Any, ...]]) -> None:
        """One frame's messages, in the order they were sent."""
        raise NotImplementedError


# -- the core's side ---------------------------------------------------------------------------
class _LinkJob(Collation):
    """A gateway's job without an Idempotency-Key, from admission to its answer."""

    __slots__ = ("conn", "items", "job", "rid")

    def __init__(self, conn: _GatewayConnection, rid: int, job: Job) -> None:
        super().__init__(len(job.texts))
        self.conn, self.rid, self.job = conn, rid, job
        self.items: list[Item] = []

    def ended(self) -> None:
        self.conn.ended(self)


class _GatewayConnection(_Framed):
    def __init__(self, door: Door, calls: dict[str, Callable[[], Any]]) -> None:
        super().__init__()
        self._door = door
        self._calls = calls
        self._loop = asyncio.get_running_loop()
        self._live: dict[int, Collation] = {}  # rid -> its job's collation, until it ends
        self._starting: set[int] = set()  # keyed jobs not yet waiting (or never: replays)
        self._gone: set[int] = set()  # of those, the ones whose client already left
        self._ended: list[_LinkJob] = []  # to conclude at the end of this loop turn
        self._deadlines = Deadlines(DEADLINE_SLOT_S)
        self._principals: dict[tuple[int, str, str | None], Principal] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def received(self, messages: list[tuple[Any, ...]]) -> None:
        runs: list[_LinkJob] = []
        principals = self._principals
        for message in messages:
            kind, rid = message[0], message[1]
            if kind == "run":
                _, _, tier, account, key, texts, single, timeout, idempotency = message
                principal = principals.get((tier, account, key))
                if principal is None:
                    principal = self._principal(tier, account, key)
                job = Job(principal, texts, single, timeout, idempotency)
                if idempotency is None:
                    runs.append(_LinkJob(self, rid, job))
                else:
                    self._starting.add(rid)
                    self._spawn(self._run(rid, job))
            elif kind == "cancel":
                if runs:  # its run may be in this frame
                    self._submit(runs)
                    runs = []
                self._cancel(rid)
            elif kind == "call":
                self._spawn(self._call(rid, message[2]))
        if runs:
            self._submit(runs)

    def _principal(self, tier: int, account: str, key: str | None) -> Principal:
        """A caller not seen lately: one Principal per caller, so that a frame's jobs of
        one caller share it (the door rate-limits them together)."""
        if len(self._principals) >= PRINCIPALS_KEPT:
            self._principals.clear()
        principal = self._principals[tier, account, key] = Principal(Tier(tier), account, key)
        return principal

    def _submit(self, runs: list[_LinkJob]) -> None:
        results = self._door.submit_all([run.job for run in runs], runs)
        now = self._loop.time()
        for run, result in zip(runs, results, strict=True):
            if isinstance(result, Rendered):  # refused
                self.send(outcome_message(run.rid, result))
                continue
            run.items = result
            self._live[run.rid] = run
            self._deadlines.add(run, run.job.timeout, now)

    def _cancel(self, rid: int) -> None:
        collation = self._live.pop(rid, None)
        if collation is not None:
            collation.leave()
        elif rid in self._starting:
            self._gone.add(rid)

    def ended(self, run: _LinkJob) -> None:
        """A job's collation ended (inside the owner's turn, a timer or a cancel): its
        answer is concluded once the turn is over, with the others that end in it."""
        if not self._ended:
            self._loop.call_soon(self._conclude)
        self._ended.append(run)

    def _conclude(self) -> None:
        runs, self._ended = self._ended, []
        live, unslot, conclude = self._live, self._deadlines.discard, self._door.conclude
        now = self._door.service.clock.now()
        answers: list[tuple[Any, ...]] = []
        for run in runs:
            live.pop(run.rid, None)
            unslot(run)
            outcome = conclude(run.job, run.items, run, now)
            run.items = []
            if not run.client_left:
                answers.append(outcome_message(run.rid, outcome))
        if answers and self.transport is not None:
            self.send_all(answers)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _register(self, rid: int, pending: Collation) -> None:
        self._starting.discard(rid)
        if rid in self._gone or self.transport is None:  # its client already left
            self._gone.discard(rid)
            pending.leave()
        else:
            self._live[rid] = pending

    async def _run(self, rid: int, job: Job) -> None:
        try:
            outcome = await self._door.run(job, None, functools.partial(self._register, rid))
        finally:
            self._live.pop(rid, None)
            self._starting.discard(rid)
            self._gone.discard(rid)
        self.send(outcome_message(rid, outcome))

    async def _call(self, rid: int, name: str) -> None:
        result = self._calls[name]()
        if asyncio.iscoroutine(result):
            result = await result
        self.send(("value", rid, result))

    def connection_lost(self, exc: Exception | None) -> None:
        """The gateway is gone: its clients are too. Withdraw what has not run."""
        self.transport = None
        live, self._live = self._live, {}
        for collation in live.values():
            collation.leave()
        self._deadlines.clear()


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
class CoreLost(NoHealthyWorker):
    """The core process went away or stopped answering; the gateway cannot serve without
    it (a 503 where it reaches a route)."""


class Receiver(Protocol):
    """Who takes a job's answer on a gateway without awaiting it (`api.direct`)."""

    def answered(self, outcome: Outcome) -> None: ...


class _CoreConnection(_Framed):
    spacing = GATEWAY_FRAME_SPACING_S
    busy_rate = GATEWAY_BUSY_RATE

    def __init__(self, lost: Callable[[], None]) -> None:
        super().__init__()
        self.receivers: dict[int, Receiver] = {}  # the direct way's jobs, by rid
        self.waiting: dict[int, asyncio.Future[Any]] = {}  # the rest: awaited answers
        self._lost = lost

    def received(self, messages: list[tuple[Any, ...]]) -> None:
        receivers, waiting = self.receivers, self.waiting
        for message in messages:
            rid = message[1]
            receiver = receivers.pop(rid, None)
            if receiver is not None:
                receiver.answered(outcome_of(message))
                continue
            future = waiting.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(outcome_of(message))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        receivers, self.receivers = self.receivers, {}
        for receiver in receivers.values():
            receiver.answered(unavailable())
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

    def submit(self, job: Job, receiver: Receiver) -> int:
        """Send `job` without awaiting it: `receiver` takes its answer (or a 503 if the
        core goes first). Its id on the link, for `withdraw`; CoreLost if the core is gone."""
        conn = self._conn
        if conn is None or conn.transport is None:
            raise CoreLost("the core process is gone")
        rid = next(self._ids)
        conn.receivers[rid] = receiver
        conn.send(run_message(rid, job))
        return rid

    def withdraw(self, rid: int) -> None:
        """The client of a submitted job left: the core withdraws it and answers nothing."""
        conn = self._conn
        if conn is not None and conn.receivers.pop(rid, None) is not None:
            conn.send(("cancel", rid))

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        conn = self._conn
        if conn is None or conn.transport is None:
            return unavailable()
        rid = next(self._ids)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = future
        conn.send(run_message(rid, job))

        def left() -> None:
            # The core withdraws the job and answers nothing for it: end the call here.
            if not future.done():
                conn.waiting.pop(rid, None)
                conn.send(("cancel", rid))
                future.set_result(client_closed())

        client.watch(left)
        try:
            return await future
        except CoreLost:
            return unavailable()
        finally:
            client.unwatch()

    async def _call(self, name: str) -> Any:
        conn = self._conn
        if conn is None or conn.transport is None:
            raise CoreLost("the core process is gone")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = future
        conn.send(("call", rid, name))
        try:
            return await asyncio.wait_for(future, CALL_TIMEOUT_S)
        except TimeoutError:
            conn.waiting.pop(rid, None)
            raise CoreLost(f"the core process did not answer within {CALL_TIMEOUT_S:g} s"
                           ) from None

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


def client_closed() -> Rendered:
    """What `Door.run` returns for a client that left (the routes count it, write nothing)."""
    return rendered(to_api_error(ClientDisconnect()))


def unavailable() -> Rendered:
    return rendered(to_api_error(CoreLost("the core process is unavailable")))


__all__ = ["CALLS", "CoreLost", "LinkServer", "Receiver", "RemoteCore", "client_closed",
           "outcome_of", "run_message", "unavailable"]
