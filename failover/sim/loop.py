"""Virtual time for the simulator: an asyncio event loop whose clock jumps.

The loop's `time()` is a number that moves only when every task waits: then, instead of
blocking in `select` for the time until its next timer, the loop adds that time to its
clock and runs the timer at once. So anyio code (the real `CoreOwner`, a pool, the
clients) runs unchanged, reads the loop's time through `batcher.LoopClock`, and a minute of
traffic takes what its events cost to process, not a minute.

Why asyncio and not trio's `MockClock` (the tests' virtual time): the planner runs on the
runtime dependencies alone, which have no trio; asyncio runs ready callbacks in the order
they were scheduled, where trio shuffles tasks woken at the same instant, so a seed gives
one outcome; and it is about three times faster here. Nothing in this loop may wait for a
file descriptor or a thread: nothing could ever wake it (`VirtualTimeError`).

Stepped (`run_until`), the loop runs only as far as its caller says: a test holds it open
between steps, its tasks pending, and moves time on as its scenario goes (`Steps`).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

EPSILON_S = 1e-9
"""A time this close ahead of the clock is due: the jumps add float noise (asyncio's own
loop runs a timer this early, its clock's resolution)."""
SPIN_LIMIT = 200_000
"""Loop passes at one instant, stepped, after which the loop is taken to spin: a task that
is always ready again at the same time would hold a step forever in real time."""


class VirtualTimeError(RuntimeError):
    """Raised by the loop when every task waits and no timer is set: in virtual time that
    is a deadlock (nothing outside the loop can ever wake it)."""


class _Jumping(selectors.BaseSelector):
    """A selector that never waits: a wait of `timeout` seconds moves the loop's clock."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        if loop is not None and loop.horizon is not None and loop.reached(timeout):
            return []
        if timeout is None:
            raise VirtualTimeError("every task waits and no timer is set: nothing can wake "
                                   "the loop in virtual time")
        if timeout > 0 and self.loop is not None:
            self.loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop in virtual time, starting at `start` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _Jumping()
        super().__init__(selector)
        selector.loop = self
        self._now = start
        self.jumps = 0  # how often the clock moved: one per distinct event time
        self.horizon: float | None = None  # stepped: the time this step runs to
        self._spins = 0  # loop passes at this instant, stepped

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self.jumps += 1
        self._spins = 0

    def run_until(self, to: float) -> None:
        """Run every task as far as it goes up to virtual time `to` and stop there, the
        clock at `to`: everything due by then has run, and the tasks still waiting stay
        pending for the next step."""
        if to < self._now - EPSILON_S:
            raise ValueError(f"the loop is at {self._now}, it cannot run back to {to}")
        self.horizon, self._spins = to, 0
        try:
            self.run_forever()
        finally:
            self.horizon = None

    def reached(self, timeout: float | None) -> bool:
        """Stepped, whether a wait of `timeout` (None: no timer) ends this step: it would
        pass the horizon, so the clock moves to it and the loop stops."""
        assert self.horizon is not None
        if timeout == 0:
            self._spins += 1
            if self._spins > SPIN_LIMIT:
                raise VirtualTimeError(f"the loop spins at {self._now}: a task is ready "
                                       "again and again without time passing")
            return False
        if timeout is not None and self._now + timeout <= self.horizon + EPSILON_S:
            return False
        if self.horizon > self._now:
            self._now = self.horizon
            self.jumps += 1
        self.stop()
        return True


def run_virtual(fn: Callable[[], Awaitable[T]], start: float = 0.0) -> T:
    """Run `fn` with anyio on a `VirtualLoop` whose clock starts at `start`."""
    return anyio.run(fn, backend="asyncio",
                     backend_options={"loop_factory": lambda: VirtualLoop(start)})


__all__ = ["EPSILON_S", "VirtualLoop", "VirtualTimeError", "run_virtual"]
