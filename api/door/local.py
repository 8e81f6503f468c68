"""The core of this process as the HTTP side sees it: the direct way's local route (and its
variant for rate limits shared between cells), and the routes' `CoreView` (the door's wait
and the status views)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from anyio.abc import TaskStatus

from api.door.door import Door
from api.door.status import StatusView
from api.http import (
    ClientWatch,
    Deadlines,
    DirectCall,
    DirectRoute,
    Job,
    Outcome,
    Rendered,
    Routes,
    TurnEnds,
)
from batcher import Closed


class LocalRoute(DirectRoute):
    """The direct way to the core in this process: the call is its items' `Collation`, its
    deadline shares a 10 ms slot's timer, and the calls that end in one loop turn are
    answered together once it is over."""

    def __init__(self, routes: Routes, door: Door) -> None:
        super().__init__(routes)
        self.door = door
        self._deadlines = Deadlines()
        self._ended = TurnEnds[DirectCall](self._conclude)

    def admit(self, call: DirectCall, job: Job) -> None:
        n = len(job.texts)
        call.outputs, call.remaining = [""] * n, n
        result = self.door.submit_all((job,), (call,))[0]
        if isinstance(result, Rendered):  # refused
            self.answer(call, result)
            return
        call.items = result
        self._deadlines.add(call, job.timeout, asyncio.get_running_loop().time())
        call.conn.departure.watch(call.leave)

    def ended(self, call: DirectCall) -> None:
        self._ended.add(call)

    def _conclude(self, calls: list[DirectCall]) -> None:
        conclude, discard = self.door.conclude, self._deadlines.discard
        now = self.door.clock.now()
        for call in calls:
            job = call.job
            assert job is not None
            try:
                discard(call)
                call.conn.departure.unwatch()
                outcome = conclude(job, call.items, call, now)
                call.items = []
            except Exception as exc:
                self.fail(call, exc, job.principal.tier.label)
                continue
            self.answer(call, outcome)


class SharedLocalRoute(LocalRoute):
    """The direct way when the rate limits are shared between cells (`Door.shared`): a
    check is a round trip, so the calls wait for it in a list, and one task (`serve`, in
    the lifespan's task group) checks all that came meanwhile in one call and admits
    those that pass. The list holds at most one call per open connection. While Redis is
    out a check may be the one that asks it again, which can take the whole timeout: then
    it runs beside the loop, so the calls after it are decided (locally) at once."""

    def __init__(self, routes: Routes, door: Door) -> None:
        super().__init__(routes, door)
        self._waiting: list[DirectCall] = []
        self._checking: dict[int, list[DirectCall]] = {}  # checks under way, by id()
        self._wake = asyncio.Event()

    @property
    def checking(self) -> int:
        """Calls whose check is under way."""
        return sum(len(calls) for calls in self._checking.values())

    def admit(self, call: DirectCall, job: Job) -> None:
        n = len(job.texts)
        call.outputs, call.remaining = [""] * n, n
        self._waiting.append(call)
        self._wake.set()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Check and admit the waiting calls until cancelled; those left then are refused."""
        shared = self.door.shared
        assert shared is not None, "the shared route needs shared limits"
        async with anyio.create_task_group() as tg:
            task_status.started()
            try:
                while True:
                    await self._wake.wait()
                    self._wake.clear()
                    calls, self._waiting = self._waiting, []
                    self._checking[id(calls)] = calls
                    if shared.out:
                        tg.start_soon(self._check, calls)
                    else:
                        await self._check(calls)
            finally:
                left = [c for calls in self._checking.values() for c in calls]
                left += self._waiting
                self._checking, self._waiting = {}, []
                for call in left:
                    self.answer(call, self.door.refusal(
                        Closed("the server is shutting down"), self._job(call).principal.tier))

    async def _check(self, calls: list[DirectCall]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        jobs = [self._job(call) for call in calls]
        results = await self.door.submit_shared(jobs, calls)
        self._checking.pop(id(calls), None)
        now = loop.time()
        for call, job, result in zip(calls, jobs, results, strict=True):
            if isinstance(result, Rendered):
                self.answer(call, result)
            else:  # its deadline stays where it was: the check's time comes off
                call.items = result
                self._deadlines.add(call, job.timeout - (now - started), now)
                call.conn.departure.watch(call.leave)  # at once if the client already left

    @staticmethod
    def _job(call: DirectCall) -> Job:
        job = call.job
        assert job is not None
        return job


class LocalCore:
    """The routes' `CoreView` in a single process."""

    def __init__(self, door: Door, status: StatusView) -> None:
        self._door, self._status = door, status

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        return await self._door.run(job, client)

    async def ready(self) -> dict[str, object]:
        return await self._status.ready()

    async def workers(self) -> list[dict[str, Any]]:
        return await self._status.workers()

    async def capacity(self) -> tuple[int, int, int] | None:
        return await self._status.capacity()

    async def metrics_text(self) -> bytes:
        return await self._status.metrics_text()

    async def cell(self) -> dict[str, Any]:
        return await self._status.cell()

    async def models(self, method: str, name: str | None, version: str | None,
                     body: bytes) -> tuple[int, dict[str, Any]]:
        return await self._status.models(method, name, version, body)


__all__ = ["LocalCore", "LocalRoute", "SharedLocalRoute"]
