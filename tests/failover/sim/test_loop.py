"""Virtual time: the loop's clock jumps to the next timer when every task waits, so an
hour of sleeping costs nothing, timers fire in order, and a wait nothing can end is an
error rather than a hang."""

from __future__ import annotations

import time

import anyio
import pytest

from batcher import LoopClock
from failover.sim import VirtualTimeError, run_virtual


def test_an_hour_of_sleep_takes_no_real_time_and_ends_exactly_on_time() -> None:
    async def main() -> float:
        await anyio.sleep(3600)
        return LoopClock().now()

    began = time.perf_counter()
    assert run_virtual(main) == 3600.0
    assert time.perf_counter() - began < 1.0


def test_the_clock_starts_where_it_is_told() -> None:
    async def main() -> float:
        await anyio.sleep_until(0.0)
        return anyio.current_time()

    assert run_virtual(main, start=-5.0) == 0.0


def test_timers_of_several_tasks_fire_in_time_order() -> None:
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await anyio.sleep(seconds)
        woke.append((name, anyio.current_time()))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for name, seconds in (("c", 3.0), ("a", 1.0), ("b", 2.0)):
                tg.start_soon(sleeper, name, seconds)

    run_virtual(main)
    assert woke == [("a", 1.0), ("b", 2.0), ("c", 3.0)]


def test_a_wait_that_nothing_can_end_is_an_error() -> None:
    async def main() -> None:
        await anyio.Event().wait()

    with pytest.raises(VirtualTimeError):
        run_virtual(main)
