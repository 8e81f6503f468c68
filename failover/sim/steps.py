"""Virtual time in steps: a `VirtualLoop` held open between steps, for a test to drive.

A test states a scenario event by event: a request now, a worker's answer now, then time
up to some instant. `Steps` keeps one loop and one task group alive across those calls, so
the tasks it started (the real `CoreOwner`, a `ContractPool`) stay pending between steps as
they would in a service, and each step runs them to rest: `call` does something inside the
loop at the current instant, `advance` moves time on to an instant, and both return only
once nothing is left to do up to it. A task that fails fails the step that ran it.

Why not `run_virtual` around the whole scenario: a hypothesis state machine takes its steps
one rule at a time from outside any loop, and a test reads the world between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio
import anyio.abc

from failover.sim.loop import VirtualLoop

T = TypeVar("T")

Begin = Callable[..., Coroutine[Any, Any, Any]]
"""A task to start: called with `task_status` (anyio's `TaskGroup.start`)."""


class _Held:
    """What the loop keeps between steps: none of it refers back to its `Steps`, so a
    finalizer can close it."""

    def __init__(self, start: float) -> None:
        self.loop = VirtualLoop(start)
        self.main: asyncio.Task[None] | None = None

    def close(self) -> None:
        loop, main = self.loop, self.main
        if loop.is_closed():
            return
        try:
            asyncio.get_running_loop()
            running = True
        except RuntimeError:
            running = False
        if main is not None and not main.done() and not running:
            main.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until(loop.time())
        if not loop.is_running():
            loop.close()


class Steps:
    """One virtual-time loop driven from outside, step by step, from `start` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        self._held = _Held(start)
        self._group: anyio.abc.TaskGroup
        self._finalizer = weakref.finalize(self, self._held.close)

    @property
    def loop(self) -> VirtualLoop:
        return self._held.loop

    @property
    def now(self) -> float:
        return self._held.loop.time()

    def start(self, *tasks: Begin) -> None:
        """Start `tasks` in order in the loop's long-lived task group, each once the one
        before has reported started; they run until `close`. Called again, it starts more
        in the same group."""
        if self._held.main is None:
            async def main() -> None:
                async with anyio.create_task_group() as group:
                    self._group = group
                    await anyio.Event().wait()  # until cancelled by `close`

            self._held.main = self.loop.create_task(main())
            self.advance(self.now)

        async def begin() -> None:
            for task in tasks:
                await self._group.start(task)

        started = self.loop.create_task(begin())
        self.advance(self.now)
        if not started.done():
            raise RuntimeError("a task that did not report started at once")
        started.result()

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` inside the loop at the current instant (where the tasks' anyio calls
        work), then let everything it set going run to rest at that instant."""

        async def once() -> T:
            return fn()

        task = self.loop.create_task(once())
        self.advance(self.now)
        if not task.done():
            raise RuntimeError("a call that waits: use `advance` to move time")
        return task.result()

    def advance(self, to: float) -> None:
        """Run everything up to virtual time `to`; the clock is at `to` after."""
        self.loop.run_until(to)
        self._check()

    def _check(self) -> None:
        """A task that failed fails this step, with its own error."""
        main = self._held.main
        if main is None or not main.done():
            return
        error = main.exception() if not main.cancelled() else None
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if error is not None:
            raise error
        raise RuntimeError("the tasks of these steps ended")

    def close(self) -> None:
        """Cancel the tasks and close the loop (also done when the steps are collected)."""
        self._finalizer()


__all__ = ["Begin", "Steps"]
