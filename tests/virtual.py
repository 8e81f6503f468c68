"""Exact virtual time: run an async test under trio with a mock clock that jumps ahead
whenever every task is blocked, so a 50 ms timer costs nothing and never flakes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from trio.testing import MockClock

T = TypeVar("T")


def run_virtual(fn: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(fn, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
