"""Admission while workers are on their way: they count from their ETA, and a refusal's
Retry-After is the time until a request of its tier would fit its budget."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher import Admission, AdmissionSettings, Overloaded, Tier
from batcher.admission import MIN_SHARE, capacity_wait

BUDGETS = {Tier.PAID: 0.4, Tier.FREE: 0.25}


def admission() -> Admission:
    return Admission(AdmissionSettings(budgets=BUDGETS, initial_latency=0.1))


def test_work_drains_faster_once_a_worker_joins() -> None:
    # 3 worker-seconds: one worker does 2 by t=2, then two do the last in 0.5 s.
    assert math.isclose(capacity_wait(3.0, 1, (2.0,)), 2.5)
    assert math.isclose(capacity_wait(3.0, 1), 3.0)
    assert capacity_wait(0.0, 1) == 0.0


def test_with_no_worker_the_work_starts_when_the_first_arrives() -> None:
    assert math.isclose(capacity_wait(1.0, 0, (5.0, 5.0)), 5.5)
    assert capacity_wait(1.0, 0) == math.inf
    assert capacity_wait(0.0, 0, (2.0,)) == 2.0


def test_tiers_served_first_leave_their_share() -> None:
    # Overtaking tiers use 1.5 of 2 workers: 0.5 left for this one.
    assert math.isclose(capacity_wait(1.0, 2, (), used=1.5), 2.0)
    assert math.isclose(capacity_wait(1.0, 1, (), used=5.0), 1.0 / MIN_SHARE)


@given(work=st.floats(0, 50), workers=st.integers(0, 8),
       joining=st.lists(st.floats(0, 30), max_size=4).map(sorted),
       extra=st.floats(0.01, 10))
def test_a_worker_that_comes_sooner_never_makes_the_wait_longer(
    work: float, workers: int, joining: list[float], extra: float
) -> None:
    later = [t + extra for t in joining]
    assert capacity_wait(work, workers, joining) <= capacity_wait(work, workers, later) + 1e-9
    assert capacity_wait(work, workers, joining) <= capacity_wait(work, workers) + 1e-9


def test_paid_is_admitted_when_its_budget_fits_on_the_capacity_coming() -> None:
    # 600 paid items ahead on one worker take 0.6 s: over the 0.4 s budget now...
    a = admission()
    with pytest.raises(Overloaded):
        a.check(Tier.PAID, 600, 1, 10.0)
    # ... but with four workers up in 0.05 s the queue drains in about 0.2 s.
    a.check(Tier.PAID, 600, 1, 10.0, joining=(0.05, 0.05, 0.05, 0.05))


def test_a_free_refusal_says_when_the_capacity_it_needs_is_up() -> None:
    # 3000 items ahead, one worker now, three more in 5 s: the queue is 3 worker-seconds;
    # by 5 s one worker has done 3 of them... make it 8000 items: 8 worker-seconds.
    a = admission()
    with pytest.raises(Overloaded) as info:
        a.check(Tier.FREE, 8000, 1, 60.0, joining=(5.0, 5.0, 5.0))
    # 5 done by t=5, the other 3 by four workers in 0.75 s: done at 5.75, a new request
    # would complete at 5.75 + 0.1; it fits the 0.25 s budget from 5.6 s on.
    assert math.isclose(info.value.retry_after, 5.75 + 0.1 - 0.25, rel_tol=1e-6)
    # With no one coming, it must wait for the queue to drain on one worker.
    with pytest.raises(Overloaded) as alone:
        a.check(Tier.FREE, 8000, 1, 60.0)
    assert alone.value.retry_after > 7.5


def test_with_no_worker_up_the_request_waits_for_the_first_one_coming() -> None:
    a = admission()
    a.check(Tier.PAID, 0, 0, 10.0, joining=(0.2,))  # completes at 0.3 s: within 0.4
    with pytest.raises(Overloaded) as info:
        a.check(Tier.FREE, 0, 0, 10.0, joining=(3.0,))
    assert info.value.code != "no_healthy_worker"
    assert math.isclose(info.value.retry_after, 3.0 + 0.1 - 0.25)


def test_while_the_offered_load_outruns_the_workers_retry_after_is_when_enough_arrive() -> None:
    # 3000 items/s offered need three workers at full batches; one is up, three are coming
    # at 2 s, 5 s and 9 s: the second of them makes three.
    a = admission()
    with pytest.raises(Overloaded) as info:
        a.check(Tier.FREE, 400, 1, 60.0, joining=(2.0, 5.0, 9.0), offered=3000.0)
    assert math.isclose(info.value.retry_after, 5.0)
    # The same queue with a load the workers keep up with: the queue's own time.
    with pytest.raises(Overloaded) as calm:
        a.check(Tier.FREE, 400, 1, 60.0, joining=(2.0, 5.0, 9.0), offered=500.0)
    assert calm.value.retry_after < 1.0
    # More than all of them can run: the last one coming.
    with pytest.raises(Overloaded) as short:
        a.check(Tier.FREE, 400, 1, 60.0, joining=(2.0, 5.0, 9.0), offered=9000.0)
    assert math.isclose(short.value.retry_after, 9.0)
