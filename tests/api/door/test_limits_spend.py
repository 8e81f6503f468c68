"""A refusal spends nothing: a request refused by its account's bucket keeps its key's own
token, and one refused by its key keeps the account's. Virtual time: `now` is a number the
test chooses."""

import pytest

from api.config import Principal, TierPolicy
from api.door import RateLimiter
from api.errors import RateLimited
from batcher import Tier

POLICY = TierPolicy(rate=10, burst=5, account_rate=15, account_burst=8, budget_ms=250,
                    timeout_ms=2000)
LIMITS = {Tier.PAID: POLICY, Tier.FREE: POLICY}
KEY_A = Principal(Tier.FREE, "acct", "a")
KEY_B = Principal(Tier.FREE, "acct", "b")


def admitted(limiter: RateLimiter, who: Principal, n: int, now: float) -> int:
    passed = 0
    for _ in range(n):
        try:
            limiter.check(who, now)
            passed += 1
        except RateLimited:
            pass
    return passed


def test_a_refusal_by_the_account_spends_none_of_the_keys_own_tokens() -> None:
    limiter = RateLimiter(LIMITS)  # a key holds 5 tokens, its account 8
    assert admitted(limiter, KEY_B, 5, now=0.0) == 5
    assert admitted(limiter, KEY_A, 3, now=0.0) == 3  # the account's last: KEY_A keeps 2
    assert admitted(limiter, KEY_A, 10, now=0.0) == 0  # the account refuses every one
    # 0.2 s on, the account holds 3 tokens again and KEY_A its 2 kept plus 2 refilled
    assert admitted(limiter, KEY_A, 10, now=0.2) == 3


def test_a_refusal_by_the_key_spends_none_of_the_accounts_tokens() -> None:
    limiter = RateLimiter(LIMITS)
    assert admitted(limiter, KEY_A, 20, now=0.0) == 5  # 15 refused by KEY_A's own bucket
    assert admitted(limiter, KEY_B, 20, now=0.0) == 3  # the account's 8 less KEY_A's 5


def test_a_refusal_says_when_both_buckets_hold_a_token_again() -> None:
    limiter = RateLimiter(LIMITS)
    admitted(limiter, KEY_B, 5, now=0.0)
    admitted(limiter, KEY_A, 3, now=0.0)
    admitted(limiter, KEY_A, 2, now=0.0)  # refused by the account: KEY_A keeps its 2
    with pytest.raises(RateLimited) as refused:
        limiter.check(KEY_A, 0.0)
    assert refused.value.retry_after == 1  # the account's 1/15 s, rounded up to a second
    limiter.check(KEY_A, 1 / 15 + 1e-9)  # then it passes: the key never ran dry
