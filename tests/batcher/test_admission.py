import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher import Admission, AdmissionSettings, Overloaded, Tier

BUDGETS = {Tier.PAID: 0.4, Tier.FREE: 0.25}


def admission() -> Admission:
    return Admission(AdmissionSettings(budgets=BUDGETS, initial_latency=0.1))


def refused(a: Admission, tier: Tier, ahead: int, workers: int, deadline: float = 10.0) -> bool:
    try:
        a.check(tier, ahead, workers, deadline)
    except Overloaded:
        return True
    return False


def test_estimate_is_queue_over_throughput_plus_one_batch() -> None:
    # Two workers serve 100 items per 0.1 s each: 300 items ahead drain in 0.15 s.
    assert math.isclose(admission().estimate(300, workers=2), 0.25)


@given(ahead=st.integers(0, 5000), workers=st.integers(0, 12), tier=st.sampled_from(Tier))
def test_refused_exactly_when_the_estimate_exceeds_the_budget(
    ahead: int, workers: int, tier: Tier
) -> None:
    a = admission()
    expected = a.estimate(ahead, workers)
    over = workers == 0 or (ahead > 0 and expected > BUDGETS[tier])
    assert refused(a, tier, ahead, workers) == over


@given(paid_ahead=st.integers(0, 3000), free_extra=st.integers(0, 3000), workers=st.integers(1, 12))
def test_paid_is_never_refused_while_free_is_admitted(
    paid_ahead: int, free_extra: int, workers: int
) -> None:
    # A free item has at least the paid queue ahead of it, and a smaller budget.
    a = admission()
    if not refused(a, Tier.FREE, paid_ahead + free_extra, workers):
        assert not refused(a, Tier.PAID, paid_ahead, workers)


def test_retry_after_grows_with_the_queue() -> None:
    a = admission()
    waits = []
    for ahead in (1000, 2000, 4000):
        with pytest.raises(Overloaded) as info:
            a.check(Tier.FREE, ahead, 1, 10.0)
        waits.append(info.value.retry_after)
    assert waits == sorted(waits) and waits[0] < waits[-1]


def test_no_ready_worker_refuses_with_its_own_code() -> None:
    with pytest.raises(Overloaded) as info:
        admission().check(Tier.PAID, 0, 0, 10.0)
    assert info.value.code == "no_healthy_worker"


def test_a_deadline_the_queue_cannot_meet_is_refused_at_the_door() -> None:
    with pytest.raises(Overloaded) as info:
        admission().check(Tier.PAID, 100, 1, deadline_in=0.15)
    assert info.value.code == "deadline_unreachable"


def test_measured_latency_moves_the_estimate() -> None:
    a = admission()
    for _ in range(50):
        a.observe_batch(0.3)
    assert math.isclose(a.batch_latency, 0.3, rel_tol=1e-3)
    assert refused(a, Tier.FREE, 1, 1)  # one batch alone now takes longer than 250 ms
    assert not refused(a, Tier.FREE, 0, 1)  # but nothing ahead: refusing protects nobody


def test_higher_tier_arrivals_lengthen_a_lower_tiers_wait() -> None:
    a = admission()
    alone = a.estimate(100, workers=1)
    overtaken = a.estimate(100, workers=1, overtaking=500.0)
    assert math.isclose(alone, 0.2) and math.isclose(overtaken, 0.3)


def test_a_tier_is_never_assumed_to_starve_completely() -> None:
    assert admission().estimate(10, workers=1, overtaking=10_000.0) < math.inf


def test_rate_meter_tracks_a_steady_rate_and_decays() -> None:
    from batcher import RateMeter

    meter = RateMeter(tau=1.0)
    for k in range(5000):
        meter.add(1, k / 500)  # 500 arrivals a second for 10 s
    assert 450 < meter.rate(10.0) < 550
    assert meter.rate(20.0) < 0.1


def learned() -> Admission:
    """Batches cost 0.1 s plus 4 us a character (a cap of 12,500 characters a batch)."""
    a = admission()
    for chars in (10, 20, 30, 20_000, 40_000, 30_000):
        a.observe_batch(0.1 + 4e-6 * chars, chars)
    return a


def test_characters_queued_ahead_weigh_what_they_cost() -> None:
    a = learned()
    short = a.estimate(100, workers=1)
    long = a.estimate(100, workers=1, queued_chars=1_000_000)  # 80 batches at the cap
    assert math.isclose(short, 0.2, rel_tol=1e-3)
    assert math.isclose(long, 80 * 0.1 + 4.0 + 0.1, rel_tol=1e-3)


def test_a_request_too_long_for_its_own_deadline_is_refused_with_nothing_ahead() -> None:
    with pytest.raises(Overloaded) as info:
        learned().check(Tier.FREE, 0, 2, 2.0, items=100, chars=1_000_000)
    assert info.value.code == "deadline_unreachable"  # not over_budget: no wait would help
    assert "fewer or shorter inputs" in str(info.value)


def test_one_short_input_with_nothing_ahead_is_admitted_whatever_its_deadline() -> None:
    learned().check(Tier.FREE, 0, 1, 0.01, items=1, chars=100)  # refusing protects nobody


def test_one_input_longer_than_a_batch_may_hold_is_judged_on_its_own_run() -> None:
    a = learned()
    a.check(Tier.FREE, 0, 1, 2.0, items=1, chars=30_000)  # 0.22 s: within budget
    with pytest.raises(Overloaded) as info:
        a.check(Tier.FREE, 0, 1, 0.2, items=1, chars=30_000)
    assert info.value.code == "deadline_unreachable"


def test_higher_tiers_arriving_with_long_inputs_lengthen_a_lower_tiers_wait() -> None:
    a = learned()
    plain = a.estimate(100, workers=1, overtaking=100.0)
    heavy = a.estimate(100, workers=1, overtaking=100.0, overtaking_chars=100_000.0)
    assert heavy > 2 * plain


# -- what one worker drains ------------------------------------------------------------------

def test_throughput_before_any_batch_is_what_admission_assumes() -> None:
    t = admission().throughput()
    assert (t.batch_items, t.batch_s) == (100, 0.1)


def test_throughput_follows_the_measured_batch_time() -> None:
    a = admission()
    for _ in range(50):
        a.observe_batch(0.3, chars=1600, items=100)
    assert a.throughput().per_worker == pytest.approx(1000 / 3, rel=1e-3)


def test_throughput_counts_the_characters_of_the_current_mix() -> None:
    a = learned()  # 0.1 s a batch plus 4 us a character
    for _ in range(50):
        a.observe_batch(0.1 + 4e-6 * 1_000, chars=1_000, items=100)  # 10 characters an item
    short = a.throughput()
    for _ in range(50):
        a.observe_batch(0.1 + 4e-6 * 12_000, chars=12_000, items=12)  # 1,000 an item
    long = a.throughput()
    assert short.per_worker == pytest.approx(100 / (0.1 + 4e-6 * 1_000), rel=0.05)
    assert long.per_worker < short.per_worker / 5
