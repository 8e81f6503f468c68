"""Rate limits in virtual time: `now` is a number the test chooses."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.config import DEFAULT_TIERS, Principal, TierPolicy
from api.door import RateLimiter, TokenBucket, pressure_factor
from api.errors import RateLimited
from batcher import Tier

POLICY = TierPolicy(rate=10, burst=5, account_rate=15, account_burst=8, budget_ms=250,
                    timeout_ms=2000)
LIMITS = {Tier.PAID: POLICY, Tier.FREE: POLICY}
KEY_A = Principal(Tier.FREE, "acct", "a")
KEY_B = Principal(Tier.FREE, "acct", "b")


def admitted(limiter: RateLimiter, who: Principal, times: list[float], factor: float = 1.0
             ) -> int:
    n = 0
    for t in times:
        try:
            limiter.check(who, t, factor)
            n += 1
        except RateLimited:
            pass
    return n


def test_a_burst_passes_then_the_rate_holds() -> None:
    limiter = RateLimiter(LIMITS)
    assert admitted(limiter, KEY_A, [0.0] * 20) == 5
    assert admitted(limiter, KEY_A, [1.0] * 20) == 5  # 10 tokens refilled, capped at the burst


def test_refusal_says_when_to_retry() -> None:
    limiter = RateLimiter(LIMITS)
    admitted(limiter, KEY_A, [0.0] * 5)
    with pytest.raises(RateLimited) as info:
        limiter.check(KEY_A, 0.0)
    assert info.value.retry_after >= 1


def test_an_account_is_limited_across_its_keys() -> None:
    limiter = RateLimiter(LIMITS)
    assert admitted(limiter, KEY_A, [0.0] * 5) + admitted(limiter, KEY_B, [0.0] * 5) == 8


def test_pressure_tightens_the_rate() -> None:
    calm, pressed = RateLimiter(LIMITS), RateLimiter(LIMITS)
    times = [i / 100 for i in range(1000)]  # 100 requests/s for 10 s
    assert admitted(pressed, KEY_A, times, factor=0.1) < admitted(calm, KEY_A, times)


def test_pressure_factor_is_one_when_calm_and_falls_to_a_tenth() -> None:
    assert pressure_factor(0.0) == pressure_factor(0.5) == 1.0
    assert pressure_factor(0.75) < 1.0 and pressure_factor(1.0) == pressure_factor(9.0) == 0.1


@given(st.lists(st.floats(0, 10), max_size=300), st.floats(0.1, 1.0))
def test_never_more_than_burst_plus_rate_times_elapsed(times: list[float], factor: float
                                                       ) -> None:
    limiter = RateLimiter(LIMITS)
    times = sorted(times)
    n = admitted(limiter, KEY_A, times, factor)
    elapsed = times[-1] - times[0] if times else 0.0
    assert n <= POLICY.burst + POLICY.rate * factor * elapsed + 1e-9


def outcomes(limiter: RateLimiter, who: Principal, n: int, now: float, factor: float
             ) -> list[float]:
    """Each request's Retry-After (0 when it passed)."""
    seen: list[float] = []
    for _ in range(n):
        try:
            limiter.check(who, now, factor)
            seen.append(0.0)
        except RateLimited as exc:
            seen.append(exc.retry_after)
    return seen


@given(st.lists(st.tuples(st.sampled_from([KEY_A, KEY_B]), st.floats(0, 0.5)), max_size=40),
       st.sampled_from([KEY_A, KEY_B]), st.integers(1, 20), st.floats(0, 0.5),
       st.floats(0.1, 1.0))
def test_a_run_allowed_at_once_passes_and_refuses_as_checking_it_one_by_one(
    history: list[tuple[Principal, float]], who: Principal, n: int, later: float,
    factor: float,
) -> None:
    """`allow` then `check` for the rest gives each request of a frame the answer, and
    leaves the buckets, as `n` checks would."""
    at_once, one_by_one = RateLimiter(LIMITS), RateLimiter(LIMITS)
    now = 0.0
    for caller, dt in history:  # the same past for both
        now += dt
        for limiter in (at_once, one_by_one):
            outcomes(limiter, caller, 1, now, factor)
    now += later
    passed = at_once.allow(who, n, now, factor)
    assert 0 <= passed <= n
    expected = outcomes(one_by_one, who, n, now, factor)
    assert passed == next((i for i, wait in enumerate(expected) if wait), n)  # all it can
    assert [0.0] * passed + outcomes(at_once, who, n - passed, now, factor) == expected
    for caller in (KEY_A, KEY_B):  # and the next requests see the same buckets
        assert outcomes(at_once, caller, 3, now + 0.05, factor) == \
            outcomes(one_by_one, caller, 3, now + 0.05, factor)


def test_token_bucket_refills_with_time() -> None:
    bucket = TokenBucket(burst=1, now=0.0)
    assert bucket.take(0.0, rate=2, burst=1) == 0.0
    assert bucket.take(0.0, rate=2, burst=1) == pytest.approx(0.5)
    assert bucket.take(0.5, rate=2, burst=1) == 0.0


def test_the_shipped_paid_limits_carry_500_requests_a_second_from_one_key() -> None:
    limiter = RateLimiter(dict(DEFAULT_TIERS))
    paid = Principal(Tier.PAID, "acme", "paid-demo-key")
    assert admitted(limiter, paid, [i / 500 for i in range(15_000)]) == 15_000


def test_tier_policies_are_validated() -> None:
    with pytest.raises(ValueError):
        replace(POLICY, rate=0)
