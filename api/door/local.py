"""The core of this process as the HTTP side sees it: the direct way's local route, and the
routes' `CoreView` (the door's wait and the status views)."""

from __future__ import annotations

import asyncio
from typing import Any

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

    async def metrics_text(self) -> bytes:
        return await self._status.metrics_text()

    async def gateways(self) -> list[dict[str, Any]]:
        return await self._status.gateways()


__all__ = ["LocalCore", "LocalRoute"]
