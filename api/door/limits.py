"""Per-key and per-account rate limits: token buckets whose rate tightens under pressure.

Each tier sets a rate and a burst for every key and for every account (keys file,
`[tiers.<tier>]`). While the queue ahead of a tier grows toward that tier's admission
budget, its rates are scaled down (free first: its budget is smaller; paid only when the
pool cannot keep up) and they relax as the queue drains. The factor is exported as a metric.
"""

from __future__ import annotations

import math

from api.config import Principal, TierPolicy
from api.errors import RateLimited
from batcher import Tier


def pressure_factor(pressure: float) -> float:
    """Rate multiplier for a tier whose expected wait is `pressure` x its budget:
    1 up to half the budget, then down linearly to 0.1 at the budget and beyond."""
    if pressure <= 0.5:
        return 1.0
    return max(0.1, 1.0 - 1.8 * (pressure - 0.5))


class TokenBucket:
    __slots__ = ("last", "tokens")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst
        self.last = now

    def refill(self, now: float, rate: float, burst: float) -> None:
        self.tokens = min(burst, self.tokens + (now - self.last) * rate)
        self.last = now

    def wait(self, now: float, rate: float, burst: float) -> float:
        """Refill; 0 if a token is there (none is taken), else the seconds until one is."""
        self.tokens = min(burst, self.tokens + (now - self.last) * rate)  # `refill`, inlined
        self.last = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / rate

    def take(self, now: float, rate: float, burst: float) -> float:
        """Take one token; 0 if allowed, else the seconds until one is available."""
        wait = self.wait(now, rate, burst)
        if wait == 0.0:
            self.tokens -= 1
        return wait


class RateLimiter:
    """One bucket per key and per account: bounded by the keys file (anonymous is one)."""

    def __init__(self, limits: dict[Tier, TierPolicy]) -> None:
        if set(limits) != set(Tier):
            raise ValueError("rate limits are needed for every tier")
        self._limits = limits
        self._keys: dict[tuple[Tier, str], TokenBucket] = {}
        self._accounts: dict[tuple[Tier, str], TokenBucket] = {}

    def check(self, principal: Principal, now: float, factor: float = 1.0) -> None:
        """Raise RateLimited if the key or its account is over its (scaled) rate. A token is
        taken from both or from neither: a refusal by one bucket spends nothing of the
        other's (a key refused by its busy account keeps its own rate for later)."""
        lim = self._limits[principal.tier]
        key = self._bucket(self._keys, (principal.tier, principal.key or principal.account),
                           now, lim.burst)
        account = self._bucket(self._accounts, (principal.tier, principal.account), now,
                               lim.account_burst)
        wait = max(key.wait(now, lim.rate * factor, lim.burst),
                   account.wait(now, lim.account_rate * factor, lim.account_burst))
        if wait > 0.0:  # the later of the two: a retry sooner is refused again
            raise RateLimited("rate limit exceeded for this key or account", math.ceil(wait))
        key.tokens -= 1
        account.tokens -= 1

    def allow(self, principal: Principal, n: int, now: float, factor: float = 1.0) -> int:
        """How many of `n` requests of `principal` at `now` pass: the first ones, as `check`
        called `n` times would pass them, their tokens taken at once. A gateway's frame
        often holds several requests of one caller; the rest are `check`ed one by one."""
        lim = self._limits[principal.tier]
        key = self._bucket(self._keys, (principal.tier, principal.key or principal.account),
                           now, lim.burst)
        account = self._bucket(self._accounts, (principal.tier, principal.account), now,
                               lim.account_burst)
        key.refill(now, lim.rate * factor, lim.burst)
        account.refill(now, lim.account_rate * factor, lim.account_burst)
        passed = min(n, int(key.tokens), int(account.tokens))
        key.tokens -= passed
        account.tokens -= passed
        return passed

    @staticmethod
    def _bucket(buckets: dict[tuple[Tier, str], TokenBucket], name: tuple[Tier, str],
                now: float, burst: float) -> TokenBucket:
        bucket = buckets.get(name)
        if bucket is None:
            bucket = buckets[name] = TokenBucket(burst, now)
        return bucket


__all__ = ["RateLimiter", "TokenBucket", "pressure_factor"]
