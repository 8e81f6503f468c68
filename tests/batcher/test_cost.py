"""The learned batch cost: a fixed part and a part per character, and the caps they imply."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher import BatchCost
from batcher.cost import GROWTH, LONG_WINDOW, PROBE_CHARS, WINDOW


def slowlong(chars: int) -> float:
    """`tests.models:slowlong`: 8 s per MB, 0.1 s at least."""
    return max(0.1, 8.0 * chars / 1e6)


def test_nothing_measured_means_the_floor_and_no_cap() -> None:
    cost = BatchCost(floor=0.1, max_batch=100)
    assert (cost.fixed, cost.per_char, cost.batch_chars()) == (0.1, 0.0, math.inf)
    assert cost.cut_chars() == GROWTH * PROBE_CHARS  # an unknown cost is probed in steps


def test_a_cost_that_grows_with_characters_is_learned() -> None:
    cost = BatchCost(floor=0.01, max_batch=100)
    for chars in (20, 50, 30, 20_000, 40, 40_000, 10, 30_000):
        cost.observe(0.1 + 4e-6 * chars, chars)
    assert cost.fixed == pytest.approx(0.1)
    assert cost.per_char == pytest.approx(4e-6)
    assert cost.batch_chars() == pytest.approx(12_500)  # characters: half the fixed part
    assert cost.seconds(1_000_000) == pytest.approx(4.1)


def test_a_fixed_cost_learns_no_slope_from_timing_noise() -> None:
    rng = random.Random(1)
    cost = BatchCost(floor=0.1, max_batch=100)
    for _ in range(10 * WINDOW):
        cost.observe(0.1 + rng.uniform(0.0, 0.02), rng.randint(5, 1000))
    assert cost.per_char == 0.0 and cost.batch_chars() == math.inf
    assert cost.fixed == pytest.approx(0.11, abs=0.005)


def test_the_fixed_part_never_drops_below_the_floor() -> None:
    cost = BatchCost(floor=0.1, max_batch=100)
    for chars in (10, 10_000, 20, 20_000):
        cost.observe(0.0001 * chars / 100, chars)
    assert cost.fixed == 0.1


def test_short_traffic_does_not_wash_out_what_long_input_costs() -> None:
    cost = BatchCost(floor=0.01, max_batch=100)
    for _ in range(4):
        cost.observe(0.1, 50)
    for chars in range(20_000, 20_000 + LONG_WINDOW):
        cost.observe(slowlong(chars), chars)
    learned = cost.per_char
    for _ in range(20 * WINDOW):  # minutes of short batches only
        cost.observe(0.1, 50)
    assert learned > 0 and cost.per_char == pytest.approx(learned, rel=0.05)


def test_a_cut_holds_at_most_twice_the_largest_batch_measured() -> None:
    cost = BatchCost(floor=0.1, max_batch=100)
    cost.observe(0.1, 50)
    cost.observe(0.1, 15_000)
    assert cost.cut_chars() == GROWTH * 15_000


def test_slowlong_settles_on_batches_that_leave_a_paid_budget_room() -> None:
    # A paid item may wait for one long batch and run in another, after a 50 ms wait for a
    # fuller batch: within the example's 400 ms. Below slowlong's knee, at 12,500
    # characters, long batches show no slope, so the cut probes past it now and then: only
    # to twice a batch that ran within 1.5 x the fixed part, never twice the probe itself.
    cost = BatchCost(floor=0.01, max_batch=100)
    for k in range(400):  # what the cut would do: short traffic, and long cut at the cap
        cost.observe(0.1, 20)
        chars = int(cost.cut_chars()) // 10_000 * 10_000 or 10_000
        cost.observe(slowlong(chars), chars)
        if k > 20:
            assert 2 * slowlong(int(cost.cut_chars())) + 0.05 <= 0.4
    assert cost.fixed == pytest.approx(0.1, abs=0.02)


def test_a_time_to_aim_at_sets_the_cap_where_a_batch_takes_that_long() -> None:
    cost = BatchCost(floor=0.01, max_batch=100, longest=0.175)
    for chars in (20, 50, 30, 20_000, 40_000, 30_000):
        cost.observe(0.1 + 4e-6 * chars, chars)
    assert cost.batch_chars() == pytest.approx(18_750)
    assert cost.seconds(cost.batch_chars()) == pytest.approx(0.175)


def test_a_fixed_cap_is_the_cap() -> None:
    cost = BatchCost(floor=0.1, max_batch=100, max_chars=5_000)
    cost.observe(8.0, 1_000_000)
    assert cost.batch_chars() == cost.cut_chars() == 5_000


@given(st.lists(st.tuples(st.floats(0.0, 30.0), st.integers(0, 1_000_000)), max_size=600))
def test_the_fit_is_never_below_the_floor_nor_a_negative_cost(
    batches: list[tuple[float, int]],
) -> None:
    cost = BatchCost(floor=0.05, max_batch=100)
    for seconds, chars in batches:
        cost.observe(seconds, chars)
        assert cost.fixed >= 0.05 and cost.per_char >= 0.0
        assert math.isfinite(cost.fixed) and cost.cut_chars() >= 1


def test_work_counts_batches_by_items_or_by_characters_whichever_is_more() -> None:
    cost = BatchCost(floor=0.1, max_batch=100, max_chars=10_000)
    assert cost.work(300, 0) == pytest.approx(0.3)  # three full batches
    assert cost.work(10, 50_000) == pytest.approx(0.5)  # five batches at the cap


# -- what one worker drains ------------------------------------------------------------------

def test_throughput_before_any_batch_is_max_batch_items_in_the_floor() -> None:
    t = BatchCost(floor=0.3, max_batch=100).throughput(chars_per_item=50)
    assert (t.batch_items, t.batch_s) == (100, 0.3)
    assert t.per_worker == pytest.approx(1000 / 3)


def test_throughput_is_what_work_charges_an_item_inverted() -> None:
    cost = BatchCost(floor=0.01, max_batch=100)
    for chars in (20, 50, 30, 20_000, 40, 40_000, 10, 30_000):
        cost.observe(0.1 + 4e-6 * chars, chars)
    for per_item in (0.0, 16.0, 125.0, 1_000.0, 50_000.0):
        t = cost.throughput(per_item)
        assert t.per_worker == pytest.approx(1 / cost.work(1, per_item))
        assert t.batch_s == pytest.approx(cost.seconds(t.batch_items * per_item))


def test_long_inputs_make_smaller_slower_batches() -> None:
    cost = BatchCost(floor=0.01, max_batch=100)
    for chars in (20, 50, 30, 20_000, 40, 40_000, 10, 30_000):
        cost.observe(0.1 + 4e-6 * chars, chars)
    short, long = cost.throughput(10.0), cost.throughput(1_000.0)
    assert short.batch_items == 100 and long.batch_items == pytest.approx(12.5)  # the cap
    assert long.per_worker < short.per_worker
