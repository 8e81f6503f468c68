"""Who calls: seeded schedules of arrivals, constant or following a rate, merged in time
order, each stream on a generator of its own."""

from __future__ import annotations

import math
import random

import pytest

from batcher import Tier
from failover.sim import Stream, constant, given, merged, varying


def test_a_constant_stream_comes_at_its_rate_within_the_run() -> None:
    times = list(constant(1_000)(random.Random(1), 10.0))
    assert abs(len(times) - 10_000) < 4 * math.sqrt(10_000)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 10.0


def test_a_varying_stream_follows_its_rate() -> None:
    def ramp(t: float) -> float:
        return 100.0 if t < 5 else 900.0

    times = list(varying(ramp, 1_000)(random.Random(2), 10.0))
    early, late = sum(t < 5 for t in times), sum(t >= 5 for t in times)
    assert abs(early - 500) < 4 * math.sqrt(500) and abs(late - 4_500) < 4 * math.sqrt(4_500)


def test_a_rate_above_its_top_is_refused() -> None:
    with pytest.raises(ValueError, match="above its top"):
        list(varying(lambda t: 2.0, 1.0)(random.Random(1), 100.0))


def test_merged_streams_come_in_time_order_and_each_keeps_its_own_draws() -> None:
    paid = Stream(constant(50), tier=Tier.PAID)
    free = Stream(constant(80), tier=Tier.FREE)
    both = list(merged([paid, free], 5.0, seed=3))
    assert [t for t, _ in both] == sorted(t for t, _ in both)
    alone = [t for t, _ in merged([paid], 5.0, seed=3)]
    assert [t for t, i in both if i == 0] == alone  # adding a stream changes no other one
    assert list(merged([paid, free], 5.0, seed=3)) == both
    assert list(merged([paid, free], 5.0, seed=4)) != both


def test_given_times_are_kept_within_the_run() -> None:
    assert [t for t, _ in merged([Stream(given([-1.0, 0.5, 2.0, 9.0]))], 5.0, 1)] == [0.5, 2.0]


@pytest.mark.parametrize("inputs", [0, 101])
def test_a_request_holds_1_to_100_inputs(inputs: int) -> None:
    with pytest.raises(ValueError):
        Stream(constant(1.0), inputs=inputs)
