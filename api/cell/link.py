"""The core's end of the link: serves every gateway's jobs through the one `Door`, so
priority, batching, admission, rate limits and idempotency stay global.

It admits each frame's jobs together and waits for them without a task, a future or a timer
each: a job's `Collation` tells the connection when it ends, deadlines fall due in 10 ms
slots with one timer per slot, and the answers of a turn are concluded together. A keyed job
(it may wait on its leader) and a status call run as tasks in the link's own task group, and
each answers something whatever happens: an error is logged and answered, never lost.

A frame's keyless jobs take the door's one way in (`Door.submit`): the rate step, then
admission. With rate limits shared between cells (`--state redis://`) the step is a round
trip, made by the step's own task (in the link's task group) for every frame that came
meanwhile; a job waiting for it is live already, so a cancel or the gateway going ends it
and it is never admitted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from api.config import Principal
from api.door import Door
from api.errors import CoreUnavailable
from api.gateway import HOST_CLOCK, Message, outcome_message
from api.http import (
    Collation,
    Deadlines,
    Job,
    Rendered,
    StatusCall,
    StatusTable,
    TurnEnds,
    answer,
)
from batcher import Clock, DeadlineExceeded, Item, Tier
from batcher.shared import Framed

log = logging.getLogger("batchgate.link")

DEADLINE_SLOT_S = 0.01  # a gateway's job times out at most this late
PRINCIPALS_KEPT = 4096  # distinct callers whose Principal a connection reuses
SPAWNS_QUEUED = 65_536  # tasks asked for and not yet started (started every loop turn)

Spawn = tuple[Callable[..., Coroutine[Any, Any, None]], tuple[Any, ...]]


class _LinkJob(Collation):
    """A gateway's job without an Idempotency-Key, from admission to its answer."""

    __slots__ = ("conn", "items", "job", "rid")

    def __init__(self, conn: _GatewayConnection, rid: int, job: Job) -> None:
        super().__init__(len(job.texts))
        self.conn, self.rid, self.job = conn, rid, job
        self.items: list[Item] = []

    def ended(self) -> None:
        self.conn.ended(self)


