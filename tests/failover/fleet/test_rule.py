"""The scaling rule on hand-made traces, in virtual time: what it asks for and when. The
caller says how many workers are on their way (the ledger's count) and what one worker
drains (its measured capacity) at each decision."""

from __future__ import annotations

import math

import pytest

from failover.fleet import SCALE_REASONS, Decision, Scaler, ScalerSettings

C = 1000.0  # items/s one worker drains: the contract's 100 items per 0.1 s, as measured


def scaler(min_workers: int = 1, max_workers: int = 4, **kw: float) -> Scaler:
    return Scaler(ScalerSettings(min_workers, max_workers, **kw))


def feed(s: Scaler, rate: float, start: float, end: float, step: float = 0.125) -> float:
    """Offer `rate` items/s from `start` to `end` in ticks of `step`; returns `end`."""
    t = start
    while t < end:
        s.arrived(round(rate * step), t, paid=False)
        t += step
    return end


def test_a_step_from_100_to_3000_asks_for_three_more_at_once() -> None:
    s = scaler()
    t = feed(s, 100, 0, 300)
    assert s.decide(t, running=1, starting=0, queued=0, start_s=5, capacity=C) == Decision()
    t = feed(s, 3000, t, t + 10)
    assert s.decide(t, running=1, starting=0, queued=0, start_s=5, capacity=C) == Decision(
        up=3, reason="demand")
    assert s.desired() == 4


def test_asked_every_second_a_step_grows_the_pool_to_the_maximum_and_no_further() -> None:
    s = scaler()
    t = feed(s, 100, 0, 300)
    asked, starting = [], 0
    for second in range(300, 330):
        t = feed(s, 3000, t, second)
        d = s.decide(t, 1, starting, 0, 5, C)
        asked.append(d.up)
        starting += d.up
    assert sum(asked[:10]) == sum(asked) == 3  # all three within 10 s, none after
    assert starting == 3


def test_starting_workers_are_not_asked_for_again() -> None:
    s = scaler()
    t = feed(s, 3000, 0, 60)
    assert s.decide(t, 1, 0, 0, 5, C).up == 3
    assert s.decide(t + 1, 1, 3, 0, 5, C) == Decision()
    assert s.decide(t + 5, 2, 2, 0, 5, C) == Decision()  # one of them came up


def test_a_steady_load_is_planned_at_the_target_utilization() -> None:
    s = scaler(1, 10)
    t = feed(s, 2000, 0, 600)
    s.decide(t, 1, 0, 0, 120, C)
    assert s.desired() == math.ceil(2000 / 700)  # 2,000 items/s fill 70% of 3 workers


def test_a_ramp_is_met_when_the_workers_asked_for_arrive() -> None:
    """13 items/s per second with a 120 s start-up: what is asked now covers the load at
    its arrival at the target utilization, give or take a tenth."""
    s = scaler(1, 100)
    t = feed(s, 200, -300, 0)
    while t < 300:
        t = feed(s, 200 + 13 * t, t, t + 1)
    s.decide(t, 1, 0, 0, 120, C)
    needed = (200 + 13 * (t + 120)) / 700
    assert needed * 0.9 <= s.desired() <= needed * 1.1 + 1


def test_a_step_is_planned_for_at_most_twice_the_short_rate() -> None:
    s = scaler(1, 100)
    t = feed(s, 10_000, feed(s, 100, 0, 300), 305)
    short, long = s.rates(t)
    assert short > long
    assert s.predicted(t, 0, 120) == pytest.approx(2 * short)  # the trend alone would be more
    assert s.predicted(t, 0, 0) < 2 * short  # with no start-up to bridge, less is carried


def test_a_queue_alone_asks_with_reason_queue() -> None:
    s = scaler()
    t = feed(s, 100, 0, 300)
    assert s.decide(t, 1, 0, queued=20_000, start_s=5, capacity=C) == Decision(
        up=3, reason="queue")


def test_below_the_minimum_it_asks_with_reason_floor() -> None:
    s = scaler(min_workers=2)
    assert s.decide(0, running=0, starting=0, queued=0, start_s=5, capacity=C) == Decision(
        up=2, reason="floor")


def test_above_the_maximum_it_retires_at_once_with_reason_floor() -> None:
    s = scaler(max_workers=2)
    assert s.decide(0, running=3, starting=0, queued=0, start_s=5, capacity=C) == Decision(
        down=1, reason="floor")


def test_desired_stays_within_the_bounds() -> None:
    s = scaler(2, 4)
    assert s.decide(0, 2, 0, 0, 5, C) == Decision()
    assert s.desired() == 2
    t = feed(s, 1_000_000, 0, 30)
    s.decide(t, 2, 0, 10**9, 5, C)
    assert s.desired() == 4


