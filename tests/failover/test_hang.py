"""The hang limits follow recent batch times, scaled by a batch's input size."""

from __future__ import annotations

import math

import pytest

from failover import BatchTimes, HangSettings
from failover.hang import MIN_SAMPLES, WINDOW


def trained(seconds: float, chars: int, n: int = MIN_SAMPLES,
            settings: HangSettings | None = None) -> BatchTimes:
    times = BatchTimes(settings)
    for _ in range(n):
        times.observe(seconds, chars)
    return times


def test_before_enough_batches_nothing_is_hedged_and_the_kill_limit_is_the_cold_one() -> None:
    times = trained(0.1, 1000, n=MIN_SAMPLES - 1)
    assert times.hedge_after(1000) == math.inf
    assert times.kill_after(1000) == HangSettings().cold_kill == 60.0


def test_a_batch_like_the_recent_ones_is_hedged_at_the_floor_and_killed_at_5_s() -> None:
    times = trained(0.1, 1000)
    assert times.hedge_after(1000) == 0.5  # 3 x 0.1 is under the floor
    assert times.kill_after(1000) == 5.0  # 20 x 0.1 is under the floor
    slow = trained(0.4, 1000)
    assert slow.hedge_after(1000) == pytest.approx(1.2)
    assert slow.kill_after(1000) == pytest.approx(8.0)


def test_limits_grow_with_the_batch_s_input_but_never_shrink_below_the_typical_batch_s() -> None:
    times = trained(0.45, 4000)  # the real model on this CPU: 100 short strings
    long_batch = 100 * 10_000  # 100 inputs at the character limit: took 9 s here
    assert times.hedge_after(long_batch) == pytest.approx(3 * 0.45 * 250)
    assert times.kill_after(long_batch) > 9.0 * 100
    assert times.hedge_after(10) == times.hedge_after(4000)


def test_the_p99_of_the_window_sets_the_pace_and_old_batches_fall_out() -> None:
    times = trained(0.1, 100, n=WINDOW - 2)
    for _ in range(2):
        times.observe(2.0, 100)  # two slow batches: beyond the P99 of 256
    assert times.hedge_after(100) == 0.5
    times = trained(0.1, 100, n=WINDOW)
    for _ in range(WINDOW):
        times.observe(0.3, 100)  # the pool got slower: the window follows
    assert times.hedge_after(100) == pytest.approx(0.9)


def test_a_fixed_kill_limit_and_no_hedging_can_be_asked_for() -> None:
    times = trained(0.1, 100, settings=HangSettings(hedge=False, kill_after=2.5))
    assert times.hedge_after(100) == math.inf and times.kill_after(10**9) == 2.5
    with pytest.raises(ValueError):
        HangSettings(kill_after=0)