class _GatewayConnection(Framed):
    def __init__(self, door: Door, clock: Clock,
                 calls: StatusTable,
                 spawn: MemoryObjectSendStream[Spawn]) -> None:
        super().__init__()
        self._door, self._clock, self._calls, self._spawns = door, clock, calls, spawn
        self._loop = asyncio.get_running_loop()
        self._live: dict[int, Collation] = {}  # rid -> its job's collation, until it ends
        self._starting: set[int] = set()  # keyed jobs not yet waiting (or never: replays)
        self._gone: set[int] = set()  # of those, the ones whose client already left
        self._ended = TurnEnds[_LinkJob](self._conclude)
        self._off = door.core.after_turns(self._ended.flush)  # answers framed in the turn
        self._deadlines = Deadlines(DEADLINE_SLOT_S)
        self._principals: dict[tuple[int, str, str | None], Principal] = {}

    def received(self, messages: list[Message]) -> None:
        runs: list[_LinkJob] = []
        principals = self._principals
        now = HOST_CLOCK()  # a job's deadline came on the host's clock
        for message in messages:
            kind, rid = message[0], message[1]
            if kind == "run":
                (_, _, tier, account, key, texts, single, deadline, idempotency, model, trace,
                 stream) = message
                principal = principals.get((tier, account, key))
                if principal is None:
                    principal = self._principal(tier, account, key)
                if deadline <= now:
                    self._late(rid, principal.tier)
                    continue
                job = Job(principal, texts, single, deadline - now, idempotency, model, trace,
                          stream)
                if idempotency is None:
                    run = self._live[rid] = _LinkJob(self, rid, job)
                    runs.append(run)
                else:
                    self._starting.add(rid)
                    self._spawn(self._run, rid, job, principal.tier)
            elif kind == "cancel":
                if runs:  # its run may be in this frame
                    self._submit(runs)
                    runs = []
                self._cancel(rid)
            elif kind == "call":
                self._spawn(self._call, rid, message[2:], None)
        if runs:
            self._submit(runs)

    def _spawn(self, task: Callable[..., Coroutine[Any, Any, None]], rid: int, arg: Any,
               tier: Tier | None) -> None:
        """Run `task` in the link's task group (a protocol callback runs in no task, so
        the link's spawner starts it). If too many wait to start, answer that the core is
        busy: a job of `tier` its refusal (made only then: the door counts each refusal),
        a call (`tier` None) an error."""
        try:
            self._spawns.send_nowait((task, (rid, arg)))
        except anyio.WouldBlock:
            self._starting.discard(rid)
            if tier is None:
                self.send(("error", rid, "the core is busy"))
            else:
                self.send(outcome_message(rid, self._door.refusal(
                    CoreUnavailable("the core is too busy to take it now"), tier)))

    def _late(self, rid: int, tier: Tier) -> None:
        """A job whose time ran out before the core read it (the core stood still): the
        504 a single process gives a request whose deadline passed, never a run."""
        self.send(outcome_message(rid, self._door.refusal(
            DeadlineExceeded("the request's deadline passed before the core read it"), tier)))

    def _principal(self, tier: int, account: str, key: str | None) -> Principal:
        """A caller not seen lately: one Principal per caller, so that a frame's jobs of
        one caller share it (the door rate-limits them together)."""
        if len(self._principals) >= PRINCIPALS_KEPT:
            self._principals.clear()
        principal = self._principals[tier, account, key] = Principal(Tier(tier), account, key)
        return principal

    def _submit(self, runs: list[_LinkJob]) -> None:
        self._door.submit([run.job for run in runs], runs, self)

    def admitted(self, runs: Sequence[_LinkJob], results: Sequence[list[Item] | Rendered],
                 late: float) -> None:
        """A submitted frame's outcome (`Door.submit`): at once, or after its rate check."""
        now = self._loop.time()
        live, deadlines = self._live, self._deadlines
        for run, result in zip(runs, results, strict=True):
            if isinstance(result, list):
                run.items = result
                deadlines.add(run, run.job.timeout - late, now)
            elif not run.finished:  # refused (one that ended meanwhile was answered then)
                live.pop(run.rid, None)
                if self.transport is not None:
                    self.send(outcome_message(run.rid, result))

    def _cancel(self, rid: int) -> None:
        collation = self._live.pop(rid, None)
        if collation is not None:
            collation.leave()
        elif rid in self._starting:
            self._gone.add(rid)

    def ended(self, run: _LinkJob) -> None:
        """A job's collation ended (inside the owner's turn, a timer or a cancel): its
        answer is concluded once the turn is over, with the others that end in it."""
        self._ended.add(run)

    def _conclude(self, runs: list[_LinkJob]) -> None:
        live, unslot, conclude = self._live, self._deadlines.discard, self._door.conclude
        now = self._clock.now()
        answers: list[Message] = []
        for run in runs:
            live.pop(run.rid, None)
            unslot(run)
            outcome = conclude(run.job, run.items, run, now)
            run.items = []
            if not run.client_left:
                answers.append(outcome_message(run.rid, outcome))
        if answers and self.transport is not None:
            self.send_all(answers)

    def _register(self, rid: int, pending: Collation) -> None:
        self._starting.discard(rid)
        if rid in self._gone or self.transport is None:  # its client already left
            self._gone.discard(rid)
            pending.leave()
        else:
            self._live[rid] = pending

    async def _run(self, rid: int, job: Job) -> None:
        try:  # `Door.run` answers every error itself
            outcome = await self._door.run(job, None, functools.partial(self._register, rid))
        finally:
            self._live.pop(rid, None)
            self._starting.discard(rid)
            self._gone.discard(rid)
        self.send(outcome_message(rid, outcome))

    async def _call(self, rid: int, what: tuple[Any, ...]) -> None:
        name, args = what[0], what[1:]
        try:
            value = await answer(self._calls, StatusCall.named(name), args)
        except Exception as exc:  # answered: the gateway's caller gets a 503, not a wait
            log.error("the link's call %r failed", name, exc_info=exc)
            self.send(("error", rid, f"{type(exc).__name__} in {name!r}"))
            return
        self.send(("value", rid, value))

    def connection_lost(self, exc: Exception | None) -> None:
        """The gateway is gone: its clients are too. Withdraw what has not run."""
        self.transport = None
        self._off()
        live, self._live = self._live, {}
        for collation in live.values():
            collation.leave()
        self._deadlines.clear()


class LinkServer:
    """Serves every gateway's link in the core process; its tasks live in its task group."""

    def __init__(self, door: Door, clock: Clock, status: StatusTable) -> None:
        """`status`: every status call's handler (`api.door.StatusView.table`), the table a
        single process answers its own routes from."""
        self._door, self._clock, self._calls = door, clock, status
        self._server: asyncio.AbstractServer | None = None

    async def serve(self, path: str, *,
                    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen on `path` until cancelled (or `close`); started once it listens. The
        door's rate step waits in the link's task group (shared limits: their round trips)."""
        loop = asyncio.get_running_loop()
        spawn, spawned = anyio.create_memory_object_stream[Spawn](SPAWNS_QUEUED)
        async with anyio.create_task_group() as tasks, spawn, spawned:
            await tasks.start(self._door.rates.run)
            self._server = await loop.create_unix_server(
                lambda: _GatewayConnection(self._door, self._clock, self._calls, spawn), path
            )
            task_status.started()
            try:
                async for task, args in spawned:  # until the cell cancels it; tasks go too
                    tasks.start_soon(task, *args)
            finally:
                self._server.close()

    def close(self) -> None:
        """Stop accepting gateways."""
        if self._server is not None:
            self._server.close()


__all__ = ["DEADLINE_SLOT_S", "LinkServer"]
