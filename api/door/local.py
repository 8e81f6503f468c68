"""The core of this process as the HTTP side sees it: the direct way's local route, and the
routes' `CoreView` (the door's wait and the status views)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from api.door.door import Door
from api.http import (
    ClientWatch,
    Deadlines,
    DirectCall,
    DirectRoute,
    Job,
    Outcome,
    Rendered,
    Routes,
    StatusCall,
    StatusTable,
    TurnEnds,
    answer,
)
from batcher import Item


class LocalRoute(DirectRoute):
    """The direct way to the core in this process: the call is its items' `Collation`, a
    frame of one on the door's one way in (`Door.submit`), its deadline shares a 10 ms
    slot's timer, and the calls that end in one loop turn are answered together once it is
    over. With the rate limits shared between cells a call waits for its check (in the
    rate step's task); nothing then watches it, so nothing ends it meanwhile."""

    def __init__(self, routes: Routes, door: Door) -> None:
        super().__init__(routes)
        self.door = door
        self._deadlines = Deadlines()
        self._ended = TurnEnds[DirectCall](self._conclude)
        door.core.after_turns(self._ended.flush)  # a batch's answers leave in its turn

    def admit(self, call: DirectCall, job: Job) -> None:
        n = len(job.texts)
        call.outputs, call.remaining = [""] * n, n
        self.door.submit((job,), (call,), self)

    def admitted(self, calls: Sequence[DirectCall], results: Sequence[list[Item] | Rendered],
                 late: float) -> None:
        now = asyncio.get_running_loop().time()
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, Rendered):  # refused
                self.answer(call, result)
                continue
            job = call.job
            assert job is not None
            call.items = result
            self._deadlines.add(call, job.timeout - late, now)
            call.conn.departure.watch(call.leave)  # at once if the client already left

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
    """The routes' `CoreView` in a single process: the door runs jobs, and the status calls
    are answered from the status view's table, as the link answers a gateway's."""

    def __init__(self, door: Door, status: StatusTable) -> None:
        self._door, self._status = door, status

    async def run(self, job: Job, client: ClientWatch) -> Outcome:
        return await self._door.run(job, client)

    async def status(self, call: StatusCall, *args: Any) -> Any:
        return await answer(self._status, call, args)


__all__ = ["LocalCore", "LocalRoute"]
