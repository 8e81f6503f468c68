"""Time, passed in. Batcher and failover read the clock through this seam and nothing else.

A clock must agree with the event loop's own clock, which the loops' timers use. In
production that is `MonotonicClock` (asyncio's loop time is `time.monotonic`), readable from
plain loop callbacks too. Tests run under trio with `trio.testing.MockClock(autojump_threshold=0)`
and `LoopClock`, so every timer of the batcher runs in exact virtual time.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float: ...


class MonotonicClock:
    """`time.monotonic`, the clock of asyncio's event loop; safe in reader callbacks."""

    def now(self) -> float:
        return time.monotonic()


class LoopClock:
    """The event loop's own monotonic clock (virtual under a mock-clocked test loop)."""

    def now(self) -> float:
        return anyio.current_time()


__all__ = ["Clock", "LoopClock", "MonotonicClock"]