def retire_as_told(s: Scaler, start: float, end: float, running: int) -> list[float]:
    """Decide each second, carrying out every retirement; the times of the retirements."""
    downs = []
    for t in range(int(start), int(end)):
        d = s.decide(t, running, 0, 0, 120, C)
        assert d.up == 0
        if d.down:
            assert d == Decision(down=1, reason="idle")
            running -= 1
            downs.append(float(t))
    return downs


def test_it_scales_down_one_worker_at_a_time_after_the_delay() -> None:
    s = scaler(1, 4)
    assert s.decide(60, 1, 0, queued=1_000_000, start_s=120, capacity=C) == Decision(
        up=3, reason="queue")
    # the queue is gone at once: calm from t=61, so the first goes 300 s later
    downs = retire_as_told(s, 61, 1000, running=4)
    assert downs == [361, 391, 421]  # then one per down_step_s, down to the minimum


def test_a_calm_that_breaks_starts_the_delay_again() -> None:
    s = scaler(1, 4, scale_down_delay_s=100)
    assert retire_as_told(s, 0, 50, running=3) == []
    # 1,500 items/s of queue: 3 workers are not too many, and 2 would be too few
    assert s.decide(50, 3, 0, queued=180_000, start_s=120, capacity=C) == Decision()
    assert retire_as_told(s, 51, 200, running=3) == [151, 181]


def test_a_scale_up_ends_a_retiring_episode() -> None:
    """After a scale-up, the next retirement waits the whole delay of calm again (starts
    still on their way that demand no longer needs are taken back after a step of calm)."""
    s = scaler(1, 4, scale_down_delay_s=100, down_step_s=10)
    assert retire_as_told(s, 0, 101, running=3) == [100]
    assert s.decide(101, 2, 0, queued=1_000_000, start_s=120, capacity=C) == Decision(
        up=2, reason="queue")
    assert s.decide(105, 2, 2, queued=250_000, start_s=120, capacity=C) == Decision()  # not calm
    running, starting, downs = 2, 2, []
    for t in range(106, 400):
        d = s.decide(t, running, starting, 0, 120, C)
        if d.down:
            downs.append(t)
            assert d.take_back == (starting > 0)  # the pending starts go first
            if d.take_back:
                starting -= 1
            else:
                running -= 1
    assert downs == [116, 117, 206]
    assert running == 1 and starting == 0


def test_a_restarted_worker_is_one_start_not_a_second_worker() -> None:
    s = scaler(2, 4)
    # a worker died; its slot starts it again (and its load may fail: still one start)
    assert s.decide(10, running=1, starting=1, queued=0, start_s=5, capacity=C) == Decision()
    assert s.decide(16, running=1, starting=1, queued=0, start_s=5, capacity=C) == Decision()


def test_next_check_is_when_the_down_condition_matures() -> None:
    s = scaler(1, 4, scale_down_delay_s=100, down_step_s=10)
    assert s.next_check(0, 0) == math.inf
    assert s.decide(5, 3, 0, 0, 120, C) == Decision()
    assert s.next_check(5, 0) == 105
    assert s.decide(105, 3, 0, 0, 120, C) == Decision(down=1, reason="idle")
    assert s.next_check(105, 0) == 115


def test_the_same_load_asks_for_workers_by_the_capacity_measured() -> None:
    wants = {}
    for capacity in (4_000.0, 1_000.0, 1_000 / 3):  # batches of 25, 100 and 300 ms
        s = scaler(1, 8)
        t = feed(s, 1_260, 0, 600)
        s.decide(t, 1, 0, 0, 120, capacity)
        wants[capacity] = s.desired()
    assert wants == {4_000.0: 1, 1_000.0: 2, 1_000 / 3: 6}  # 0.45, 1.8, 5.4 workers at 70 %


def test_a_capacity_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        scaler().decide(0, 1, 0, 0, 5, capacity=0.0)


def test_rates_count_every_offered_item_of_both_tiers() -> None:
    s = scaler()
    s.arrived(10, 0, paid=True)
    s.arrived(10, 0, paid=False)
    short, long = s.rates(0)
    assert short == pytest.approx(20 / 10) and long == pytest.approx(20 / 60)
    assert s.rates(10)[0] == pytest.approx(2 * math.exp(-1))


def test_reasons_are_the_published_ones() -> None:
    assert set(SCALE_REASONS) == {"demand", "queue", "floor", "idle"}


@pytest.mark.parametrize("kw", [
    {"min_workers": -1}, {"min_workers": 3, "max_workers": 2}, {"max_workers": 0},
    {"down_utilization": 0.8}, {"target_utilization": 1.5},
    {"scale_down_delay_s": -1}, {"short_window_s": 90},
])
def test_settings_refuse_what_cannot_work(kw: dict[str, float]) -> None:
    args: dict[str, float] = {"min_workers": 1, "max_workers": 4, **kw}
    with pytest.raises(ValueError):
        ScalerSettings(**args)  # type: ignore[arg-type]
